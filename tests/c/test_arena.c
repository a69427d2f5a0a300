/* arena.h driven directly: random alloc/free/grow against a shadow list of live blocks, with
 * cb_arena_check and data patterns verified after every step (both exact and power-of-two
 * modes, a non-power-of-two capacity); every error path leaves the stats unchanged; close and
 * pins; the KV cache layout and growth. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "colibri/arena.h"
#include "testutil.h"

#define MAXB 64

typedef struct {
    size_t off, n;
    uint8_t tag;
} blk;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void fill(uint8_t *base, const blk *b) {
    for (size_t i = 0; i < b->n; i++) base[b->off + i] = (uint8_t)(b->tag + i * 31);
}
static int intact(const uint8_t *base, const blk *b) {
    for (size_t i = 0; i < b->n; i++)
        if (base[b->off + i] != (uint8_t)(b->tag + i * 31)) return 0;
    return 1;
}

static int same_stats(const cb_arena_stats_t *x, const cb_arena_stats_t *y) {
    return x->used == y->used && x->free == y->free && x->largest_free == y->largest_free &&
           x->n_blocks == y->n_blocks && x->n_free_blocks == y->n_free_blocks &&
           x->requested == y->requested;
}

static size_t prev_pow2(size_t x) {
    size_t p = 1;
    while (p * 2 <= x) p <<= 1;
    return p;
}

/* Alignment (bytes) of a block of bsz bytes: exact mode 2^max(0, floor(log2 units) - 5) units
 * (at most 1/32 of its size), classic mode its size. */
static size_t block_align(size_t bsz, size_t mb, int exact) {
    size_t p = prev_pow2(bsz / mb);
    if (exact) p = p >= 32 ? p / 32 : 1;
    return p * mb;
}

static void random_ops(size_t capacity, size_t mb, int exact, int steps) {
    cb_arena_params p = cb_arena_default_params();
    p.capacity = capacity;
    p.min_block = mb;
    p.exact = exact;
    p.hugepages = CB_HUGEPAGES_OFF;
    cb_arena_t *a = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    if (!a) return;
    uint8_t *base = cb_arena_base(a);
    cb_arena_stats_t st0;
    CHECK(cb_arena_stats(a, &st0) == CB_OK);
    size_t cap = st0.capacity;
    CHECK(cap >= capacity && cap % mb == 0 && cap - capacity < mb);
    blk live[MAXB];
    int nl = 0, bad_data = 0, bad_layout = 0;
    for (int step = 0; step < steps; step++) {
        uint64_t r = rnd() % 10;
        size_t n = 1 + rnd() % (r < 8 ? 6 * mb : cap / 3);
        if (r < 4 && nl < MAXB) {
            size_t off;
            cb_status s = cb_arena_alloc(a, n, &off);
            if (s == CB_OK) {
                live[nl] = (blk){off, n, (uint8_t)rnd()};
                fill(base, &live[nl]);
                nl++;
            } else {
                CHECK(s == CB_STATUS_OUT_OF_MEMORY);
            }
        } else if (r < 7 && nl > 0) {
            int i = (int)(rnd() % (uint64_t)nl);
            if (!intact(base, &live[i])) bad_data++;
            CHECK(cb_arena_free_block(a, live[i].off) == CB_OK);
            live[i] = live[--nl];
        } else if (nl > 0) {
            int i = (int)(rnd() % (uint64_t)nl);
            size_t nn = r == 9 ? 1 + live[i].n / 2 : live[i].n + 1 + rnd() % (4 * mb);
            size_t off;
            cb_arena_stats_t before, after;
            cb_arena_stats(a, &before);
            cb_status s = cb_arena_grow(a, live[i].off, nn, &off);
            if (s == CB_OK) {
                size_t keep = nn < live[i].n ? nn : live[i].n;
                blk k = {off, keep, live[i].tag};
                if (!intact(base, &k)) bad_data++;
                live[i].off = off;
                live[i].n = nn;
                fill(base, &live[i]);
            } else {
                CHECK(s == CB_STATUS_OUT_OF_MEMORY);
                cb_arena_stats(a, &after);
                CHECK(same_stats(&before, &after));
                if (!intact(base, &live[i])) bad_data++;
            }
        }
        CHECK(cb_arena_check(a) == CB_OK);
        /* Shadow checks: inside, aligned as the rule says (block_align), no overlap. */
        size_t sum_req = 0;
        for (int i = 0; i < nl; i++) {
            size_t req = 0, bsz = 0;
            CHECK(cb_arena_block_info(a, live[i].off, &req, &bsz) == CB_OK);
            sum_req += req;
            if (req != live[i].n || bsz < req || bsz - req >= (exact ? mb : bsz) ||
                live[i].off % block_align(bsz, mb, exact) != 0 || live[i].off + bsz > cap)
                bad_layout++;
            void *vp = NULL; /* every byte of a block is viewable through its own block */
            if (cb_arena_view(a, live[i].off + live[i].n - 1, 1, &vp) != CB_OK ||
                vp != base + live[i].off + live[i].n - 1)
                bad_layout++;
            else
                cb_arena_unpin(a);
            if (cb_arena_view(a, live[i].off + live[i].n / 2, live[i].n - live[i].n / 2, &vp) != CB_OK)
                bad_layout++;
            else
                cb_arena_unpin(a);
            for (int j = 0; j < i; j++)
                if (live[i].off < live[j].off + live[j].n && live[j].off < live[i].off + live[i].n)
                    bad_layout++;
        }
        cb_arena_stats_t st;
        cb_arena_stats(a, &st);
        CHECK(st.n_blocks == (size_t)nl && st.requested == sum_req && st.used + st.free == cap);
    }
    CHECK(bad_data == 0);
    CHECK(bad_layout == 0);
    while (nl > 0) {
        if (!intact(base, &live[nl - 1])) bad_data++;
        CHECK(cb_arena_free_block(a, live[--nl].off) == CB_OK);
    }
    CHECK(bad_data == 0);
    cb_arena_stats_t st;
    CHECK(cb_arena_check(a) == CB_OK);
    cb_arena_stats(a, &st);
    CHECK(same_stats(&st, &st0) && st.used == 0 && st.n_free_blocks == st.n_roots);
    cb_arena_free(a);
}

