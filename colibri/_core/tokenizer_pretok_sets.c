/* The pre-tokenizer regexes llama.cpp adds beyond the GPT-2 / Llama 3 / Qwen 2 / DeepSeek families
 * (tokenizer_pretok.c composes them into stages). llama.cpp runs most of these through std::regex
 * on a "collapsed" text: every non-ASCII code point becomes one byte standing for its category
 * (\p{Lu}, \p{Ll}, ... all become \p{L}), non-ASCII whitespace becomes \v; a regex without \p{..}
 * sees the code points themselves with non-ASCII whitespace as \v. The matchers below follow
 * llama.cpp, not HF tokenizers, where the two differ (letter case outside ASCII, whitespace inside
 * explicit character ranges). A few regexes have hand-written implementations in llama.cpp
 * (kimi-k2, qwen35, afmoe's digits): those are followed instead. */
#include "tokenizer_pretok.h"

static inline int ascii_lower(uint32_t x) { return x >= 'a' && x <= 'z'; }
static inline int ascii_upper(uint32_t x) { return x >= 'A' && x <= 'Z'; }

/* a code point inside an explicit range of a regex run on code points: non-ASCII whitespace never
 * is (llama.cpp replaced it by \v) */
static inline int in_ranges(const cps *c, size_t i, const uint32_t (*r)[2], size_t n) {
    const uint32_t x = c->cp[i];
    if (x >= 0x80 && (c->fl[i] & F_WS)) return 0;
    for (size_t k = 0; k < n; k++)
        if (x >= r[k][0] && x <= r[k][1]) return 1;
    return 0;
}

static size_t ranges_run(const cps *c, size_t pos, size_t end, const uint32_t (*r)[2], size_t n) {
    size_t k = pos;
    while (k < end && in_ranges(c, k, r, n)) k++;
    return k - pos;
}

/* ---------------------------------------------------------------------------------------------
 * the Llama 3 shape: (?:'[sS]|...)|[^\r\n\p{L}\p{N}]?LET+|\p{N}{1,D}| ?[^\s LET \p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+, with options */

typedef struct {
    int contractions;  /* the contraction alternative is there */
    size_t maxdigits;  /* \p{N}{1,D} */
    uint16_t letters;  /* LET: F_L, or F_L | F_M (qwen35) */
    int punct_crlf;    /* [\r\n]* after the punctuation run */
    int jais2;         /* jais-2's cascade \s{512}(?!\S)|...|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1} */
} l3opt;

/* \s{L}(?!\S) for L = 512, 256, ..., 4, then \s{1,2}(?!\S), then \s{1} */
static size_t jais2_ws(const cps *c, size_t pos, size_t end) {
    const size_t r = run_of(c, pos, end, F_WS);
    if (r == 0) return 0;
    for (size_t l = 512; l >= 4; l /= 2)
        if (r > l || (r == l && pos + l == end)) return l;
    for (size_t l = 2; l >= 1; l--)
        if (r > l || (r == l && pos + l == end)) return l;
    return 1;
}

static size_t l3_like(const cps *c, size_t pos, size_t end, const l3opt *o) {
    const uint16_t let = o->letters;
    if (o->contractions) {
        const size_t k = contraction(c, pos, end, 1);
        if (k) return k;
    }
    if (!IS_CRLF(pos) && !(c->fl[pos] & (F_L | F_N)) && pos + 1 < end && (c->fl[pos + 1] & let))
        return 1 + run_of(c, pos + 1, end, let);
    if (c->fl[pos] & let) return run_of(c, pos, end, let);
    if (IS_N(pos)) {
        const size_t k = run_of(c, pos, end, F_N);
        return k < o->maxdigits ? k : o->maxdigits;
    }
    const uint16_t notp = F_WS | let | F_N;
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && !(c->fl[pos + 1] & notp)) q = pos + 1;
    if (!(c->fl[q] & notp)) {
        while (q < end && !(c->fl[q] & notp)) q++;
        if (o->punct_crlf)
            while (q < end && IS_CRLF(q)) q++;
        return q - pos;
    }
    const size_t k = ws_newlines(c, pos, end);
    if (k) return k;
    return o->jais2 ? jais2_ws(c, pos, end) : ws_tail(c, pos, end);
}

