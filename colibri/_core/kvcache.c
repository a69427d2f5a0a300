/* The KV cache (include/colibri/arena.h, "KV cache"): sequences of tokens whose K and V live in
 * one block of a cb_arena_t per sequence, in pages of page_tokens tokens inside which each K/V
 * head's rows are one run; a capacity change re-lays out only the block's last page (relayout).
 *
 * Table. max_sequences kv_seq slots allocated at cb_kvcache_new (never resized) and a stack of the
 * unused ids; a slot is live between cb_kvcache_seq_new and cb_kvcache_seq_free. A live slot with
 * has_block owns one arena block of cap * stride bytes or more at offset; len <= cap tokens are
 * written; need (<= cap) is the most tokens a reserve asked for, so cap - need is chunk rounding
 * that a full cache may give back (make_room).
 *
 * The cache only uses the arena's public API (cb_arena_alloc/grow/free_block/compact/stats/base):
 * the allocator (arena.c) knows nothing of sequences. The cache's mutex guards the table; the
 * arena takes its own mutex inside each call. Ownership: the arena is borrowed and must outlive
 * the cache; the cache owns its table and frees its blocks at close.
 */
#include "colibri/arena.h"

#include "alloc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_seq {
    size_t offset; /* block offset in the arena (valid when has_block) */
    size_t cap;    /* tokens that fit */
    size_t len;    /* tokens written */
    size_t need;   /* the most tokens a reserve asked for (cap - need is chunk rounding) */
    void *state;   /* state_bytes of recurrent state (arena.h), NULL without */
    uint8_t live, has_block;
} kv_seq;

typedef struct kv_place {
    size_t offset;
    uint32_t seq;
} kv_place;

struct cb_kvcache {
    pthread_mutex_t mu;
    cb_arena_t *arena; /* borrowed */
    cb_kvcache_params p;
    size_t elt, stride;            /* bytes: element, token */
    size_t page, row_elems, token_elems, n_groups; /* the layout (arena.h) */
    kv_seq *seqs;                  /* max_sequences entries */
    uint32_t *free_ids;            /* stack of unused ids */
    uint32_t n_free;
    kv_place *place;               /* max_sequences entries: scratch of make_room */
    size_t *offs;                  /* max_sequences entries: scratch of make_room */
    int closed;                    /* after cb_kvcache_close: every call fails with CLOSED */
};

cb_kvcache_params cb_kvcache_default_params(void) {
    cb_kvcache_params p;
    memset(&p, 0, sizeof p);
    p.dtype = CB_KV_F16;
    p.max_sequences = 1024;
    p.chunk_tokens = 16;
    p.page_tokens = CB_KV_PAGE_TOKENS;
    return p;
}

