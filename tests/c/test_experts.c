/* experts.h: cache and mmap stores against the mapped store on a file of known bytes; LRU miss
 * counts against a reference simulation (a scan of a list); LFRU keeps a frequent expert
 * through a scan that LRU evicts; locked experts are never evicted; too-small pools fail.
 * One read per expert on a container-like layout (gate|up|down adjacent per expert); the
 * prefetch thread: hinted experts become hits, bytes always match the mapped store while hints
 * and acquires race, statistics add up, free() while reads are in flight. The cache pool's
 * pin/unpin callbacks: once each, unpin before the unmap, refusals. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "colibri/experts.h"
#include "testutil.h"

enum { NL = 2, NE = 6, GS = 100, US = 60, DS = 84 };

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* reference LRU over (layer, expert) keys: list[0] = least recent */
static int ref_list[NL * NE], ref_n;

/* every test runs twice: buffered reads, then O_DIRECT (where /tmp's file system takes it; the
 * default, 1, would not use it for experts this small) */
static int g_direct;

static cb_experts_params_t params(void) {
    cb_experts_params_t p = cb_experts_default_params();
    p.direct_io = g_direct ? 2 : 0; /* 2: even for these small experts */
    return p;
}

static cb_experts_t *make(int mode, int policy, const char *path, uint64_t budget, int min_slots,
                          const cb_experts_layer_t *ls) {
    cb_experts_params_t p = params();
    p.mode = mode;
    p.policy = policy;
    p.path = path;
    p.budget_bytes = budget;
    p.min_slots = min_slots;
    cb_experts_t *s = NULL;
    CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
    return s;
}

static int same_bytes(const cb_expert_ref_t *a, const cb_expert_ref_t *b) {
    return memcmp(a->gate, b->gate, GS) == 0 && memcmp(a->up, b->up, US) == 0 &&
           memcmp(a->down, b->down, DS) == 0;
}

/* A file whose experts are laid out like the colibri container: per expert one block of BLK
 * bytes holding gate | up | down (small alignment gaps), layer-major. */
enum { CNE = 8, CG = 1000, CU = 700, CD = 900, CBLK = 4096 };

static void write_file(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(b, 1, n, f) == n);
    fclose(f);
}