static void error_paths(void) {
    cb_arena_params p = cb_arena_default_params();
    cb_arena_t *a = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_STATUS_INVALID_ARGUMENT && a == NULL); /* capacity 0 */
    p.capacity = 1 << 20;
    p.min_block = 3000;
    CHECK(cb_arena_new(&p, &a) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(cb_last_error(), "min_block 3000") != NULL);
    p.min_block = 4096;
    p.hugepages = CB_HUGEPAGES_AUTO;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    cb_arena_stats_t s0, s1;
    cb_arena_stats(a, &s0);
    CHECK(strlen(s0.backing) > 0);
    size_t off, off2;
    CHECK(cb_arena_alloc(a, 0, &off) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_alloc(a, (2 << 20), &off) == CB_STATUS_OUT_OF_MEMORY);
    CHECK(strstr(cb_last_error(), "2097152") && strstr(cb_last_error(), "largest free block is 1048576"));
    CHECK(cb_arena_alloc(a, 5000, &off) == CB_OK);
    cb_arena_stats(a, &s0);
    CHECK(s0.used == 8192 && s0.requested == 5000 && s0.internal_waste == 3192);
    CHECK(cb_arena_free_block(a, off + 4096) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_free_block(a, off + 1) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_free_block(a, 1 << 20) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_grow(a, off, 0, &off2) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_grow(a, off, 1 << 21, &off2) == CB_STATUS_OUT_OF_MEMORY);
    void *ptr;
    CHECK(cb_arena_view(a, off + 4000, 1001, &ptr) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_view(a, off + 8192, 1, &ptr) == CB_STATUS_INVALID_ARGUMENT);
    cb_arena_stats(a, &s1);
    CHECK(same_stats(&s0, &s1));
    CHECK(cb_arena_free_block(a, off) == CB_OK);
    CHECK(cb_arena_free_block(a, off) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(cb_last_error(), "double free") != NULL);
    /* A pinned view keeps the mapping after close. */
    CHECK(cb_arena_alloc(a, 100, &off) == CB_OK);
    CHECK(cb_arena_view(a, off, 100, &ptr) == CB_OK);
    cb_arena_close(a);
    memset(ptr, 7, 100);
    CHECK(((uint8_t *)ptr)[99] == 7);
    CHECK(cb_arena_alloc(a, 1, &off) == CB_STATUS_CLOSED);
    CHECK(cb_arena_check(a) == CB_STATUS_CLOSED);
    CHECK(cb_arena_base(a) == NULL);
    cb_arena_unpin(a);
    cb_arena_close(a);
    cb_arena_free(a);
    cb_arena_free(NULL);
    /* Full arena with a non-power-of-two capacity: every root is usable. */
    p.capacity = 7 * 4096;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    size_t o[3];
    CHECK(cb_arena_alloc(a, 4 * 4096, &o[0]) == CB_OK);
    CHECK(cb_arena_alloc(a, 2 * 4096, &o[1]) == CB_OK);
    CHECK(cb_arena_alloc(a, 4096, &o[2]) == CB_OK);
    CHECK(cb_arena_alloc(a, 1, &off) == CB_STATUS_OUT_OF_MEMORY);
    CHECK(cb_arena_check(a) == CB_OK);
    for (int i = 0; i < 3; i++) CHECK(cb_arena_free_block(a, o[i]) == CB_OK);
    cb_arena_stats(a, &s0);
    CHECK(s0.n_roots == 3 && s0.n_free_blocks == 3 && s0.largest_free == 4 * 4096);
    cb_arena_free(a);
    /* Grow in place when the buddy is free; move with contents otherwise. */
    p.capacity = 64 * 4096;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    CHECK(cb_arena_alloc(a, 4096, &off) == CB_OK);
    CHECK(cb_arena_grow(a, off, 3 * 4096, &off2) == CB_OK && off2 == off);
    size_t blocker;
    CHECK(cb_arena_alloc(a, 4096, &blocker) == CB_OK && blocker == off + 3 * 4096);
    memset(cb_arena_base(a) + off, 0x5a, 3 * 4096);
    CHECK(cb_arena_grow(a, off, 4 * 4096, &off2) == CB_OK && off2 != off);
    CHECK(cb_arena_base(a)[off2] == 0x5a && cb_arena_base(a)[off2 + 3 * 4096 - 1] == 0x5a);
    CHECK(cb_arena_check(a) == CB_OK);
    cb_arena_free(a);
}

