/* UTF-8 validator and repair (colibri/_core/utf8.c) on the hard cases: overlongs, surrogates,
 * values above U+10FFFF, bytes that never occur, and sequences truncated by the end of the input.
 * Inputs are copied into exactly-sized heap buffers so that ASan catches any read past the end.
 * Then the tokenizer (colibri/_core/tokenizer.c) on random bytes and random ids, SPM and every
 * byte-level BPE pre-tokenizer, strict and lenient, under the same sanitizers; and smollm's digit
 * split on a vocabulary whose merges would join digits. */
#include <string.h>

#include "colibri/tokenizer.h"
#include "testutil.h"

static unsigned char *dup_exact(const char *s, size_t n) {
    unsigned char *p = malloc(n ? n : 1);
    memcpy(p, s, n);
    return p;
}

/* validate: expect ok (bad = -1) or failure at offset bad */
static void check_validate(const char *s, size_t n, long bad) {
    unsigned char *p = dup_exact(s, n);
    size_t off = 12345;
    cb_status st = cb_utf8_validate(p, n, &off);
    if (bad < 0) {
        CHECK(st == CB_OK);
    } else {
        CHECK(st == CB_STATUS_CORRUPT);
        CHECK(off == (size_t)bad);
        CHECK(strstr(cb_last_error(), "offset") != NULL);
    }
    cb_clear_error();
    free(p);
}

/* sanitize: expect exactly `want` (WHATWG: one U+FFFD per maximal subpart) */
static void check_sanitize(const char *s, size_t n, const char *want, size_t want_n, size_t reps) {
    unsigned char *p = dup_exact(s, n);
    unsigned char *out = NULL;
    size_t out_n = 0, nrep = 99;
    CHECK(cb_utf8_sanitize(p, n, &out, &out_n, &nrep) == CB_OK);
    CHECK(out_n == want_n);
    CHECK(out && memcmp(out, want, want_n) == 0);
    CHECK(nrep == reps);
    /* the repaired text always validates */
    CHECK(cb_utf8_validate(out, out_n, NULL) == CB_OK);
    cb_tokenizer_buffer_free(out);
    free(p);
}

#define V(lit, bad) check_validate(lit, sizeof(lit) - 1, bad)
#define S(lit, want, reps) check_sanitize(lit, sizeof(lit) - 1, want, sizeof(want) - 1, reps)
#define R "\xEF\xBF\xBD"

/* ---- tokenizer under the sanitizers ------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* text pool: ASCII, spaces, newlines, and multi-byte characters of several categories */
static const char *const POOL[] = {"a", "b", "Z", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "1", "23",
                                   "\xc3\xa9", "\xe2\x96\x81", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                   "\xcc\x81", "\xe3\x80\x80", "<s>", "<ctrl>", "\xff", "\xed\xa0\x80",
                                   "\xe2\x82", ".", "!?", "\xd9\xa3", "\xe0\xa4\x95\xe0\xa4\xbf"};

static unsigned char *random_text(size_t *n) {
    const size_t parts = rnd() % 24;
    unsigned char *buf = malloc(parts * 8 + 1);
    size_t o = 0;
    for (size_t i = 0; i < parts; i++) {
        const char *p = POOL[rnd() % (sizeof POOL / sizeof POOL[0])];
        const size_t k = strlen(p);
        memcpy(buf + o, p, k);
        o += k;
    }
    unsigned char *exact = malloc(o ? o : 1); /* exactly sized, so ASan sees over-reads */
    memcpy(exact, buf, o);
    free(buf);
    *n = o;
    return exact;
}

/* GPT-2's byte alphabet spelling of byte b, as UTF-8, into t (3 bytes at most) */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static void byte_char(int b, char *t) {
    int extra = 0; /* the non-printable bytes before b, spelled 256, 257, ... in order */
    for (int x = 0; x < b; x++) extra += !byte_is_printable(x);
    const unsigned cp = byte_is_printable(b) ? (unsigned)b : 256u + (unsigned)extra;
    if (cp < 0x80) {
        t[0] = (char)cp;
        t[1] = 0;
    } else {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        t[2] = 0;
    }
}

