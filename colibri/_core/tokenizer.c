/* The tokenizer (include/colibri/tokenizer.h): SentencePiece-style BPE by scores with byte
 * fallback, byte-level BPE by merge rank behind regex pre-tokenizers, special-token partitioning,
 * decoding and the stream decoder. The algorithms follow llama.cpp's llama-vocab.cpp so that ids
 * are identical to llama.cpp's; the code is our own.
 *
 * Layout and invariants
 *  - Every array of the params is copied at creation; the handle is immutable afterwards, so
 *    encode/decode are reentrant. All per-call scratch is allocated per call.
 *  - Vocabulary lookup is one open-addressing hash table from key bytes to token id, built once.
 *    For SPM the key is the GGUF text; for byte-level BPE it is the text mapped back from the GPT-2
 *    byte alphabet to raw bytes (tokens with characters outside that alphabet can never be formed
 *    by merges and are left out), so that BPE runs on raw bytes without re-encoding the input.
 *  - Merges (BPE) live in a second table keyed by (left bytes ++ right bytes, length of left).
 *  - SPM merging is llama.cpp's: a linked list of symbols (one per UTF-8 character) and a binary
 *    heap of candidate bigrams ordered by (score desc, left position asc); stale candidates are
 *    skipped when popped. BPE merging is the same with (rank asc, left asc). O(n log n).
 *  - Special tokens (control, user-defined, unknown) are found with a byte trie; the partition is
 *    llama.cpp's: tokens are applied longest first (ties: lower id first), each taking its
 *    leftmost non-overlapping occurrences in the text not yet claimed. User-defined tokens are
 *    always recognised, control and unknown ones only with CB_ENCODE_PARSE_SPECIAL.
 *  - Pre-tokenizer regexes are hand-written matchers over code points and category flags
 *    (unicode_tables.h); a pre-tokenizer is a list of stages, each splitting every piece of the
 *    previous stage into its matches and the gaps between them (HF Split "isolated").
 */
#include "colibri/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "unicode_tables.h"

/* ---------------------------------------------------------------------------------------------
 * small helpers */

typedef struct { int32_t *v; size_t n, cap; } ivec;

static int ivec_push(ivec *a, int32_t x) {
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

static uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t seed) {
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

static const uint8_t utf8_len_tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};

/* GPT-2 byte alphabet: byte b <-> code point byte_cp[b]. */
static void byte_alphabet(uint32_t byte_cp[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        const int direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_cp[b] = direct ? (uint32_t)b : (uint32_t)(256 + k++);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Unicode categories */

enum {
    F_L = 1 << 0, F_LU = 1 << 1, F_LL = 1 << 2, F_LT = 1 << 3, F_LM = 1 << 4, F_LO = 1 << 5,
    F_N = 1 << 6, F_P = 1 << 7, F_S = 1 << 8, F_M = 1 << 9, F_WS = 1 << 10,
};

static uint16_t group_flags(uint32_t g) {
    switch (g) {
    case CB_UC_LU: return F_L | F_LU;
    case CB_UC_LL: return F_L | F_LL;
    case CB_UC_LT: return F_L | F_LT;
    case CB_UC_LM: return F_L | F_LM;
    case CB_UC_LO: return F_L | F_LO;
    case CB_UC_M: return F_M;
    case CB_UC_N: return F_N;
    case CB_UC_P: return F_P;
    case CB_UC_S: return F_S;
    default: return 0;
    }
}

static int in_ranges(const cb_uc_range *r, size_t n, uint32_t cp, uint32_t *value) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (cp < r[mid].first) hi = mid;
        else if (cp > r[mid].last) lo = mid + 1;
        else {
            if (value) *value = r[mid].value;
            return 1;
        }
    }
    return 0;
}

static uint16_t cp_flags_slow(uint32_t cp) {
    uint32_t g = 0;
    uint16_t f = in_ranges(cb_uc_cat_ranges, CB_UC_CAT_RANGES_N, cp, &g) ? group_flags(g) : 0;
    if (in_ranges(cb_uc_space_ranges, CB_UC_SPACE_RANGES_N, cp, NULL)) f |= F_WS;
    return f;
}

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
    uint16_t *bmp_flags; /* category flags of U+0000..U+FFFF */
};

cb_tokenizer_params cb_tokenizer_default_params(void) {
    cb_tokenizer_params p;
    memset(&p, 0, sizeof p);
    p.bos_id = -1;
    p.eos_id = -1;
    return p;
}

int32_t cb_tokenizer_n_tokens(const cb_tokenizer_t *tok) { return tok ? tok->n : 0; }

void cb_tokenizer_buffer_free(void *p) { free(p); }

void cb_tokenizer_free(cb_tokenizer_t *t) {
    if (!t) return;
    free(t->text); free(t->off); free(t->score); free(t->attr); free(t->piece); free(t->piece_off);
    free(t->key); free(t->key_off); free(t->vslot);
    free(t->mkey); free(t->moff); free(t->mleft); free(t->mfp); free(t->midx);
    free(t->special_rank); free(t->trie); free(t->bmp_flags);
    free(t);
}

static inline uint16_t cpflags(const cb_tokenizer_t *t, uint32_t cp) {
    return cp < 0x10000 ? t->bmp_flags[cp] : cp_flags_slow(cp);
}

