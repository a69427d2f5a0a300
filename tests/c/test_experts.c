/* experts.h: cache and mmap stores against the mapped store on a file of known bytes; LRU miss
 * counts against a reference simulation (a scan of a list); LFRU keeps a frequent expert
 * through a scan that LRU evicts; locked experts are never evicted; too-small pools fail. */
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

static cb_experts_t *make(int mode, int policy, const char *path, uint64_t budget, int min_slots,
                          const cb_experts_layer_t *ls) {
    cb_experts_params_t p = cb_experts_default_params();
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

int main(void) {
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
        s = make(CB_EXPERTS_CACHE, CB_EXPERTS_LRU, path, 3 * 320, 2, ls); /* slots of 128 + 64 + 128 bytes */
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
        cb_experts_params_t p = cb_experts_default_params();
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

    cb_experts_free(ref);
    free(bytes);
    close(fd);
    unlink(path);
    TEST_MAIN_END("test_experts");
}
