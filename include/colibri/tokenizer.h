/* colibri tokenizer: SentencePiece-style and byte-level BPE built from a GGUF vocabulary, strict
 * UTF-8 handling, and a stream decoder that only ever emits whole characters.
 *
 * The vocabulary arrives already validated by Python (colibri/tokenizer.py reads and checks the
 * GGUF metadata); cb_tokenizer_new copies everything it is given, so the params' arrays are
 * borrowed for the duration of the call only. A tokenizer is immutable after creation: encode,
 * decode and piece lookups may run concurrently from several threads on one handle. A stream
 * decoder is single-threaded state that borrows its tokenizer (the caller keeps it alive).
 *
 * Text is bytes. Encoding input must be UTF-8: by default an ill-formed sequence fails with
 * CB_STATUS_CORRUPT naming its byte offset; with CB_ENCODE_LENIENT each maximal ill-formed subpart
 * becomes U+FFFD (the WHATWG rule) first. Decoded output is always well-formed UTF-8 (byte tokens
 * that do not form characters come out as U+FFFD under the same rule).
 */
#ifndef COLIBRI_TOKENIZER_H
#define COLIBRI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Classifies the sequence at s[0..n), reading no byte at or beyond s[n].
 * Returns k > 0: a well-formed sequence of k bytes encoding *cp.
 *         k < 0: ill-formed; -k (1..3) is the length of its maximal subpart, to be replaced by one
 *                U+FFFD; *truncated is 1 when that subpart is a valid prefix cut by the end of
 *                the buffer (more bytes could complete it), else 0.
 *         0:     n == 0. */
int cb_utf8_next(const uint8_t *s, size_t n, uint32_t *cp, int *truncated);

/* CB_OK if s[0..n) is well-formed UTF-8 (no overlongs, surrogates, values above U+10FFFF or
 * truncated sequences). Otherwise CB_STATUS_CORRUPT, the detail names the byte offset, and
 * *bad_offset (may be NULL) receives the offset of the first ill-formed byte. */
cb_status cb_utf8_validate(const uint8_t *s, size_t n, size_t *bad_offset);

/* Copies s[0..n) to a new buffer, replacing each maximal ill-formed subpart by U+FFFD (EF BF BD).
 * *out is caller-freed with cb_tokenizer_buffer_free(); *out_len its length in bytes;
 * *n_replaced (may be NULL) the number of replacements. */
cb_status cb_utf8_sanitize(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len,
                           size_t *n_replaced);

/* Same, into a caller buffer of at least 3*n bytes; returns the bytes written. */
size_t cb_utf8_sanitize_into(const uint8_t *s, size_t n, uint8_t *out, size_t *n_replaced);

/* ---- vocabulary --------------------------------------------------------------------------- */

/* Token attributes (bit values equal llama.cpp's llama_token_attr). */
#define CB_TOKEN_ATTR_UNDEFINED 0u
#define CB_TOKEN_ATTR_UNKNOWN (1u << 0)
#define CB_TOKEN_ATTR_UNUSED (1u << 1)
#define CB_TOKEN_ATTR_NORMAL (1u << 2)
#define CB_TOKEN_ATTR_CONTROL (1u << 3)
#define CB_TOKEN_ATTR_USER_DEFINED (1u << 4)
#define CB_TOKEN_ATTR_BYTE (1u << 5)

typedef enum cb_tokenizer_model {
    CB_TOKENIZER_SPM = 0, /* tokenizer.ggml.model = "llama": merges by score, <0xNN> byte fallback */
    CB_TOKENIZER_BPE = 1, /* "gpt2": byte-level BPE, merges by rank, regex pre-tokenizer */
} cb_tokenizer_model;