static void kvcache(void) {
    cb_arena_params p = cb_arena_default_params();
    p.capacity = 4 << 20;
    p.hugepages = CB_HUGEPAGES_OFF;
    cb_arena_t *a = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    cb_kvcache_params kp = cb_kvcache_default_params();
    cb_kvcache_t *kv = NULL;
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_STATUS_INVALID_ARGUMENT);
    kp.n_layers = 3;
    kp.n_kv_heads = 2;
    kp.head_dim = 8;
    kp.dtype = CB_KV_F32;
    kp.chunk_tokens = 4;
    kp.page_tokens = 0;
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_STATUS_INVALID_ARGUMENT);
    kp.page_tokens = 5; /* pages of 5 tokens: every sequence crosses pages, growth re-lays out */
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_OK);
    size_t stride = cb_kvcache_token_stride(kv);
    CHECK(stride == 3 * 2 * 2 * 8 * 4 && cb_kvcache_page_tokens(kv) == 5 && cb_kvcache_row_elems(kv) == 8);
    uint32_t s[4];
    for (int i = 0; i < 4; i++) CHECK(cb_kvcache_seq_new(kv, &s[i]) == CB_OK);
    CHECK(s[0] == 0 && s[3] == 3);
    /* Write every token of every sequence as it grows, re-checking all earlier values. */
    int bad = 0;
    for (size_t t = 0; t < 160; t++) {
        for (int q = 0; q < 4; q++) {
            if (t >= (size_t)(40 * (q + 1))) continue;
            CHECK(cb_kvcache_seq_reserve(kv, s[q], t + 1) == CB_OK);
            for (uint32_t l = 0; l < 3; l++)
                for (uint32_t k = 0; k < 2; k++)
                    for (uint32_t h = 0; h < 2; h++) {
                        float *f;
                        CHECK(cb_kvcache_row_ptr(kv, s[q], t, l, k, h, (void **)&f) == CB_OK);
                        for (int e = 0; e < 8; e++) f[e] = (float)(q * 100000 + t * 100 + l * 10 + k) + (h * 8 + e) * 0.25f;
                    }
            CHECK(cb_kvcache_seq_set_len(kv, s[q], t + 1) == CB_OK);
        }
    }
    size_t off, len, cap;
    int has;
    for (int q = 0; q < 4; q++) {
        CHECK(cb_kvcache_seq_len(kv, s[q], &len) == CB_OK && len == (size_t)(40 * (q + 1)));
        CHECK(cb_kvcache_seq_capacity(kv, s[q], &cap) == CB_OK && cap >= len && cap % 4 == 0);
        CHECK(cb_kvcache_seq_offset(kv, s[q], &off, &has) == CB_OK && has);
        const uint8_t *base = cb_arena_base(a);
        /* the documented layout: page of 5 at start * stride, r rows, group g's rows together */
        for (size_t t = 0; t < len; t++)
            for (uint32_t l = 0; l < 3; l++)
                for (uint32_t k = 0; k < 2; k++)
                    for (uint32_t h = 0; h < 2; h++) {
                        size_t start = t / 5 * 5, r = cap - start < 5 ? cap - start : 5, g = (l * 2 + k) * 2 + h;
                        const float *f = (const float *)(base + off + start * stride + (g * r + t % 5) * 8 * 4);
                        for (int e = 0; e < 8; e++)
                            if (f[e] != (float)(q * 100000 + t * 100 + l * 10 + k) + (h * 8 + e) * 0.25f) bad++;
                    }
    }
    CHECK(bad == 0);
    void *ptr;
    CHECK(cb_kvcache_row_ptr(kv, s[0], cap + 1000, 0, 0, 0, &ptr) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_row_ptr(kv, s[0], 0, 3, 0, 0, &ptr) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_row_ptr(kv, s[0], 0, 0, 0, 2, &ptr) == CB_STATUS_INVALID_ARGUMENT);
    float rows[40 * 2 * 8];
    CHECK(cb_kvcache_read(kv, s[0], 2, 1, 0, 40, rows) == CB_OK);
    bad = 0;
    for (size_t t = 0; t < 40; t++)
        for (int e = 0; e < 16; e++) bad += rows[t * 16 + e] != (float)(t * 100 + 21) + e * 0.25f;
    CHECK(bad == 0);
    CHECK(cb_kvcache_read(kv, s[0], 2, 1, 1, 40, rows) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_write(kv, s[0], 2, 1, 0, 40, rows) == CB_OK);
    CHECK(cb_kvcache_seq_set_len(kv, s[0], 1000) == CB_STATUS_INVALID_ARGUMENT);
    cb_arena_stats_t st0, st1;
    cb_arena_stats(a, &st0);
    CHECK(cb_kvcache_seq_reserve(kv, s[0], 1 << 20) == CB_STATUS_OUT_OF_MEMORY);
    cb_arena_stats(a, &st1);
    CHECK(same_stats(&st0, &st1));
    CHECK(cb_kvcache_seq_len(kv, s[0], &len) == CB_OK && len == 40);
    CHECK(cb_kvcache_list(kv, NULL, 0) == 4);
    CHECK(cb_kvcache_seq_free(kv, s[1]) == CB_OK);
    CHECK(cb_kvcache_seq_free(kv, s[1]) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_list(kv, NULL, 0) == 3);
    CHECK(cb_arena_check(a) == CB_OK);
    cb_kvcache_close(kv);
    cb_arena_stats(a, &st1);
    CHECK(st1.used == 0 && st1.n_blocks == 0);
    CHECK(cb_kvcache_seq_new(kv, &s[0]) == CB_STATUS_CLOSED);
    CHECK(cb_kvcache_row_ptr(kv, s[2], 0, 0, 0, 0, &ptr) == CB_STATUS_CLOSED);
    CHECK(cb_kvcache_list(kv, NULL, 0) == 0);
    cb_kvcache_close(kv);
    cb_kvcache_free(kv);
    cb_kvcache_free(NULL);
    /* Freeing a cache frees its sequences' blocks. */
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_OK);
    CHECK(cb_kvcache_seq_new(kv, &s[0]) == CB_OK && cb_kvcache_seq_reserve(kv, s[0], 10) == CB_OK);
    cb_kvcache_free(kv);
    cb_arena_stats(a, &st1);
    CHECK(st1.used == 0);
    cb_arena_free(a);
}

