/* The pre-tokenizers of byte-level BPE (cb_pretokenizer): each regex of llama.cpp's / HF's
 * pre-tokenizer is a hand-written matcher over code points and their Unicode category flags
 * (unicode_tables.h); a pre-tokenizer is a list of stages, each splitting every piece of the
 * previous stage into its matches and the gaps between them (HF Split "isolated"). */
#include "tokenizer_pretok.h"

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t m_gpt2(const cps *c, size_t pos, size_t end) {
    size_t k = contraction(c, pos, end, 0);
    if (k) return k;
    const int sp = c->cp[pos] == ' ' && pos + 1 < end;
    if (sp && IS_L(pos + 1)) return 1 + run_of(c, pos + 1, end, F_L);
    if (IS_L(pos)) return run_of(c, pos, end, F_L);
    if (sp && IS_N(pos + 1)) return 1 + run_of(c, pos + 1, end, F_N);
    if (IS_N(pos)) return run_of(c, pos, end, F_N);
    if (sp && is_other(c, pos + 1)) return 1 + other_run(c, pos + 1, end);
    if (is_other(c, pos)) return other_run(c, pos, end);
    return ws_tail(c, pos, end);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+   (D = 3: llama3, D = 1: qwen2) */
static size_t llama3_like(const cps *c, size_t pos, size_t end, size_t maxdigits) {
    size_t k = contraction(c, pos, end, 1);
    if (k) return k;
    if (!IS_CRLF(pos) && !IS_L(pos) && !IS_N(pos) && pos + 1 < end && IS_L(pos + 1))
        return 1 + run_of(c, pos + 1, end, F_L);
    if (IS_L(pos)) return run_of(c, pos, end, F_L);
    if (IS_N(pos)) {
        k = run_of(c, pos, end, F_N);
        return k < maxdigits ? k : maxdigits;
    }
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && is_other(c, pos + 1)) q = pos + 1;
    if (is_other(c, q)) {
        q += other_run(c, q, end);
        while (q < end && IS_CRLF(q)) q++;
        return q - pos;
    }
    k = ws_newlines(c, pos, end);
    if (k) return k;
    return ws_tail(c, pos, end);
}

static size_t m_llama3(const cps *c, size_t pos, size_t end) { return llama3_like(c, pos, end, 3); }
static size_t m_qwen2(const cps *c, size_t pos, size_t end) { return llama3_like(c, pos, end, 1); }

/* llama.cpp "default", stage 1: [\p{P}\$\+<=>\^~\|]+ */
static inline int def_punct(const cps *c, size_t i) {
    const uint32_t x = c->cp[i];
    return (c->fl[i] & F_P) || x == '$' || x == '+' || x == '<' || x == '=' || x == '>' || x == '^' ||
           x == '~' || x == '|';
}
static size_t m_def_punct(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end && def_punct(c, k)) k++;
    return k - pos;
}
/* \p{N}+ */
static size_t m_nrun(const cps *c, size_t pos, size_t end) { return run_of(c, pos, end, F_N); }
/* [0-9][0-9][0-9] */
static size_t m_3digits(const cps *c, size_t pos, size_t end) {
    if (pos + 3 > end) return 0;
    for (size_t i = pos; i < pos + 3; i++)
        if (c->cp[i] < '0' || c->cp[i] > '9') return 0;
    return 3;
}
/* \p{N}{1,3} */
static size_t m_n3(const cps *c, size_t pos, size_t end) {
    const size_t k = run_of(c, pos, end, F_N);
    return k < 3 ? k : 3;
}
/* \p{N} (one code point: smollm's first stage, HF Digits(individual_digits=True)) */
static size_t m_n1(const cps *c, size_t pos, size_t end) {
    (void)end;
    return IS_N(pos) ? 1 : 0;
}
/* [\r\n] */
static size_t m_crlf(const cps *c, size_t pos, size_t end) {
    (void)end;
    return IS_CRLF(pos) ? 1 : 0;
}

typedef struct { uint32_t a, b; } cprange;

/* code point i within one of the ranges of a regex llama.cpp runs on code points, where
 * non-ASCII whitespace became \v (so U+3000 is not in "　-。") */
static int in_cpranges(const cprange *r, size_t n, const cps *c, size_t i) {
    const uint32_t x = c->cp[i];
    if (x >= 0x80 && (c->fl[i] & F_WS)) return 0;
    for (size_t k = 0; k < n; k++)
        if (x >= r[k].a && x <= r[k].b) return 1;
    return 0;
}