typedef enum cb_pretokenizer {
    CB_PRE_NONE = 0,         /* SPM vocabularies */
    CB_PRE_DEFAULT = 1,      /* llama.cpp's "default" four-stage split */
    CB_PRE_GPT2 = 2,         /* gpt2, olmo */
    CB_PRE_LLAMA3 = 3,       /* llama3, llama-bpe */
    CB_PRE_QWEN2 = 4,        /* qwen2 */
    CB_PRE_DEEPSEEK_LLM = 5, /* deepseek-llm */
    CB_PRE_DEEPSEEK_V3 = 6,  /* deepseek-v3 */
    CB_PRE_GPT4O = 7,        /* gpt-4o */
    CB_PRE_SMOLLM = 8,       /* smollm, command-r, starcoder, ...: each \p{N} alone, then gpt2 */
    CB_PRE_TEKKEN = 9,
    CB_PRE_GRANITE_97M = 10, /* granite-embed-multi-97m */
    CB_PRE_YOUTU = 11,
    CB_PRE_TINY_AYA = 12,    /* tiny_aya, cohere2moe */
    CB_PRE_SEED_CODER = 13,
    CB_PRE_UFAKZEKA = 14,
    CB_PRE_MINICPM5 = 15,
    CB_PRE_JAIS2 = 16,
    CB_PRE_QWEN35 = 17,
    CB_PRE_DEEPSEEK_CODER = 18,
    CB_PRE_FALCON = 19,
    CB_PRE_SPARK2_5 = 20,
    CB_PRE_PORO = 21,        /* poro-chat, bloom, gpt3-finnish */
    CB_PRE_VIKING = 22,
    CB_PRE_CHAMELEON = 23,
    CB_PRE_SUPERBPE = 24,
    CB_PRE_EXAONE_MOE = 25,
    CB_PRE_LAGUNA = 26,
    CB_PRE_AFMOE = 27,
    CB_PRE_KIMI_K2 = 28,
    CB_PRE_NEWLINES = 29,    /* gemma4, sarvam-moe: [^\n]+|[\n]+ (SentencePiece-style BPE) */
    CB_PRE_WHITESPACE = 30,  /* whitespace: \S+ */
    CB_PRE_LAST = CB_PRE_WHITESPACE, /* the highest value: cb_tokenizer_new refuses any above */
} cb_pretokenizer;

/* SentencePiece-style BPE (llama.cpp's gemma4, sarvam-moe): merges by rank over UTF-8 characters
 * of the text itself, byte fallback to <0xNN> tokens, pieces rendered as SPM's */
#define CB_BPE_RAW_UTF8 1u      /* words are not byte-level encoded; token texts are the keys */
#define CB_BPE_ESCAPE_SPACES 2u /* spaces become U+2581 before pre-tokenization */
#define CB_BPE_NEWLINE_WORDS 4u /* a word of only '\n' that is a token is taken whole (gemma4) */

typedef struct cb_tokenizer_params {
    cb_tokenizer_model model;
    cb_pretokenizer pre; /* CB_PRE_NONE for SPM */
    int32_t n_tokens;    /* >= 1 */
    /* Token texts exactly as stored in the GGUF, concatenated: token i is
     * text[text_offsets[i] .. text_offsets[i+1]). Borrowed. text_offsets has n_tokens+1 entries,
     * starts at 0 and never decreases. Texts must be distinct and non-empty. */
    const uint8_t *text;
    const int64_t *text_offsets;
    const float *scores;  /* n_tokens merge scores (SPM), borrowed; NULL means all 0 */
    const uint32_t *attrs; /* n_tokens CB_TOKEN_ATTR_* bit sets, borrowed */
    /* BPE merges "left right" in rank order, same layout as the texts. Borrowed; n_merges may be 0. */
    int32_t n_merges;
    const uint8_t *merges;
    const int64_t *merge_offsets;
    int32_t bos_id, eos_id; /* -1: none */
    int add_bos, add_eos;   /* added by encode when CB_ENCODE_ADD_SPECIAL is set */
    int add_space_prefix;   /* SPM: prepend a space to text that starts the input or follows a special token */
    int ignore_merges;      /* BPE: a pre-tokenized word that is a whole token is emitted as is (llama3) */
    int bpe_flags;          /* BPE: CB_BPE_* bits (0: byte-level BPE) */
} cb_tokenizer_params;

