from libc.stdint cimport uint8_t, int32_t, int64_t, uint32_t

from colibri._core.status cimport cb_status


cdef extern from "colibri/tokenizer.h" nogil:
    int cb_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, int *truncated)
    cb_status cb_utf8_validate(const uint8_t *s, size_t n, size_t *bad_offset)
    cb_status cb_utf8_sanitize(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len,
                               size_t *n_replaced)

    enum:  # #defined bits of cb_tokenizer_params.attrs
        CB_TOKEN_ATTR_UNDEFINED
        CB_TOKEN_ATTR_UNKNOWN
        CB_TOKEN_ATTR_UNUSED
        CB_TOKEN_ATTR_NORMAL
        CB_TOKEN_ATTR_CONTROL
        CB_TOKEN_ATTR_USER_DEFINED
        CB_TOKEN_ATTR_BYTE
        CB_BPE_RAW_UTF8
        CB_BPE_ESCAPE_SPACES
        CB_BPE_NEWLINE_WORDS

    ctypedef enum cb_tokenizer_model:
        CB_TOKENIZER_SPM
        CB_TOKENIZER_BPE

    ctypedef enum cb_pretokenizer:
        CB_PRE_NONE
        CB_PRE_DEFAULT
        CB_PRE_GPT2
        CB_PRE_LLAMA3
        CB_PRE_QWEN2
        CB_PRE_DEEPSEEK_LLM
        CB_PRE_DEEPSEEK_V3
        CB_PRE_GPT4O
        CB_PRE_SMOLLM
        CB_PRE_TEKKEN
        CB_PRE_GRANITE_97M
        CB_PRE_YOUTU
        CB_PRE_TINY_AYA
        CB_PRE_SEED_CODER
        CB_PRE_UFAKZEKA
        CB_PRE_MINICPM5
        CB_PRE_JAIS2
        CB_PRE_QWEN35
        CB_PRE_DEEPSEEK_CODER
        CB_PRE_FALCON
        CB_PRE_SPARK2_5
        CB_PRE_PORO
        CB_PRE_VIKING
        CB_PRE_CHAMELEON
        CB_PRE_SUPERBPE
        CB_PRE_EXAONE_MOE
        CB_PRE_LAGUNA
        CB_PRE_AFMOE
        CB_PRE_KIMI_K2
        CB_PRE_NEWLINES
        CB_PRE_WHITESPACE
        CB_PRE_LAST

    ctypedef struct cb_tokenizer_params:
        cb_tokenizer_model model
        cb_pretokenizer pre
        int32_t n_tokens
        const uint8_t *text
        const int64_t *text_offsets
        const float *scores
        const uint32_t *attrs
        int32_t n_merges
        const uint8_t *merges
        const int64_t *merge_offsets
        int32_t bos_id
        int32_t eos_id
        int add_bos
        int add_eos
        int add_space_prefix
        int ignore_merges
        int bpe_flags

    ctypedef struct cb_tokenizer_t:
        pass

    cb_tokenizer_params cb_tokenizer_default_params()
    cb_status cb_tokenizer_new(const cb_tokenizer_params *params, cb_tokenizer_t **out)
    void cb_tokenizer_free(cb_tokenizer_t *tok)
    int32_t cb_tokenizer_n_tokens(const cb_tokenizer_t *tok)

    unsigned CB_ENCODE_ADD_SPECIAL
    unsigned CB_ENCODE_PARSE_SPECIAL
    unsigned CB_ENCODE_LENIENT
    unsigned CB_DECODE_SPECIAL

    cb_status cb_tokenizer_encode(const cb_tokenizer_t *tok, const uint8_t *text, size_t len,
                                  unsigned flags, int32_t **ids, size_t *n_ids)
    cb_status cb_tokenizer_piece(const cb_tokenizer_t *tok, int32_t id, int special,
                                 const uint8_t **piece, size_t *len)
    cb_status cb_tokenizer_decode(const cb_tokenizer_t *tok, const int32_t *ids, size_t n,
                                  unsigned flags, uint8_t **out, size_t *out_len)
    void cb_tokenizer_buffer_free(void *p)

    ctypedef struct cb_tok_stream_t:
        pass

    cb_status cb_tok_stream_new(const cb_tokenizer_t *tok, unsigned flags, cb_tok_stream_t **out)
    void cb_tok_stream_free(cb_tok_stream_t *s)
    cb_status cb_tok_stream_feed(cb_tok_stream_t *s, int32_t id, const uint8_t **out,
                                 size_t *out_len)
    cb_status cb_tok_stream_flush(cb_tok_stream_t *s, const uint8_t **out, size_t *out_len)