/* vocabulary lookup: id of the token whose key is p[0..n), or -1 */
static int32_t vocab_find(const cb_tokenizer_t *t, const uint8_t *p, size_t n) {
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
static int32_t merge_find(const cb_tokenizer_t *t, const uint8_t *p, size_t nl, size_t n) {
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

static uint32_t table_mask(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    return (uint32_t)(cap - 1);
}

/* Maps GGUF text in the GPT-2 byte alphabet back to bytes; returns the length, or -1 when the text
 * has a character outside the alphabet. out has room for n bytes. */
static long unmap_bytes(const uint8_t *s, size_t n, const int16_t *cp_byte, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int tr;
        const int k = cb_utf8_next(s + i, n - i, &cp, &tr);
        if (k <= 0 || cp >= 512 || cp_byte[cp] < 0) return -1;
        out[o++] = (uint8_t)cp_byte[cp];
        i += (size_t)k;
    }
    return (long)o;
}

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

#define NOMEM(what) cb_fail(CB_STATUS_OUT_OF_MEMORY, "tokenizer: cannot allocate %s", what)

static cb_status build_pieces(cb_tokenizer_t *t, const int16_t *cp_byte) {
    const int64_t total = t->off[t->n];
    /* a piece is never longer than its text */
    t->piece = cb_malloc((size_t)total + 1);
    t->piece_off = cb_malloc(((size_t)t->n + 1) * sizeof(int64_t));
    if (!t->piece || !t->piece_off) return NOMEM("token pieces");
    int64_t o = 0;
    for (int32_t i = 0; i < t->n; i++) {
        t->piece_off[i] = o;
        const uint8_t *s = t->text + t->off[i];
        const size_t n = (size_t)(t->off[i + 1] - t->off[i]);
        const uint32_t a = t->attr[i];
        uint8_t *dst = t->piece + o;
        if (a & (CB_TOKEN_ATTR_UNKNOWN | CB_TOKEN_ATTR_CONTROL | CB_TOKEN_ATTR_USER_DEFINED)) {
            memcpy(dst, s, n);
            o += (int64_t)n;
        } else if (a & CB_TOKEN_ATTR_NORMAL) {
            if (t->model == CB_TOKENIZER_SPM) {
                size_t j = 0;
                while (j < n) {
                    if (j + 3 <= n && s[j] == 0xE2 && s[j + 1] == 0x96 && s[j + 2] == 0x81) {
                        dst[0] = ' ';
                        dst++;
                        o++;
                        j += 3;
                    } else {
                        *dst++ = s[j++];
                        o++;
                    }
                }
            } else {
                /* byte alphabet back to bytes; characters outside it are kept as they are */
                size_t j = 0;
                while (j < n) {
                    uint32_t cp;
                    int tr;
                    const int k = cb_utf8_next(s + j, n - j, &cp, &tr);
                    if (k > 0 && cp < 512 && cp_byte[cp] >= 0) {
                        *dst++ = (uint8_t)cp_byte[cp];
                        o++;
                        j += (size_t)k;
                    } else {
                        const size_t len = k > 0 ? (size_t)k : (size_t)(-k);
                        memcpy(dst, s + j, len);
                        dst += len;
                        o += (int64_t)len;
                        j += len;
                    }
                }
            }
        } else if ((a & CB_TOKEN_ATTR_BYTE) && t->model == CB_TOKENIZER_SPM) {
            if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
                hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
                *dst = (uint8_t)(hexval(s[3]) * 16 + hexval(s[4]));
                o++;
            } else {
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "tokenizer: byte token %d is not of the form <0xNN>", i);
            }
        }
        /* unused / undefined / BPE byte tokens render as nothing (as in llama.cpp) */
    }
    t->piece_off[t->n] = o;
    return CB_OK;
}

static cb_status build_vocab_table(cb_tokenizer_t *t, const int16_t *cp_byte) {
    const int64_t total = t->off[t->n];
    t->key_off = cb_malloc(((size_t)t->n + 1) * sizeof(int64_t));
    if (!t->key_off) return NOMEM("vocabulary keys");
    if (t->model == CB_TOKENIZER_SPM) {
        t->key = cb_malloc((size_t)total + 1);
        if (!t->key) return NOMEM("vocabulary keys");
        memcpy(t->key, t->text, (size_t)total);
        memcpy(t->key_off, t->off, ((size_t)t->n + 1) * sizeof(int64_t));
    } else {
        t->key = cb_malloc((size_t)total + 1);
        if (!t->key) return NOMEM("vocabulary keys");
        int64_t o = 0;
        for (int32_t i = 0; i < t->n; i++) {
            t->key_off[i] = o;
            const long k = unmap_bytes(t->text + t->off[i], (size_t)(t->off[i + 1] - t->off[i]),
                                       cp_byte, t->key + o);
            if (k > 0) o += k;
        }
        t->key_off[t->n] = o;
    }
    t->vmask = table_mask((size_t)t->n);
    t->vslot = cb_calloc((size_t)t->vmask + 1, sizeof(uint64_t));
    if (!t->vslot) return NOMEM("vocabulary table");
    for (int32_t id = 0; id < t->n; id++) {
        const uint8_t *k = t->key + t->key_off[id];
        const size_t kn = (size_t)(t->key_off[id + 1] - t->key_off[id]);
        if (kn == 0) continue; /* not formable */
        if (vocab_find(t, k, kn) >= 0) {
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "tokenizer: token %d duplicates the text of token %d", id,
                           vocab_find(t, k, kn));
        }
        const uint64_t h = hash_bytes(k, kn, 0x1234567ull);
        uint32_t i = (uint32_t)h & t->vmask;
        while (t->vslot[i]) i = (i + 1) & t->vmask;
        t->vslot[i] = ((uint64_t)((uint32_t)(h >> 32) | 1u) << 32) | (uint32_t)id;
    }
    return CB_OK;
}