size_t cb_pm_seed_coder(const cps *c, size_t pos, size_t end) {
    static const l3opt o = {1, 1, F_L, 0, 0};
    return l3_like(c, pos, end, &o);
}
size_t cb_pm_ufakzeka(const cps *c, size_t pos, size_t end) {
    static const l3opt o = {0, 1, F_L, 1, 0};
    return l3_like(c, pos, end, &o);
}
size_t cb_pm_minicpm5(const cps *c, size_t pos, size_t end) {
    static const l3opt o = {1, (size_t)-1, F_L, 1, 0};
    return l3_like(c, pos, end, &o);
}
size_t cb_pm_jais2(const cps *c, size_t pos, size_t end) {
    static const l3opt o = {1, 3, F_L, 1, 1};
    return l3_like(c, pos, end, &o);
}
size_t cb_pm_qwen35(const cps *c, size_t pos, size_t end) {
    static const l3opt o = {1, 1, F_L | F_M, 1, 0};
    return l3_like(c, pos, end, &o);
}

/* ---------------------------------------------------------------------------------------------
 * the GPT-4o shape: X?UP*LOW+C?|X?UP+LOW*C?|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|
 * \s+(?!\S)|\s+, X = [^\r\n\p{L}\p{N}], C the optional contraction. What UP and LOW are: */
enum {
    G4_LOOKAHEAD,  /* llama.cpp's ((?=[\p{L}])([^a-z])) / ([^A-Z]): a non-ASCII letter is both */
    G4_LOOKAHEAD_M, /* the same over [\p{L}\p{M}] (granite-embed-multi-97m) */
    G4_COLLAPSED,  /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] collapsed: any letter or mark, both */
    G4_NOT_HAN,    /* kimi-k2: any letter but Han, both */
};

typedef struct {
    int mode;
    size_t maxdigits;
    int contractions;
    int slash;     /* '/' among the characters after the punctuation run */
} g4opt;

static int is_han(uint32_t x) {
    return (x >= 0x4E00 && x <= 0x9FFF) || (x >= 0x3400 && x <= 0x4DBF) || (x >= 0x20000 && x <= 0x2A6DF) ||
           (x >= 0x2A700 && x <= 0x2EBEF) || (x >= 0xF900 && x <= 0xFAFF) || (x >= 0x2F800 && x <= 0x2FA1F);
}

static inline int g4_up(const cps *c, size_t i, int mode) {
    switch (mode) {
    case G4_LOOKAHEAD: return IS_L(i) && !ascii_lower(c->cp[i]);
    case G4_LOOKAHEAD_M: return (c->fl[i] & (F_L | F_M)) && !ascii_lower(c->cp[i]);
    case G4_COLLAPSED: return (c->fl[i] & (F_L | F_M)) != 0;
    default: return IS_L(i) && !is_han(c->cp[i]);
    }
}
static inline int g4_low(const cps *c, size_t i, int mode) {
    switch (mode) {
    case G4_LOOKAHEAD: return IS_L(i) && !ascii_upper(c->cp[i]);
    case G4_LOOKAHEAD_M: return (c->fl[i] & (F_L | F_M)) && !ascii_upper(c->cp[i]);
    case G4_COLLAPSED: return (c->fl[i] & (F_L | F_M)) != 0;
    default: return IS_L(i) && !is_han(c->cp[i]);
    }
}

static size_t g4_run(const cps *c, size_t i, size_t end, int mode, int up) {
    size_t k = i;
    while (k < end && (up ? g4_up(c, k, mode) : g4_low(c, k, mode))) k++;
    return k - i;
}

static size_t g4_like(const cps *c, size_t pos, size_t end, const g4opt *o) {
    const int m = o->mode;
    const int x_ok = !IS_CRLF(pos) && !IS_L(pos) && !IS_N(pos);
    /* X?UP*LOW+C?, with and then without X; UP* gives back one at a time */
    for (int x = x_ok ? 1 : 0; x >= 0; x--) {
        const size_t q = pos + (size_t)x;
        if (q >= end) continue;
        const size_t a = g4_run(c, q, end, m, 1);
        for (size_t k = a + 1; k-- > 0;) {
            if (q + k < end && g4_low(c, q + k, m)) {
                size_t e = q + k + g4_run(c, q + k, end, m, 0);
                if (o->contractions) e += contraction(c, e, end, 1);
                return e - pos;
            }
        }
    }
    /* X?UP+LOW*C? */
    for (int x = x_ok ? 1 : 0; x >= 0; x--) {
        const size_t q = pos + (size_t)x;
        if (q >= end) continue;
        const size_t a = g4_run(c, q, end, m, 1);
        if (a == 0) continue;
        size_t e = q + a;
        e += g4_run(c, e, end, m, 0);
        if (o->contractions) e += contraction(c, e, end, 1);
        return e - pos;
    }
    if (IS_N(pos)) {
        const size_t k = run_of(c, pos, end, F_N);
        return k < o->maxdigits ? k : o->maxdigits;
    }
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && is_other(c, pos + 1)) q = pos + 1;
    if (is_other(c, q)) {
        q += other_run(c, q, end);
        while (q < end && (IS_CRLF(q) || (o->slash && c->cp[q] == '/'))) q++;
        return q - pos;
    }
    const size_t k = ws_newlines(c, pos, end);
    if (k) return k;
    return ws_tail(c, pos, end);
}

