"""The C tokenizer handle (include/colibri/tokenizer.h). The Python API is colibri.tokenizer:
it reads and validates the GGUF vocabulary and builds a CTokenizer from plain arrays."""

import operator

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy
from cpython.unicode cimport PyUnicode_DecodeUTF8

from colibri._core.tokenizer cimport *


# token attribute bits (tokenizer.h's CB_TOKEN_ATTR_*, llama.cpp's values)
ATTR_UNDEFINED = CB_TOKEN_ATTR_UNDEFINED
ATTR_UNKNOWN = CB_TOKEN_ATTR_UNKNOWN
ATTR_UNUSED = CB_TOKEN_ATTR_UNUSED
ATTR_NORMAL = CB_TOKEN_ATTR_NORMAL
ATTR_CONTROL = CB_TOKEN_ATTR_CONTROL
ATTR_USER_DEFINED = CB_TOKEN_ATTR_USER_DEFINED
ATTR_BYTE = CB_TOKEN_ATTR_BYTE
MODEL_SPM = CB_TOKENIZER_SPM
MODEL_BPE = CB_TOKENIZER_BPE
BPE_RAW_UTF8 = CB_BPE_RAW_UTF8
BPE_ESCAPE_SPACES = CB_BPE_ESCAPE_SPACES
BPE_NEWLINE_WORDS = CB_BPE_NEWLINE_WORDS
PRE_IDS = {
    "default": CB_PRE_DEFAULT,
    "gpt2": CB_PRE_GPT2,
    "llama3": CB_PRE_LLAMA3,
    "qwen2": CB_PRE_QWEN2,
    "deepseek-llm": CB_PRE_DEEPSEEK_LLM,
    "deepseek-v3": CB_PRE_DEEPSEEK_V3,
    "gpt-4o": CB_PRE_GPT4O,
    "smollm": CB_PRE_SMOLLM,
    "tekken": CB_PRE_TEKKEN,
    "granite-embed-multi-97m": CB_PRE_GRANITE_97M,
    "youtu": CB_PRE_YOUTU,
    "tiny_aya": CB_PRE_TINY_AYA,
    "seed-coder": CB_PRE_SEED_CODER,
    "ufakzeka": CB_PRE_UFAKZEKA,
    "minicpm5": CB_PRE_MINICPM5,
    "jais-2": CB_PRE_JAIS2,
    "qwen35": CB_PRE_QWEN35,
    "deepseek-coder": CB_PRE_DEEPSEEK_CODER,
    "falcon": CB_PRE_FALCON,
    "spark2_5": CB_PRE_SPARK2_5,
    "poro": CB_PRE_PORO,
    "viking": CB_PRE_VIKING,
    "chameleon": CB_PRE_CHAMELEON,
    "superbpe": CB_PRE_SUPERBPE,
    "exaone-moe": CB_PRE_EXAONE_MOE,
    "laguna": CB_PRE_LAGUNA,
    "afmoe": CB_PRE_AFMOE,
    "kimi-k2": CB_PRE_KIMI_K2,
    "newlines": CB_PRE_NEWLINES,
    "whitespace": CB_PRE_WHITESPACE,
}


cdef int32_t _token_id(object value, int32_t n) except? -1:
    """A caller's token id checked against [0, n): ValueError naming it (the C code checks
    again; this keeps ids beyond int32 from becoming an OverflowError)."""
    v = operator.index(value)
    if not 0 <= v < n:
        raise ValueError(f"token id {v} out of range [0, {n})")
    return <int32_t>v


def utf8_validate(const uint8_t[::1] data not None):
    """None if data is well-formed UTF-8, else raise ValueError naming the byte offset."""
    cdef size_t off = 0
    cdef size_t n = data.shape[0]
    cdef const uint8_t *p = &data[0] if n else NULL
    with nogil:
        s = cb_utf8_validate(p, n, &off)
    check(s)


def utf8_sanitize(const uint8_t[::1] data not None):
    """data with each maximal ill-formed subpart replaced by U+FFFD (bytes)."""
    cdef size_t n = data.shape[0]
    cdef const uint8_t *p = &data[0] if n else NULL
    cdef uint8_t *out = NULL
    cdef size_t on = 0
    with nogil:
        s = cb_utf8_sanitize(p, n, &out, &on, NULL)
    check(s)
    try:
        return out[:on] if on else b""
    finally:
        cb_tokenizer_buffer_free(out)