/* Threads allocate, grow, verify and free their own blocks concurrently. */
typedef struct {
    cb_arena_t *a;
    uint64_t seed;
    int bad;
} thread_arg;

static void *thread_ops(void *p) {
    thread_arg *t = p;
    uint64_t r = t->seed;
    blk mine[16];
    int n = 0;
    uint8_t *base = cb_arena_base(t->a);
    for (int step = 0; step < 3000; step++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        if ((r % 3 == 0 || n == 0) && n < 16) {
            size_t sz = 1 + (r >> 8) % 20000, off;
            if (cb_arena_alloc(t->a, sz, &off) == CB_OK) {
                mine[n] = (blk){off, sz, (uint8_t)(r >> 40)};
                fill(base, &mine[n++]);
            }
        } else {
            int i = (int)((r >> 16) % (uint64_t)n);
            if (!intact(base, &mine[i])) t->bad++;
            size_t off;
            if (r % 3 == 1 && cb_arena_grow(t->a, mine[i].off, mine[i].n * 2, &off) == CB_OK) {
                blk moved = {off, mine[i].n, mine[i].tag};
                if (!intact(base, &moved)) t->bad++;
                mine[i].off = off;
                mine[i].n *= 2;
                fill(base, &mine[i]);
            } else {
                if (cb_arena_free_block(t->a, mine[i].off) != CB_OK) t->bad++;
                mine[i] = mine[--n];
            }
        }
    }
    while (n > 0)
        if (cb_arena_free_block(t->a, mine[--n].off) != CB_OK) t->bad++;
    return NULL;
}

static void threads(void) {
    cb_arena_params p = cb_arena_default_params();
    p.capacity = 8 << 20;
    p.min_block = 512;
    cb_arena_t *a = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){a, 0x1234567ull * (uint64_t)(i + 1), 0};
        CHECK(pthread_create(&th[i], NULL, thread_ops, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].bad == 0);
    }
    cb_arena_stats_t st;
    CHECK(cb_arena_check(a) == CB_OK);
    CHECK(cb_arena_stats(a, &st) == CB_OK && st.used == 0 && st.n_free_blocks == 1);
    cb_arena_free(a);
}

/* cb_arena_compact slides listed blocks down or up into the free stretches next to them, data
 * and invariants intact; bad lists move nothing. */
