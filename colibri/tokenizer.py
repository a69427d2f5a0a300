"""The tokenizer of a GGUF model: `Tokenizer.from_gguf(gguf_file_or_path)`.

The vocabulary (`tokenizer.ggml.*` metadata, as the GGUFFile the model parsed holds it) is
checked here, in Python; the C core (include/colibri/tokenizer.h) receives plain, validated
arrays. Ids are the same as llama.cpp's
tokenizer for the same file:

- `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE by scores with `<0xNN>` byte fallback
  (Gemma, Llama 2, Mixtral); spaces become U+2581, `add_space_prefix` prepends one.
- `tokenizer.ggml.model = "gpt2"`: byte-level BPE by merge rank, after the pre-tokenizer named by
  `tokenizer.ggml.pre` (see `SUPPORTED_PRE`). An unknown value is an error, never a fallback.

Special tokens: user-defined tokens are always recognised in the text (as llama.cpp and HF do);
control tokens (`<bos>`, `<start_of_turn>`, ...) only with `parse_special=True`, longest first.

Errors: input text must be well-formed UTF-8. With `errors="strict"` (the default) ill-formed
input raises ValueError naming the byte offset (for `str`, the character offset of a lone
surrogate); with `errors="replace"` every maximal ill-formed subpart becomes U+FFFD (the WHATWG
rule; for `str`, each lone surrogate). Choose it per tokenizer (`from_gguf(path, errors=...)`) or
per call (`encode(..., errors=...)`). Decoded text is always a valid `str`: byte tokens that do
not form whole characters decode to U+FFFD.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf.constants import TokenType

import colibri._core._tokenizer as _tok

__all__ = ["SUPPORTED_PRE", "StreamDecoder", "Tokenizer", "VocabInfo", "eog_ids", "read_gguf_vocab"]

# tokenizer.ggml.pre value -> the pre-tokenizer that implements it (llama.cpp's names).
SUPPORTED_PRE: dict[str, str] = {
    "default": "default",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "olmo": "gpt2",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "llama-bpe": "llama3",
    "qwen2": "qwen2",
    "deepseek-llm": "deepseek-llm",
    "deepseek-v3": "deepseek-v3",
    "gpt-4o": "gpt-4o",
    "smollm": "smollm",     # SmolLM / SmolLM2: each \p{N} alone, then the gpt2 regex
    "command-r": "smollm",  # llama.cpp: the same regexes and flags (clean_spaces off)
}

# GGUF token types (tokenizer.ggml.token_type) -> llama.cpp token attributes (tokenizer.h's
# CB_TOKEN_ATTR_* bits, read from the header).
ATTR_UNDEFINED, ATTR_UNKNOWN, ATTR_UNUSED = _tok.ATTR_UNDEFINED, _tok.ATTR_UNKNOWN, _tok.ATTR_UNUSED
ATTR_NORMAL, ATTR_CONTROL = _tok.ATTR_NORMAL, _tok.ATTR_CONTROL
ATTR_USER_DEFINED, ATTR_BYTE = _tok.ATTR_USER_DEFINED, _tok.ATTR_BYTE
_TYPE_TO_ATTR = {TokenType.NORMAL: ATTR_NORMAL, TokenType.UNKNOWN: ATTR_UNKNOWN,
                 TokenType.CONTROL: ATTR_CONTROL, TokenType.USER_DEFINED: ATTR_USER_DEFINED,
                 TokenType.UNUSED: ATTR_UNUSED, TokenType.BYTE: ATTR_BYTE}

# Texts llama.cpp treats as control tokens whatever their declared type (end-of-generation and
# fill-in-the-middle markers; llama-vocab.cpp, "control-looking token").
_CONTROL_LOOKING = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
}
_FIM_LOOKING = {
    "fim_pre": {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"},
    "fim_suf": {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"},
    "fim_mid": {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"},
    "fim_pad": {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
    "fim_rep": {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
    "fim_sep": {"<|file_sep|>"},
}
_ALWAYS_USER_DEFINED = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}

_ERRORS = ("strict", "replace")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class VocabInfo:
    """The tokenizer metadata of a GGUF file, checked (see read_gguf_vocab)."""

    model: str                       # "llama" or "gpt2"
    pre: str                         # tokenizer.ggml.pre ("" when absent)
    tokens: list[bytes]
    scores: npt.NDArray[np.float32] | None
    token_types: npt.NDArray[np.int32] | None
    merges: list[bytes] = field(default_factory=list)
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    add_space_prefix: bool | None = None
    special_ids: dict[str, int] = field(default_factory=dict)  # other tokenizer.ggml.*_token_id


_INT_TYPES = frozenset({"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                        "bool"})  # GGUFFile.metadata_types of integer scalars


def _open_metadata(path: str) -> Any:
    """A GGUF file (or a colibri container) opened for its metadata alone: tensor types without
    kernels are accepted (lenient), since the tokenizer reads none of them."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"COLI":
        from colibri.container import ContainerFile

        return ContainerFile(path, verify=False)
    from colibri.gguf import GGUFFile

    return GGUFFile(path, lenient=True)


