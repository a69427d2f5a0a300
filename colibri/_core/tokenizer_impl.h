/* Private to the tokenizer (include/colibri/tokenizer.h), whose parts are:
 *   tokenizer.c         the handle (vocabulary, merges and special tokens built once), the
 *                       special-token partition, encode, decode and the stream decoder;
 *   tokenizer_spm.c     SentencePiece merging by score, with byte fallback;
 *   tokenizer_bpe.c     byte-level BPE merging by rank, one pre-tokenized word at a time;
 *   tokenizer_pretok.c  the pre-tokenizer regexes as matchers over code points.
 * The design and its invariants are described atop tokenizer.c. The lookups and the bigram heap
 * are static inline here: they are the inner loops of SPM and BPE merging. */
#ifndef COLIBRI_TOKENIZER_IMPL_H
#define COLIBRI_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "colibri/tokenizer.h"

/* ---------------------------------------------------------------------------------------------
 * small helpers */

typedef struct { int32_t *v; size_t n, cap; } ivec;

static inline int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *nv = cb_realloc(a->v, nc * sizeof *nv);
        if (!nv) return -1;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t seed) {
    uint64_t h = seed ^ ((uint64_t)n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w ^ ((uint64_t)n << 59)) * 0x94D049BB133111EBull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    h ^= h >> 32;
    return h;
}

/* Unicode category flags of a code point (unicode_tables.h) */
enum {
    F_L = 1 << 0, F_LU = 1 << 1, F_LL = 1 << 2, F_LT = 1 << 3, F_LM = 1 << 4, F_LO = 1 << 5,
    F_N = 1 << 6, F_P = 1 << 7, F_S = 1 << 8, F_M = 1 << 9, F_WS = 1 << 10,
};

/* flags of a code point outside the BMP (the handle keeps a table for the BMP) */
uint16_t cb_tok_cp_flags_slow(uint32_t cp);
/* whether cp is in the letter ranges of the deepseek-llm pre-tokenizer (unicode_tables.h) */
int cb_tok_is_deepseek_letter(uint32_t cp);

/* ---------------------------------------------------------------------------------------------
 * the handle */

typedef struct trie_node {
    int32_t child, sibling, token;
    uint8_t byte;
} trie_node;

struct cb_tokenizer {
    cb_tokenizer_model model;
    cb_pretokenizer pre;
    int32_t n;
    uint8_t *text;      /* GGUF texts */
    int64_t *off;       /* n+1 */
    float *score;       /* n */
    uint32_t *attr;     /* n */
    uint8_t *piece;     /* rendering with special=1 */
    int64_t *piece_off; /* n+1 */
    /* lookup keys (SPM: the texts; BPE: raw bytes, key_off[i] == key_off[i+1] when not mappable) */
    uint8_t *key;
    int64_t *key_off;
    uint32_t vmask;     /* vocab table: capacity-1 */
    uint64_t *vslot;    /* (fingerprint << 32 | id); fingerprint 0 = empty slot */
    /* merges */
    int32_t n_merges;
    uint8_t *mkey;      /* left ++ right raw bytes */
    int64_t *moff;      /* n_merges+1 */
    uint32_t *mleft;    /* length of the left part */
    uint32_t mmask;
    uint32_t *mfp;
    int32_t *midx;      /* merge index = rank */
    /* special tokens */
    int32_t n_special;
    int32_t *special_rank; /* per token: rank in the partition order, -1 if not special */
    trie_node *trie;
    int32_t n_trie;
    uint8_t first_any[256], first_user[256]; /* first bytes of all / non-control special tokens */
    int32_t byte_tok[256];
    int32_t bos, eos;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    unsigned bpe_flags;  /* CB_BPE_* */
    int spm_text;        /* token texts are the lookup keys and render as SPM's (SPM, raw BPE) */
    uint16_t *bmp_flags; /* category flags of U+0000..U+FFFF */
};

static inline uint16_t cpflags(const cb_tokenizer_t *t, uint32_t cp) {
    return cp < 0x10000 ? t->bmp_flags[cp] : cb_tok_cp_flags_slow(cp);
}

/* vocabulary lookup: id of the token whose key is p[0..n), or -1 */
static inline int32_t vocab_find(const cb_tokenizer_t *t, const uint8_t *p, size_t n) {
    const uint64_t h = hash_bytes(p, n, 0x1234567ull);
    const uint32_t fp = (uint32_t)(h >> 32) | 1u;
    uint32_t i = (uint32_t)h & t->vmask;
    for (;;) {
        const uint64_t slot = t->vslot[i];
        const uint32_t f = (uint32_t)(slot >> 32);
        if (f == 0) return -1;
        if (f == fp) {
            const int32_t id = (int32_t)(uint32_t)slot;
            const int64_t a = t->key_off[id], b = t->key_off[id + 1];
            if ((size_t)(b - a) == n && memcmp(t->key + a, p, n) == 0) return id;
        }
        i = (i + 1) & t->vmask;
    }
}