static void compaction(void) {
    cb_arena_params p = cb_arena_default_params();
    p.capacity = 64 * 64;
    p.min_block = 64;
    p.hugepages = CB_HUGEPAGES_OFF;
    cb_arena_t *a = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    uint8_t *base = cb_arena_base(a);
    blk b[8];
    for (int i = 0; i < 8; i++) {
        b[i].n = 5 * 64 - 7;
        b[i].tag = (uint8_t)(i * 17 + 1);
        CHECK(cb_arena_alloc(a, b[i].n, &b[i].off) == CB_OK);
        fill(base, &b[i]);
    }
    blk keep[4];
    size_t offs[4];
    for (int i = 0; i < 8; i++) {
        if (i % 2) CHECK(cb_arena_free_block(a, b[i].off) == CB_OK);
        else keep[i / 2] = b[i];
    }
    for (int i = 0; i < 4; i++) offs[i] = keep[i].off;
    size_t rev[2] = {offs[1], offs[0]}, bad_off[2] = {offs[0], offs[0] + 64};
    CHECK(cb_arena_compact(a, rev, 2, 0) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_arena_compact(a, bad_off, 2, 0) == CB_STATUS_INVALID_ARGUMENT);
    size_t bad_first[2] = {offs[0] + 64, offs[1]}; /* the first offset is checked too */
    CHECK(cb_arena_compact(a, bad_first, 2, 0) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(rev[0] == offs[1] && bad_off[0] == offs[0]);
    int bad = 0;
    for (int i = 0; i < 4; i++) bad += !intact(base, &keep[i]);
    CHECK(bad == 0);
    /* down: back to back from the bottom (5-unit blocks are aligned to 1 unit) */
    CHECK(cb_arena_compact(a, offs, 4, 0) == CB_OK);
    CHECK(cb_arena_check(a) == CB_OK);
    for (int i = 0; i < 4; i++) {
        CHECK(offs[i] == (size_t)i * 5 * 64);
        keep[i].off = offs[i];
        bad += !intact(base, &keep[i]);
    }
    CHECK(bad == 0);
    cb_arena_stats_t st;
    CHECK(cb_arena_stats(a, &st) == CB_OK && st.largest_free == 32 * 64);
    /* up: back to back against the top */
    CHECK(cb_arena_compact(a, offs, 4, 1) == CB_OK);
    CHECK(cb_arena_check(a) == CB_OK);
    for (int i = 0; i < 4; i++) {
        CHECK(offs[i] == (size_t)(64 - 5 * (4 - i)) * 64);
        keep[i].off = offs[i];
        bad += !intact(base, &keep[i]);
    }
    CHECK(bad == 0);
    cb_arena_free(a);
}

/* Sequences growing one token at a time, interleaved, fill an arena sized for 40 tokens to
 * the last token: a full reserve gives back the others' chunk rounding and compacts (moving
 * other sequences, whose tokens stay intact). */
static void kvcache_full(void) {
    cb_kvcache_params kp = cb_kvcache_default_params();
    kp.n_layers = 2;
    kp.n_kv_heads = 1;
    kp.head_dim = 16;
    kp.dtype = CB_KV_F32;
    kp.chunk_tokens = 16;
    size_t stride = 2 * 2 * 16 * 4;
    cb_arena_params p = cb_arena_default_params();
    p.capacity = 40 * stride;
    p.min_block = 64;
    p.hugepages = CB_HUGEPAGES_OFF;
    cb_arena_t *a = NULL;
    cb_kvcache_t *kv = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_OK);
    uint32_t s[3];
    for (int q = 0; q < 3; q++) CHECK(cb_kvcache_seq_new(kv, &s[q]) == CB_OK);
    size_t held = 0;
    int full = 0;
    for (size_t t = 0; !full; t++) {
        for (int q = 0; q < 3 && !full; q++) {
            cb_status st = cb_kvcache_seq_reserve(kv, s[q], t + 1);
            if (st != CB_OK) {
                CHECK(st == CB_STATUS_OUT_OF_MEMORY);
                CHECK(strstr(cb_last_error(), "the cache holds") != NULL);
                CHECK(strstr(cb_last_error(), "in 3 live sequences") != NULL);
                full = 1;
                break;
            }
            for (uint32_t l = 0; l < 2; l++)
                for (uint32_t k = 0; k < 2; k++) {
                    float *f;
                    CHECK(cb_kvcache_row_ptr(kv, s[q], t, l, k, 0, (void **)&f) == CB_OK);
                    for (int e = 0; e < 16; e++) f[e] = (float)(q * 1000 + t) + ((l * 2 + k) * 16 + e) * 0.5f;
                }
            CHECK(cb_kvcache_seq_set_len(kv, s[q], t + 1) == CB_OK);
            held++;
        }
    }
    CHECK(held == 40);
    CHECK(cb_arena_check(a) == CB_OK);
    int bad = 0;
    for (int q = 0; q < 3; q++) {
        size_t len = 0;
        CHECK(cb_kvcache_seq_len(kv, s[q], &len) == CB_OK);
        for (size_t t = 0; t < len; t++)
            for (uint32_t l = 0; l < 2; l++)
                for (uint32_t k = 0; k < 2; k++) {
                    float *f;
                    CHECK(cb_kvcache_row_ptr(kv, s[q], t, l, k, 0, (void **)&f) == CB_OK);
                    for (int e = 0; e < 16; e++) bad += f[e] != (float)(q * 1000 + t) + ((l * 2 + k) * 16 + e) * 0.5f;
                }
    }
    CHECK(bad == 0);
    cb_kvcache_free(kv);
    cb_arena_free(a);
}

/* Byte b of token t of sequence tag q: a pattern that differs by token, layer, K/V and byte. */
static uint8_t kv_pat(unsigned q, size_t t, size_t b) { return (uint8_t)(q * 131u + t * 7u + b * 13u + 1u); }

static void kv_fill(cb_kvcache_t *kv, const cb_kvcache_params *kp, uint32_t seq, unsigned q, size_t from, size_t to) {
    const size_t row = cb_kvcache_token_stride(kv) / (2 * kp->n_layers * kp->n_kv_heads);
    for (size_t t = from; t < to; t++)
        for (uint32_t g = 0; g < 2 * kp->n_layers * kp->n_kv_heads; g++) {
            uint8_t *p = NULL;
            CHECK(cb_kvcache_row_ptr(kv, seq, t, g / (2 * kp->n_kv_heads), g / kp->n_kv_heads % 2, g % kp->n_kv_heads, (void **)&p) == CB_OK);
            for (size_t b = 0; b < row; b++) p[b] = kv_pat(q, t, g * row + b);
        }
    CHECK(cb_kvcache_seq_set_len(kv, seq, to) == CB_OK);
}

/* Whether tokens [0, n) of seq hold q's pattern, read row by row through cb_kvcache_row_ptr
 * (so the layout, not one memcmp of the block, is what is checked). */
