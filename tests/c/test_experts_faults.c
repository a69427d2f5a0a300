/* I/O faults under the cache expert store (experts.h's test-only read hook, and a real
 * truncation of the file): short reads and EINTR are absorbed (bytes equal the mapped store's);
 * EIO, a read that scribbles into the slot then fails, and the end of the file fail the acquire
 * with CB_STATUS_IO and a detail naming the file, the layer and the expert; the failed expert is
 * never handed out or kept resident (the next acquire reads it again, and its bytes are right);
 * a failed prefetch read leaves nothing behind; the store works again once the fault is gone.
 * Every case runs with the prefetch thread on, on both read layouts (three reads per expert
 * like GGUF, one read per expert like the container), with several misses per acquire so the
 * parallel readers run. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colibri/experts.h"
#include "testutil.h"

enum { NL = 2, NE = 6, MAT = 1000, BLK = 4096, HEAD = 4096 };

enum fault_kind { F_NONE, F_EINTR, F_SHORT, F_EIO, F_SCRIBBLE_EIO, F_EOF };

typedef struct plan {
    int kind;
    uint64_t lo, hi; /* reads overlapping [lo, hi) are faulted */
    int every;       /* F_EINTR / F_SHORT: also fault reads elsewhere */
    long calls, faults;
} plan_t;

static int64_t hook(void *user, int fd, void *buf, size_t len, uint64_t off) {
    plan_t *p = user;
    __atomic_add_fetch(&p->calls, 1, __ATOMIC_RELAXED);
    int hit = p->kind != F_NONE && (p->every || (off < p->hi && off + len > p->lo));
    if (!hit) return pread(fd, buf, len, (off_t)off);
    long n = __atomic_add_fetch(&p->faults, 1, __ATOMIC_RELAXED);
    switch (p->kind) {
    case F_EINTR:
        if (n % 2) { /* every other call is interrupted before it reads anything */
            errno = EINTR;
            return -1;
        }
        return pread(fd, buf, len, (off_t)off);
    case F_SHORT: /* a few bytes at a time */
        return pread(fd, buf, len < 333 ? len : 333, (off_t)off);
    case F_EIO:
        errno = EIO;
        return -1;
    case F_SCRIBBLE_EIO: /* the device writes garbage into the buffer, then fails the read
                            (a successful short read returns good bytes, whatever its length:
                            an O_DIRECT read's first part can cover all the bytes wanted) */
        (void)n;
        memset(buf, 0xA5, len);
        errno = EIO;
        return -1;
    case F_EOF:
        return 0;
    }
    return -1;
}

static char path[64];
static uint8_t *bytes;
static size_t fsize;
static cb_experts_layer_t ls[NL];
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static void write_all(void) {
    int fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0);
    CHECK(write(fd, bytes, fsize) == (ssize_t)fsize);
    close(fd);
}