static void test_one_read(void) {
    char path[] = "/tmp/cb_test_experts_c_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    const size_t head = 8192;
    size_t fsize = head + (size_t)NL * CNE * CBLK;
    uint8_t *bytes = malloc(fsize);
    for (size_t i = 0; i < fsize; i++) bytes[i] = (uint8_t)rnd();
    write_file(path, bytes, fsize);
    cb_experts_layer_t ls[NL];
    memset(ls, 0, sizeof ls);
    for (int l = 0; l < NL; l++) {
        size_t o = head + (size_t)l * CNE * CBLK;
        ls[l] = (cb_experts_layer_t){.n_expert = CNE, .n_embd = 4, .n_ff = 4,
                                     .gate_stride = CBLK, .up_stride = CBLK, .down_stride = CBLK,
                                     .gate_bytes = CG, .up_bytes = CU, .down_bytes = CD,
                                     .gate_off = o, .up_off = o + 1024, .down_off = o + 1792};
        ls[l].gate_base = bytes + ls[l].gate_off;
        ls[l].up_base = bytes + ls[l].up_off;
        ls[l].down_base = bytes + ls[l].down_off;
    }
    cb_experts_t *ref = make(CB_EXPERTS_MAPPED, 0, NULL, 0, 1, ls);
    for (int pf = 0; pf <= 1; pf++) {
        cb_experts_params_t p = params();
        p.mode = CB_EXPERTS_CACHE;
        p.path = path;
        p.budget_bytes = 3 * CBLK;
        p.min_slots = 2;
        p.prefetch = pf;
        cb_experts_t *s = NULL;
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
        if (!s) continue;
        cb_experts_info_t info;
        CHECK(cb_experts_info(s, &info) == CB_OK);
        CHECK(info.one_read_layers == NL && info.prefetch == pf);
        CHECK(info.expert_bytes == (uint64_t)NL * CNE * (CG + CU + CD));
        for (int step = 0; step < 200; step++) {
            int layer = (int)(rnd() % NL), ids[2] = {(int)(rnd() % CNE), (int)(rnd() % CNE)};
            int n = ids[0] == ids[1] ? 1 : 2;
            if (pf && step % 3 == 0) {
                int h[3] = {(int)(rnd() % CNE), (int)(rnd() % CNE), ids[0]};
                CHECK(cb_experts_prefetch(s, layer, h, 3) == CB_OK);
            }
            cb_expert_ref_t a[2], b[2];
            CHECK(cb_experts_acquire(s, layer, ids, n, NULL, a) == CB_OK);
            CHECK(cb_experts_acquire(ref, layer, ids, n, NULL, b) == CB_OK);
            for (int i = 0; i < n; i++)
                CHECK(memcmp(a[i].gate, b[i].gate, CG) == 0 && memcmp(a[i].up, b[i].up, CU) == 0 &&
                      memcmp(a[i].down, b[i].down, CD) == 0);
            CHECK(cb_experts_release(s, layer, ids, n) == CB_OK);
        }
        cb_experts_prefetch_sync(s);
        cb_experts_layer_stats_t st;
        CHECK(cb_experts_stats(s, -1, &st) == CB_OK);
        /* one pread per expert read, misses and prefetches alike; the span includes the gaps */
        CHECK(st.misses > 0 && st.reads == st.misses + st.prefetch_issued);
        CHECK(st.bytes_read == st.reads * (1792 + CD));
        CHECK(st.hits + st.misses == st.acquired);
        CHECK(pf || st.prefetch_issued == 0);
        cb_experts_free(s);
    }
    /* not in gate|up|down order: three reads per expert */
    for (int l = 0; l < NL; l++) {
        ls[l].down_off = ls[l].gate_off + 1024;
        ls[l].up_off = ls[l].gate_off + 2048;
        ls[l].up_base = bytes + ls[l].up_off;
        ls[l].down_base = bytes + ls[l].down_off;
    }
    cb_experts_t *s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 1, 1, ls);
    cb_experts_info_t info;
    CHECK(cb_experts_info(s, &info) == CB_OK && info.one_read_layers == 0);
    cb_expert_ref_t a;
    int one = 1;
    CHECK(cb_experts_acquire(s, 0, &one, 1, NULL, &a) == CB_OK);
    CHECK(memcmp(a.up, bytes + ls[0].up_off + CBLK, CU) == 0 &&
          memcmp(a.down, bytes + ls[0].down_off + CBLK, CD) == 0);
    CHECK(cb_experts_release(s, 0, &one, 1) == CB_OK);
    cb_experts_layer_stats_t st;
    CHECK(cb_experts_stats(s, 0, &st) == CB_OK && st.reads == 3 && st.misses == 1);
    CHECK(st.bytes_read == CG + CU + CD);
    cb_experts_free(s);
    /* a matrix larger than its stride is refused */
    ls[0].gate_bytes = CBLK + 1;
    cb_experts_params_t p = params();
    s = NULL;
    CHECK(cb_experts_new(&p, ls, NL, &s) == CB_STATUS_INVALID_ARGUMENT && !s);
    cb_experts_free(ref);
    free(bytes);
    unlink(path);
}

/* Misses read in parallel: an acquire of 6 missing experts reads them at once (several reader
 * threads; one job per expert, or per matrix when they are not adjacent) into the right slots;
 * when the file has shrunk under the store, the acquire fails with an I/O error naming the
 * cause, keeps nothing it could not read, and the store works again once the file is whole. */
static void test_parallel_reads(int three) {
    char path[] = "/tmp/cb_test_experts_r_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const size_t head = 4096, per = 64 * 1024;
    size_t fsize = head + (size_t)NL * CNE * per;
    uint8_t *bytes = malloc(fsize);
    for (size_t i = 0; i < fsize; i++) bytes[i] = (uint8_t)rnd();
    CHECK(write(fd, bytes, fsize) == (ssize_t)fsize);
    cb_experts_layer_t ls[NL];
    memset(ls, 0, sizeof ls);
    /* gate|up|down in order (one read per expert), or gate|down|up (three reads, each a job) */
    const size_t up_at = three ? 2048 : 1024, down_at = three ? 1024 : 1792;
    for (int l = 0; l < NL; l++) {
        size_t o = head + (size_t)l * CNE * per;
        ls[l] = (cb_experts_layer_t){.n_expert = CNE, .n_embd = 4, .n_ff = 4,
                                     .gate_stride = per, .up_stride = per, .down_stride = per,
                                     .gate_bytes = CG, .up_bytes = CU, .down_bytes = CD,
                                     .gate_off = o, .up_off = o + up_at, .down_off = o + down_at};
        ls[l].gate_base = bytes + ls[l].gate_off;
        ls[l].up_base = bytes + ls[l].up_off;
        ls[l].down_base = bytes + ls[l].down_off;
    }
    cb_experts_t *s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 1, 6, ls);
    cb_experts_info_t info;
    CHECK(cb_experts_info(s, &info) == CB_OK && info.one_read_layers == (three ? 0 : NL));
    int ids[6] = {5, 0, 7, 2, 3, 6};
    cb_expert_ref_t a[6];
    CHECK(ftruncate(fd, (off_t)head) == 0); /* every expert now lies past the end */
    CHECK(cb_experts_acquire(s, 1, ids, 6, NULL, a) == CB_STATUS_IO);
    CHECK(strstr(cb_last_error(), "ends before") != NULL);
    cb_experts_layer_stats_t st;
    CHECK(cb_experts_stats(s, -1, &st) == CB_OK && st.resident == 0 && st.misses == 0);
    CHECK(pwrite(fd, bytes, fsize, 0) == (ssize_t)fsize);
    for (int round = 0; round < 2; round++) { /* misses, then hits */
        CHECK(cb_experts_acquire(s, 1, ids, 6, NULL, a) == CB_OK);
        for (int i = 0; i < 6; i++) {
            size_t o = ls[1].gate_off + (size_t)ids[i] * per;
            CHECK(memcmp(a[i].gate, bytes + o, CG) == 0 &&
                  memcmp(a[i].up, bytes + o + up_at, CU) == 0 &&
                  memcmp(a[i].down, bytes + o + down_at, CD) == 0);
        }
        CHECK(cb_experts_release(s, 1, ids, 6) == CB_OK);
    }
    CHECK(cb_experts_stats(s, -1, &st) == CB_OK && st.misses == 6 && st.hits == 6 &&
          st.resident == 6 && st.reads == (three ? 18u : 6u));
    cb_experts_free(s);
    free(bytes);
    close(fd);
    unlink(path);
}