static void build_vocab(cb_tokenizer_model model, cb_pretokenizer pre, cb_tokenizer_t **out) {
    /* tokens: control <s> and <ctrl>, 256 byte tokens (SPM: <0xNN>; BPE: the byte alphabet),
     * a few merges/pieces */
    char texts[8192];
    int64_t offs[300];
    uint32_t attrs[300];
    float scores[300];
    int n = 0;
    size_t o = 0;
#define ADD(str, attr, score)                      \
    do {                                           \
        const size_t k_ = strlen(str);             \
        offs[n] = (int64_t)o;                      \
        memcpy(texts + o, str, k_);                \
        o += k_;                                   \
        attrs[n] = (attr);                         \
        scores[n] = (score);                       \
        n++;                                       \
    } while (0)
    ADD("<s>", CB_TOKEN_ATTR_CONTROL, 0.0f);
    ADD("<ctrl>", CB_TOKEN_ATTR_CONTROL, 0.0f);
    for (int b = 0; b < 256; b++) {
        char t[8];
        if (model == CB_TOKENIZER_SPM) {
            snprintf(t, sizeof t, "<0x%02X>", b);
            ADD(t, CB_TOKEN_ATTR_BYTE, 0.0f);
        } else {
            byte_char(b, t); /* GPT-2 byte alphabet as UTF-8 */
            ADD(t, CB_TOKEN_ATTR_NORMAL, 0.0f);
        }
    }
    if (model == CB_TOKENIZER_SPM) {
        ADD("\xe2\x96\x81" "a", CB_TOKEN_ATTR_NORMAL, -1.0f);
        ADD("ab", CB_TOKEN_ATTR_NORMAL, -2.0f);
        ADD("\xe2\x96\x81" "ab", CB_TOKEN_ATTR_NORMAL, -0.5f);
        ADD("\xe4\xb8\xad", CB_TOKEN_ATTR_NORMAL, -3.0f);
    } else {
        ADD("\xc4\xa0" "a", CB_TOKEN_ATTR_NORMAL, 0.0f); /* "Ġa" */
        ADD("ab", CB_TOKEN_ATTR_NORMAL, 0.0f);
    }
    offs[n] = (int64_t)o;
    const char *merges = "\xc4\xa0 a" "a b"; /* "Ġ a", "a b" */
    const int64_t moffs[3] = {0, 4, 7};
    cb_tokenizer_params p = cb_tokenizer_default_params();
    p.model = model;
    p.pre = pre;
    p.n_tokens = n;
    p.text = (const uint8_t *)texts;
    p.text_offsets = offs;
    p.scores = scores;
    p.attrs = attrs;
    p.n_merges = model == CB_TOKENIZER_BPE ? 2 : 0;
    p.merges = (const uint8_t *)merges;
    p.merge_offsets = moffs;
    p.bos_id = 0;
    p.eos_id = 1;
    p.add_bos = 1;
    p.add_eos = model == CB_TOKENIZER_SPM;
    p.add_space_prefix = model == CB_TOKENIZER_SPM;
    p.ignore_merges = pre == CB_PRE_LLAMA3;
    CHECK(cb_tokenizer_new(&p, out) == CB_OK);
#undef ADD
}

