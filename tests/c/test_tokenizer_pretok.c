/* Every pre-tokenizer (cb_pretokenizer) and the SentencePiece-style BPE flags over random UTF-8
 * text under ASan/UBSan: encoding never reads out of bounds and, with every byte a token, is
 * lossless (decode(encode(x)) == x). Which ids each gives is checked against llama.cpp in
 * tests/core/test_tokenizer_hf.py and test_tokenizer_spm_bpe.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/tokenizer.h"
#include "testutil.h"

static uint8_t text[16384];
static int64_t off[600];
static uint32_t attr[600];
static int n_tok;
static uint8_t mtext[256];
static int64_t moff[8];

static void add_tok(const void *s, size_t len, uint32_t a) {
    memcpy(text + off[n_tok], s, len);
    off[n_tok + 1] = off[n_tok] + (int64_t)len;
    attr[n_tok++] = a;
}

static size_t put_utf8(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | (c >> 6)); o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12)); o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18)); o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63)); o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* byte-level: GPT-2's 256 byte tokens; raw: <0xNN> byte tokens and a few characters */
static void build(int raw) {
    n_tok = 0;
    off[0] = 0;
    uint32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t u[8];
        if (raw) {
            snprintf((char *)u, sizeof u, "<0x%02X>", b);
            add_tok(u, 6, CB_TOKEN_ATTR_BYTE);
        } else {
            const uint32_t cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? (uint32_t)b
                                                                                           : 256 + extra++;
            add_tok(u, put_utf8(cp, u), CB_TOKEN_ATTR_NORMAL);
        }
    }
    add_tok("ab", 2, CB_TOKEN_ATTR_NORMAL);
    add_tok("\n\n", 2, CB_TOKEN_ATTR_NORMAL);
    add_tok("\xe2\x96\x81", 3, CB_TOKEN_ATTR_NORMAL);
    add_tok("<|endoftext|>", 13, CB_TOKEN_ATTR_CONTROL);
    memcpy(mtext, "a b", 3);
    moff[0] = 0;
    moff[1] = 3;
}

static uint32_t rng = 12345;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* random text from a mix of ASCII, whitespace, digits, marks, CJK, Hangul, Thai and astral code
 * points (never U+2581, which raw BPE's decode renders as a space) */
static size_t random_text(uint8_t *o, size_t max_cp) {
    static const uint32_t pool[][2] = {{0x20, 0x7E}, {0x09, 0x0D}, {0x30, 0x39}, {0x300, 0x36F},
                                       {0x4E00, 0x4E20}, {0xAC00, 0xAC20}, {0x0E00, 0x0E7F}, {0x3000, 0x3010},
                                       {0xA0, 0x17F}, {0x2000, 0x2030}, {0x1F600, 0x1F610}, {0x660, 0x669},
                                       {0xFF01, 0xFF20}, {0x391, 0x3C9}};
    const size_t npool = sizeof pool / sizeof pool[0];
    size_t n = 0, k = next() % max_cp;
    for (size_t i = 0; i < k; i++) {
        const uint32_t *r = pool[next() % npool];
        const uint32_t cp = r[0] + next() % (r[1] - r[0] + 1);
        n += put_utf8(cp, o + n);
    }
    return n;
}

int main(void) {
    static uint8_t buf[4096];
    for (int raw = 0; raw <= 1; raw++) {
        build(raw);
        for (int pre = CB_PRE_DEFAULT; pre <= CB_PRE_LAST; pre++) {
            cb_tokenizer_params p = cb_tokenizer_default_params();
            p.model = CB_TOKENIZER_BPE;
            p.pre = (cb_pretokenizer)pre;
            p.n_tokens = n_tok;
            p.text = text;
            p.text_offsets = off;
            p.attrs = attr;
            p.n_merges = 1;
            p.merges = mtext;
            p.merge_offsets = moff;
            p.ignore_merges = pre % 2;
            p.bpe_flags = raw ? (int)(CB_BPE_RAW_UTF8 | CB_BPE_ESCAPE_SPACES | CB_BPE_NEWLINE_WORDS) : 0;
            cb_tokenizer_t *t = NULL;
            CHECK(cb_tokenizer_new(&p, &t) == CB_OK);
            if (!t) continue;
            for (int it = 0; it < 300; it++) {
                const size_t n = random_text(buf, 200);
                int32_t *ids = NULL;
                size_t n_ids = 0, n_out = 0;
                uint8_t *out = NULL;
                CHECK(cb_tokenizer_encode(t, buf, n, 0, &ids, &n_ids) == CB_OK);
                CHECK(cb_tokenizer_decode(t, ids, n_ids, 0, &out, &n_out) == CB_OK);
                CHECK(n_out == n && (n == 0 || memcmp(out, buf, n) == 0));
                cb_tokenizer_buffer_free(ids);
                cb_tokenizer_buffer_free(out);
            }
            cb_tokenizer_free(t);
        }
    }
    TEST_MAIN_END("test_tokenizer_pretok");
}