def read_gguf_vocab(source: Any) -> VocabInfo:
    """Reads and type-checks the `tokenizer.ggml.*` metadata of a model file. source: the
    GGUFFile (or ContainerFile) the model already parsed, whose `metadata` and `metadata_types`
    are read (no second parse), or a path, which is opened, read and closed."""
    if isinstance(source, str | os.PathLike):
        p = os.fspath(source)
        if not os.path.exists(p):
            raise FileNotFoundError(f"GGUF file not found: {p}")
        gf = _open_metadata(p)
        try:
            return read_gguf_vocab(gf)
        finally:
            gf.close()
    p = str(getattr(source, "path", "<GGUF>"))
    md: dict[str, Any] = source.metadata
    types: dict[str, str] = source.metadata_types

    def get(key: str, kinds: tuple[str, ...], what: str) -> Any:
        full = "tokenizer.ggml." + key
        if full not in md:
            return None
        if types.get(full) not in kinds:
            raise ValueError(f"{p}: GGUF key {full} must be {what}")
        return md[full]

    strings = ("array[string]",)
    numbers = tuple(f"array[{t}]" for t in ("uint8", "int8", "uint16", "int16", "uint32", "int32",
                                            "uint64", "int64", "float32", "float64", "bool"))
    model = get("model", ("string",), "a string")
    if model is None:
        raise ValueError(f"{p}: no tokenizer.ggml.model in the GGUF metadata")
    tokens = get("tokens", strings, "an array of strings")
    if tokens is None:
        raise ValueError(f"{p}: no tokenizer.ggml.tokens in the GGUF metadata")
    pre = get("pre", ("string",), "a string")
    info = VocabInfo(model=model, pre=pre if pre is not None else "",
                     tokens=[t.encode("utf-8") for t in tokens], scores=None, token_types=None)
    scores = get("scores", numbers, "an array of numbers")
    if scores is not None:
        if scores.dtype.kind not in "fi":
            raise ValueError(f"{p}: tokenizer.ggml.scores must be float32 or int32")
        info.scores = scores.astype(np.float32)
    ttypes = get("token_type", numbers, "an array of numbers")
    if ttypes is not None:
        if ttypes.dtype.kind not in "iu" or ttypes.dtype.itemsize != 4:
            raise ValueError(f"{p}: tokenizer.ggml.token_type must be int32")
        info.token_types = ttypes.astype(np.int32)
    merges = get("merges", strings, "an array of strings")
    if merges is not None:
        info.merges = [m.encode("utf-8") for m in merges]
    for key in md:
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            short = key[len("tokenizer.ggml."):]
            info.special_ids[short[:-len("_token_id")]] = int(get(short, tuple(_INT_TYPES),
                                                                  "an integer"))
    info.bos_id = info.special_ids.get("bos")
    info.eos_id = info.special_ids.get("eos")
    for attr, key in (("add_bos", "add_bos_token"), ("add_eos", "add_eos_token"),
                      ("add_space_prefix", "add_space_prefix")):
        v = get(key, ("bool",), "a bool")
        if v is not None:
            setattr(info, attr, bool(v))
    return info


