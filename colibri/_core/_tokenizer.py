"""The C tokenizer handle (include/colibri/tokenizer.h): the names that _tokenizer.pxi defines in
colibri._core._native, the one extension module."""

from colibri._core._native import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNDEFINED,
    ATTR_UNKNOWN,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    BPE_ESCAPE_SPACES,
    BPE_NEWLINE_WORDS,
    BPE_RAW_UTF8,
    MODEL_BPE,
    MODEL_SPM,
    PRE_IDS,
    CStream,
    CTokenizer,
    utf8_sanitize,
    utf8_validate,
)

__all__ = [
    "ATTR_BYTE", "ATTR_CONTROL", "ATTR_NORMAL", "ATTR_UNDEFINED", "ATTR_UNKNOWN", "ATTR_UNUSED",
    "ATTR_USER_DEFINED", "BPE_ESCAPE_SPACES", "BPE_NEWLINE_WORDS", "BPE_RAW_UTF8", "MODEL_SPM", "MODEL_BPE", "PRE_IDS", "utf8_validate", "utf8_sanitize", "CTokenizer",
    "CStream",
]