static int kv_holds(cb_kvcache_t *kv, const cb_kvcache_params *kp, uint32_t seq, unsigned q, size_t n) {
    const size_t row = cb_kvcache_token_stride(kv) / (2 * kp->n_layers * kp->n_kv_heads);
    for (size_t t = 0; t < n; t++)
        for (uint32_t g = 0; g < 2 * kp->n_layers * kp->n_kv_heads; g++) {
            uint8_t *p = NULL;
            if (cb_kvcache_row_ptr(kv, seq, t, g / (2 * kp->n_kv_heads), g / kp->n_kv_heads % 2, g % kp->n_kv_heads, (void **)&p) != CB_OK) return 0;
            for (size_t b = 0; b < row; b++)
                if (p[b] != kv_pat(q, t, g * row + b)) return 0;
        }
    return 1;
}

/* cb_kvcache_copy_prefix: every layer's K and V, both dtypes, pages of 256 and 4 tokens, its
 * argument checks, a copy over a longer destination, a copy whose reserve must compact the cache
 * (both blocks move), and a destination that cannot hold the prefix (unchanged). */
static void copy_prefix(void) {
    for (int cfg = 0; cfg < 4; cfg++) {
        const int dt = cfg & 1;
        cb_arena_params p = cb_arena_default_params();
        p.capacity = 64 * 4096;
        p.min_block = 256;
        p.hugepages = CB_HUGEPAGES_OFF;
        cb_arena_t *a = NULL;
        CHECK(cb_arena_new(&p, &a) == CB_OK);
        cb_kvcache_params kp = cb_kvcache_default_params();
        kp.n_layers = 3;
        kp.n_kv_heads = 2;
        kp.head_dim = 8;
        kp.dtype = dt ? CB_KV_F32 : CB_KV_F16;
        kp.chunk_tokens = 4;
        kp.page_tokens = cfg & 2 ? 4 : 256;
        cb_kvcache_t *kv = NULL;
        CHECK(cb_kvcache_new(a, &kp, &kv) == CB_OK);
        size_t stride = cb_kvcache_token_stride(kv);
        CHECK(stride == 3u * 2 * 2 * 8 * (dt ? 4 : 2));
        uint32_t src, dst, other, dead;
        CHECK(cb_kvcache_seq_new(kv, &src) == CB_OK && cb_kvcache_seq_new(kv, &dst) == CB_OK);
        CHECK(cb_kvcache_seq_reserve(kv, src, 37) == CB_OK);
        kv_fill(kv, &kp, src, 1, 0, 37);
        /* into an empty sequence */
        CHECK(cb_kvcache_copy_prefix(kv, src, dst, 21) == CB_OK);
        size_t len = 0, cap = 0;
        CHECK(cb_kvcache_seq_len(kv, dst, &len) == CB_OK && len == 21);
        CHECK(cb_kvcache_seq_capacity(kv, dst, &cap) == CB_OK && cap >= 21);
        CHECK(kv_holds(kv, &kp, dst, 1, 21));
        CHECK(cb_kvcache_seq_len(kv, src, &len) == CB_OK && len == 37);
        CHECK(kv_holds(kv, &kp, src, 1, 37));
        /* over a longer destination: its length becomes n, its own tokens beyond are dropped */
        CHECK(cb_kvcache_seq_new(kv, &other) == CB_OK && cb_kvcache_seq_reserve(kv, other, 50) == CB_OK);
        kv_fill(kv, &kp, other, 2, 0, 50);
        CHECK(cb_kvcache_copy_prefix(kv, src, other, 37) == CB_OK);
        CHECK(cb_kvcache_seq_len(kv, other, &len) == CB_OK && len == 37);
        CHECK(kv_holds(kv, &kp, other, 1, 37));
        /* the whole source, then zero tokens */
        CHECK(cb_kvcache_copy_prefix(kv, other, dst, 37) == CB_OK && kv_holds(kv, &kp, dst, 1, 37));
        CHECK(cb_kvcache_copy_prefix(kv, src, dst, 0) == CB_OK);
        CHECK(cb_kvcache_seq_len(kv, dst, &len) == CB_OK && len == 0);
        /* argument checks: nothing changes */
        CHECK(cb_kvcache_copy_prefix(kv, src, src, 3) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_copy_prefix(kv, src, dst, 38) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_copy_prefix(kv, src, 999, 3) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_copy_prefix(kv, 999, dst, 3) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_seq_new(kv, &dead) == CB_OK && cb_kvcache_seq_free(kv, dead) == CB_OK);
        CHECK(cb_kvcache_copy_prefix(kv, dead, dst, 0) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_copy_prefix(kv, src, dead, 0) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_copy_prefix(NULL, src, dst, 1) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_kvcache_seq_len(kv, dst, &len) == CB_OK && len == 0);
        CHECK(cb_kvcache_seq_len(kv, src, &len) == CB_OK && len == 37);
        CHECK(cb_arena_check(a) == CB_OK);
        /* a fragmented, nearly full cache: fillers between the sequences, every other one
         * freed, so the copy's reserve only fits after compaction moves the blocks */
        CHECK(cb_kvcache_seq_free(kv, other) == CB_OK && cb_kvcache_seq_free(kv, dst) == CB_OK);
        CHECK(cb_kvcache_seq_new(kv, &dst) == CB_OK);
        uint32_t fill[256];
        size_t nf = 0;
        while (nf < 256) {
            CHECK(cb_kvcache_seq_new(kv, &fill[nf]) == CB_OK);
            if (cb_kvcache_seq_reserve(kv, fill[nf], 5) != CB_OK) {
                CHECK(cb_kvcache_seq_free(kv, fill[nf]) == CB_OK);
                break;
            }
            kv_fill(kv, &kp, fill[nf], 10 + (unsigned)nf % 50, 0, 5);
            nf++;
        }
        CHECK(nf > 8 && nf < 256);
        size_t off = 0;
        int has = 0;
        size_t freed = 0;
        for (size_t i = 0; i < nf; i += 2) {
            CHECK(cb_kvcache_seq_free(kv, fill[i]) == CB_OK);
            fill[i] = UINT32_MAX;
            freed += 5;
        }
        size_t n = freed > 37 ? 37 : freed - 2;
        CHECK(n >= 20);
        size_t before[256];
        for (size_t i = 1; i < nf; i += 2) CHECK(cb_kvcache_seq_offset(kv, fill[i], &before[i], &has) == CB_OK);
        CHECK(cb_kvcache_copy_prefix(kv, src, dst, n) == CB_OK);
        CHECK(kv_holds(kv, &kp, dst, 1, n) && kv_holds(kv, &kp, src, 1, 37));
        size_t moved = 0;
        for (size_t i = 1; i < nf; i += 2) {
            CHECK(cb_kvcache_seq_offset(kv, fill[i], &off, &has) == CB_OK);
            moved += off != before[i];
        }
        CHECK(moved > 0); /* the reserve did compact */
        for (size_t i = 1; i < nf; i += 2) CHECK(kv_holds(kv, &kp, fill[i], 10 + (unsigned)i % 50, 5));
        CHECK(cb_kvcache_seq_offset(kv, src, &off, &has) == CB_OK && has);
        CHECK(cb_arena_check(a) == CB_OK);
        /* a destination that cannot hold the prefix: OUT_OF_MEMORY, its length unchanged */
        uint32_t big, hog;
        CHECK(cb_kvcache_seq_new(kv, &big) == CB_OK);
        CHECK(cb_kvcache_seq_reserve(kv, big, 1) == CB_OK);
        kv_fill(kv, &kp, big, 3, 0, 1);
        CHECK(cb_kvcache_seq_new(kv, &hog) == CB_OK);
        size_t h = 1;
        while (cb_kvcache_seq_reserve(kv, hog, h) == CB_OK) h++; /* takes the rest */
        CHECK(h > 37);
        CHECK(cb_kvcache_copy_prefix(kv, src, big, 37) == CB_STATUS_OUT_OF_MEMORY);
        CHECK(cb_kvcache_seq_len(kv, big, &len) == CB_OK && len == 1 && kv_holds(kv, &kp, big, 3, 1));
        CHECK(cb_arena_check(a) == CB_OK);
        cb_kvcache_close(kv);
        CHECK(cb_kvcache_copy_prefix(kv, src, dst, 1) == CB_STATUS_CLOSED);
        cb_kvcache_free(kv);
        cb_arena_free(a);
        cb_clear_error();
    }
}