static cb_status build_merges(cb_tokenizer_t *t, const cb_tokenizer_params *p, const int16_t *cp_byte) {
    const int32_t nm = p->n_merges;
    t->n_merges = 0;
    if (nm <= 0) return CB_OK;
    const int64_t total = p->merge_offsets[nm];
    t->mkey = cb_malloc((size_t)total + 1);
    t->moff = cb_malloc(((size_t)nm + 1) * sizeof(int64_t));
    t->mleft = cb_malloc(((size_t)nm + 1) * sizeof(uint32_t));
    t->mmask = table_mask((size_t)nm);
    t->mfp = cb_calloc((size_t)t->mmask + 1, sizeof(uint32_t));
    t->midx = cb_malloc(((size_t)t->mmask + 1) * sizeof(int32_t));
    if (!t->mkey || !t->moff || !t->mleft || !t->mfp || !t->midx) return NOMEM("merges");
    t->n_merges = nm;
    int64_t o = 0;
    for (int32_t m = 0; m < nm; m++) {
        t->moff[m] = o;
        t->mleft[m] = 0;
        const uint8_t *s = p->merges + p->merge_offsets[m];
        const size_t n = (size_t)(p->merge_offsets[m + 1] - p->merge_offsets[m]);
        /* split at the first space after the first byte (llama.cpp: word.find(' ', 1)) */
        size_t sp = 1;
        while (sp < n && s[sp] != ' ') sp++;
        if (n < 2 || sp >= n) continue;
        const long l = unmap_bytes(s, sp, cp_byte, t->mkey + o);
        if (l <= 0) continue;
        const long r = unmap_bytes(s + sp + 1, n - sp - 1, cp_byte, t->mkey + o + l);
        if (r <= 0) continue;
        t->moff[m + 1] = o + l + r; /* provisional, for merge_find */
        t->mleft[m] = (uint32_t)l;
        if (merge_find(t, t->mkey + o, (size_t)l, (size_t)(l + r)) >= 0) continue; /* first wins */
        const uint64_t h = hash_bytes(t->mkey + o, (size_t)(l + r), 0x7654321ull + (uint64_t)l);
        uint32_t i = (uint32_t)h & t->mmask;
        while (t->mfp[i]) i = (i + 1) & t->mmask;
        t->mfp[i] = (uint32_t)(h >> 32) | 1u;
        t->midx[i] = m;
        o += l + r;
    }
    t->moff[nm] = o;
    return CB_OK;
}

typedef struct { int32_t len, id; } len_id;

static int cmp_special(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static cb_status build_specials(cb_tokenizer_t *t) {
    const uint32_t special = CB_TOKEN_ATTR_CONTROL | CB_TOKEN_ATTR_USER_DEFINED | CB_TOKEN_ATTR_UNKNOWN;
    int32_t ns = 0;
    int64_t nodes = 1;
    for (int32_t i = 0; i < t->n; i++) {
        if (t->attr[i] & special) {
            ns++;
            nodes += t->off[i + 1] - t->off[i];
        }
    }
    t->special_rank = cb_malloc((size_t)t->n * sizeof(int32_t));
    len_id *order = cb_malloc(((size_t)ns + 1) * sizeof(len_id));
    t->trie = cb_malloc((size_t)nodes * sizeof(trie_node));
    if (!t->special_rank || !order || !t->trie) {
        free(order);
        return NOMEM("special tokens");
    }
    ns = 0;
    for (int32_t i = 0; i < t->n; i++) {
        t->special_rank[i] = -1;
        if (t->attr[i] & special) {
            order[ns].len = (int32_t)(t->off[i + 1] - t->off[i]);
            order[ns].id = i;
            ns++;
        }
    }
    qsort(order, (size_t)ns, sizeof *order, cmp_special);
    t->n_special = ns;
    t->trie[0] = (trie_node){-1, -1, -1, 0};
    t->n_trie = 1;
    memset(t->first_any, 0, 256);
    memset(t->first_user, 0, 256);
    for (int32_t r = 0; r < ns; r++) {
        const int32_t id = order[r].id;
        t->special_rank[id] = r;
        const uint8_t *s = t->text + t->off[id];
        const size_t n = (size_t)order[r].len;
        t->first_any[s[0]] = 1;
        if (!(t->attr[id] & (CB_TOKEN_ATTR_CONTROL | CB_TOKEN_ATTR_UNKNOWN))) t->first_user[s[0]] = 1;
        int32_t node = 0;
        for (size_t j = 0; j < n; j++) {
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != s[j]) c = t->trie[c].sibling;
            if (c < 0) {
                c = t->n_trie++;
                t->trie[c] = (trie_node){-1, t->trie[node].child, -1, s[j]};
                t->trie[node].child = c;
            }
            node = c;
        }
        t->trie[node].token = id;
    }
    free(order);
    return CB_OK;
}