cb_status cb_kvcache_new(cb_arena_t *arena, const cb_kvcache_params *p, cb_kvcache_t **out) {
    if (!arena || !p || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: arena, params and out must not be NULL");
    *out = NULL;
    if (p->n_layers == 0 || p->n_kv_heads == 0 || p->head_dim == 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: n_layers %u, n_kv_heads %u, head_dim %u must all be > 0", p->n_layers, p->n_kv_heads, p->head_dim);
    if (p->dtype != CB_KV_F32 && p->dtype != CB_KV_F16)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: unknown dtype %d", (int)p->dtype);
    if (p->max_sequences == 0 || p->max_sequences > (1u << 24))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: max_sequences %u must be in [1, 2^24]", p->max_sequences);
    if (p->chunk_tokens == 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: chunk_tokens must be > 0");
    if (p->page_tokens == 0 || p->page_tokens > (1u << 20))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: page_tokens %u must be in [1, 2^20]", p->page_tokens);
    size_t elt = p->dtype == CB_KV_F32 ? 4 : 2;
    uint64_t kvs = (uint64_t)p->n_kv_heads * p->head_dim * elt;
    uint64_t stride = kvs * 2 * p->n_layers;
    if (kvs > ((uint64_t)1 << 40) || stride > ((uint64_t)1 << 40))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: token stride %llu bytes is too large", (unsigned long long)stride);
    cb_kvcache_t *kv = cb_calloc(1, sizeof *kv);
    if (!kv) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "kvcache: cannot allocate the handle");
    kv->seqs = cb_calloc(p->max_sequences, sizeof *kv->seqs);
    kv->free_ids = cb_calloc(p->max_sequences, sizeof *kv->free_ids);
    kv->place = cb_calloc(p->max_sequences, sizeof *kv->place);
    kv->offs = cb_calloc(p->max_sequences, sizeof *kv->offs);
    if (!kv->seqs || !kv->free_ids || !kv->place || !kv->offs) {
        free(kv->seqs);
        free(kv->free_ids);
        free(kv->place);
        free(kv->offs);
        free(kv);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "kvcache: cannot allocate a table of %u sequences", p->max_sequences);
    }
    for (uint32_t i = 0; i < p->max_sequences; i++) kv->free_ids[i] = p->max_sequences - 1 - i;
    kv->n_free = p->max_sequences;
    kv->arena = arena;
    kv->p = *p;
    kv->elt = elt;
    kv->stride = (size_t)stride;
    kv->page = p->page_tokens;
    kv->row_elems = p->head_dim;
    kv->token_elems = (size_t)stride / elt;
    kv->n_groups = (size_t)p->n_layers * 2 * p->n_kv_heads;
    pthread_mutex_init(&kv->mu, NULL);
    *out = kv;
    return CB_OK;
}

static void kv_close_locked(cb_kvcache_t *kv) {
    if (kv->closed) return;
    for (uint32_t i = 0; i < kv->p.max_sequences; i++) {
        if (kv->seqs[i].live && kv->seqs[i].has_block) cb_arena_free_block(kv->arena, kv->seqs[i].offset);
        free(kv->seqs[i].state);
        memset(&kv->seqs[i], 0, sizeof kv->seqs[i]);
    }
    kv->n_free = 0;
    kv->closed = 1;
    cb_clear_error();
}

void cb_kvcache_close(cb_kvcache_t *kv) {
    if (!kv) return;
    pthread_mutex_lock(&kv->mu);
    kv_close_locked(kv);
    pthread_mutex_unlock(&kv->mu);
}

void cb_kvcache_free(cb_kvcache_t *kv) {
    if (!kv) return;
    kv_close_locked(kv);
    pthread_mutex_destroy(&kv->mu);
    free(kv->seqs);
    free(kv->free_ids);
    free(kv->place);
    free(kv->offs);
    free(kv);
}

size_t cb_kvcache_token_stride(const cb_kvcache_t *kv) { return kv ? kv->stride : 0; }
size_t cb_kvcache_page_tokens(const cb_kvcache_t *kv) { return kv ? kv->page : 0; }
size_t cb_kvcache_row_elems(const cb_kvcache_t *kv) { return kv ? kv->row_elems : 0; }

/* Rows of the page starting at token `start` in a block of cap tokens. */
static size_t page_rows(const cb_kvcache_t *kv, size_t cap, size_t start) {
    return cap - start < kv->page ? cap - start : kv->page;
}

/* A block's capacity changes from a to b tokens (mu held; blk: the block, holding the larger
 * of the two layouts' bytes): the tokens [0, min(a, b)) keep their values. Only the page
 * holding token min(a, b) can differ between the layouts (the ones before are full in both),
 * and only when that page holds data: each row group's run of it moves, in the order that
 * never overwrites a run not yet moved. */
static void relayout(const cb_kvcache_t *kv, uint8_t *blk, size_t a, size_t b) {
    const size_t m = a < b ? a : b, start = m - m % kv->page;
    if (m == start) return;
    const size_t ra = page_rows(kv, a, start), rb = page_rows(kv, b, start);
    const size_t row = kv->row_elems * kv->elt, v = (m - start) * row;
    uint8_t *pg = blk + start * kv->stride;
    if (rb > ra)
        for (size_t g = kv->n_groups; g-- > 1;) memmove(pg + g * rb * row, pg + g * ra * row, v);
    else if (rb < ra)
        for (size_t g = 1; g < kv->n_groups; g++) memmove(pg + g * rb * row, pg + g * ra * row, v);
}

#define KV_LOCK(kv)                                                                  \
    do {                                                                             \
        if (!(kv)) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: NULL handle"); \
        pthread_mutex_lock(&(kv)->mu);                                               \
        if ((kv)->closed) {                                                          \
            pthread_mutex_unlock(&(kv)->mu);                                         \
            return cb_fail(CB_STATUS_CLOSED, "kvcache: the cache is closed");        \
        }                                                                            \
    } while (0)

#define KV_RETURN(kv, expr)                \
    do {                                   \
        cb_status rs_ = (expr);            \
        pthread_mutex_unlock(&(kv)->mu);   \
        return rs_;                        \
    } while (0)

static cb_status bad_seq(const cb_kvcache_t *kv, uint32_t seq) {
    return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: sequence %u is not live (max_sequences %u)", seq, kv->p.max_sequences);
}

#define SEQ_OR_FAIL(kv, seq)                                                     \
    do {                                                                         \
        if ((seq) >= (kv)->p.max_sequences || !(kv)->seqs[(seq)].live)           \
            KV_RETURN(kv, bad_seq(kv, seq));                                     \
    } while (0)

cb_status cb_kvcache_seq_new(cb_kvcache_t *kv, uint32_t *seq) {
    if (!seq) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: seq must not be NULL");
    KV_LOCK(kv);
    if (kv->n_free == 0)
        KV_RETURN(kv, cb_fail(CB_STATUS_OUT_OF_MEMORY, "kvcache: all %u sequence ids are live (raise max_sequences)", kv->p.max_sequences));
    void *st = NULL;
    if (kv->p.state_bytes > 0) {
        size_t sb = (kv->p.state_bytes + 63) / 64 * 64;
        if (cb_posix_memalign(&st, 64, sb) != 0)
            KV_RETURN(kv, cb_fail(CB_STATUS_OUT_OF_MEMORY, "kvcache: no memory for a sequence's recurrent state of %zu bytes", kv->p.state_bytes));
        memset(st, 0, sb);
    }
    uint32_t id = kv->free_ids[--kv->n_free];
    memset(&kv->seqs[id], 0, sizeof kv->seqs[id]);
    kv->seqs[id].live = 1;
    kv->seqs[id].state = st;
    *seq = id;
    KV_RETURN(kv, CB_OK);
}

static cb_status reserve_bytes(cb_kvcache_t *kv, kv_seq *s, size_t tokens) {
    if (tokens > SIZE_MAX / kv->stride) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "kvcache: %zu tokens overflow size_t", tokens);
    size_t bytes = tokens * kv->stride, off, old = s->has_block ? s->cap : 0;
    cb_status st = s->has_block ? cb_arena_grow(kv->arena, s->offset, bytes, &off)
                                : cb_arena_alloc(kv->arena, bytes, &off);
    if (st != CB_OK) return st;
    s->offset = off;
    s->has_block = 1;
    s->cap = tokens;
    uint8_t *base = cb_arena_base(kv->arena);
    if (old && base) relayout(kv, base + off, old, tokens);
    return CB_OK;
}

static int place_cmp(const void *x, const void *y) {
    size_t a = ((const kv_place *)x)->offset, b = ((const kv_place *)y)->offset;
    return (a > b) - (a < b);
}

/* The cache is full for a reserve of sequence `grow` (mu held): give back every sequence's
 * chunk rounding (shrink in place to the most tokens it asked for, at least its length), then
 * slide the cache's blocks up to `grow`'s down and the ones above it up (cb_arena_compact), so
 * the free room becomes one stretch right after `grow`'s block, where it grows in place (a
 * sequence without a block: everything down, the room at the top). Moves other sequences'
 * blocks: pointers into any sequence are valid until the next reserve (arena.h). */
static void make_room(cb_kvcache_t *kv, uint32_t grow) {
    size_t k = 0;
    for (uint32_t i = 0; i < kv->p.max_sequences; i++) {
        kv_seq *s = &kv->seqs[i];
        if (!s->live || !s->has_block) continue;
        size_t keep = s->need > s->len ? s->need : s->len, off;
        if (keep == 0) keep = 1;
        uint8_t *base = cb_arena_base(kv->arena);
        if (keep < s->cap && base) {
            relayout(kv, base + s->offset, s->cap, keep); /* before the tail is given back */
            if (cb_arena_grow(kv->arena, s->offset, keep * kv->stride, &off) == CB_OK) {
                s->offset = off; /* a shrink stays in place */
                s->cap = keep;
            } else {
                relayout(kv, base + s->offset, keep, s->cap);
            }
        }
        kv->place[k].offset = s->offset;
        kv->place[k].seq = i;
        k++;
    }
    qsort(kv->place, k, sizeof *kv->place, place_cmp);
    size_t low = k; /* blocks [0, low) slide down, [low, k) up */
    if (kv->seqs[grow].has_block)
        for (low = 0; low < k && kv->place[low].offset <= kv->seqs[grow].offset; low++) {}
    for (size_t j = 0; j < k; j++) kv->offs[j] = kv->place[j].offset;
    if (cb_arena_compact(kv->arena, kv->offs, low, 0) == CB_OK &&
        cb_arena_compact(kv->arena, kv->offs + low, k - low, 1) == CB_OK)
        for (size_t j = 0; j < k; j++) kv->seqs[kv->place[j].seq].offset = kv->offs[j];
    cb_clear_error();
}

/* Whether the free bytes plus every sequence's chunk rounding hold the tokens s lacks (mu
 * held): a hopeless reserve fails without compacting anything. */
static int room_would_do(cb_kvcache_t *kv, const kv_seq *s, size_t n_tokens) {
    cb_arena_stats_t as;
    if (cb_arena_stats(kv->arena, &as) != CB_OK) return 0;
    size_t slack = 0;
    for (uint32_t i = 0; i < kv->p.max_sequences; i++) {
        const kv_seq *q = &kv->seqs[i];
        size_t keep = q->need > q->len ? q->need : q->len;
        if (q->live && q->has_block && q->cap > keep) slack += q->cap - keep;
    }
    size_t lack = n_tokens - s->cap; /* n_tokens > s->cap here */
    return lack <= as.free / kv->stride + slack;
}

/* cb_kvcache_seq_reserve with mu held and seq live. */
static cb_status reserve_locked(cb_kvcache_t *kv, uint32_t seq, size_t n_tokens) {
    kv_seq *s = &kv->seqs[seq];
    if (n_tokens > s->need && n_tokens <= s->cap) s->need = n_tokens;
    if (n_tokens <= s->cap) return CB_OK;
    size_t c = kv->p.chunk_tokens;
    if (n_tokens > SIZE_MAX - c) return (cb_fail(CB_STATUS_OUT_OF_MEMORY, "kvcache: %zu tokens overflow size_t", n_tokens));
    size_t want = (n_tokens + c - 1) / c * c;
    if (kv->p.doubling && s->cap && s->cap * 2 > want && s->cap <= SIZE_MAX / 2) {
        if (reserve_bytes(kv, s, s->cap * 2) == CB_OK) {
            s->need = n_tokens;
            return CB_OK;
        }
    }
    cb_status st = reserve_bytes(kv, s, want);
    /* The chunk is a convenience, not a need: when it does not fit, the tokens asked for may,
     * else after the other sequences' chunk rounding is given back and the blocks compacted. */
    if (st == CB_STATUS_OUT_OF_MEMORY && want > n_tokens) {
        want = n_tokens;
        st = reserve_bytes(kv, s, want);
    }
    if (st == CB_STATUS_OUT_OF_MEMORY && room_would_do(kv, s, n_tokens)) {
        want = n_tokens;
        make_room(kv, seq);
        st = reserve_bytes(kv, s, want);
    }
    if (st == CB_OK) s->need = n_tokens;
    if (st != CB_OK) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", cb_last_error());
        if (st != CB_STATUS_OUT_OF_MEMORY)
            return (cb_fail(st, "kvcache: sequence %u cannot reserve %zu tokens (%zu bytes at %zu bytes/token): %s",
                                  seq, want, want * kv->stride, kv->stride, detail));
        /* what the cache holds now, so that a full cache says how full */
        size_t n_live = 0, held = 0, reserved = 0;
        for (uint32_t i = 0; i < kv->p.max_sequences; i++) {
            if (!kv->seqs[i].live) continue;
            n_live++;
            held += kv->seqs[i].len;
            reserved += kv->seqs[i].cap;
        }
        cb_arena_stats_t as;
        size_t used = 0, total = 0;
        if (cb_arena_stats(kv->arena, &as) == CB_OK) {
            used = as.used;
            total = as.capacity;
        }
        return (cb_fail(st, "kvcache: sequence %u (%zu tokens) cannot grow to %zu tokens "
                              "(%zu bytes at %zu bytes/token): the cache holds %zu tokens (%zu "
                              "reserved) in %zu live sequences, %zu of %zu arena bytes in use "
                              "(room for about %zu tokens in all); %s",
                              seq, s->cap, want, want * kv->stride, kv->stride, held, reserved,
                              n_live, used, total, total / kv->stride, detail));
    }
    return CB_OK;
}

