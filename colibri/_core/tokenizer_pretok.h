/* Private to the pre-tokenizers (tokenizer_pretok.c, tokenizer_pretok_sets.c): the code points of
 * the text being split with their category flags, the matcher type and the small matchers both
 * files build on. */
#ifndef COLIBRI_TOKENIZER_PRETOK_H
#define COLIBRI_TOKENIZER_PRETOK_H

#include "tokenizer_impl.h"

/* ---------------------------------------------------------------------------------------------
 * pre-tokenizer matchers: each returns the length (in code points) of the match starting at pos
 * within [pos, end), 0 when the regex does not match there. */

typedef struct {
    const uint32_t *cp;
    const uint16_t *fl;
} cps;

typedef size_t (*matcher)(const cps *c, size_t pos, size_t end);

#define IS_L(i) (c->fl[i] & F_L)
#define IS_N(i) (c->fl[i] & F_N)
#define IS_WS(i) (c->fl[i] & F_WS)
#define IS_CRLF(i) (c->cp[i] == '\r' || c->cp[i] == '\n')

static inline size_t run_of(const cps *c, size_t i, size_t end, uint16_t mask) {
    size_t k = i;
    while (k < end && (c->fl[k] & mask)) k++;
    return k - i;
}

/* not \s, \p{L}, \p{N} */
static inline int is_other(const cps *c, size_t i) { return !(c->fl[i] & (F_WS | F_L | F_N)); }

static inline size_t other_run(const cps *c, size_t i, size_t end) {
    size_t k = i;
    while (k < end && is_other(c, k)) k++;
    return k - i;
}

static inline uint32_t lower_ascii(uint32_t x) { return x >= 'A' && x <= 'Z' ? x + 32 : x; }

/* 's 't 're 've 'm 'll 'd; icase: ASCII case-insensitive */
static inline size_t contraction(const cps *c, size_t pos, size_t end, int icase) {
    if (pos + 1 >= end || c->cp[pos] != '\'') return 0;
    uint32_t a = c->cp[pos + 1];
    if (icase) a = lower_ascii(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= end) return 0;
    uint32_t b = c->cp[pos + 2];
    if (icase) b = lower_ascii(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ */
static inline size_t ws_tail(const cps *c, size_t pos, size_t end) {
    const size_t r = run_of(c, pos, end, F_WS);
    if (r == 0) return 0;
    if (pos + r == end || r == 1) return r; /* \s+(?!\S) matched whole, or \s+ */
    return r - 1;                           /* leave the last space to the next word */
}

/* \s*[\r\n]+ */
static inline size_t ws_newlines(const cps *c, size_t pos, size_t end) {
    const size_t r = run_of(c, pos, end, F_WS);
    for (size_t k = r; k > 0; k--)
        if (IS_CRLF(pos + k - 1)) return k;
    return 0;
}


#define IS_ASCII_DIGIT(i) (c->cp[i] >= '0' && c->cp[i] <= '9')

/* the matchers of tokenizer_pretok_sets.c (each: length of the match at pos, 0 if none) */
size_t cb_pm_gpt4o(const cps *c, size_t pos, size_t end);
size_t cb_pm_tekken(const cps *c, size_t pos, size_t end);
size_t cb_pm_granite97m(const cps *c, size_t pos, size_t end);
size_t cb_pm_youtu_cjk(const cps *c, size_t pos, size_t end);
size_t cb_pm_youtu(const cps *c, size_t pos, size_t end);
size_t cb_pm_tiny_aya(const cps *c, size_t pos, size_t end);
size_t cb_pm_digit_groups(const cps *c, size_t pos, size_t end);
size_t cb_pm_superbpe(const cps *c, size_t pos, size_t end);
size_t cb_pm_kimi_k2(const cps *c, size_t pos, size_t end);
size_t cb_pm_seed_coder(const cps *c, size_t pos, size_t end);
size_t cb_pm_ufakzeka(const cps *c, size_t pos, size_t end);
size_t cb_pm_minicpm5(const cps *c, size_t pos, size_t end);
size_t cb_pm_jais2(const cps *c, size_t pos, size_t end);
size_t cb_pm_qwen35(const cps *c, size_t pos, size_t end);
size_t cb_pm_exaone_moe(const cps *c, size_t pos, size_t end);
size_t cb_pm_ws_letters(const cps *c, size_t pos, size_t end);
size_t cb_pm_ws_punct(const cps *c, size_t pos, size_t end);
size_t cb_pm_dsc_cjk(const cps *c, size_t pos, size_t end);
size_t cb_pm_falcon_punct(const cps *c, size_t pos, size_t end);
size_t cb_pm_spark_main(const cps *c, size_t pos, size_t end);
size_t cb_pm_poro(const cps *c, size_t pos, size_t end);
size_t cb_pm_sentinel(const cps *c, size_t pos, size_t end);
size_t cb_pm_imgimg(const cps *c, size_t pos, size_t end);
size_t cb_pm_cham_ws(const cps *c, size_t pos, size_t end);
size_t cb_pm_cham_punct(const cps *c, size_t pos, size_t end);
size_t cb_pm_newline_runs(const cps *c, size_t pos, size_t end);
size_t cb_pm_nonws(const cps *c, size_t pos, size_t end);
size_t cb_pm_afmoe_cjk(const cps *c, size_t pos, size_t end);

#endif