cb_status cb_tokenizer_new(const cb_tokenizer_params *p, cb_tokenizer_t **out) {
    if (!p || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: NULL argument");
    *out = NULL;
    if (p->model != CB_TOKENIZER_SPM && p->model != CB_TOKENIZER_BPE)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: unknown model %d", (int)p->model);
    if (p->model == CB_TOKENIZER_BPE && (p->pre < CB_PRE_DEFAULT || p->pre > CB_PRE_GPT4O))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: unknown pre-tokenizer %d", (int)p->pre);
    if (p->n_tokens < 1 || !p->text || !p->text_offsets || !p->attrs)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: empty vocabulary (%d tokens)", p->n_tokens);
    if (p->n_merges < 0 || (p->n_merges > 0 && (!p->merges || !p->merge_offsets)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: bad merges (%d)", p->n_merges);
    const int32_t n = p->n_tokens;
    if (p->text_offsets[0] != 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: text_offsets[0] = %lld, not 0",
                       (long long)p->text_offsets[0]);
    for (int32_t i = 0; i < n; i++) {
        if (p->text_offsets[i + 1] <= p->text_offsets[i])
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: token %d has an empty or negative length", i);
        if (p->scores && isnan(p->scores[i]))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: token %d has a NaN score", i);
    }
    if (p->n_merges > 0) {
        if (p->merge_offsets[0] != 0)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: merge_offsets[0] is not 0");
        for (int32_t m = 0; m < p->n_merges; m++)
            if (p->merge_offsets[m + 1] < p->merge_offsets[m])
                return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: merge %d has a negative length", m);
    }
    if (p->bos_id < -1 || p->bos_id >= n || p->eos_id < -1 || p->eos_id >= n)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: bos %d / eos %d out of range [0, %d)",
                       p->bos_id, p->eos_id, n);
    if ((p->add_bos && p->bos_id < 0) || (p->add_eos && p->eos_id < 0))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_new: add_bos/add_eos set without a bos/eos id");

    cb_tokenizer_t *t = cb_calloc(1, sizeof *t);
    if (!t) return NOMEM("handle");
    t->model = p->model;
    t->pre = p->model == CB_TOKENIZER_BPE ? p->pre : CB_PRE_NONE;
    t->n = n;
    t->bos = p->bos_id;
    t->eos = p->eos_id;
    t->add_bos = p->add_bos != 0;
    t->add_eos = p->add_eos != 0;
    t->add_space_prefix = p->model == CB_TOKENIZER_SPM && p->add_space_prefix;
    t->ignore_merges = p->ignore_merges != 0;
    const int64_t total = p->text_offsets[n];
    t->text = cb_malloc((size_t)total + 1);
    t->off = cb_malloc(((size_t)n + 1) * sizeof(int64_t));
    t->score = cb_malloc((size_t)n * sizeof(float));
    t->attr = cb_malloc((size_t)n * sizeof(uint32_t));
    t->bmp_flags = cb_malloc(0x10000 * sizeof(uint16_t));
    cb_status st = CB_OK;
    if (!t->text || !t->off || !t->score || !t->attr || !t->bmp_flags) {
        st = NOMEM("vocabulary");
        goto fail;
    }
    memcpy(t->text, p->text, (size_t)total);
    memcpy(t->off, p->text_offsets, ((size_t)n + 1) * sizeof(int64_t));
    for (int32_t i = 0; i < n; i++) t->score[i] = p->scores ? p->scores[i] : 0.0f;
    memcpy(t->attr, p->attrs, (size_t)n * sizeof(uint32_t));

    /* category flags of the BMP, by walking the sorted range tables once */
    memset(t->bmp_flags, 0, 0x10000 * sizeof(uint16_t));
    for (size_t r = 0; r < CB_UC_CAT_RANGES_N && cb_uc_cat_ranges[r].first < 0x10000; r++) {
        const uint16_t f = group_flags(cb_uc_cat_ranges[r].value);
        const uint32_t last = cb_uc_cat_ranges[r].last < 0xFFFF ? cb_uc_cat_ranges[r].last : 0xFFFF;
        for (uint32_t c = cb_uc_cat_ranges[r].first; c <= last; c++) t->bmp_flags[c] = f;
    }
    for (size_t r = 0; r < CB_UC_SPACE_RANGES_N; r++)
        for (uint32_t c = cb_uc_space_ranges[r].first; c <= cb_uc_space_ranges[r].last && c < 0x10000; c++)
            t->bmp_flags[c] |= F_WS;

    uint32_t byte_cp[256];
    int16_t cp_byte[512];
    byte_alphabet(byte_cp);
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_byte[byte_cp[b]] = (int16_t)b;

    if ((st = build_pieces(t, cp_byte)) != CB_OK) goto fail;
    if ((st = build_vocab_table(t, cp_byte)) != CB_OK) goto fail;
    if (t->model == CB_TOKENIZER_BPE && (st = build_merges(t, p, cp_byte)) != CB_OK) goto fail;
    if ((st = build_specials(t)) != CB_OK) goto fail;

    for (int b = 0; b < 256; b++) {
        const uint8_t one = (uint8_t)b;
        if (t->model == CB_TOKENIZER_SPM) {
            static const char hex[] = "0123456789ABCDEF";
            const uint8_t name[6] = {'<', '0', 'x', (uint8_t)hex[b >> 4], (uint8_t)hex[b & 15], '>'};
            int32_t id = vocab_find(t, name, 6);
            if (id < 0) id = vocab_find(t, &one, 1);
            t->byte_tok[b] = id;
        } else {
            t->byte_tok[b] = vocab_find(t, &one, 1);
        }
    }
    *out = t;
    return CB_OK;
fail:
    cb_tokenizer_free(t);
    return st;
}

cb_status cb_tokenizer_piece(const cb_tokenizer_t *t, int32_t id, int special, const uint8_t **piece,
                             size_t *len) {
    if (!t || !piece || !len) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_piece: NULL argument");
    if (id < 0 || id >= t->n)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "token id %d out of range [0, %d)", id, t->n);
    *piece = t->piece + t->piece_off[id];
    *len = (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
    if (!special && (t->attr[id] & (CB_TOKEN_ATTR_UNKNOWN | CB_TOKEN_ATTR_CONTROL))) *len = 0;
    return CB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * special-token partition */

typedef struct { uint32_t pos; int32_t tok; } cand;
typedef struct { size_t start, len; int32_t tok; } frag; /* tok >= 0: a special token */

static int cmp_cand_pos(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Splits s[0..n) into text fragments and special tokens. *frags is malloc'd. */
static cb_status partition(const cb_tokenizer_t *t, const uint8_t *s, size_t n, int parse_special,
                           frag **frags, size_t *nfrags) {
    *frags = NULL;
    *nfrags = 0;
    const uint8_t *first = parse_special ? t->first_any : t->first_user;
    cand *c = NULL;
    size_t nc = 0, capc = 0;
    for (size_t pos = 0; pos < n; pos++) {
        if (!first[s[pos]]) continue;
        int32_t node = 0;
        for (size_t j = pos; j < n; j++) {
            int32_t ch = t->trie[node].child;
            while (ch >= 0 && t->trie[ch].byte != s[j]) ch = t->trie[ch].sibling;
            if (ch < 0) break;
            node = ch;
            const int32_t tk = t->trie[node].token;
            if (tk >= 0 && (parse_special || !(t->attr[tk] & (CB_TOKEN_ATTR_CONTROL | CB_TOKEN_ATTR_UNKNOWN)))) {
                if (nc == capc) {
                    capc = capc ? capc * 2 : 256;
                    cand *nv = cb_realloc(c, capc * sizeof *nv);
                    if (!nv) {
                        free(c);
                        return NOMEM("special-token candidates");
                    }
                    c = nv;
                }
                c[nc].pos = (uint32_t)pos;
                c[nc].tok = tk;
                nc++;
            }
        }
    }
    cand *acc = NULL;
    size_t nacc = 0;
    if (nc) {
        /* stable counting sort by rank keeps positions ascending within a rank */
        const int32_t nr = t->n_special;
        size_t *cnt = cb_calloc((size_t)nr + 1, sizeof(size_t));
        cand *sorted = cb_malloc(nc * sizeof *sorted);
        uint8_t *covered = cb_calloc(n, 1);
        acc = cb_malloc(nc * sizeof *acc);
        if (!cnt || !sorted || !covered || !acc) {
            free(cnt); free(sorted); free(covered); free(acc); free(c);
            return NOMEM("special-token partition");
        }
        for (size_t i = 0; i < nc; i++) cnt[t->special_rank[c[i].tok] + 1]++;
        for (int32_t r = 0; r < nr; r++) cnt[r + 1] += cnt[r];
        for (size_t i = 0; i < nc; i++) sorted[cnt[t->special_rank[c[i].tok]]++] = c[i];
        for (size_t i = 0; i < nc; i++) {
            const size_t p0 = sorted[i].pos;
            const size_t len = (size_t)(t->off[sorted[i].tok + 1] - t->off[sorted[i].tok]);
            int free_span = 1;
            for (size_t j = p0; j < p0 + len; j++) {
                if (covered[j]) {
                    free_span = 0;
                    break;
                }
            }
            if (!free_span) continue;
            memset(covered + p0, 1, len);
            acc[nacc++] = sorted[i];
        }
        free(cnt);
        free(sorted);
        free(covered);
        qsort(acc, nacc, sizeof *acc, cmp_cand_pos);
    }
    free(c);
    frag *f = cb_malloc((2 * nacc + 1) * sizeof *f);
    if (!f) {
        free(acc);
        return NOMEM("fragments");
    }
    size_t nf = 0, pos = 0;
    for (size_t i = 0; i < nacc; i++) {
        if (acc[i].pos > pos) f[nf++] = (frag){pos, acc[i].pos - pos, -1};
        const size_t len = (size_t)(t->off[acc[i].tok + 1] - t->off[acc[i].tok]);
        f[nf++] = (frag){acc[i].pos, len, acc[i].tok};
        pos = acc[i].pos + len;
    }
    if (pos < n) f[nf++] = (frag){pos, n - pos, -1};
    free(acc);
    *frags = f;
    *nfrags = nf;
    return CB_OK;
}

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

static int heap_push(merger *m, bigram b) {
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

static bigram heap_pop(merger *m) {
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

static int syms_reserve(merger *m, size_t n) {
    if (n <= m->caps) return 0;
    size_t nc = m->caps ? m->caps : 256;
    while (nc < n) nc *= 2;
    sym *nv = cb_realloc(m->s, nc * sizeof *nv);
    if (!nv) return -1;
    m->s = nv;
    m->caps = nc;
    return 0;
}

/* SPM: the whole (escaped) fragment s[0..n) */
static int spm_try_bigram(const cb_tokenizer_t *t, merger *m, const uint8_t *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const uint32_t size = m->s[l].n + m->s[r].n;
    const int32_t id = vocab_find(t, s + m->s[l].off, size);
    if (id < 0) return 0;
    return heap_push(m, (bigram){t->score[id], l, r, size});
}

static cb_status spm_tokenize(const cb_tokenizer_t *t, merger *m, const uint8_t *s, size_t n, ivec *out) {
    m->ns = 0;
    m->nh = 0;
    if (n == 0) return CB_OK;
    if (syms_reserve(m, n)) return NOMEM("symbols");
    size_t off = 0;
    int32_t idx = 0;
    while (off < n) {
        size_t len = utf8_len_tab[s[off] >> 4];
        if (len > n - off) len = n - off;
        m->s[idx] = (sym){idx - 1, off + len == n ? -1 : idx + 1, (uint32_t)off, (uint32_t)len};
        off += len;
        idx++;
    }
    m->ns = (size_t)idx;
    for (int32_t i = 1; i < idx; i++)
        if (spm_try_bigram(t, m, s, i - 1, i)) return NOMEM("bigrams");
    while (m->nh) {
        const bigram b = heap_pop(m);
        sym *L = &m->s[b.left], *R = &m->s[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) m->s[R->next].prev = b.left;
        if (spm_try_bigram(t, m, s, L->prev, b.left) || spm_try_bigram(t, m, s, b.left, L->next))
            return NOMEM("bigrams");
    }
    for (int32_t i = 0; i != -1; i = m->s[i].next) {
        const sym *y = &m->s[i];
        const int32_t id = vocab_find(t, s + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(out, id)) return NOMEM("ids");
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            const uint8_t byte = s[y->off + j];
            if (t->byte_tok[byte] < 0)
                return cb_fail(CB_STATUS_UNSUPPORTED,
                               "tokenizer: the vocabulary has no byte token for 0x%02X (needed at byte %u)",
                               byte, y->off + j);
            if (ivec_push(out, t->byte_tok[byte])) return NOMEM("ids");
        }
    }
    return CB_OK;
}

/* BPE: one pre-tokenized word w[0..n) of raw bytes */
static int bpe_try_bigram(const cb_tokenizer_t *t, merger *m, const uint8_t *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const uint32_t size = m->s[l].n + m->s[r].n;
    const int32_t rank = merge_find(t, w + m->s[l].off, m->s[l].n, size);
    if (rank < 0) return 0;
    return heap_push(m, (bigram){-(float)rank, l, r, size});
}

static cb_status bpe_word(const cb_tokenizer_t *t, merger *m, const uint8_t *w, size_t n, ivec *out) {
    if (n == 0) return CB_OK;
    if (t->ignore_merges || n == 1) {
        const int32_t id = vocab_find(t, w, n);
        if (id >= 0) return ivec_push(out, id) ? NOMEM("ids") : CB_OK;
    }
    if (syms_reserve(m, n)) return NOMEM("symbols");
    m->nh = 0;
    for (size_t i = 0; i < n; i++)
        m->s[i] = (sym){(int32_t)i - 1, i + 1 == n ? -1 : (int32_t)i + 1, (uint32_t)i, 1};
    m->ns = n;
    for (size_t i = 1; i < n; i++)
        if (bpe_try_bigram(t, m, w, (int32_t)i - 1, (int32_t)i)) return NOMEM("bigrams");
    while (m->nh) {
        const bigram b = heap_pop(m);
        sym *L = &m->s[b.left], *R = &m->s[b.right];
        if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) m->s[R->next].prev = b.left;
        if (bpe_try_bigram(t, m, w, L->prev, b.left) || bpe_try_bigram(t, m, w, b.left, L->next))
            return NOMEM("bigrams");
    }
    for (int32_t i = 0; i != -1; i = m->s[i].next) {
        const sym *y = &m->s[i];
        const int32_t id = vocab_find(t, w + y->off, y->n);
        if (id >= 0) {
            if (ivec_push(out, id)) return NOMEM("ids");
            continue;
        }
        for (uint32_t j = 0; j < y->n; j++) {
            const int32_t b = t->byte_tok[w[y->off + j]];
            if (b >= 0 && ivec_push(out, b)) return NOMEM("ids"); /* llama.cpp drops missing bytes */
        }
    }
    return CB_OK;
}

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

static size_t run_of(const cps *c, size_t i, size_t end, uint16_t mask) {
    size_t k = i;
    while (k < end && (c->fl[k] & mask)) k++;
    return k - i;
}

/* not \s, \p{L}, \p{N} */
static inline int is_other(const cps *c, size_t i) { return !(c->fl[i] & (F_WS | F_L | F_N)); }

static size_t other_run(const cps *c, size_t i, size_t end) {
    size_t k = i;
    while (k < end && is_other(c, k)) k++;
    return k - i;
}

static inline uint32_t lower_ascii(uint32_t x) { return x >= 'A' && x <= 'Z' ? x + 32 : x; }

/* 's 't 're 've 'm 'll 'd; icase: ASCII case-insensitive */
static size_t contraction(const cps *c, size_t pos, size_t end, int icase) {
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
static size_t ws_tail(const cps *c, size_t pos, size_t end) {
    const size_t r = run_of(c, pos, end, F_WS);
    if (r == 0) return 0;
    if (pos + r == end || r == 1) return r; /* \s+(?!\S) matched whole, or \s+ */
    return r - 1;                           /* leave the last space to the next word */
}

/* \s*[\r\n]+ */
static size_t ws_newlines(const cps *c, size_t pos, size_t end) {
    const size_t r = run_of(c, pos, end, F_WS);
    for (size_t k = r; k > 0; k--)
        if (IS_CRLF(pos + k - 1)) return k;
    return 0;
}

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

/* GPT-4o (o200k):
 * [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...|'d)?
 * |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...|'d)?
 * |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
#define F_UP (F_LU | F_LT | F_LM | F_LO | F_M)
#define F_LOW (F_LL | F_LM | F_LO | F_M)

static size_t m_gpt4o(const cps *c, size_t pos, size_t end) {
    const int x_ok = !IS_CRLF(pos) && !IS_L(pos) && !IS_N(pos);
    /* alternative 1, with and then without the optional prefix character */
    for (int x = x_ok ? 1 : 0; x >= 0; x--) {
        const size_t q = pos + (size_t)x;
        if (q >= end) continue;
        const size_t a = run_of(c, q, end, F_UP);
        for (size_t k = a + 1; k-- > 0;) {
            if (q + k < end && (c->fl[q + k] & F_LOW)) {
                size_t e = q + k + run_of(c, q + k, end, F_LOW);
                e += contraction(c, e, end, 1);
                return e - pos;
            }
        }
    }
    /* alternative 2 */
    for (int x = x_ok ? 1 : 0; x >= 0; x--) {
        const size_t q = pos + (size_t)x;
        if (q >= end) continue;
        const size_t a = run_of(c, q, end, F_UP);
        if (a == 0) continue;
        size_t e = q + a;
        e += run_of(c, e, end, F_LOW);
        e += contraction(c, e, end, 1);
        return e - pos;
    }
    if (IS_N(pos)) {
        const size_t k = run_of(c, pos, end, F_N);
        return k < 3 ? k : 3;
    }
    size_t q = pos;
    if (c->cp[pos] == ' ' && pos + 1 < end && is_other(c, pos + 1)) q = pos + 1;
    if (is_other(c, q)) {
        q += other_run(c, q, end);
        while (q < end && (IS_CRLF(q) || c->cp[q] == '/')) q++;
        return q - pos;
    }
    const size_t k = ws_newlines(c, pos, end);
    if (k) return k;
    return ws_tail(c, pos, end);
}

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
/* [\r\n] */
static size_t m_crlf(const cps *c, size_t pos, size_t end) {
    (void)end;
    return IS_CRLF(pos) ? 1 : 0;
}

typedef struct { uint32_t a, b; } cprange;

static int in_cpranges(const cprange *r, size_t n, uint32_t x) {
    for (size_t i = 0; i < n; i++)
        if (x >= r[i].a && x <= r[i].b) return 1;
    return 0;
}

static const cprange ds_cjk[] = {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}};
static const cprange ds3_cjk[] = {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};
static const cprange ds_punct[] = {{0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
                                   {0x2018, 0x201F}, {0x3000, 0x3002}};

static int ds_latin(uint32_t x) {
    return in_ranges(cb_uc_deepseek_letter_ranges, CB_UC_DEEPSEEK_LETTER_RANGES_N, x, NULL);
}

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
#define T(i) in_cpranges(ds_punct, 6, c->cp[i])
    OPT_SPACE_CLASS_RUN(T);
#undef T
}
static size_t m_ds_cjk(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end && in_cpranges(ds_cjk, 3, c->cp[k])) k++;
    return k - pos;
}
static size_t m_ds3_cjk(const cps *c, size_t pos, size_t end) {
    size_t k = pos;
    while (k < end && in_cpranges(ds3_cjk, 3, c->cp[k])) k++;
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
    switch (pre) {
    case CB_PRE_DEFAULT:
        s.n = 4; s.m[0] = m_def_punct; s.m[1] = m_gpt2; s.m[2] = m_nrun; s.m[3] = m_3digits;
        break;
    case CB_PRE_GPT2: s.n = 1; s.m[0] = m_gpt2; break;
    case CB_PRE_LLAMA3: s.n = 1; s.m[0] = m_llama3; break;
    case CB_PRE_QWEN2: s.n = 1; s.m[0] = m_qwen2; break;
    case CB_PRE_GPT4O: s.n = 1; s.m[0] = m_gpt4o; break;
    case CB_PRE_DEEPSEEK_LLM:
        s.n = 6; s.m[0] = m_crlf; s.m[1] = m_ds_latin; s.m[2] = m_ds_punct; s.m[3] = m_ws_end;
        s.m[4] = m_ds_cjk; s.m[5] = m_nrun;
        break;
    case CB_PRE_DEEPSEEK_V3:
        s.n = 3; s.m[0] = m_n3; s.m[1] = m_ds3_cjk; s.m[2] = m_ds3_main;
        break;
    default: break;
    }
    return s;
}

typedef struct { size_t *v; size_t n, cap; } zvec; /* piece boundaries: pairs (start, end) */

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

typedef struct {
    uint32_t *cp;
    uint16_t *fl;
    size_t *boff;
    size_t cap;
    zvec z[2];
} pre_scratch;

static cb_status bpe_fragment(const cb_tokenizer_t *t, merger *m, pre_scratch *ps, const uint8_t *s,
                              size_t n, ivec *out) {
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
    const zvec *pieces = &ps->z[cur];
    for (size_t p = 0; p < pieces->n; p += 2) {
        const size_t b0 = ps->boff[pieces->v[p]], b1 = ps->boff[pieces->v[p + 1]];
        const cb_status r = bpe_word(t, m, s + b0, b1 - b0, out);
        if (r != CB_OK) return r;
    }
    return CB_OK;
}

/* ---------------------------------------------------------------------------------------------
 * encode */

cb_status cb_tokenizer_encode(const cb_tokenizer_t *t, const uint8_t *text, size_t len, unsigned flags,
                              int32_t **ids, size_t *n_ids) {
    if (!t || !ids || !n_ids || (len && !text))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)UINT32_MAX / 4)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_encode: text of %zu bytes is too long", len);
    uint8_t *clean = NULL;
    if (flags & CB_ENCODE_LENIENT) {
        size_t nl;
        const cb_status st = cb_utf8_sanitize(text, len, &clean, &nl, NULL);
        if (st != CB_OK) return st;
        text = clean;
        len = nl;
    } else {
        const cb_status st = cb_utf8_validate(text, len, NULL);
        if (st != CB_OK) return st;
    }
    cb_status st = CB_OK;
    ivec out = {0};
    merger m;
    memset(&m, 0, sizeof m);
    pre_scratch ps;
    memset(&ps, 0, sizeof ps);
    frag *fr = NULL;
    size_t nfr = 0;
    uint8_t *esc = NULL;
    const int add_special = (flags & CB_ENCODE_ADD_SPECIAL) != 0;

    if (len) {
        st = partition(t, text, len, (flags & CB_ENCODE_PARSE_SPECIAL) != 0, &fr, &nfr);
        if (st != CB_OK) goto done;
    }
    if (add_special && t->add_bos && ivec_push(&out, t->bos)) {
        st = NOMEM("ids");
        goto done;
    }
    int prev_special = 1;
    size_t esc_cap = 0;
    for (size_t f = 0; f < nfr; f++) {
        if (fr[f].tok >= 0) {
            if (ivec_push(&out, fr[f].tok)) {
                st = NOMEM("ids");
                goto done;
            }
            prev_special = 1;
            continue;
        }
        const uint8_t *s = text + fr[f].start;
        const size_t n = fr[f].len;
        if (t->model == CB_TOKENIZER_SPM) {
            /* escape spaces as U+2581, optionally after a prefix space */
            const size_t need = 3 * (n + 1);
            if (need > esc_cap) {
                uint8_t *e = cb_realloc(esc, need);
                if (!e) {
                    st = NOMEM("escaped text");
                    goto done;
                }
                esc = e;
                esc_cap = need;
            }
            size_t o = 0;
            if (t->add_space_prefix && prev_special) {
                esc[o++] = 0xE2; esc[o++] = 0x96; esc[o++] = 0x81;
            }
            for (size_t i = 0; i < n; i++) {
                if (s[i] == ' ') {
                    esc[o++] = 0xE2; esc[o++] = 0x96; esc[o++] = 0x81;
                } else {
                    esc[o++] = s[i];
                }
            }
            st = spm_tokenize(t, &m, esc, o, &out);
        } else {
            st = bpe_fragment(t, &m, &ps, s, n, &out);
        }
        if (st != CB_OK) goto done;
        prev_special = 0;
    }
    if (add_special && t->add_eos && ivec_push(&out, t->eos)) {
        st = NOMEM("ids");
        goto done;
    }
    *ids = out.v;
    *n_ids = out.n;
    out.v = NULL;
done:
    free(out.v);
    free(m.s);
    free(m.h);
    free(ps.cp);
    free(ps.fl);
    free(ps.boff);
    free(ps.z[0].v);
    free(ps.z[1].v);
    free(fr);
    free(esc);
    free(clean);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * decode and the stream decoder */

typedef struct { uint8_t *v; size_t n, cap; } bvec;

static int bvec_add(bvec *b, const uint8_t *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n) nc *= 2;
        uint8_t *nv = cb_realloc(b->v, nc);
        if (!nv) return -1;
        b->v = nv;
        b->cap = nc;
    }
    if (n) memcpy(b->v + b->n, p, n);
    b->n += n;
    return 0;
}