/* merge rank of (p[0..nl), p[nl..n)), or -1 */
static inline int32_t merge_find(const cb_tokenizer_t *t, const uint8_t *p, size_t nl, size_t n) {
    if (!t->n_merges) return -1;
    const uint64_t h = hash_bytes(p, n, 0x7654321ull + nl);
    const uint32_t fp = (uint32_t)(h >> 32) | 1u;
    uint32_t i = (uint32_t)h & t->mmask;
    for (;;) {
        const uint32_t f = t->mfp[i];
        if (f == 0) return -1;
        if (f == fp) {
            const int32_t m = t->midx[i];
            const int64_t a = t->moff[m], b = t->moff[m + 1];
            if ((size_t)(b - a) == n && t->mleft[m] == nl && memcmp(t->mkey + a, p, n) == 0) return m;
        }
        i = (i + 1) & t->mmask;
    }
}

#define NOMEM(what) cb_fail(CB_STATUS_OUT_OF_MEMORY, "tokenizer: cannot allocate %s", what)

/* ---------------------------------------------------------------------------------------------
 * merging: symbols in a linked list, candidate bigrams in a binary heap */

typedef struct { int32_t prev, next; uint32_t off, n; } sym;
typedef struct { float key; int32_t left, right; uint32_t size; } bigram; /* key: score (SPM) or -rank (BPE) */

typedef struct {
    sym *s;
    size_t ns, caps;
    bigram *h;
    size_t nh, caph;
} merger;

static inline int bg_before(const bigram *a, const bigram *b) {
    return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static inline int heap_push(merger *m, bigram b) {
    if (m->nh == m->caph) {
        size_t nc = m->caph ? m->caph * 2 : 256;
        bigram *nv = cb_realloc(m->h, nc * sizeof *nv);
        if (!nv) return -1;
        m->h = nv;
        m->caph = nc;
    }
    size_t i = m->nh++;
    while (i > 0) {
        const size_t parent = (i - 1) / 2;
        if (!bg_before(&b, &m->h[parent])) break;
        m->h[i] = m->h[parent];
        i = parent;
    }
    m->h[i] = b;
    return 0;
}

static inline bigram heap_pop(merger *m) {
    const bigram top = m->h[0];
    const bigram last = m->h[--m->nh];
    size_t i = 0;
    const size_t n = m->nh;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bg_before(&m->h[c + 1], &m->h[c])) c++;
        if (!bg_before(&m->h[c], &last)) break;
        m->h[i] = m->h[c];
        i = c;
    }
    if (n) m->h[i] = last;
    return top;
}

static inline int syms_reserve(merger *m, size_t n) {
    if (n <= m->caps) return 0;
    size_t nc = m->caps ? m->caps : 256;
    while (nc < n) nc *= 2;
    sym *nv = cb_realloc(m->s, nc * sizeof *nv);
    if (!nv) return -1;
    m->s = nv;
    m->caps = nc;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * pre-tokenizer scratch (per encode call) */

typedef struct { size_t *v; size_t n, cap; } zvec; /* piece boundaries: pairs (start, end) */

typedef struct {
    uint32_t *cp;
    uint16_t *fl;
    size_t *boff;
    size_t cap;
    zvec z[2];
} pre_scratch;

/* ---------------------------------------------------------------------------------------------
 * the parts */

/* tokenizer_spm.c: the whole (escaped) fragment s[0..n) */
cb_status cb_tok_spm_tokenize(const cb_tokenizer_t *t, merger *m, const uint8_t *s, size_t n, ivec *out);

/* tokenizer_bpe.c: a text fragment s[0..n), pre-tokenized, each word merged */
cb_status cb_tok_bpe_fragment(const cb_tokenizer_t *t, merger *m, pre_scratch *ps, const uint8_t *s,
                              size_t n, ivec *out);

/* tokenizer_pretok.c: splits s[0..n) with t's pre-tokenizer; *pieces holds pairs (start, end) of
 * code point indices into ps (ps->boff[i]: byte offset of code point i; ps->boff[ncp] == n) */
cb_status cb_tok_pretokenize(const cb_tokenizer_t *t, pre_scratch *ps, const uint8_t *s, size_t n,
                             const zvec **pieces);

#endif