static void fuzz_tokenizer(cb_tokenizer_model model, cb_pretokenizer pre) {
    cb_tokenizer_t *tok = NULL;
    build_vocab(model, pre, &tok);
    if (!tok) return;
    const int32_t nt = cb_tokenizer_n_tokens(tok);
    for (int iter = 0; iter < 300; iter++) {
        size_t n;
        unsigned char *text = random_text(&n);
        for (unsigned flags = 0; flags < 8; flags++) {
            int32_t *ids = NULL;
            size_t nids = 0;
            const cb_status st = cb_tokenizer_encode(tok, text, n, flags, &ids, &nids);
            const int valid = cb_utf8_validate(text, n, NULL) == CB_OK;
            cb_clear_error();
            CHECK(st == CB_OK || (!valid && !(flags & CB_ENCODE_LENIENT) && st == CB_STATUS_CORRUPT));
            cb_clear_error();
            for (size_t i = 0; i < nids; i++) CHECK(ids[i] >= 0 && ids[i] < nt);
            if (st == CB_OK && valid && !(flags & CB_ENCODE_PARSE_SPECIAL) && model == CB_TOKENIZER_BPE) {
                /* byte-level BPE is lossless */
                uint8_t *back = NULL;
                size_t bn = 0;
                CHECK(cb_tokenizer_decode(tok, ids, nids, 0, &back, &bn) == CB_OK);
                CHECK(bn == n && (n == 0 || memcmp(back, text, n) == 0));
                cb_tokenizer_buffer_free(back);
            }
            cb_tokenizer_buffer_free(ids);
        }
        free(text);
        /* random ids: decode and stream agree */
        int32_t rid[16];
        const size_t k = rnd() % 16;
        for (size_t i = 0; i < k; i++) rid[i] = (int32_t)(rnd() % (uint32_t)nt);
        uint8_t *dec = NULL;
        size_t dn = 0;
        CHECK(cb_tokenizer_decode(tok, rid, k, 0, &dec, &dn) == CB_OK);
        CHECK(cb_utf8_validate(dec, dn, NULL) == CB_OK);
        cb_tok_stream_t *s = NULL;
        CHECK(cb_tok_stream_new(tok, 0, &s) == CB_OK);
        unsigned char acc[16 * 64 + 16];
        size_t an = 0;
        for (size_t i = 0; i < k; i++) {
            const uint8_t *o;
            size_t on;
            CHECK(cb_tok_stream_feed(s, rid[i], &o, &on) == CB_OK);
            memcpy(acc + an, o, on);
            an += on;
        }
        const uint8_t *o;
        size_t on;
        CHECK(cb_tok_stream_flush(s, &o, &on) == CB_OK);
        memcpy(acc + an, o, on);
        an += on;
        CHECK(an == dn && (dn == 0 || memcmp(acc, dec, dn) == 0));
        cb_tok_stream_free(s);
        cb_tokenizer_buffer_free(dec);
    }
    int32_t bad = nt;
    uint8_t *dec = NULL;
    size_t dn = 0;
    CHECK(cb_tokenizer_decode(tok, &bad, 1, 0, &dec, &dn) == CB_STATUS_INVALID_ARGUMENT);
    cb_clear_error();
    cb_tokenizer_free(tok);
}

/* ids of text under pre with a vocabulary of the 256 byte tokens (ids 0..255, byte order) and
 * the merges "1 2" (256), "Ġ 1" (257), "Ù £" (258: U+0663 ARABIC-INDIC DIGIT THREE), "Ù£ 4" (259),
 * "Ġ a" (260), "Ġa b" (261) */
