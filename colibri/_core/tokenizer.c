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
 *
 * Files: this one holds the handle (built once), the special-token partition, encode, decode and
 * the stream decoder; tokenizer_spm.c the SPM merging, tokenizer_bpe.c the BPE merging,
 * tokenizer_pretok.c the pre-tokenizers; tokenizer_impl.h what they share (the handle's struct,
 * the lookups and the bigram heap).
 */
#include "colibri/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "tokenizer_impl.h"
#include "unicode_tables.h"

/* ---------------------------------------------------------------------------------------------
 * small helpers */

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

int cb_tok_is_deepseek_letter(uint32_t cp) {
    return in_ranges(cb_uc_deepseek_letter_ranges, CB_UC_DEEPSEEK_LETTER_RANGES_N, cp, NULL);
}

uint16_t cb_tok_cp_flags_slow(uint32_t cp) {
    uint32_t g = 0;
    uint16_t f = in_ranges(cb_uc_cat_ranges, CB_UC_CAT_RANGES_N, cp, &g) ? group_flags(g) : 0;
    if (in_ranges(cb_uc_space_ranges, CB_UC_SPACE_RANGES_N, cp, NULL)) f |= F_WS;
    return f;
}

/* ---------------------------------------------------------------------------------------------
 * the handle */

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
            if (t->model == CB_TOKENIZER_SPM || (t->bpe_flags & CB_BPE_ESCAPE_SPACES)) {
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
        } else if ((a & CB_TOKEN_ATTR_BYTE) && t->spm_text) {
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
    if (t->spm_text) {
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
        long l, r;
        if (t->spm_text) { /* the texts themselves */
            l = (long)sp;
            r = (long)(n - sp - 1);
            memcpy(t->mkey + o, s, sp);
            memcpy(t->mkey + o + l, s + sp + 1, (size_t)r);
        } else {
            l = unmap_bytes(s, sp, cp_byte, t->mkey + o);
            if (l <= 0) continue;
            r = unmap_bytes(s + sp + 1, n - sp - 1, cp_byte, t->mkey + o + l);
        }
        if (l <= 0 || r <= 0) continue;
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
    if (p->model == CB_TOKENIZER_BPE && (p->pre < CB_PRE_DEFAULT || p->pre > CB_PRE_LAST))
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
    t->bpe_flags = p->model == CB_TOKENIZER_BPE ? (unsigned)p->bpe_flags : 0u;
    t->spm_text = p->model == CB_TOKENIZER_SPM || (t->bpe_flags & CB_BPE_RAW_UTF8);
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
        if (t->spm_text) {
            static const char hex[] = "0123456789ABCDEF";
            const uint8_t name[6] = {'<', '0', 'x', (uint8_t)hex[b >> 4], (uint8_t)hex[b & 15], '>'};
            int32_t id = vocab_find(t, name, 6);
            if (id < 0 && t->model == CB_TOKENIZER_SPM) id = vocab_find(t, &one, 1);
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
        if (t->model == CB_TOKENIZER_SPM || (t->bpe_flags & CB_BPE_ESCAPE_SPACES)) {
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
            if (t->model == CB_TOKENIZER_SPM)
                st = cb_tok_spm_tokenize(t, &m, esc, o, &out);
            else
                st = cb_tok_bpe_fragment(t, &m, &ps, esc, o, &out);
        } else {
            st = cb_tok_bpe_fragment(t, &m, &ps, s, n, &out);
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