/* The piece of id as decode renders it; *strip: in/out state of the leading-space rule (drop one
 * leading space of the first non-control piece, the one SPM encode prepended). */
static void render(const cb_tokenizer_t *t, int32_t id, unsigned flags, int *strip, const uint8_t **p,
                   size_t *n) {
    *p = t->piece + t->piece_off[id];
    *n = (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
    if (t->attr[id] & (CB_TOKEN_ATTR_UNKNOWN | CB_TOKEN_ATTR_CONTROL)) {
        if (!(flags & CB_DECODE_SPECIAL)) *n = 0;
        return; /* control tokens (BOS, ...) never carry the prefix space */
    }
    if (*strip && *n) {
        if ((*p)[0] == ' ') {
            (*p)++;
            (*n)--;
        }
        *strip = 0;
    }
}

cb_status cb_tokenizer_decode(const cb_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                              uint8_t **out, size_t *out_len) {
    if (!t || !out || !out_len || (n && !ids))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tokenizer_decode: NULL argument");
    *out = NULL;
    *out_len = 0;
    bvec raw = {0};
    int strip = t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n) {
            free(raw.v);
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "token id %d at position %zu out of range [0, %d)",
                           ids[i], i, t->n);
        }
        const uint8_t *p;
        size_t k;
        render(t, ids[i], flags, &strip, &p, &k);
        if (bvec_add(&raw, p, k)) {
            free(raw.v);
            return NOMEM("decoded text");
        }
    }
    if (!raw.v) {
        raw.v = cb_malloc(1);
        if (!raw.v) return NOMEM("decoded text");
    }
    if (cb_utf8_validate(raw.v, raw.n, NULL) == CB_OK) { /* the common case: no repair, no copy */
        *out = raw.v;
        *out_len = raw.n;
        return CB_OK;
    }
    cb_clear_error();
    uint8_t *res;
    size_t rn;
    const cb_status st = cb_utf8_sanitize(raw.v, raw.n, &res, &rn, NULL);
    free(raw.v);
    if (st != CB_OK) return st;
    *out = res;
    *out_len = rn;
    return CB_OK;
}