static size_t encode_digits(cb_pretokenizer pre, const char *text, int32_t *out) {
    static const char *const merges[] = {"1 2", "\xc4\xa0 1", "\xc3\x99 \xc2\xa3", "\xc3\x99\xc2\xa3 4",
                                         "\xc4\xa0 a", "\xc4\xa0" "a b"};
    char texts[2048];
    int64_t offs[263];
    uint32_t attrs[262];
    char mtext[64];
    int64_t moffs[7];
    size_t o = 0, mo = 0;
    for (int b = 0; b < 256; b++) {
        char t[4];
        byte_char(b, t);
        offs[b] = (int64_t)o;
        memcpy(texts + o, t, strlen(t));
        o += strlen(t);
        attrs[b] = CB_TOKEN_ATTR_NORMAL;
    }
    for (int m = 0; m < 6; m++) {
        const char *sp = strchr(merges[m], ' ');
        offs[256 + m] = (int64_t)o;
        memcpy(texts + o, merges[m], (size_t)(sp - merges[m]));
        o += (size_t)(sp - merges[m]);
        memcpy(texts + o, sp + 1, strlen(sp + 1));
        o += strlen(sp + 1);
        attrs[256 + m] = CB_TOKEN_ATTR_NORMAL;
        moffs[m] = (int64_t)mo;
        memcpy(mtext + mo, merges[m], strlen(merges[m]));
        mo += strlen(merges[m]);
    }
    offs[262] = (int64_t)o;
    moffs[6] = (int64_t)mo;
    cb_tokenizer_params p = cb_tokenizer_default_params();
    p.model = CB_TOKENIZER_BPE;
    p.pre = pre;
    p.n_tokens = 262;
    p.text = (const uint8_t *)texts;
    p.text_offsets = offs;
    p.attrs = attrs;
    p.n_merges = 6;
    p.merges = (const uint8_t *)mtext;
    p.merge_offsets = moffs;
    cb_tokenizer_t *tok = NULL;
    CHECK(cb_tokenizer_new(&p, &tok) == CB_OK);
    if (!tok) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(cb_tokenizer_encode(tok, (const uint8_t *)text, strlen(text), 0, &ids, &n) == CB_OK);
    for (size_t i = 0; i < n && i < 16; i++) out[i] = ids[i];
    cb_tokenizer_buffer_free(ids);
    cb_tokenizer_free(tok);
    return n;
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)
static void check_ids(cb_pretokenizer pre, const char *text, const int32_t *want, size_t n_want) {
    int32_t got[16];
    const size_t n = encode_digits(pre, text, got);
    CHECK(n == n_want && memcmp(got, want, n * sizeof *got) == 0);
}

/* smollm (llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM): "\p{N}" isolates every digit of any script
 * before the gpt2 regex, so no merge joins two digits or a space and a digit; gpt2 joins them */
static void test_pretok_smollm(void) {
    check_ids(CB_PRE_GPT2, "12", IDS(256));
    check_ids(CB_PRE_SMOLLM, "12", IDS('1', '2'));
    check_ids(CB_PRE_GPT2, " 1", IDS(257));
    check_ids(CB_PRE_SMOLLM, " 1", IDS(' ', '1'));
    check_ids(CB_PRE_GPT2, " 12", IDS(' ', 256)); /* "1 2" ranks before "Ġ 1" */
    check_ids(CB_PRE_SMOLLM, " 12", IDS(' ', '1', '2'));
    check_ids(CB_PRE_GPT2, "\xd9\xa3" "4", IDS(259));
    check_ids(CB_PRE_SMOLLM, "\xd9\xa3" "4", IDS(258, '4'));
    /* letters and spaces as gpt2 */
    check_ids(CB_PRE_SMOLLM, "a ab 1", IDS('a', 261, ' ', '1'));
    check_ids(CB_PRE_GPT2, "a ab 1", IDS('a', 261, 257));
    /* the highest pre-tokenizer is accepted, one above is refused */
    cb_tokenizer_params p = cb_tokenizer_default_params();
    const uint8_t t[] = "a";
    const int64_t off[] = {0, 1};
    const uint32_t attr[] = {CB_TOKEN_ATTR_NORMAL};
    p.model = CB_TOKENIZER_BPE;
    p.pre = (cb_pretokenizer)(CB_PRE_LAST + 1);
    p.n_tokens = 1;
    p.text = t;
    p.text_offsets = off;
    p.attrs = attr;
    cb_tokenizer_t *tok = NULL;
    CHECK(cb_tokenizer_new(&p, &tok) == CB_STATUS_INVALID_ARGUMENT && tok == NULL);
    CHECK(strstr(cb_last_error(), "pre-tokenizer") != NULL);
    cb_clear_error();
}

static void test_tokenizer_fuzz(void) {
    fuzz_tokenizer(CB_TOKENIZER_SPM, CB_PRE_NONE);
    for (int pre = CB_PRE_DEFAULT; pre <= CB_PRE_LAST; pre++) fuzz_tokenizer(CB_TOKENIZER_BPE, (cb_pretokenizer)pre);
    cb_tokenizer_free(NULL);
    cb_tok_stream_free(NULL);
}