cdef class CTokenizer:
    """Owns one cb_tokenizer_t. Built from validated arrays (see colibri.tokenizer)."""
    cdef cb_tokenizer_t *tok

    def __cinit__(self, int model, int pre, const uint8_t[::1] text not None,
                  const int64_t[::1] offsets not None, const float[::1] scores not None,
                  const uint32_t[::1] attrs not None, const uint8_t[::1] merges not None,
                  const int64_t[::1] merge_offsets not None, int bos_id, int eos_id,
                  bint add_bos, bint add_eos, bint add_space_prefix, bint ignore_merges,
                  int bpe_flags=0):
        self.tok = NULL
        cdef Py_ssize_t n = attrs.shape[0]
        if n < 1 or offsets.shape[0] != n + 1 or scores.shape[0] != n:
            raise ValueError(f"tokenizer arrays disagree: {n} attrs, {offsets.shape[0]} offsets, "
                             f"{scores.shape[0]} scores")
        if offsets[n] != text.shape[0] or merge_offsets.shape[0] < 1 or \
                merge_offsets[merge_offsets.shape[0] - 1] != merges.shape[0]:
            raise ValueError("tokenizer offsets do not end at the length of their text")
        cdef cb_tokenizer_params p = cb_tokenizer_default_params()
        p.model = <cb_tokenizer_model>model
        p.pre = <cb_pretokenizer>pre
        p.n_tokens = <int32_t>n
        p.text = &text[0] if text.shape[0] else <const uint8_t *>b""
        p.text_offsets = &offsets[0]
        p.scores = &scores[0]
        p.attrs = &attrs[0]
        p.n_merges = <int32_t>(merge_offsets.shape[0] - 1)
        p.merges = &merges[0] if merges.shape[0] else <const uint8_t *>b""
        p.merge_offsets = &merge_offsets[0]
        p.bos_id = bos_id
        p.eos_id = eos_id
        p.add_bos = add_bos
        p.add_eos = add_eos
        p.add_space_prefix = add_space_prefix
        p.ignore_merges = ignore_merges
        p.bpe_flags = bpe_flags
        with nogil:
            s = cb_tokenizer_new(&p, &self.tok)
        check(s)

    def __dealloc__(self):
        cb_tokenizer_free(self.tok)
        self.tok = NULL

    @property
    def n_tokens(self):
        return cb_tokenizer_n_tokens(self.tok)

    def encode(self, const uint8_t[::1] text not None, bint add_special, bint parse_special,
               bint lenient):
        """Token ids of UTF-8 bytes, as an int32 numpy array. Runs without the GIL."""
        cdef unsigned flags = 0
        if add_special:
            flags |= CB_ENCODE_ADD_SPECIAL
        if parse_special:
            flags |= CB_ENCODE_PARSE_SPECIAL
        if lenient:
            flags |= CB_ENCODE_LENIENT
        cdef size_t n = text.shape[0]
        cdef const uint8_t *p = &text[0] if n else NULL
        cdef int32_t *ids = NULL
        cdef size_t nids = 0
        with nogil:
            s = cb_tokenizer_encode(self.tok, p, n, flags, &ids, &nids)
        check(s)
        out = np.empty(nids, dtype=np.int32)
        cdef int32_t[::1] ov = out
        if nids:
            memcpy(&ov[0], ids, nids * sizeof(int32_t))
        cb_tokenizer_buffer_free(ids)
        return out

    def decode(self, const int32_t[::1] ids not None, bint special):
        """The text of ids (str; the C code guarantees well-formed UTF-8)."""
        cdef size_t n = ids.shape[0]
        cdef const int32_t *p = &ids[0] if n else NULL
        cdef uint8_t *out = NULL
        cdef size_t on = 0
        with nogil:
            s = cb_tokenizer_decode(self.tok, p, n, CB_DECODE_SPECIAL if special else 0, &out, &on)
        check(s)
        try:
            return PyUnicode_DecodeUTF8(<const char *>out, on, NULL)
        finally:
            cb_tokenizer_buffer_free(out)

    def piece(self, id, bint special):
        """The bytes token id renders to."""
        cdef int32_t i = _token_id(id, cb_tokenizer_n_tokens(self.tok))
        cdef const uint8_t *p = NULL
        cdef size_t n = 0
        check(cb_tokenizer_piece(self.tok, i, special, &p, &n))
        return p[:n] if n else b""

    def stream(self, bint special):
        return CStream(self, special)


cdef class CStream:
    """Owns one cb_tok_stream_t; keeps its CTokenizer alive."""
    cdef cb_tok_stream_t *s
    cdef CTokenizer parent

    def __cinit__(self, CTokenizer parent not None, bint special):
        self.s = NULL
        self.parent = parent
        check(cb_tok_stream_new(parent.tok, CB_DECODE_SPECIAL if special else 0, &self.s))

    def __dealloc__(self):
        cb_tok_stream_free(self.s)
        self.s = NULL

    def feed(self, id):
        cdef int32_t i = _token_id(id, cb_tokenizer_n_tokens(self.parent.tok))
        cdef const uint8_t *p = NULL
        cdef size_t n = 0
        check(cb_tok_stream_feed(self.s, i, &p, &n))
        return PyUnicode_DecodeUTF8(<const char *>p, n, NULL)

    def flush(self):
        cdef const uint8_t *p = NULL
        cdef size_t n = 0
        check(cb_tok_stream_flush(self.s, &p, &n))
        return PyUnicode_DecodeUTF8(<const char *>p, n, NULL)