/* The prefetch thread on bigger experts (reads take time): hinted experts are hits; bytes match
 * the mapped store while hints and acquires race (every mode and policy); statistics add up;
 * free() joins a thread that is reading. */
enum { PNE = 16, PMAT = 96 * 1024 };

static void test_prefetch(void) {
    char path[] = "/tmp/cb_test_experts_p_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    const size_t per_layer = (size_t)PNE * 3 * PMAT;
    size_t fsize = (size_t)NL * per_layer;
    uint8_t *bytes = malloc(fsize);
    for (size_t i = 0; i < fsize; i++) bytes[i] = (uint8_t)rnd();
    write_file(path, bytes, fsize);
    cb_experts_layer_t ls[NL];
    memset(ls, 0, sizeof ls);
    for (int l = 0; l < NL; l++) { /* GGUF-like: three stacked tensors */
        size_t o = (size_t)l * per_layer;
        ls[l] = (cb_experts_layer_t){.n_expert = PNE, .n_embd = 4, .n_ff = 4,
                                     .gate_stride = PMAT, .up_stride = PMAT, .down_stride = PMAT,
                                     .gate_off = o, .up_off = o + PNE * PMAT,
                                     .down_off = o + 2 * PNE * PMAT};
        ls[l].gate_base = bytes + ls[l].gate_off;
        ls[l].up_base = bytes + ls[l].up_off;
        ls[l].down_base = bytes + ls[l].down_off;
    }
    cb_experts_t *ref = make(CB_EXPERTS_MAPPED, 0, NULL, 0, 1, ls);
    cb_experts_params_t p = params();
    p.path = path;
    p.prefetch = 1;
    for (int mode = CB_EXPERTS_CACHE; mode <= CB_EXPERTS_MMAP; mode++) {
        p.mode = mode;
        /* everything fits: a hint, then a sync, then the acquire is all hits */
        p.policy = CB_EXPERTS_LRU;
        p.budget_bytes = (uint64_t)fsize;
        p.min_slots = 4;
        cb_experts_t *s = NULL;
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
        if (!s) continue;
        CHECK(cb_experts_prefetching(s) == 1);
        int ids[4] = {3, 7, 7, 11};
        CHECK(cb_experts_prefetch(s, 1, ids, 4) == CB_OK);
        cb_experts_prefetch_sync(s);
        cb_expert_ref_t a[4], b[4];
        CHECK(cb_experts_acquire(s, 1, ids, 4, NULL, a) == CB_OK);
        CHECK(cb_experts_acquire(ref, 1, ids, 4, NULL, b) == CB_OK);
        for (int i = 0; i < 4; i++)
            CHECK(memcmp(a[i].gate, b[i].gate, PMAT) == 0 && memcmp(a[i].down, b[i].down, PMAT) == 0);
        CHECK(cb_experts_release(s, 1, ids, 4) == CB_OK);
        cb_experts_layer_stats_t st;
        CHECK(cb_experts_stats(s, 1, &st) == CB_OK);
        CHECK(st.prefetch_issued == 3 && st.misses == 0 && st.hits == 3 && st.acquired == 4);
        CHECK(st.prefetch_hits == 3 && st.prefetch_wasted == 0);
        CHECK(st.reads == (mode == CB_EXPERTS_CACHE ? 9u : 0u));
        CHECK(cb_experts_prefetch(s, 1, (int[]){PNE}, 1) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_experts_prefetch(s, 2, ids, 1) == CB_STATUS_INVALID_ARGUMENT);
        cb_experts_free(s);

        /* races: small pools, hints for the next layer while this one is held */
        for (int policy = 0; policy <= 1; policy++) {
            p.policy = policy;
            p.budget_bytes = 6 * 3 * PMAT;
            p.min_slots = 4;
            s = NULL;
            CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
            if (!s) continue;
            for (int step = 0; step < 120; step++) {
                int layer = step % NL, n = 1 + (int)(rnd() % 4), got[4], m = 0;
                for (int i = 0; i < n; i++) {
                    int e = (int)(rnd() % 6), dup = 0; /* a hot set larger than the pool */
                    for (int j = 0; j < m; j++) dup |= got[j] == e;
                    if (!dup) got[m++] = e;
                }
                CHECK(cb_experts_acquire(s, layer, got, m, NULL, a) == CB_OK);
                int hint[4];
                for (int i = 0; i < 4; i++) hint[i] = (int)(rnd() % 6);
                CHECK(cb_experts_prefetch(s, (layer + 1) % NL, hint, 4) == CB_OK);
                CHECK(cb_experts_acquire(ref, layer, got, m, NULL, b) == CB_OK);
                for (int i = 0; i < m; i++)
                    CHECK(memcmp(a[i].gate, b[i].gate, PMAT) == 0 &&
                          memcmp(a[i].up, b[i].up, PMAT) == 0 &&
                          memcmp(a[i].down, b[i].down, PMAT) == 0);
                CHECK(cb_experts_release(s, layer, got, m) == CB_OK);
            }
            cb_experts_prefetch_sync(s);
            CHECK(cb_experts_stats(s, -1, &st) == CB_OK);
            CHECK(st.hits + st.misses == st.acquired);
            CHECK(st.prefetch_hits <= st.hits);
            CHECK(st.prefetch_hits + st.prefetch_wasted <= st.prefetch_issued);
            CHECK(st.bytes_read == (st.misses + st.prefetch_issued) * 3 * PMAT);
            CHECK(st.resident <= 6 && st.resident_bytes == st.resident * 3 * PMAT);
            CHECK(st.prefetch_issued > 0);
            cb_experts_free(s);
        }
        /* free() while the thread is reading (and more is queued) */
        p.policy = CB_EXPERTS_LRU;
        p.budget_bytes = (uint64_t)fsize;
        s = NULL;
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
        int all[PNE];
        for (int i = 0; i < PNE; i++) all[i] = i;
        CHECK(cb_experts_prefetch(s, 0, all, PNE) == CB_OK);
        cb_experts_free(s);
    }
    /* wrong predictions: once most prefetched experts were evicted unused, the thread stops
     * evicting (fills free slots only), so the used expert stays and reads stop */
    p.mode = CB_EXPERTS_CACHE;
    p.policy = CB_EXPERTS_LRU;
    p.budget_bytes = 4 * 3 * PMAT;
    p.min_slots = 1;
    {
        cb_experts_t *s = NULL;
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
        int zero = 0;
        cb_expert_ref_t r;
        for (int round = 0; round < 40; round++) {
            int wrong[2] = {(2 * round) % PNE, (2 * round + 1) % PNE};
            CHECK(cb_experts_prefetch(s, 1, wrong, 2) == CB_OK);
            cb_experts_prefetch_sync(s);
            CHECK(cb_experts_acquire(s, 0, &zero, 1, NULL, &r) == CB_OK);
            CHECK(cb_experts_release(s, 0, &zero, 1) == CB_OK);
        }
        cb_experts_layer_stats_t st0, st1;
        CHECK(cb_experts_stats(s, 0, &st0) == CB_OK && cb_experts_stats(s, 1, &st1) == CB_OK);
        CHECK(st1.prefetch_hits == 0 && st1.prefetch_issued <= 6);
        CHECK(st1.prefetch_wasted <= st1.prefetch_issued);
        CHECK(st0.misses == 1 && st0.hits == 39);
        cb_experts_free(s);
    }
    /* no thread: hints are accepted and ignored */
    p.mode = CB_EXPERTS_CACHE;
    p.prefetch = 0;
    cb_experts_t *s = NULL;
    CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
    CHECK(cb_experts_prefetching(s) == 0 && cb_experts_prefetch(s, 0, (int[]){1}, 1) == CB_OK);
    cb_experts_prefetch_sync(s);
    cb_experts_layer_stats_t st;
    CHECK(cb_experts_stats(s, -1, &st) == CB_OK && st.prefetch_issued == 0 && st.resident == 0);
    cb_experts_free(s);
    CHECK(cb_experts_prefetching(ref) == 0);
    CHECK(cb_experts_prefetch(ref, 0, (int[]){1}, 1) == CB_OK);
    cb_experts_free(ref);
    free(bytes);
    unlink(path);
}