static const cprange ds_cjk[] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};
static const cprange ds3_cjk[] = {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};
static const cprange ds_punct[] = {{0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
                                   {0x2018, 0x201F}, {0x3000, 0x3002}};

static int ds_latin(uint32_t x) { return cb_tok_is_deepseek_letter(x); }

/* \s?[CLASS]+ */
#define OPT_SPACE_CLASS_RUN(test)                                          \
    do {                                                                   \
        size_t q = pos;                                                    \
        if (IS_WS(pos) && pos + 1 < end && test(pos + 1)) q = pos + 1;     \
        if (!test(q)) return 0;                                            \
        while (q < end && test(q)) q++;                                    \
        return q - pos;                                                    \
    } while (0)

static size_t m_ds_latin(const cps *c, size_t pos, size_t end) {
#define T(i) ds_latin(c->cp[i])
    OPT_SPACE_CLASS_RUN(T);
#undef T
}
static size_t m_ds_punct(const cps *c, size_t pos, size_t end) {
#define T(i) in_cpranges(ds_punct, 6, c, i)
    OPT_SPACE_CLASS_RUN(T);
#undef T
}
static size_t m_ds_cjk(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end && in_cpranges(ds_cjk, 3, c, k)) k++;
    return k - pos;
}
static size_t m_ds3_cjk(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end && in_cpranges(ds3_cjk, 3, c, k)) k++;
    return k - pos;
}
/* \s+$ : only the whitespace run that ends the piece (handled specially by the splitter) */
static size_t m_ws_end(const cps *c, size_t pos, size_t end) {
    const size_t r = run_of(c, pos, end, F_WS);
    return r && pos + r == end ? r : 0;
}

/* DeepSeek-V3, stage 3:
 * [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
 *  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static inline int ascii_alpha(uint32_t x) { return (x >= 'A' && x <= 'Z') || (x >= 'a' && x <= 'z'); }
static inline int ascii_punct(uint32_t x) {
    return (x >= 0x21 && x <= 0x2F) || (x >= 0x3A && x <= 0x40) || (x >= 0x5B && x <= 0x60) ||
           (x >= 0x7B && x <= 0x7E);
}
static size_t m_ds3_main(const cps *c, size_t pos, size_t end) {
    if (ascii_punct(c->cp[pos]) && pos + 1 < end && ascii_alpha(c->cp[pos + 1])) {
        size_t q = pos + 1;
        while (q < end && ascii_alpha(c->cp[q])) q++;
        return q - pos;
    }
    const int x_ok = !IS_CRLF(pos) && !(c->fl[pos] & (F_L | F_P | F_S));
    if (x_ok && pos + 1 < end && (c->fl[pos + 1] & (F_L | F_M))) return 1 + run_of(c, pos + 1, end, F_L | F_M);
    if (c->fl[pos] & (F_L | F_M)) return run_of(c, pos, end, F_L | F_M);
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && (c->fl[pos + 1] & (F_P | F_S))) q = pos + 1;
    if (c->fl[q] & (F_P | F_S)) {
        q += run_of(c, q, end, F_P | F_S);
        while (q < end && IS_CRLF(q)) q++;
        return q - pos;
    }
    const size_t k = ws_newlines(c, pos, end);
    if (k) return k;
    return ws_tail(c, pos, end);
}

typedef struct {
    size_t n;
    matcher m[6];
} pre_stages;

static pre_stages stages_of(cb_pretokenizer pre) {
    pre_stages s;
    memset(&s, 0, sizeof s);
#define ST(...)                                                         \
    do {                                                                \
        const matcher m_[] = {__VA_ARGS__};                             \
        s.n = sizeof m_ / sizeof m_[0];                                 \
        memcpy(s.m, m_, sizeof m_);                                     \
    } while (0)
    switch (pre) {
    case CB_PRE_DEFAULT: ST(m_def_punct, m_gpt2, m_nrun, m_3digits); break;
    case CB_PRE_GPT2: ST(m_gpt2); break;
    case CB_PRE_LLAMA3: ST(m_llama3); break;
    case CB_PRE_QWEN2: ST(m_qwen2); break;
    case CB_PRE_GPT4O: ST(cb_pm_gpt4o); break;
    case CB_PRE_SMOLLM: ST(m_n1, m_gpt2); break;
    case CB_PRE_DEEPSEEK_LLM: ST(m_crlf, m_ds_latin, m_ds_punct, m_ws_end, m_ds_cjk, m_nrun); break;
    case CB_PRE_DEEPSEEK_V3: ST(m_n3, m_ds3_cjk, m_ds3_main); break;
    case CB_PRE_TEKKEN: ST(cb_pm_tekken); break;
    case CB_PRE_GRANITE_97M: ST(cb_pm_granite97m); break;
    case CB_PRE_YOUTU: ST(cb_pm_youtu_cjk, cb_pm_youtu); break;
    case CB_PRE_TINY_AYA: ST(cb_pm_digit_groups, cb_pm_tiny_aya); break;
    case CB_PRE_SEED_CODER: ST(cb_pm_seed_coder); break;
    case CB_PRE_UFAKZEKA: ST(cb_pm_ufakzeka); break;
    case CB_PRE_MINICPM5: ST(m_n3, cb_pm_minicpm5); break;
    case CB_PRE_JAIS2: ST(cb_pm_jais2); break;
    case CB_PRE_QWEN35: ST(cb_pm_qwen35); break;
    case CB_PRE_DEEPSEEK_CODER: ST(m_crlf, cb_pm_ws_letters, cb_pm_ws_punct, cb_pm_dsc_cjk, m_n1); break;
    case CB_PRE_FALCON: ST(cb_pm_falcon_punct, m_gpt2, m_3digits); break;
    case CB_PRE_SPARK2_5: ST(m_n3, m_ds3_cjk, cb_pm_spark_main, m_n1); break;
    case CB_PRE_PORO: ST(cb_pm_poro); break;
    case CB_PRE_VIKING: ST(cb_pm_poro, m_n1); break;
    case CB_PRE_CHAMELEON:
        ST(cb_pm_sentinel, cb_pm_imgimg, cb_pm_cham_ws, m_n1, cb_pm_cham_punct, m_gpt2);
        break;
    case CB_PRE_SUPERBPE: ST(m_nrun, cb_pm_superbpe); break;
    case CB_PRE_EXAONE_MOE: ST(cb_pm_exaone_moe); break;
    case CB_PRE_LAGUNA: ST(cb_pm_newline_runs, m_qwen2); break;
    case CB_PRE_AFMOE: ST(cb_pm_digit_groups, cb_pm_afmoe_cjk, m_ds3_main); break;
    case CB_PRE_KIMI_K2: ST(cb_pm_kimi_k2); break;
    case CB_PRE_NEWLINES: ST(cb_pm_newline_runs); break;
    case CB_PRE_WHITESPACE: ST(cb_pm_nonws); break;
    default: break;
    }
#undef ST
    return s;
}

static int zvec_push2(zvec *a, size_t x, size_t y) {
    if (a->n + 2 > a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 256;
        size_t *nv = cb_realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    a->v[a->n++] = y;
    return 0;
}

/* One stage: every piece of in becomes its matches and the gaps between them. */
static int split_stage(const cps *c, matcher m, const zvec *in, zvec *out) {
    out->n = 0;
    for (size_t i = 0; i < in->n; i += 2) {
        const size_t a = in->v[i], b = in->v[i + 1];
        if (m == m_ws_end) { /* leftmost match of \s+$ is the trailing whitespace run, if any */
            size_t s = b;
            while (s > a && (c->fl[s - 1] & F_WS)) s--;
            if (s > a && zvec_push2(out, a, s)) return -1;
            if (s < b && zvec_push2(out, s, b)) return -1;
            continue;
        }
        size_t gap = a, pos = a;
        while (pos < b) {
            const size_t k = m(c, pos, b);
            if (k == 0) {
                pos++;
                continue;
            }
            if (pos > gap && zvec_push2(out, gap, pos)) return -1;
            if (zvec_push2(out, pos, pos + k)) return -1;
            pos += k;
            gap = pos;
        }
        if (gap < b && zvec_push2(out, gap, b)) return -1;
    }
    return 0;
}