# Texts of end-of-turn tokens that end a generation even when no *_token_id key names them.
# (and o200k_harmony's, gpt-oss: <|return|> after the answer, <|call|> after a tool call, as
# llama.cpp's vocabulary ends a generation on both; its <|end|> ends a message, not the turn)
_EOG_TEXTS = (b"<end_of_turn>", b"<|im_end|>", b"<|eot_id|>", b"<|endoftext|>", b"<|return|>",
              b"<|call|>")


def _eos_id(info: VocabInfo, n: int) -> int:
    """The eos id the tokenizer uses (-1: none): the metadata's when in [0, n), else the
    vocabulary kind's default (SentencePiece 2, byte-level BPE 11) when in range, as llama.cpp."""
    if info.eos_id is not None and 0 <= info.eos_id < n:
        return info.eos_id
    default = {"llama": 2, "gpt2": 11}.get(info.model, -1)
    return default if default < n else -1


def eog_ids(info: VocabInfo, n: int) -> frozenset[int]:
    """THE end-of-generation rule, which every caller reads (Tokenizer.eog_ids, Model.eog_ids,
    generate.stop_token_ids, the engine, the serve grammar): the ids in [0, n) of eos, eot and
    eom named by the metadata, and of the end-of-turn tokens named by text (_EOG_TEXTS); when
    none is named, the tokenizer's eos (its default, see _eos_id)."""
    ids = {v for k, v in info.special_ids.items() if k in ("eos", "eot", "eom") and 0 <= v < n}
    for text in _EOG_TEXTS:
        if text in info.tokens[:n]:
            ids.add(info.tokens.index(text))
    if not ids and _eos_id(info, n) >= 0:
        ids.add(_eos_id(info, n))
    return frozenset(ids)


def model_eog_ids(model: Any) -> frozenset[int]:
    """A Model's eog_ids among its n_vocab outputs: from its tokenizer, or (loaded without one)
    from the vocabulary of the GGUFFile it parsed; none when the file has no valid vocabulary."""
    tok = model.tokenizer
    if tok is not None:
        ids = tok.eog_ids
    else:
        try:
            info = read_gguf_vocab(model.gguf)
        except ValueError:
            return frozenset()
        ids = eog_ids(info, len(info.tokens))
    return frozenset(i for i in ids if i < model.n_vocab)