/* pool pinning: the callbacks see the pool's range once each, unpin runs before the unmap
 * (the range is still mapped inside it), double pins and pool-less stores are refused, a
 * failing pin keeps nothing */
static struct {
    int pins, unpins, fail, mapped_at_unpin;
    uint8_t *base;
    size_t bytes;
} pinrec;

static cb_status rec_pin(void *user, uint8_t *base, size_t bytes) {
    CHECK(user == &pinrec);
    if (pinrec.fail) return cb_fail(CB_STATUS_IO, "test: cannot pin %zu bytes", bytes);
    pinrec.pins++;
    pinrec.base = base;
    pinrec.bytes = bytes;
    return CB_OK;
}

static void rec_unpin(void *user, uint8_t *base, size_t bytes) {
    CHECK(user == &pinrec && base == pinrec.base && bytes == pinrec.bytes);
    unsigned char vec[4];
    /* mincore fails with ENOMEM on an unmapped range: the pool must still be mapped */
    pinrec.mapped_at_unpin = mincore(base, 4 * (size_t)sysconf(_SC_PAGESIZE), vec) == 0;
    memset(base, 0x5a, bytes < 4096 ? bytes : 4096); /* and writable */
    pinrec.unpins++;
}

static void test_pool_pinning(const char *path, const cb_experts_layer_t *ls) {
    cb_experts_pool_t pool;
    memset(&pinrec, 0, sizeof pinrec); /* run_all runs twice */
    for (int mode = CB_EXPERTS_MAPPED; mode <= CB_EXPERTS_MMAP; mode += 2) {
        cb_experts_t *s = make(mode, CB_EXPERTS_LRU, path, 1, 3, ls);
        CHECK(cb_experts_pool(s, &pool) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(cb_last_error(), "only the cache store") != NULL);
        CHECK(cb_experts_pin_pool(s, rec_pin, rec_unpin, &pinrec) == CB_STATUS_INVALID_ARGUMENT);
        cb_experts_unpin_pool(s); /* not pinned: nothing */
        cb_experts_free(s);
    }
    CHECK(pinrec.pins == 0 && pinrec.unpins == 0);
    cb_experts_unpin_pool(NULL);

    cb_experts_t *s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 1, 3, ls);
    cb_experts_info_t info;
    CHECK(cb_experts_info(s, &info) == CB_OK);
    CHECK(cb_experts_pool(s, &pool) == CB_OK);
    CHECK(pool.base != NULL && pool.n_slots == info.n_slots && pool.n_slots == 3);
    CHECK(pool.slot_bytes == info.slot_bytes && pool.bytes == info.pool_bytes);
    CHECK(pool.bytes >= (size_t)pool.n_slots * pool.slot_bytes && pool.bytes % (2u << 20) == 0);
    CHECK((uintptr_t)pool.base % (uintptr_t)sysconf(_SC_PAGESIZE) == 0 && !pool.pinned);
    /* acquire's pointers lie inside the pool's slots */
    int ids[3] = {0, 4, 5};
    cb_expert_ref_t r[3];
    CHECK(cb_experts_acquire(s, 1, ids, 3, NULL, r) == CB_OK);
    const uint8_t *end = pool.base + (size_t)pool.n_slots * pool.slot_bytes;
    for (int i = 0; i < 3; i++) {
        CHECK(r[i].gate >= pool.base && r[i].gate + GS <= end);
        CHECK(r[i].up >= pool.base && r[i].up + US <= end);
        CHECK(r[i].down >= pool.base && r[i].down + DS <= end);
    }
    CHECK(cb_experts_release(s, 1, ids, 3) == CB_OK);
    /* a failing pin is reported and keeps nothing */
    pinrec.fail = 1;
    CHECK(cb_experts_pin_pool(s, rec_pin, rec_unpin, &pinrec) == CB_STATUS_IO);
    CHECK(strstr(cb_last_error(), "cannot pin") != NULL);
    CHECK(cb_experts_pool(s, &pool) == CB_OK && !pool.pinned);
    pinrec.fail = 0;
    CHECK(cb_experts_pin_pool(s, NULL, rec_unpin, &pinrec) == CB_STATUS_INVALID_ARGUMENT);
    /* pin once; a second registration is refused; unpin once; pin again */
    CHECK(cb_experts_pin_pool(s, rec_pin, rec_unpin, &pinrec) == CB_OK);
    CHECK(pinrec.pins == 1 && pinrec.base == pool.base && pinrec.bytes == pool.bytes);
    CHECK(cb_experts_pool(s, &pool) == CB_OK && pool.pinned);
    CHECK(cb_experts_pin_pool(s, rec_pin, rec_unpin, &pinrec) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(cb_last_error(), "already pinned") != NULL && pinrec.pins == 1);
    cb_experts_unpin_pool(s);
    cb_experts_unpin_pool(s);
    CHECK(pinrec.unpins == 1 && pinrec.mapped_at_unpin);
    CHECK(cb_experts_pool(s, &pool) == CB_OK && !pool.pinned);
    CHECK(cb_experts_pin_pool(s, rec_pin, rec_unpin, &pinrec) == CB_OK && pinrec.pins == 2);
    /* the store still works while pinned */
    CHECK(cb_experts_acquire(s, 0, ids, 3, NULL, r) == CB_OK);
    CHECK(cb_experts_release(s, 0, ids, 3) == CB_OK);
    /* free unpins, before the unmap */
    pinrec.mapped_at_unpin = 0;
    cb_experts_free(s);
    CHECK(pinrec.unpins == 2 && pinrec.mapped_at_unpin);
}