size_t cb_pm_gpt4o(const cps *c, size_t pos, size_t end) {
    static const g4opt o = {G4_LOOKAHEAD, 3, 1, 1};
    return g4_like(c, pos, end, &o);
}
size_t cb_pm_tekken(const cps *c, size_t pos, size_t end) {
    static const g4opt o = {G4_LOOKAHEAD, 1, 0, 1};
    return g4_like(c, pos, end, &o);
}
size_t cb_pm_granite97m(const cps *c, size_t pos, size_t end) {
    static const g4opt o = {G4_LOOKAHEAD_M, 3, 1, 1};
    return g4_like(c, pos, end, &o);
}
size_t cb_pm_youtu(const cps *c, size_t pos, size_t end) {
    static const g4opt o = {G4_COLLAPSED, 1, 1, 1};
    return g4_like(c, pos, end, &o);
}
size_t cb_pm_tiny_aya(const cps *c, size_t pos, size_t end) {
    static const g4opt o = {G4_COLLAPSED, 3, 1, 1};
    return g4_like(c, pos, end, &o);
}
/* kimi-k2 (llama.cpp's own implementation): [\p{Han}]+ first, then the GPT-4o shape over the
 * letters that are not Han, \p{N}{1,3}, no '/' after punctuation */
size_t cb_pm_kimi_k2(const cps *c, size_t pos, size_t end) {
    static const g4opt o = {G4_NOT_HAN, 3, 1, 0};
    if (is_han(c->cp[pos])) {
        size_t k = pos;
        while (k < end && is_han(c->cp[k])) k++;
        return k - pos;
    }
    return g4_like(c, pos, end, &o);
}

/* ---------------------------------------------------------------------------------------------
 * digits */

/* afmoe's and tiny_aya's digit groups (llama.cpp's own code): a \p{N} run is cut after its first
 * length % 3 digits, then after every three; the text before a run stays with its first group.
 * The match returned is the text up to the next cut, so the whole piece is covered. */
size_t cb_pm_digit_groups(const cps *c, size_t pos, size_t end) {
    size_t s = pos;
    while (s < end && !IS_N(s)) s++;
    if (s == end) return end - pos;
    const size_t e = s + run_of(c, s, end, F_N);
    return s + (e - s - 1) % 3 + 1 - pos;
}

static size_t ascii_digit_run(const cps *c, size_t i, size_t end) {
    size_t k = i;
    while (k < end && IS_ASCII_DIGIT(k)) k++;
    return k - i;
}

/* superbpe's (?=(\d{3})+(?!\d)): empty matches, i.e. cuts before every ASCII digit followed by a
 * multiple of three ASCII digits up to the piece's end or a non-digit. The match returned here is
 * the text up to the next cut (so the whole piece is covered, cut where the regex cuts). */
size_t cb_pm_superbpe(const cps *c, size_t pos, size_t end) {
    size_t i = pos + 1;
    if (IS_ASCII_DIGIT(pos)) { /* cuts later in the run holding pos */
        const size_t left = ascii_digit_run(c, pos, end); /* from pos to the run's end */
        if (left > 3) return (left - 1) % 3 + 1;
        i = pos + left;
    }
    while (i < end) {
        if (!IS_ASCII_DIGIT(i)) {
            i++;
            continue;
        }
        const size_t r = ascii_digit_run(c, i, end);
        if (r >= 3) return i + r % 3 - pos;
        i += r;
    }
    return end - pos;
}

/* ---------------------------------------------------------------------------------------------
 * exaone-moe: (?:'[sS]|...)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}|
 *  ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+ */
static size_t exaone_words(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end) {
        if (IS_L(k) || ((c->fl[k] & F_M) && k > pos)) {
            k++;
        } else if (c->cp[k] == ' ' && k > pos && k + 1 < end && IS_L(k + 1)) {
            k += 2;
        } else {
            break;
        }
    }
    return k - pos;
}