/* layer 0: three stacked tensors (three reads per expert); layer 1: one block per expert */
static void build(void) {
    const size_t l1 = HEAD + 3 * NE * MAT + 512;
    fsize = l1 + NE * BLK;
    bytes = malloc(fsize);
    for (size_t i = 0; i < fsize; i++) bytes[i] = (uint8_t)rnd();
    snprintf(path, sizeof path, "/tmp/cb_test_experts_faults_XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    write_all();
    memset(ls, 0, sizeof ls);
    ls[0] = (cb_experts_layer_t){.n_expert = NE, .n_embd = 4, .n_ff = 4, .gate_off = HEAD,
                                 .up_off = HEAD + NE * MAT, .down_off = HEAD + 2 * NE * MAT,
                                 .gate_stride = MAT, .up_stride = MAT, .down_stride = MAT};
    ls[1] = (cb_experts_layer_t){.n_expert = NE, .n_embd = 4, .n_ff = 4, .gate_off = l1,
                                 .up_off = l1 + 1024, .down_off = l1 + 2048, .gate_stride = BLK,
                                 .up_stride = BLK, .down_stride = BLK, .gate_bytes = MAT,
                                 .up_bytes = MAT, .down_bytes = MAT};
    for (int l = 0; l < NL; l++) {
        ls[l].gate_base = bytes + ls[l].gate_off;
        ls[l].up_base = bytes + ls[l].up_off;
        ls[l].down_base = bytes + ls[l].down_off;
    }
}

/* the file range of expert e of layer l (all three matrices) */
static void range_of(int l, int e, uint64_t *lo, uint64_t *hi) {
    if (l == 0) { /* the fault hits its down matrix */
        *lo = ls[0].down_off + (uint64_t)e * MAT;
        *hi = *lo + MAT;
    } else {
        *lo = ls[1].gate_off + (uint64_t)e * BLK;
        *hi = *lo + 2048 + MAT;
    }
}

static int right_bytes(int l, const int32_t *ids, int n, const cb_expert_ref_t *r) {
    int ok = 1;
    for (int i = 0; i < n; i++) {
        size_t e = (size_t)ids[i];
        ok &= memcmp(r[i].gate, ls[l].gate_base + e * ls[l].gate_stride, MAT) == 0;
        ok &= memcmp(r[i].up, ls[l].up_base + e * ls[l].up_stride, MAT) == 0;
        ok &= memcmp(r[i].down, ls[l].down_base + e * ls[l].down_stride, MAT) == 0;
    }
    return ok;
}

static int g_direct; /* 0: buffered reads; 2: O_DIRECT (where /tmp takes it) */

static cb_experts_t *new_store(int policy) {
    cb_experts_params_t p = cb_experts_default_params();
    p.direct_io = g_direct;
    p.mode = CB_EXPERTS_CACHE;
    p.policy = policy;
    p.path = path;
    p.budget_bytes = 4 * BLK;
    p.min_slots = 4;
    p.prefetch = 1;
    cb_experts_t *s = NULL;
    CHECK(cb_experts_new(&p, ls, NL, &s) == CB_OK);
    return s;
}

static int n_cases;

/* the detail names the file, the layer and the expert */
static void check_detail(int l, int e) {
    const char *d = cb_last_error();
    char want[64];
    snprintf(want, sizeof want, "expert %d of layer %d", e, l);
    CHECK(strstr(d, path) != NULL);
    CHECK(strstr(d, want) != NULL);
    if (!strstr(d, path) || !strstr(d, want)) fprintf(stderr, "detail: %s\n", d);
}

static uint64_t resident(cb_experts_t *s) {
    cb_experts_layer_stats_t st;
    CHECK(cb_experts_stats(s, -1, &st) == CB_OK);
    return st.resident;
}

/* transparent faults: every read interrupted or short; bytes equal the file's */
static void test_transparent(int kind) {
    for (int policy = 0; policy <= 1; policy++) {
        cb_experts_t *s = new_store(policy);
        if (!s) return;
        plan_t pl = {.kind = kind, .every = 1};
        cb_experts_set_read_hook(s, hook, &pl);
        for (int step = 0; step < 60; step++) {
            int l = step % NL;
            int32_t ids[3] = {(int32_t)(rnd() % NE), 0, 0};
            ids[1] = (ids[0] + 1 + (int32_t)(rnd() % (NE - 1))) % NE;
            ids[2] = (ids[1] + 1) % NE == ids[0] ? (ids[1] + 2) % NE : (ids[1] + 1) % NE;
            int32_t hint[2] = {(int32_t)(rnd() % NE), (int32_t)(rnd() % NE)};
            CHECK(cb_experts_prefetch(s, 1 - l, hint, 2) == CB_OK);
            cb_expert_ref_t r[3];
            cb_status st = cb_experts_acquire(s, l, ids, 3, NULL, r);
            CHECK(st == CB_OK);
            if (st != CB_OK) fprintf(stderr, "transparent fault %d: %s\n", kind, cb_last_error());
            if (st == CB_OK) {
                CHECK(right_bytes(l, ids, 3, r));
                CHECK(cb_experts_release(s, l, ids, 3) == CB_OK);
            }
            n_cases++;
        }
        cb_experts_prefetch_sync(s);
        CHECK(pl.faults > 0);
        cb_experts_free(s);
    }
}

/* hard faults on one expert: the acquire fails naming it, the others stay usable, the failed
 * expert is never resident, and after the fault is gone the same acquire returns right bytes */
static void test_hard(int kind) {
    for (int l = 0; l < NL; l++)
        for (int e = 0; e < NE; e += 2) {
            cb_experts_t *s = new_store(e % 4 == 0 ? CB_EXPERTS_LRU : CB_EXPERTS_LFRU);
            if (!s) return;
            plan_t pl = {.kind = kind};
            range_of(l, e, &pl.lo, &pl.hi);
            cb_experts_set_read_hook(s, hook, &pl);
            int32_t ids[3] = {(e + 1) % NE, e, (e + 3) % NE};
            /* a prefetch of the faulty expert fails quietly and leaves no resident slot */
            int32_t hint[1] = {e};
            CHECK(cb_experts_prefetch(s, l, hint, 1) == CB_OK);
            cb_experts_prefetch_sync(s);
            CHECK(resident(s) == 0);
            cb_expert_ref_t r[3];
            for (int again = 0; again < 2; again++) { /* the failure repeats while the fault is on */
                cb_clear_error();
                CHECK(cb_experts_acquire(s, l, ids, 3, NULL, r) == CB_STATUS_IO);
                check_detail(l, e);
                CHECK(resident(s) == 2); /* the two good experts, not the failed one */
                n_cases++;
            }
            /* the same through a started acquire: the faulty expert's wait and the finish
             * fail naming it, the good ones' waits succeed, and nothing stays locked */
            cb_clear_error();
            CHECK(cb_experts_acquire_start(s, l, ids, 3, NULL, r) == CB_OK);
            CHECK(cb_experts_wait(s, 2) == CB_OK);
            CHECK(cb_experts_wait(s, 1) == CB_STATUS_IO);
            CHECK(cb_experts_acquire_finish(s) == CB_STATUS_IO);
            check_detail(l, e);
            CHECK(resident(s) == 2);
            n_cases++;
            /* the good experts alone are fine meanwhile */
            int32_t good[2] = {ids[0], ids[2]};
            CHECK(cb_experts_acquire(s, l, good, 2, NULL, r) == CB_OK);
            CHECK(right_bytes(l, good, 2, r));
            CHECK(cb_experts_release(s, l, good, 2) == CB_OK);
            /* the fault is gone: the same acquire works and the bytes are the file's */
            cb_experts_layer_stats_t before, after;
            CHECK(cb_experts_stats(s, l, &before) == CB_OK);
            cb_experts_set_read_hook(s, NULL, NULL);
            CHECK(cb_experts_acquire(s, l, ids, 3, NULL, r) == CB_OK);
            CHECK(right_bytes(l, ids, 3, r));
            CHECK(cb_experts_release(s, l, ids, 3) == CB_OK);
            CHECK(cb_experts_stats(s, l, &after) == CB_OK);
            CHECK(after.misses == before.misses + 1); /* the failed one is read again */
            CHECK(pl.faults > 0);
            cb_experts_free(s);
        }
}

/* the file shrinks under the store (a real ftruncate) and comes back */
static void test_truncate(void) {
    for (int l = 0; l < NL; l++) {
        cb_experts_t *s = new_store(CB_EXPERTS_LRU);
        if (!s) return;
        int e = NE - 1; /* the last expert of the layer: its bytes are past the cut */
        uint64_t lo, hi;
        range_of(l, e, &lo, &hi);
        int32_t warm[2] = {0, 1};
        cb_expert_ref_t r[3];
        CHECK(cb_experts_acquire(s, 1 - l, warm, 2, NULL, r) == CB_OK);
        CHECK(cb_experts_release(s, 1 - l, warm, 2) == CB_OK);
        CHECK(truncate(path, (off_t)(lo + 10)) == 0);
        int32_t hint[2] = {e, 2};
        CHECK(cb_experts_prefetch(s, l, hint, 2) == CB_OK);
        cb_experts_prefetch_sync(s);
        int32_t ids[2] = {2, e};
        cb_clear_error();
        CHECK(cb_experts_acquire(s, l, ids, 2, NULL, r) == CB_STATUS_IO);
        check_detail(l, e);
        CHECK(strstr(cb_last_error(), "ends") != NULL);
        write_all(); /* the file is whole again */
        CHECK(cb_experts_acquire(s, l, ids, 2, NULL, r) == CB_OK);
        CHECK(right_bytes(l, ids, 2, r));
        CHECK(cb_experts_release(s, l, ids, 2) == CB_OK);
        n_cases += 2;
        cb_experts_free(s);
    }
}

int main(void) {
    build();
    static const char *const names[] = {"", "EINTR", "short reads", "EIO", "scribble+EIO", "EOF"};
    for (g_direct = 0; g_direct <= 2; g_direct += 2) {
        const char *how = g_direct ? "O_DIRECT" : "buffered";
        for (int kind = F_EINTR; kind <= F_SHORT; kind++) {
            int before = n_cases;
            test_transparent(kind);
            printf("%s, %s: %d acquires, all right\n", how, names[kind], n_cases - before);
        }
        for (int kind = F_EIO; kind <= F_EOF; kind++) {
            int before = n_cases;
            test_hard(kind);
            printf("%s, %s: %d failing acquires, each reported and recovered\n", how,
                   names[kind], n_cases - before);
        }
        int before = n_cases;
        test_truncate();
        printf("%s, truncated file: %d cases\n", how, n_cases - before);
    }
    unlink(path);
    free(bytes);
    TEST_MAIN_END("test_experts_faults");
}