int main(void) {
    /* well-formed */
    V("", -1);
    V("plain ascii text, longer than eight bytes", -1);
    V("\xC2\x80\xDF\xBF", -1);                  /* U+0080, U+07FF */
    V("\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80", -1); /* U+0800, U+D7FF, U+E000 */
    V("\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF", -1); /* U+FFFF, U+10000, U+10FFFF */
    V("h\xC3\xA9llo \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD", -1);

    /* overlongs */
    V("\xC0\x80", 0);
    V("\xC1\xBF", 0);
    V("ab\xE0\x80\x80", 2);
    V("\xE0\x9F\xBF", 0);
    V("\xF0\x80\x80\x80", 0);
    V("\xF0\x8F\xBF\xBF", 0);
    /* surrogates */
    V("\xED\xA0\x80", 0);
    V("xyz\xED\xBF\xBF", 3);
    /* above U+10FFFF, never-valid bytes */
    V("\xF4\x90\x80\x80", 0);
    V("\xF5\x80\x80\x80", 0);
    V("\xFE", 0);
    V("0123456789\xFF", 10);
    /* lone continuation bytes, missing continuations */
    V("\x80", 0);
    V("abcdefgh\xBF", 8);
    V("\xC3(", 0);
    V("\xE2\x82(", 0);
    /* truncated at the end of the input */
    V("\xC3", 0);
    V("ok\xE2\x82", 2);
    V("\xF0\x9F\x98", 0);
    V("12345678\xF0", 8);

    /* WHATWG / Unicode maximal-subpart replacement */
    S("", "", 0);
    S("abc", "abc", 0);
    S("\xC0\x80", R R, 2);                 /* C0 never starts a sequence: each byte alone */
    S("\xE0\x80\x80", R R R, 3);           /* E0 80: 80 is outside A0..BF */
    S("\xED\xA0\x80", R R R, 3);           /* surrogate */
    S("\xF4\x90\x80\x80", R R R R, 4);     /* above U+10FFFF */
    S("\xF0\x9F\x98", R, 1);               /* truncated 4-byte sequence: one replacement */
    S("\xE2\x82" "a", R "a", 1);
    S("\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80", 0);
    S("a\xFF" "b\xC3\xA9", "a" R "b\xC3\xA9", 1);
    S("\xF1\x80\x80\xE1\x80\xC2", R R R, 3);
    S("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41", R R R R "A", 4);

    /* cb_utf8_next reports truncation only at the end of the buffer */
    {
        unsigned char *p = dup_exact("\xF0\x9F", 2);
        uint32_t cp = 0;
        int tr = 0;
        CHECK(cb_utf8_next(p, 2, &cp, &tr) == -2);
        CHECK(tr == 1);
        free(p);
        p = dup_exact("\xF0\x9F\x41", 3);
        CHECK(cb_utf8_next(p, 3, &cp, &tr) == -2);
        CHECK(tr == 0);
        CHECK(cb_utf8_next(p + 2, 1, &cp, &tr) == 1 && cp == 0x41);
        free(p);
    }
    /* exhaustive: every 1..2 byte input agrees between validate and sanitize */
    for (int a = 0; a < 256; a++) {
        for (int b = -1; b < 256; b++) {
            unsigned char buf[2] = {(unsigned char)a, (unsigned char)(b < 0 ? 0 : b)};
            const size_t n = b < 0 ? 1 : 2;
            unsigned char *p = dup_exact((const char *)buf, n);
            unsigned char *out = NULL;
            size_t on = 0, reps = 0;
            const int ok = cb_utf8_validate(p, n, NULL) == CB_OK;
            cb_clear_error();
            CHECK(cb_utf8_sanitize(p, n, &out, &on, &reps) == CB_OK);
            if ((reps == 0) != ok) CHECK(0);
            if (ok && (on != n || memcmp(out, p, n) != 0)) CHECK(0);
            cb_tokenizer_buffer_free(out);
            free(p);
        }
    }
    CHECK(cb_utf8_validate(NULL, 3, NULL) == CB_STATUS_INVALID_ARGUMENT);
    cb_clear_error();
    test_pretok_smollm();
    test_tokenizer_fuzz();
    TEST_MAIN_END("test_utf8");
}