cb_status cb_kvcache_seq_reserve(cb_kvcache_t *kv, uint32_t seq, size_t n_tokens) {
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    KV_RETURN(kv, reserve_locked(kv, seq, n_tokens));
}

static cb_status copy_prefix(cb_kvcache_t *kv, uint32_t src, uint32_t dst, size_t n_tokens,
                             const void *state);

cb_status cb_kvcache_copy_prefix(cb_kvcache_t *kv, uint32_t src, uint32_t dst, size_t n_tokens) {
    return copy_prefix(kv, src, dst, n_tokens, NULL);
}

cb_status cb_kvcache_copy_prefix_state(cb_kvcache_t *kv, uint32_t src, uint32_t dst,
                                       size_t n_tokens, const void *state) {
    if (!state) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: copy_prefix_state: state must not be NULL");
    return copy_prefix(kv, src, dst, n_tokens, state);
}

static cb_status copy_prefix(cb_kvcache_t *kv, uint32_t src, uint32_t dst, size_t n_tokens,
                             const void *state) {
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, src);
    SEQ_OR_FAIL(kv, dst);
    if (src == dst)
        KV_RETURN(kv, cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: copy_prefix: source and destination are the same sequence %u", src));
    if (n_tokens > kv->seqs[src].len)
        KV_RETURN(kv, cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: copy_prefix: %zu tokens asked of sequence %u, which holds %zu", n_tokens, src, kv->seqs[src].len));
    if (state && !kv->seqs[src].state)
        KV_RETURN(kv, cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: copy_prefix_state: the cache holds no recurrent state (state_bytes 0)"));
    if (kv->seqs[src].state && !state && n_tokens != 0 && n_tokens != kv->seqs[src].len)
        KV_RETURN(kv, cb_fail(CB_STATUS_UNSUPPORTED, "kvcache: copy_prefix: sequence %u's recurrent state is the one after its %zu tokens, not after %zu (restore a snapshot with cb_kvcache_state_set)", src, kv->seqs[src].len, n_tokens));
    if (n_tokens > 0) {
        /* the reserve may compact, moving both blocks: offsets are read after it */
        cb_status st = reserve_locked(kv, dst, n_tokens);
        if (st != CB_OK) KV_RETURN(kv, st);
        uint8_t *base = cb_arena_base(kv->arena);
        if (!base) KV_RETURN(kv, cb_fail(CB_STATUS_CLOSED, "kvcache: the arena is closed"));
        /* the full pages are full in both blocks (both hold >= n_tokens): one run of bytes;
         * the last page's rows are a run per row group. Two live blocks never overlap. */
        uint8_t *d = base + kv->seqs[dst].offset;
        const uint8_t *sp = base + kv->seqs[src].offset;
        const size_t full = n_tokens - n_tokens % kv->page, row = kv->row_elems * kv->elt;
        memcpy(d, sp, full * kv->stride);
        if (full < n_tokens) {
            const size_t rs = page_rows(kv, kv->seqs[src].cap, full), rd = page_rows(kv, kv->seqs[dst].cap, full);
            d += full * kv->stride;
            sp += full * kv->stride;
            for (size_t g = 0; g < kv->n_groups; g++)
                memcpy(d + g * rd * row, sp + g * rs * row, (n_tokens - full) * row);
        }
    }
    kv->seqs[dst].len = n_tokens;
    if (kv->seqs[dst].state) {
        if (state) memcpy(kv->seqs[dst].state, state, kv->p.state_bytes);
        else if (n_tokens) memcpy(kv->seqs[dst].state, kv->seqs[src].state, kv->p.state_bytes);
        else memset(kv->seqs[dst].state, 0, kv->p.state_bytes);
    }
    KV_RETURN(kv, CB_OK);
}

cb_status cb_kvcache_seq_free(cb_kvcache_t *kv, uint32_t seq) {
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    kv_seq *s = &kv->seqs[seq];
    if (s->has_block) {
        cb_status st = cb_arena_free_block(kv->arena, s->offset);
        if (st != CB_OK && st != CB_STATUS_CLOSED) KV_RETURN(kv, st);
    }
    free(s->state);
    memset(s, 0, sizeof *s);
    kv->free_ids[kv->n_free++] = seq;
    KV_RETURN(kv, CB_OK);
}

cb_status cb_kvcache_seq_len(cb_kvcache_t *kv, uint32_t seq, size_t *len) {
    if (!len) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: len must not be NULL");
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    *len = kv->seqs[seq].len;
    KV_RETURN(kv, CB_OK);
}

cb_status cb_kvcache_seq_capacity(cb_kvcache_t *kv, uint32_t seq, size_t *cap) {
    if (!cap) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: cap must not be NULL");
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    *cap = kv->seqs[seq].cap;
    KV_RETURN(kv, CB_OK);
}

cb_status cb_kvcache_seq_set_len(cb_kvcache_t *kv, uint32_t seq, size_t n) {
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    if (n > kv->seqs[seq].cap)
        KV_RETURN(kv, cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: sequence %u: length %zu exceeds its capacity %zu tokens (reserve first)", seq, n, kv->seqs[seq].cap));
    kv_seq *s = &kv->seqs[seq];
    if (s->state && n < s->len) {
        if (n != 0)
            KV_RETURN(kv, cb_fail(CB_STATUS_UNSUPPORTED, "kvcache: sequence %u: a recurrent state cannot be truncated from %zu to %zu tokens (only to 0)", seq, s->len, n));
        memset(s->state, 0, kv->p.state_bytes);
    }
    s->len = n;
    KV_RETURN(kv, CB_OK);
}

size_t cb_kvcache_state_bytes(const cb_kvcache_t *kv) { return kv ? kv->p.state_bytes : 0; }

cb_status cb_kvcache_seq_state(cb_kvcache_t *kv, uint32_t seq, void **state) {
    if (!state) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: state must not be NULL");
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    *state = kv->seqs[seq].state;
    if (!*state) KV_RETURN(kv, cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: the cache holds no recurrent state (state_bytes 0)"));
    KV_RETURN(kv, CB_OK);
}

static cb_status state_copy(cb_kvcache_t *kv, uint32_t seq, void *out, const void *in) {
    if (!out && !in) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: buf must not be NULL");
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    void *st = kv->seqs[seq].state;
    if (!st) KV_RETURN(kv, cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: the cache holds no recurrent state (state_bytes 0)"));
    if (out) memcpy(out, st, kv->p.state_bytes);
    else if (in) memcpy(st, in, kv->p.state_bytes);
    KV_RETURN(kv, CB_OK);
}

cb_status cb_kvcache_state_get(cb_kvcache_t *kv, uint32_t seq, void *buf) {
    return state_copy(kv, seq, buf, NULL);
}

cb_status cb_kvcache_state_set(cb_kvcache_t *kv, uint32_t seq, const void *buf) {
    return buf ? state_copy(kv, seq, NULL, buf) : cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: buf must not be NULL");
}

cb_status cb_kvcache_seq_offset(cb_kvcache_t *kv, uint32_t seq, size_t *offset, int *has_block) {
    if (!offset || !has_block) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: offset and has_block must not be NULL");
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    *offset = kv->seqs[seq].has_block ? kv->seqs[seq].offset : 0;
    *has_block = kv->seqs[seq].has_block;
    KV_RETURN(kv, CB_OK);
}

size_t cb_kvcache_list(cb_kvcache_t *kv, uint32_t *ids, size_t max_ids) {
    if (!kv) return 0;
    pthread_mutex_lock(&kv->mu);
    size_t n = 0;
    for (uint32_t i = 0; i < kv->p.max_sequences; i++) {
        if (!kv->seqs[i].live) continue;
        if (ids && n < max_ids) ids[n] = i;
        n++;
    }
    pthread_mutex_unlock(&kv->mu);
    return n;
}

/* Checks of row_ptr/read/write (mu held): seq live, [pos, pos + n) within its capacity (a
 * block when n > 0), layer, kv_index and head in range. */
static cb_status rows_check(const cb_kvcache_t *kv, uint32_t seq, size_t pos, size_t n,
                            uint32_t layer, uint32_t kv_index, uint32_t head) {
    if (seq >= kv->p.max_sequences || !kv->seqs[seq].live) return bad_seq(kv, seq);
    const kv_seq *s = &kv->seqs[seq];
    if (pos > s->cap || n > s->cap - pos || layer >= kv->p.n_layers ||
        kv_index > 1 || head >= kv->p.n_kv_heads)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "kvcache: sequence %u: positions [%zu, %zu) (capacity %zu), layer %u (of %u), "
                       "kv %u (0 or 1), head %u (of %u) out of range",
                       seq, pos, pos + n, s->cap, layer, kv->p.n_layers, kv_index, head,
                       kv->p.n_kv_heads);
    return CB_OK;
}

/* Address of a row in the sequence's block at blk (checks done, mu held). */
static uint8_t *row_addr(const cb_kvcache_t *kv, const kv_seq *s, uint8_t *blk, size_t pos,
                         uint32_t layer, uint32_t kv_index, uint32_t head) {
    size_t g = ((size_t)layer * 2 + kv_index) * kv->p.n_kv_heads + head;
    return blk + cb_kvcache_row_elem(pos, s->cap, kv->page, kv->token_elems, kv->row_elems, g * kv->row_elems) * kv->elt;
}

cb_status cb_kvcache_row_ptr(cb_kvcache_t *kv, uint32_t seq, size_t pos, uint32_t layer,
                             uint32_t kv_index, uint32_t kv_head, void **ptr) {
    if (!ptr) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: NULL argument");
    KV_LOCK(kv);
    cb_status st = rows_check(kv, seq, pos, 1, layer, kv_index, kv_head);
    uint8_t *base = cb_arena_base(kv->arena);
    if (st == CB_OK && !base) st = cb_fail(CB_STATUS_CLOSED, "kvcache: the arena is closed");
    if (st == CB_OK) *ptr = row_addr(kv, &kv->seqs[seq], base + kv->seqs[seq].offset, pos, layer, kv_index, kv_head);
    KV_RETURN(kv, st);
}

cb_status cb_kvcache_seq_block(cb_kvcache_t *kv, uint32_t seq, void **base, size_t *cap) {
    if (!base || !cap) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: NULL argument");
    KV_LOCK(kv);
    SEQ_OR_FAIL(kv, seq);
    const kv_seq *s = &kv->seqs[seq];
    uint8_t *b = cb_arena_base(kv->arena);
    if (!b) KV_RETURN(kv, cb_fail(CB_STATUS_CLOSED, "kvcache: the arena is closed"));
    *base = s->has_block ? b + s->offset : NULL;
    *cap = s->has_block ? s->cap : 0;
    KV_RETURN(kv, CB_OK);
}

static cb_status rows_copy(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                           size_t start, size_t n, uint8_t *buf, int into_cache) {
    if (!buf && n) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "kvcache: NULL buffer");
    KV_LOCK(kv);
    cb_status st = rows_check(kv, seq, start, n, layer, kv_index, 0);
    if (st != CB_OK || n == 0) KV_RETURN(kv, st);
    /* the block pinned while copying: a cb_arena_close from another thread defers the unmap */
    const kv_seq *s = &kv->seqs[seq];
    void *blk = NULL;
    st = cb_arena_view(kv->arena, s->offset, s->cap * kv->stride, &blk);
    if (st != CB_OK) KV_RETURN(kv, st);
    const size_t row = kv->row_elems * kv->elt;
    for (size_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < kv->p.n_kv_heads; h++) {
            uint8_t *r = row_addr(kv, s, blk, start + t, layer, kv_index, h);
            uint8_t *b = buf + (t * kv->p.n_kv_heads + h) * row;
            if (into_cache) memcpy(r, b, row);
            else memcpy(b, r, row);
        }
    cb_arena_unpin(kv->arena);
    KV_RETURN(kv, CB_OK);
}

cb_status cb_kvcache_read(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                          size_t start, size_t n, void *buf) {
    return rows_copy(kv, seq, layer, kv_index, start, n, buf, 0);
}

cb_status cb_kvcache_write(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                           size_t start, size_t n, const void *buf) {
    return rows_copy(kv, seq, layer, kv_index, start, n, (uint8_t *)(uintptr_t)buf, 1);
}