def _pack(strings: Sequence[bytes]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    lengths = np.fromiter((len(s) for s in strings), dtype=np.int64, count=len(strings))
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(b"".join(strings), dtype=np.uint8).copy(), offsets


def _token_attrs(info: VocabInfo, tokens: list[bytes], index: dict[bytes, int]) -> npt.NDArray[np.uint32]:
    n = len(tokens)
    if info.token_types is None:
        attrs = np.full(n, ATTR_NORMAL, dtype=np.uint32)
    else:
        lut = np.zeros(8, dtype=np.uint32)
        for ttype, attr in _TYPE_TO_ATTR.items():
            lut[ttype] = attr
        tt = info.token_types[:n]
        attrs = np.where((tt >= 0) & (tt < 8), lut[np.clip(tt, 0, 7)], ATTR_UNDEFINED).astype(np.uint32)
    # llama.cpp's fixes by token text (see _CONTROL_LOOKING)
    def find(text: str) -> int | None:
        return index.get(text.encode("utf-8"))

    looking = set(_CONTROL_LOOKING)
    if "eom" in info.special_ids:
        looking.discard("<|eom_id|>")
    for kind, texts in _FIM_LOOKING.items():
        if kind not in info.special_ids:
            looking |= texts
    for text in looking:
        found = find(text)
        if found is not None:
            attrs[found] |= ATTR_CONTROL
    for i in np.nonzero(attrs & ATTR_CONTROL)[0].tolist():
        if b"unused" in tokens[i]:
            attrs[i] |= ATTR_UNUSED
    for text in _ALWAYS_USER_DEFINED:
        found = find(text)
        if found is not None:
            attrs[found] = ATTR_USER_DEFINED
    end = find("<|end|>")
    if end is not None and (all(find(t) is not None for t in ("<|return|>", "<|call|>")) or
                            all(find(t) is not None for t in ("<|calls|>", "<|flush|>"))):
        attrs[end] = ATTR_USER_DEFINED
    return attrs


class Tokenizer:
    """Encodes text to token ids and back, with a GGUF model's vocabulary (see module doc)."""

    def __init__(self, info: VocabInfo, errors: str = "strict") -> None:
        if errors not in _ERRORS:
            raise ValueError(f"errors must be one of {_ERRORS}, not {errors!r}")
        self.errors = errors
        model = info.model
        if model not in ("llama", "gpt2"):
            raise ValueError(f"unsupported tokenizer.ggml.model {model!r} (supported: 'llama', 'gpt2')")
        tokens = list(info.tokens)
        n = len(tokens)
        if n < 1 or n >= 2**31 - 1:
            raise ValueError(f"tokenizer.ggml.tokens has {n} entries")
        if not all(type(t) is bytes for t in tokens):
            raise ValueError("tokenizer.ggml.tokens must be a list of bytes")
        index = {t: i for i, t in enumerate(tokens)}
        if b"" in index:  # as llama.cpp
            for i, t in enumerate(tokens):
                if not t:
                    tokens[i] = f"[EMPTY_{i}]".encode()
            index = {t: i for i, t in enumerate(tokens)}
        if len(index) != n:
            seen: dict[bytes, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
                seen[t] = i
        scores = np.zeros(n, dtype=np.float32)
        if info.scores is not None:
            if len(info.scores) < n:
                raise ValueError(f"tokenizer.ggml.scores has {len(info.scores)} entries for {n} tokens")
            scores = np.ascontiguousarray(info.scores[:n], dtype=np.float32)
            if np.isnan(scores).any():
                raise ValueError(f"tokenizer.ggml.scores has NaN at id {int(np.argmax(np.isnan(scores)))}")
        if info.token_types is not None and len(info.token_types) < n:
            raise ValueError(f"tokenizer.ggml.token_type has {len(info.token_types)} entries for {n} tokens")
        attrs = _token_attrs(info, tokens, index)

        if model == "llama":
            cmodel, cpre, pre_name = _tok.MODEL_SPM, 0, ""
            bos = 1
            add_bos, add_eos, add_space_prefix, ignore_merges = True, False, True, False
            merges: list[bytes] = []
        else:
            pre = info.pre or "default"
            if pre not in SUPPORTED_PRE:
                raise ValueError(
                    f"unsupported tokenizer.ggml.pre {pre!r}; supported: {', '.join(sorted(SUPPORTED_PRE))}")
            pre_name = SUPPORTED_PRE[pre]
            cmodel, cpre = _tok.MODEL_BPE, _tok.PRE_IDS[pre_name]
            bos = 11
            add_bos = pre_name == "llama3"
            add_eos, add_space_prefix = False, False
            ignore_merges = pre_name == "llama3"
            merges = list(info.merges)
            if not merges:
                raise ValueError("byte-level BPE vocabulary without tokenizer.ggml.merges")
            if not all(type(mg) is bytes for mg in merges):
                raise ValueError("tokenizer.ggml.merges must be a list of bytes")
        # metadata overrides the defaults; ids out of range are ignored (as llama.cpp)
        if bos >= n:
            bos = -1
        if info.bos_id is not None and 0 <= info.bos_id < n:
            bos = info.bos_id
        eos = _eos_id(info, n)
        if info.add_bos is not None:
            add_bos = info.add_bos
        if info.add_eos is not None:
            add_eos = info.add_eos
        if info.add_space_prefix is not None and model == "llama":
            add_space_prefix = info.add_space_prefix
        if add_bos and bos < 0:
            raise ValueError("tokenizer.ggml.add_bos_token is true but there is no valid bos token id")
        if add_eos and eos < 0:
            raise ValueError("tokenizer.ggml.add_eos_token is true but there is no valid eos token id")

        text, offsets = _pack(tokens)
        mtext, moffsets = _pack(merges)
        self._c = _tok.CTokenizer(cmodel, cpre, text, offsets, scores, attrs, mtext, moffsets,
                                  bos, eos, add_bos, add_eos, add_space_prefix, ignore_merges)
        self.model = model
        self.pre = pre_name
        self._n = n
        self._bos = bos
        self._eos = eos
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self.token_attrs = attrs
        self._eog = eog_ids(info, n)

    @classmethod
    def from_gguf(cls, source: Any, errors: str = "strict") -> Tokenizer:
        """The tokenizer stored in a model file: a path, or the GGUFFile / ContainerFile already
        opened (its parsed metadata is used, the file is not read again). errors: "strict" or
        "replace" (module doc)."""
        return cls(read_gguf_vocab(source), errors=errors)

    @property
    def vocab_size(self) -> int:
        return self._n

    @property
    def bos_id(self) -> int | None:
        return self._bos if self._bos >= 0 else None

    @property
    def eos_id(self) -> int | None:
        return self._eos if self._eos >= 0 else None

    @property
    def eog_ids(self) -> frozenset[int]:
        """The ids that end a generation (eog_ids: the one rule)."""
        return self._eog

    def encode(self, text: str | bytes, add_special: bool = True, parse_special: bool = False,
               errors: str | None = None) -> npt.NDArray[np.int32]:
        """Token ids of text (int32 array). add_special: add BOS/EOS as the vocabulary asks;
        parse_special: recognise control tokens written in the text. The GIL is released while
        the C code runs."""
        mode = self.errors if errors is None else errors
        if mode not in _ERRORS:
            raise ValueError(f"errors must be one of {_ERRORS}, not {mode!r}")
        if isinstance(text, str):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError as e:
                if mode == "strict":
                    raise ValueError(
                        f"text is not valid Unicode: lone surrogate at character offset {e.start}") from None
                data = _SURROGATE.sub("\ufffd", text).encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise TypeError(f"text must be str or bytes, not {type(text).__name__}")
        return self._c.encode(data, add_special, parse_special, mode == "replace")

    def _ids(self, ids: Iterable[int] | npt.NDArray[Any]) -> npt.NDArray[np.int32]:
        if isinstance(ids, np.ndarray) and ids.dtype == np.int32 and ids.ndim == 1:
            return np.ascontiguousarray(ids)  # the C code checks the range
        arr = np.asarray(ids if not isinstance(ids, (bytes, str)) else list(ids))
        if arr.size == 0:
            return np.zeros(0, dtype=np.int32)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError("ids must be a one-dimensional sequence of integers")
        bad = (arr < 0) | (arr >= self._n)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"token id {int(arr[i])} at position {i} out of range [0, {self._n})")
        return arr.astype(np.int32)

    def decode(self, ids: Iterable[int] | npt.NDArray[Any], special: bool = False) -> str:
        """Text of ids. Control tokens render as nothing unless special=True; with
        add_space_prefix (SentencePiece) the space encode prepended is removed again."""
        return self._c.decode(self._ids(ids), special)

    def token_to_piece(self, id: int, special: bool = False) -> bytes:
        """The bytes one token stands for (control tokens: b"" unless special=True)."""
        i = int(id)
        if not 0 <= i < self._n:
            raise ValueError(f"token id {i} out of range [0, {self._n})")
        return self._c.piece(i, special)

    def stream(self, special: bool = False) -> StreamDecoder:
        """A decoder that takes one id at a time and returns only whole characters."""
        return StreamDecoder(self, special)


class StreamDecoder:
    """Incremental decoding: feed(id) returns the complete characters now available and holds an
    unfinished UTF-8 sequence back; flush() emits what is held (U+FFFD if unfinished). The
    concatenation of every feed() and the final flush() equals Tokenizer.decode(ids)."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._c = tokenizer._c.stream(special)

    def feed(self, id: int) -> str:
        i = int(id)
        n = self._tokenizer.vocab_size
        if not 0 <= i < n:
            raise ValueError(f"token id {i} out of range [0, {n})")
        return self._c.feed(i)

    def flush(self) -> str:
        return self._c.flush()


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table: how byte-level BPE vocabularies spell each
    byte (printable Latin-1 bytes stand for themselves, the others map to U+0100 onwards)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = iter(range(256, 512))
    table = {b: (b if b in keep else next(extra)) for b in range(256)}
    return [chr(table[b]) for b in range(256)]