size_t cb_pm_exaone_moe(const cps *c, size_t pos, size_t end) {
    size_t k = contraction(c, pos, end, 1);
    if (k) return k;
    if (!IS_CRLF(pos) && !IS_L(pos) && !IS_N(pos) && pos + 1 < end && IS_L(pos + 1))
        return 1 + exaone_words(c, pos + 1, end);
    if (IS_L(pos)) return exaone_words(c, pos, end);
    if (IS_N(pos)) return 1;
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && is_other(c, pos + 1)) q = pos + 1;
    if (is_other(c, q)) {
        q += other_run(c, q, end);
        if (q < end && (IS_CRLF(q) || c->cp[q] == '/')) q++;
        return q - pos;
    }
    k = ws_newlines(c, pos, end);
    if (k) return k;
    return ws_tail(c, pos, end);
}

/* ---------------------------------------------------------------------------------------------
 * deepseek-coder, falcon, spark2_5, poro, chameleon, afmoe, youtu, gemma4, whitespace */

/* \s?\p{L}+ */
size_t cb_pm_ws_letters(const cps *c, size_t pos, size_t end) {
    size_t q = pos;
    if (IS_WS(pos) && pos + 1 < end && IS_L(pos + 1)) q = pos + 1;
    if (!IS_L(q)) return 0;
    return q - pos + run_of(c, q, end, F_L);
}
/* \s?\p{P}+ */
size_t cb_pm_ws_punct(const cps *c, size_t pos, size_t end) {
    size_t q = pos;
    if (IS_WS(pos) && pos + 1 < end && (c->fl[pos + 1] & F_P)) q = pos + 1;
    if (!(c->fl[q] & F_P)) return 0;
    return q - pos + run_of(c, q, end, F_P);
}
/* [一-龥ࠀ-一가-퟿]+ */
size_t cb_pm_dsc_cjk(const cps *c, size_t pos, size_t end) {
    static const uint32_t r[][2] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};
    return ranges_run(c, pos, end, r, 3);
}
/* [\p{P}\$\+<=>\^~\|`]+ */
size_t cb_pm_falcon_punct(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    for (; k < end; k++) {
        const uint32_t x = c->cp[k];
        if (!((c->fl[k] & F_P) || x == '$' || x == '+' || x == '<' || x == '=' || x == '>' || x == '^' ||
              x == '~' || x == '|' || x == '`'))
            break;
    }
    return k - pos;
}

static inline int ascii_punct(uint32_t x) {
    return (x >= 0x21 && x <= 0x2F) || (x >= 0x3A && x <= 0x40) || (x >= 0x5B && x <= 0x60) ||
           (x >= 0x7B && x <= 0x7E);
}
/* spark2_5, stage 3: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|
 * [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+ */
size_t cb_pm_spark_main(const cps *c, size_t pos, size_t end) {
    if (ascii_punct(c->cp[pos]) && pos + 1 < end && (ascii_upper(c->cp[pos + 1]) || ascii_lower(c->cp[pos + 1]))) {
        size_t q = pos + 1;
        while (q < end && (ascii_upper(c->cp[q]) || ascii_lower(c->cp[q]))) q++;
        return q - pos;
    }
    const int x_ok = !IS_CRLF(pos) && !(c->fl[pos] & (F_L | F_P | F_S));
    if (x_ok && pos + 1 < end && (c->fl[pos + 1] & (F_L | F_M))) return 1 + run_of(c, pos + 1, end, F_L | F_M);
    if (c->fl[pos] & (F_L | F_M)) return run_of(c, pos, end, F_L | F_M);
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && (c->fl[pos + 1] & (F_P | F_S))) q = pos + 1;
    if (c->fl[q] & (F_P | F_S)) return q - pos + run_of(c, q, end, F_P | F_S);
    if (IS_CRLF(pos)) return 1;
    return ws_tail(c, pos, end);
}

/* poro, bloom, gpt3-finnish, viking: " ?[^(\s|.,!?…。，、।۔،)]+" */
static inline int poro_char(const cps *c, size_t i) {
    const uint32_t x = c->cp[i];
    if (IS_WS(i)) return 0;
    switch (x) {
    case '(': case ')': case '|': case '.': case ',': case '!': case '?': case 0x2026: case 0x3002:
    case 0xFF0C: case 0x3001: case 0x0964: case 0x06D4: case 0x060C:
        return 0;
    default: return 1;
    }
}
size_t cb_pm_poro(const cps *c, size_t pos, size_t end) {
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && poro_char(c, pos + 1)) q = pos + 1;
    if (!poro_char(c, q)) return 0;
    while (q < end && poro_char(c, q)) q++;
    return q - pos;
}

