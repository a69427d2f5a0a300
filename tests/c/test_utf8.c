/* UTF-8 validator and repair (colibri/_core/utf8.c) on the hard cases: overlongs, surrogates,
 * values above U+10FFFF, bytes that never occur, and sequences truncated by the end of the input.
 * Inputs are copied into exactly-sized heap buffers so that ASan catches any read past the end. */
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
    TEST_MAIN_END("test_utf8");
}