/* The recurrent state (state_bytes): zeroed at seq_new, copied in and out, kept through a
 * growing length, zeroed by a length of 0, never truncated otherwise; copy_prefix copies it at
 * the source's end, takes a snapshot otherwise, and refuses a prefix without one. */
static void recurrent_state(void) {
    cb_arena_params p = cb_arena_default_params();
    p.capacity = 1 << 20;
    p.hugepages = CB_HUGEPAGES_OFF;
    cb_arena_t *a = NULL;
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    cb_kvcache_params kp = cb_kvcache_default_params();
    kp.n_layers = 1;
    kp.n_kv_heads = 1;
    kp.head_dim = 4;
    kp.state_bytes = 40;
    cb_kvcache_t *kv = NULL;
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_OK);
    CHECK(cb_kvcache_state_bytes(kv) == 40);
    uint32_t s0, s1;
    CHECK(cb_kvcache_seq_new(kv, &s0) == CB_OK && cb_kvcache_seq_new(kv, &s1) == CB_OK);
    float *st = NULL, buf[10], snap[10];
    CHECK(cb_kvcache_seq_state(kv, s0, (void **)&st) == CB_OK && st && ((uintptr_t)st % 64) == 0);
    for (int i = 0; i < 10; i++) CHECK(st[i] == 0.0f);
    for (int i = 0; i < 10; i++) st[i] = (float)i + 1.0f;
    CHECK(cb_kvcache_seq_reserve(kv, s0, 20) == CB_OK && cb_kvcache_seq_set_len(kv, s0, 8) == CB_OK);
    CHECK(cb_kvcache_state_get(kv, s0, snap) == CB_OK && snap[9] == 10.0f);
    CHECK(cb_kvcache_seq_set_len(kv, s0, 12) == CB_OK && st[3] == 4.0f); /* growth keeps it */
    st[0] = 100.0f;
    CHECK(cb_kvcache_seq_set_len(kv, s0, 5) == CB_STATUS_UNSUPPORTED);
    size_t len = 0;
    CHECK(cb_kvcache_seq_len(kv, s0, &len) == CB_OK && len == 12);
    CHECK(cb_kvcache_copy_prefix(kv, s0, s1, 8) == CB_STATUS_UNSUPPORTED); /* no state there */
    CHECK(cb_kvcache_copy_prefix_state(kv, s0, s1, 8, snap) == CB_OK);
    CHECK(cb_kvcache_state_get(kv, s1, buf) == CB_OK && buf[0] == 1.0f && buf[9] == 10.0f);
    CHECK(cb_kvcache_seq_len(kv, s1, &len) == CB_OK && len == 8);
    CHECK(cb_kvcache_copy_prefix(kv, s0, s1, 12) == CB_OK); /* the end: the state itself */
    CHECK(cb_kvcache_state_get(kv, s1, buf) == CB_OK && buf[0] == 100.0f);
    CHECK(cb_kvcache_copy_prefix(kv, s0, s1, 0) == CB_OK);
    CHECK(cb_kvcache_state_get(kv, s1, buf) == CB_OK && buf[0] == 0.0f && buf[9] == 0.0f);
    buf[4] = 7.0f;
    CHECK(cb_kvcache_state_set(kv, s1, buf) == CB_OK && cb_kvcache_state_get(kv, s1, snap) == CB_OK && snap[4] == 7.0f);
    CHECK(cb_kvcache_seq_set_len(kv, s0, 0) == CB_OK && st[0] == 0.0f && st[9] == 0.0f);
    CHECK(cb_kvcache_state_get(kv, 7, buf) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_state_set(kv, s1, NULL) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_copy_prefix_state(kv, s0, s1, 0, NULL) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_seq_free(kv, s0) == CB_OK && cb_kvcache_seq_new(kv, &s0) == CB_OK);
    CHECK(cb_kvcache_seq_state(kv, s0, (void **)&st) == CB_OK && st[0] == 0.0f);
    cb_kvcache_free(kv);
    /* without state_bytes: none to get */
    kp.state_bytes = 0;
    CHECK(cb_kvcache_new(a, &kp, &kv) == CB_OK && cb_kvcache_seq_new(kv, &s0) == CB_OK);
    CHECK(cb_kvcache_seq_state(kv, s0, (void **)&st) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_kvcache_copy_prefix_state(kv, s0, s0, 0, buf) == CB_STATUS_INVALID_ARGUMENT);
    cb_kvcache_free(kv);
    cb_arena_free(a);
    cb_clear_error();
}