/* chameleon: <sentinel:[0-9]+> */
size_t cb_pm_sentinel(const cps *c, size_t pos, size_t end) {
    static const char head[] = "<sentinel:";
    size_t q = pos;
    for (const char *h = head; *h; h++, q++)
        if (q >= end || c->cp[q] != (uint32_t)*h) return 0;
    const size_t d = ascii_digit_run(c, q, end);
    if (d == 0 || q + d >= end || c->cp[q + d] != '>') return 0;
    return q + d + 1 - pos;
}
/* (IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z */
size_t cb_pm_imgimg(const cps *c, size_t pos, size_t end) {
    static const char head[] = "IMGIMG";
    size_t q = pos;
    for (const char *h = head; *h; h++, q++)
        if (q >= end || c->cp[q] != (uint32_t)*h) return 0;
    size_t n = 0;
    while (q + n < end && n < 4 && c->cp[q + n] >= 'A' && c->cp[q + n] <= 'I') n++;
    if (n == 0 || q + n >= end || c->cp[q + n] != 'Z') return 0;
    return q + n + 1 - pos;
}
/* ([\t\n]|    |  ) */
size_t cb_pm_cham_ws(const cps *c, size_t pos, size_t end) {
    if (c->cp[pos] == '\t' || c->cp[pos] == '\n') return 1;
    size_t n = 0;
    while (pos + n < end && n < 4 && c->cp[pos + n] == ' ') n++;
    return n == 4 ? 4 : n >= 2 ? 2 : 0;
}
/* [\p{P}!-/:-@\[-`{-~] */
size_t cb_pm_cham_punct(const cps *c, size_t pos, size_t end) {
    (void)end;
    return (c->fl[pos] & F_P) || ascii_punct(c->cp[pos]) ? 1 : 0;
}
/* [^\n]+|[\n]+ (gemma4, sarvam-moe, laguna) */
size_t cb_pm_newline_runs(const cps *c, size_t pos, size_t end) {
    const int nl = c->cp[pos] == '\n';
    size_t k = pos;
    while (k < end && (c->cp[k] == '\n') == nl) k++;
    return k - pos;
}
/* \S+ */
size_t cb_pm_nonws(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end && !IS_WS(k)) k++;
    return k - pos;
}
/* afmoe, stage 2 (its "豈" is stored as U+8C48, its "เ" is U+0E40): [一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+ */
size_t cb_pm_afmoe_cjk(const cps *c, size_t pos, size_t end) {
    static const uint32_t r[][2] = {{0x4E00, 0x9FFF}, {0x3400, 0x4DBF}, {0x8C48, 0xFAFF}, {0x3040, 0x309F},
                                    {0x30A0, 0x30FF}, {0xFF65, 0xFF9F}, {0x2F00, 0x2FDF}, {0x0E40, 0x0E7F},
                                    {0x0E80, 0x0EFF}, {0x1780, 0x17FF}, {0x1000, 0x109F}, {0xAA60, 0xAA7F},
                                    {0xA9E0, 0xA9FF}, {0xAC00, 0xD7AF}, {0x1100, 0x11FF}};
    return ranges_run(c, pos, end, r, 15);
}
/* youtu, stage 1: [가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+ */
size_t cb_pm_youtu_cjk(const cps *c, size_t pos, size_t end) {
    static const uint32_t hangul[][2] = {{0xAC00, 0xD7A3}, {0x3131, 0x318E}};
    static const uint32_t punct[][2] = {{0xFF01, 0xFF01}, {0x2026, 0x2026}, {0x201C, 0x201D}, {0x2018, 0x2019},
                                        {0x2014, 0x2014}, {0xFF1A, 0xFF1B}, {0xFF0C, 0xFF0C}, {0x3001, 0x303F},
                                        {0xFE30, 0xFE4F}};
    static const uint32_t bopomofo[][2] = {{0x3105, 0x312F}};
    static const uint32_t cjk[][2] = {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};
    size_t k;
    if ((k = ranges_run(c, pos, end, hangul, 2))) return k;
    if ((k = ranges_run(c, pos, end, punct, 9))) return k;
    if ((k = ranges_run(c, pos, end, bopomofo, 1))) return k;
    return ranges_run(c, pos, end, cjk, 3);
}
