"""The C tokenizer handle (include/colibri/tokenizer.h): the names that _tokenizer.pxi defines in
colibri._core._native, the one extension module."""

from colibri._core._native import (
    MODEL_BPE,
    MODEL_SPM,
    PRE_IDS,
    CStream,
    CTokenizer,
    utf8_sanitize,
    utf8_validate,
)

__all__ = [
    "MODEL_SPM", "MODEL_BPE", "PRE_IDS", "utf8_validate", "utf8_sanitize", "CTokenizer",
    "CStream",
]