static void run_all(void) {
    char path[] = "/tmp/cb_test_experts_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const size_t head = 37, per_layer = (size_t)NE * (GS + US + DS);
    size_t fsize = head + NL * per_layer;
    uint8_t *bytes = malloc(fsize);
    for (size_t i = 0; i < fsize; i++) bytes[i] = (uint8_t)rnd();
    CHECK(write(fd, bytes, fsize) == (ssize_t)fsize);
    cb_experts_layer_t ls[NL];
    memset(ls, 0, sizeof ls);
    for (int l = 0; l < NL; l++) {
        size_t o = head + (size_t)l * per_layer;
        ls[l] = (cb_experts_layer_t){.n_expert = NE, .n_embd = 4, .n_ff = 4,
                                     .gate_stride = GS, .up_stride = US, .down_stride = DS,
                                     .gate_off = o, .up_off = o + NE * GS,
                                     .down_off = o + NE * (GS + US)};
        ls[l].gate_base = bytes + ls[l].gate_off;
        ls[l].up_base = bytes + ls[l].up_off;
        ls[l].down_base = bytes + ls[l].down_off;
    }
    cb_experts_t *ref = make(CB_EXPERTS_MAPPED, 0, NULL, 0, 1, ls);

    /* random batches: same bytes as mapped; LRU miss counts equal the reference's */
    for (int mode = CB_EXPERTS_CACHE; mode <= CB_EXPERTS_MMAP; mode++)
        for (int policy = 0; policy <= 1; policy++) {
            const int cap = 4;
            cb_experts_t *s = make(mode, policy, path, 1, cap, ls);
            cb_experts_info_t info;
            CHECK(cb_experts_info(s, &info) == CB_OK && info.n_slots == cap);
            ref_n = 0;
            uint64_t ref_miss = 0;
            for (int step = 0; step < 400; step++) {
                int layer = (int)(rnd() % NL), n = 1 + (int)(rnd() % cap), ids[NE];
                int perm[NE];
                for (int i = 0; i < NE; i++) perm[i] = i;
                for (int i = NE - 1; i > 0; i--) {
                    int j = (int)(rnd() % (uint32_t)(i + 1)), t = perm[i];
                    perm[i] = perm[j];
                    perm[j] = t;
                }
                /* skewed: small ids more often */
                for (int i = 0; i < n; i++) ids[i] = (rnd() % 2) ? perm[i] % 3 : perm[i];
                /* dedupe */
                int m = 0;
                for (int i = 0; i < n; i++) {
                    int dup = 0;
                    for (int j = 0; j < m; j++) dup |= ids[j] == ids[i];
                    if (!dup) ids[m++] = ids[i];
                }
                cb_expert_ref_t a[NE], b[NE];
                CHECK(cb_experts_acquire(s, layer, ids, m, NULL, a) == CB_OK);
                CHECK(cb_experts_acquire(ref, layer, ids, m, NULL, b) == CB_OK);
                for (int i = 0; i < m; i++) CHECK(same_bytes(&a[i], &b[i]));
                /* the reference sees hits first (they are locked), then misses, then release
                 * order (ascending index) as recency */
                int hit_first[NE], nh = 0;
                for (int i = 0; i < m; i++) {
                    int key = layer * NE + ids[i], found = 0;
                    for (int j = 0; j < ref_n; j++) found |= ref_list[j] == key;
                    if (found) hit_first[nh++] = key;
                }
                /* hits leave the list while locked */
                for (int h = 0; h < nh; h++)
                    for (int j = 0; j < ref_n; j++)
                        if (ref_list[j] == hit_first[h]) {
                            memmove(ref_list + j, ref_list + j + 1,
                                    (size_t)(ref_n - j - 1) * sizeof(int));
                            ref_n--;
                            break;
                        }
                int misses = m - nh;
                /* misses evict from the unlocked list's head, locked count against capacity */
                ref_miss += (uint64_t)misses;
                int keep = cap - m; /* unlocked room */
                while (ref_n > keep) {
                    memmove(ref_list, ref_list + 1, (size_t)(ref_n - 1) * sizeof(int));
                    ref_n--;
                }
                CHECK(cb_experts_release(s, layer, ids, m) == CB_OK);
                for (int i = 0; i < m; i++) {
                    ref_list[ref_n++] = layer * NE + ids[i];
                }
                if (ref_n > cap) CHECK(0);
            }
            cb_experts_layer_stats_t st;
            CHECK(cb_experts_stats(s, -1, &st) == CB_OK);
            CHECK(st.hits + st.misses == st.acquired);
            CHECK(st.bytes_read == st.misses * (GS + US + DS));
            CHECK(st.resident <= (uint64_t)cap && st.resident_bytes == st.resident * (GS + US + DS));
            if (policy == CB_EXPERTS_LRU) CHECK(st.misses == ref_miss);
            cb_experts_free(s);
        }

    /* a scan: expert 0 used before every one-off expert; LFRU keeps it, LRU with 2 slots
     * and a scan of 2 new experts per step loses it */
    for (int policy = 0; policy <= 1; policy++) {
        cb_experts_t *s = make(CB_EXPERTS_CACHE, policy, path, 1, 2, ls);
        cb_expert_ref_t r[2];
        int zero = 0;
        for (int k = 0; k < 20; k++) { /* make expert 0 frequent */
            CHECK(cb_experts_acquire(s, 0, &zero, 1, NULL, r) == CB_OK);
            CHECK(cb_experts_release(s, 0, &zero, 1) == CB_OK);
        }
        for (int k = 1; k < NE; k++) { /* one-offs */
            int id = k;
            CHECK(cb_experts_acquire(s, 0, &id, 1, NULL, r) == CB_OK);
            CHECK(cb_experts_release(s, 0, &id, 1) == CB_OK);
            int id2 = k % (NE - 1) + 1;
            CHECK(cb_experts_acquire(s, 1, &id2, 1, NULL, r) == CB_OK);
            CHECK(cb_experts_release(s, 1, &id2, 1) == CB_OK);
        }
        cb_experts_reset_stats(s);
        CHECK(cb_experts_acquire(s, 0, &zero, 1, NULL, r) == CB_OK);
        cb_experts_layer_stats_t st;
        CHECK(cb_experts_stats(s, 0, &st) == CB_OK);
        CHECK(st.hits == (policy == CB_EXPERTS_LFRU ? 1u : 0u));
        CHECK(cb_experts_release(s, 0, &zero, 1) == CB_OK);
        cb_experts_free(s);
    }

    /* locked experts stay; a batch larger than the pool fails, then the store still works */
    {
        cb_experts_t *s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 1, 3, ls);
        int ids[4] = {0, 1, 2, 3};
        cb_expert_ref_t r[4], b[4];
        CHECK(cb_experts_acquire(s, 0, ids, 4, NULL, r) == CB_STATUS_OUT_OF_MEMORY);
        CHECK(strstr(cb_last_error(), "needs 4 experts") != NULL);
        CHECK(cb_experts_acquire(s, 0, ids, 3, NULL, r) == CB_OK);
        CHECK(cb_experts_acquire(ref, 0, ids, 3, NULL, b) == CB_OK);
        int more = 4;
        CHECK(cb_experts_acquire(s, 1, &more, 1, NULL, r + 3) == CB_STATUS_OUT_OF_MEMORY);
        for (int i = 0; i < 3; i++) CHECK(same_bytes(&r[i], &b[i]));
        CHECK(cb_experts_release(s, 0, ids, 3) == CB_OK);
        CHECK(cb_experts_acquire(s, 1, &more, 1, NULL, r + 3) == CB_OK);
        CHECK(cb_experts_release(s, 1, &more, 1) == CB_OK);
        /* pinning: would leave fewer than min_slots unpinned */
        CHECK(cb_experts_pin(s, 0, 5) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_experts_pin(s, 0, 6) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_experts_acquire(s, 0, (int[]){6}, 1, NULL, r) == CB_STATUS_INVALID_ARGUMENT);
        cb_experts_free(s);
        /* pinned experts survive any number of misses */
        cb_experts_info_t info;
        s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 0, 1, ls);
        CHECK(cb_experts_info(s, &info) == CB_OK);
        { /* O_DIRECT is used exactly when asked and the file system takes it */
            int dfd = open(path, O_RDONLY | O_DIRECT);
            CHECK(info.direct_io == (g_direct && dfd >= 0));
            if (dfd >= 0) close(dfd);
            else printf("test_experts: %s refuses O_DIRECT: buffered reads only\n", path);
        }
        cb_experts_free(s);
        /* three slots (of 128 + 64 + 128 bytes, or their O_DIRECT regions) */
        s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 3 * info.slot_bytes, 2, ls);
        CHECK(cb_experts_pin(s, 1, 2) == CB_OK);
        for (int k = 0; k < 20; k++) {
            int id = k % NE;
            CHECK(cb_experts_acquire(s, 0, &id, 1, NULL, r) == CB_OK);
            CHECK(cb_experts_release(s, 0, &id, 1) == CB_OK);
        }
        cb_experts_reset_stats(s);
        int two = 2;
        CHECK(cb_experts_acquire(s, 1, &two, 1, NULL, r) == CB_OK);
        CHECK(cb_experts_acquire(ref, 1, &two, 1, NULL, b) == CB_OK);
        CHECK(same_bytes(r, b));
        cb_experts_layer_stats_t st;
        CHECK(cb_experts_stats(s, 1, &st) == CB_OK && st.hits == 1 && st.misses == 0);
        cb_experts_free(s);
    }

    /* ranges past the end of the file and missing files are refused */
    {
        cb_experts_layer_t bad[NL];
        memcpy(bad, ls, sizeof bad);
        bad[1].down_off = fsize - DS; /* NE experts cannot fit */
        cb_experts_params_t p = params();
        p.mode = CB_EXPERTS_CACHE;
        p.path = path;
        cb_experts_t *s = NULL;
        CHECK(cb_experts_new(&p, bad, NL, &s) == CB_STATUS_INVALID_ARGUMENT && !s);
        p.path = "/nonexistent/cb_model";
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_STATUS_NOT_FOUND && !s);
        p.path = NULL;
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_STATUS_INVALID_ARGUMENT && !s);
        p.mode = 7;
        CHECK(cb_experts_new(&p, ls, NL, &s) == CB_STATUS_INVALID_ARGUMENT && !s);
    }

    /* a started acquire (compute overlapping the reads): the same bytes as acquire, waits in
     * any order, one started acquire at a time, and the calls in the wrong order refused */
    for (int mode = CB_EXPERTS_MAPPED; mode <= CB_EXPERTS_MMAP; mode++) {
        cb_experts_t *s = make(mode, CB_EXPERTS_LRU, path, 1, 4, ls);
        int ids[4] = {3, 0, 5, 1};
        cb_expert_ref_t r[4], b[4];
        for (int round = 0; round < 3; round++) { /* misses, then hits, then another layer's */
            int layer = round == 2;
            CHECK(cb_experts_acquire_start(s, layer, ids, 4, NULL, r) == CB_OK);
            CHECK(cb_experts_acquire_start(s, layer, ids, 4, NULL, r) ==
                  CB_STATUS_INVALID_ARGUMENT);
            CHECK(cb_experts_acquire(s, layer, ids, 4, NULL, r) == (mode == CB_EXPERTS_MAPPED
                                                                       ? CB_OK
                                                                       : CB_STATUS_INVALID_ARGUMENT));
            CHECK(cb_experts_wait(s, 4) == CB_STATUS_INVALID_ARGUMENT);
            for (int i = 3; i >= 0; i--) CHECK(cb_experts_wait(s, i) == CB_OK);
            CHECK(cb_experts_acquire(ref, layer, ids, 4, NULL, b) == CB_OK);
            for (int i = 0; i < 4; i++) CHECK(same_bytes(&r[i], &b[i]));
            CHECK(cb_experts_acquire_finish(s) == CB_OK);
            for (int i = 0; i < 4; i++) CHECK(same_bytes(&r[i], &b[i])); /* unchanged */
            CHECK(cb_experts_acquire_finish(s) == CB_STATUS_INVALID_ARGUMENT);
            CHECK(cb_experts_wait(s, 0) == CB_STATUS_INVALID_ARGUMENT);
            CHECK(cb_experts_release(s, layer, ids, 4) == CB_OK);
        }
        cb_experts_layer_stats_t st;
        CHECK(cb_experts_stats(s, 0, &st) == CB_OK);
        if (mode != CB_EXPERTS_MAPPED) CHECK(st.misses == 4 && st.hits == 4);
        /* freed with a started acquire: its readers are joined, nothing leaks */
        CHECK(cb_experts_acquire_start(s, 1, ids, 4, NULL, r) == CB_OK);
        cb_experts_free(s);
    }

    test_pool_pinning(path, ls);
    cb_experts_free(ref);
    free(bytes);
    close(fd);
    unlink(path);
    test_one_read();
    test_parallel_reads(0);
    test_parallel_reads(1);
    test_prefetch();
}

int main(void) {
    CHECK(cb_experts_default_params().direct_io == 1);
    for (g_direct = 0; g_direct <= 1; g_direct++) run_all();
    TEST_MAIN_END("test_experts");
}