typedef struct cb_tokenizer cb_tokenizer_t;

/* Zeroed params with bos_id = eos_id = -1. */
cb_tokenizer_params cb_tokenizer_default_params(void);

/* Builds a tokenizer (copies every array it is given). *out is owned by the caller, freed with
 * cb_tokenizer_free. Fails with CB_STATUS_INVALID_ARGUMENT on inconsistent params (naming the
 * offending token), CB_STATUS_OUT_OF_MEMORY when allocation fails. */
cb_status cb_tokenizer_new(const cb_tokenizer_params *params, cb_tokenizer_t **out);
void cb_tokenizer_free(cb_tokenizer_t *tok); /* accepts NULL */

int32_t cb_tokenizer_n_tokens(const cb_tokenizer_t *tok);

/* encode flags */
#define CB_ENCODE_ADD_SPECIAL 1u   /* add BOS/EOS as the vocabulary asks */
#define CB_ENCODE_PARSE_SPECIAL 2u /* recognise control tokens in the text (user-defined ones always are) */
#define CB_ENCODE_LENIENT 4u       /* replace ill-formed UTF-8 by U+FFFD instead of failing */

/* Encodes text[0..len) (bytes, UTF-8). *ids (caller-freed with cb_tokenizer_buffer_free) receives
 * *n_ids token ids; *ids may be NULL when *n_ids is 0. Reentrant; takes time proportional to the
 * text (n log n), so callers release the GIL around it. */
cb_status cb_tokenizer_encode(const cb_tokenizer_t *tok, const uint8_t *text, size_t len,
                              unsigned flags, int32_t **ids, size_t *n_ids);

/* The bytes token id renders to (SPM: U+2581 as space, <0xNN> as the byte; BPE: the byte-level
 * alphabet mapped back to bytes; control/unknown tokens: their text when special != 0, else empty).
 * *piece is borrowed from the tokenizer and lives as long as it. Fails for ids out of range. */
cb_status cb_tokenizer_piece(const cb_tokenizer_t *tok, int32_t id, int special,
                             const uint8_t **piece, size_t *len);

/* decode flags */
#define CB_DECODE_SPECIAL 1u /* render control tokens as their text */

/* Decodes ids[0..n) to well-formed UTF-8 (U+FFFD for byte sequences that do not form characters).
 * With add_space_prefix (SPM) the space encode prepended is removed: one leading space of the first
 * non-empty piece that is not a control token. *out is caller-freed with cb_tokenizer_buffer_free; fails on ids out of range. */
cb_status cb_tokenizer_decode(const cb_tokenizer_t *tok, const int32_t *ids, size_t n,
                              unsigned flags, uint8_t **out, size_t *out_len);

void cb_tokenizer_buffer_free(void *p); /* frees buffers returned above; accepts NULL */

/* ---- stream decoder ----------------------------------------------------------------------- */

typedef struct cb_tok_stream cb_tok_stream_t;

/* A decoder fed one id at a time. tok is borrowed and must outlive the stream. flags: CB_DECODE_*. */
cb_status cb_tok_stream_new(const cb_tokenizer_t *tok, unsigned flags, cb_tok_stream_t **out);
void cb_tok_stream_free(cb_tok_stream_t *s); /* accepts NULL */

/* Appends the piece of id and returns in *out[0..*out_len) every complete character now
 * available (well-formed UTF-8, U+FFFD for ill-formed subparts); an unfinished sequence at the end
 * is held back. *out is borrowed from the stream, valid until its next call. The concatenation of
 * all outputs and of the final flush equals cb_tokenizer_decode of the same ids. */
cb_status cb_tok_stream_feed(cb_tok_stream_t *s, int32_t id, const uint8_t **out, size_t *out_len);

/* Emits what is held back (U+FFFD for an unfinished sequence) and resets the stream. */
cb_status cb_tok_stream_flush(cb_tok_stream_t *s, const uint8_t **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