cb_status cb_tok_pretokenize(const cb_tokenizer_t *t, pre_scratch *ps, const uint8_t *s, size_t n,
                             const zvec **pieces) {
    if (n + 1 > ps->cap) {
        size_t nc = ps->cap ? ps->cap : 1024;
        while (nc < n + 1) nc *= 2;
        uint32_t *cp = cb_realloc(ps->cp, nc * sizeof *cp);
        if (cp) ps->cp = cp;
        uint16_t *fl = cb_realloc(ps->fl, nc * sizeof *fl);
        if (fl) ps->fl = fl;
        size_t *bo = cb_realloc(ps->boff, nc * sizeof *bo);
        if (bo) ps->boff = bo;
        if (!cp || !fl || !bo) return NOMEM("code points");
        ps->cap = nc;
    }
    size_t ncp = 0, i = 0;
    while (i < n) {
        uint32_t x;
        int tr;
        int k = cb_utf8_next(s + i, n - i, &x, &tr);
        if (k <= 0) { /* cannot happen on validated text; treat the byte as U+FFFD */
            x = 0xFFFD;
            k = 1;
        }
        ps->cp[ncp] = x;
        ps->fl[ncp] = cpflags(t, x);
        ps->boff[ncp] = i;
        ncp++;
        i += (size_t)k;
    }
    ps->boff[ncp] = n;
    const cps c = {ps->cp, ps->fl};
    const pre_stages st = stages_of(t->pre);
    ps->z[0].n = 0;
    if (zvec_push2(&ps->z[0], 0, ncp)) return NOMEM("pieces");
    int cur = 0;
    for (size_t k = 0; k < st.n; k++) {
        if (split_stage(&c, st.m[k], &ps->z[cur], &ps->z[1 - cur])) return NOMEM("pieces");
        cur = 1 - cur;
    }
    *pieces = &ps->z[cur];
    return CB_OK;
}