/* Exact mode packs a run against its neighbours (arena.h): after a 1-unit block at 0 the free
 * blocks are units 1 (order 0), 2-3, 4-7, 8-15; a 3-unit run starts at the free unit 1,
 * followed by the free units 2-3, not at the first free 4-unit block (unit 4), where the
 * power-of-two mode puts its 4-unit block. */
static void exact_packing(void) {
    for (int exact = 1; exact >= 0; exact--) {
        cb_arena_params p = cb_arena_default_params();
        p.capacity = 16 * 4096;
        p.exact = exact;
        cb_arena_t *a = NULL;
        size_t o1, o3, req, blk;
        CHECK(cb_arena_new(&p, &a) == CB_OK);
        CHECK(cb_arena_alloc(a, 4096, &o1) == CB_OK && o1 == 0);
        CHECK(cb_arena_alloc(a, 3 * 4096 - 5, &o3) == CB_OK);
        CHECK(o3 == (exact ? 4096u : 4u * 4096));
        CHECK(cb_arena_block_info(a, o3, &req, &blk) == CB_OK && req == 3 * 4096 - 5 &&
              blk == (exact ? 3u : 4u) * 4096);
        CHECK(cb_arena_check(a) == CB_OK);
        cb_arena_free(a);
    }
}

/* The THP mode the arena reads is the bracketed word of the sysfs file (read here on its own):
 * shared memory under AUTO gets THP advised unless the mode is "never" or "deny" (or the file
 * is unreadable), and the note quotes the mode. */
static void shm_thp_mode(void) {
    char line[256] = "", mode[64] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f) {
        if (fgets(line, sizeof line, f)) {
            char *l = strchr(line, '['), *r = l ? strchr(l, ']') : NULL;
            if (l && r && r - l - 1 < (long)sizeof mode) snprintf(mode, sizeof mode, "%.*s", (int)(r - l - 1), l + 1);
        }
        fclose(f);
    }
    cb_arena_params p = cb_arena_default_params();
    p.capacity = 1 << 21;
    p.backing = CB_BACKING_SHM;
    cb_arena_t *a = NULL;
    if (access("/dev/shm", W_OK) != 0) return; /* no /dev/shm here: nothing to compare */
    CHECK(cb_arena_new(&p, &a) == CB_OK);
    cb_arena_stats_t s;
    cb_arena_stats(a, &s);
    if (mode[0] == '\0' || strcmp(mode, "never") == 0 || strcmp(mode, "deny") == 0) {
        char want[80];
        snprintf(want, sizeof want, "are '%s'", mode[0] ? mode : "unavailable");
        CHECK(strcmp(s.backing, "shm") == 0 && strstr(s.backing_note, want) != NULL);
    } else {
        CHECK(strcmp(s.backing, "shm+thp") == 0 || strstr(s.backing_note, "madvise") != NULL);
    }
    cb_arena_free(a);
}

int main(void) {
    exact_packing();
    shm_thp_mode();
    random_ops(1 << 20, 4096, 1, 3000);
    random_ops(1 << 20, 4096, 0, 3000);
    random_ops(13 * 4096 * 5 + 100, 4096, 1, 3000);
    random_ops(100 * 64 + 1, 64, 1, 2000);
    error_paths();
    kvcache();
    compaction();
    kvcache_full();
    copy_prefix();
    recurrent_state();
    threads();
    TEST_MAIN_END("test_arena");
}