struct cb_tok_stream {
    const cb_tokenizer_t *tok;
    unsigned flags;
    int strip;
    uint8_t pend[4]; /* an unfinished UTF-8 sequence (at most 3 bytes) */
    size_t npend;
    bvec in, out;
};

cb_status cb_tok_stream_new(const cb_tokenizer_t *tok, unsigned flags, cb_tok_stream_t **out) {
    if (!tok || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tok_stream_new: NULL argument");
    cb_tok_stream_t *s = cb_calloc(1, sizeof *s);
    if (!s) return NOMEM("stream");
    s->tok = tok;
    s->flags = flags;
    s->strip = tok->add_space_prefix;
    *out = s;
    return CB_OK;
}

void cb_tok_stream_free(cb_tok_stream_t *s) {
    if (!s) return;
    free(s->in.v);
    free(s->out.v);
    free(s);
}

cb_status cb_tok_stream_feed(cb_tok_stream_t *s, int32_t id, const uint8_t **out, size_t *out_len) {
    if (!s || !out || !out_len) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tok_stream_feed: NULL argument");
    const cb_tokenizer_t *t = s->tok;
    if (id < 0 || id >= t->n) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "token id %d out of range [0, %d)", id, t->n);
    /* all-or-nothing: the stream's state (strip, pending bytes) changes only once every buffer
     * it needs is allocated, so a failed feed can be repeated */
    const uint8_t *p;
    size_t k;
    int strip = s->strip;
    render(t, id, s->flags, &strip, &p, &k);
    s->in.n = 0;
    if (bvec_add(&s->in, s->pend, s->npend) || bvec_add(&s->in, p, k)) return NOMEM("stream buffer");
    /* keep back a valid-but-unfinished sequence at the very end */
    const uint8_t *b = s->in.v ? s->in.v : (const uint8_t *)"";
    size_t n = s->in.n;
    size_t keep = 0;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const size_t i = n - back;
        if ((b[i] & 0xC0) != 0x80) { /* a lead byte (or ASCII): is it an unfinished prefix? */
            uint32_t cp;
            int tr;
            const int r = cb_utf8_next(b + i, n - i, &cp, &tr);
            if (r < 0 && tr && (size_t)(-r) == back) keep = back;
            break;
        }
    }
    n -= keep;
    if (s->out.cap < 3 * n + 1) {
        uint8_t *nv = cb_realloc(s->out.v, 3 * n + 1);
        if (!nv) return NOMEM("stream output");
        s->out.v = nv;
        s->out.cap = 3 * n + 1;
    }
    memcpy(s->pend, b + n, keep);
    s->npend = keep;
    s->strip = strip;
    s->out.n = cb_utf8_sanitize_into(b, n, s->out.v, NULL);
    *out = s->out.v;
    *out_len = s->out.n;
    return CB_OK;
}

cb_status cb_tok_stream_flush(cb_tok_stream_t *s, const uint8_t **out, size_t *out_len) {
    if (!s || !out || !out_len) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "tok_stream_flush: NULL argument");
    if (s->out.cap < 4) {
        uint8_t *nv = cb_realloc(s->out.v, 16);
        if (!nv) return NOMEM("stream output");
        s->out.v = nv;
        s->out.cap = 16;
    }
    s->out.n = cb_utf8_sanitize_into(s->pend, s->npend, s->out.v, NULL);
    s->npend = 0;
    s->strip = s->tok->add_space_prefix;
    *out = s->out.v;
    *out_len = s->out.n;
    return CB_OK;
}
