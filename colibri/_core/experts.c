/* Expert store (see include/colibri/experts.h): the mapped store (addresses into the caller's
 * file mapping), the cache store (a slot pool filled with pread) and the mmap store (the
 * mapping plus a tracked resident set trimmed with madvise/fadvise), both optionally fed by a
 * background prefetch thread.
 *
 * Bookkeeping shared by cache and mmap: every (layer, expert) has a global index
 * g = offsets[layer] + expert; slot_of[g] is its slot or -1; a slot knows its owner g, whether
 * it is locked (acquired and not yet released, or being read by acquire), loading (being read
 * by the prefetch thread) or pinned. Unlocked, unpinned, loaded resident slots - and only those
 * - are in the eviction structure: a doubly linked list (LRU: head = least recent) or a binary
 * min-heap on (key, tick) (LFRU). Free slots sit on a stack. So a lookup is O(1), a victim
 * O(1) (LRU) or O(log n) (LFRU), and an expert in use or in flight cannot be chosen.
 * Invariants (under mu): slot_of[owner[k]] == k for every used slot k; a slot is in exactly one
 * of {free stack, eviction structure, locked, loading, pinned}.
 *
 * Concurrency: one mutex mu guards every table, slot and statistic. The compute thread (acquire,
 * release, pin, prefetch) and the prefetch thread take it for bookkeeping only: a read (pread,
 * madvise) runs with mu released on a slot that its reader owns (locked or loading), which no
 * one else reads, writes or evicts meanwhile. An acquire claims all its misses' slots first and
 * then reads them on up to CB_EXPERTS_READERS threads at once (cache mode; see read_jobs).
 * cv_done is broadcast when a prefetch read ends
 * (an acquire waiting for that expert, or for any evictable slot, wakes up); cv_work wakes the
 * prefetch thread. The prefetch queue is the current hint only (a new hint empties it), in
 * hint order, and a hint round number protects the current hint's resident experts from the
 * prefetch thread's evictions (so a big hint does not evict itself). The thread evicts only
 * while at least half of the recent prefetches (a window of ~64 outcomes) were used before
 * being evicted; below that it fills free slots only, so wrong predictions cannot displace
 * experts the compute uses.
 * Per-layer statistics and per-expert routing counts live in tables allocated once; acquire
 * allocates nothing.
 * Pool pinning (cache mode): an outside owner of page locks (colibri.cuda's cuMemHostRegister)
 * registers the pool through cb_experts_pin_pool's callbacks; the store keeps the unpin
 * callback and calls it exactly once, at cb_experts_unpin_pool or in cb_experts_free before the
 * munmap, so the registration can never outlive the mapping.
 * Files: experts_policy.c holds the eviction structures (LRU, LFRU), experts_impl.h the store's
 * struct and what the two share. */
#include "colibri/experts.h"

#include "alloc.h"
#include "experts_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static size_t mat_bytes(size_t bytes, size_t stride) { return bytes ? bytes : stride; }

/* bytes of one expert's three matrices in layer l */
static uint64_t layer_expert_bytes(const cb_experts_layer_t *L) {
    return (uint64_t)mat_bytes(L->gate_bytes, L->gate_stride) +
           mat_bytes(L->up_bytes, L->up_stride) + mat_bytes(L->down_bytes, L->down_stride);
}

/* the slot layout of layer L: one read when gate, up and down are adjacent for every expert
 * (equal strides, in order, gaps at most max(64 KiB, 1/8 of the expert)) */
static layout_t make_layout(const cb_experts_layer_t *L) {
    layout_t y;
    memset(&y, 0, sizeof y);
    y.bytes[0] = mat_bytes(L->gate_bytes, L->gate_stride);
    y.bytes[1] = mat_bytes(L->up_bytes, L->up_stride);
    y.bytes[2] = mat_bytes(L->down_bytes, L->down_stride);
    size_t sum = y.bytes[0] + y.bytes[1] + y.bytes[2];
    size_t max_gap = sum / 8 > ONE_READ_MIN_GAP ? sum / 8 : ONE_READ_MIN_GAP;
    if (L->gate_stride == L->up_stride && L->up_stride == L->down_stride &&
        L->up_off >= L->gate_off + y.bytes[0] && L->down_off >= L->up_off + y.bytes[1]) {
        uint64_t span = L->down_off + y.bytes[2] - L->gate_off;
        if (span - sum <= max_gap && span <= L->gate_stride) {
            y.one_read = 1;
            y.at[1] = (size_t)(L->up_off - L->gate_off);
            y.at[2] = (size_t)(L->down_off - L->gate_off);
            y.span = (size_t)span;
            return y;
        }
    }
    y.at[1] = align_up(y.bytes[0], SLOT_ALIGN);
    y.at[2] = y.at[1] + align_up(y.bytes[1], SLOT_ALIGN);
    y.span = y.at[2] + y.bytes[2];
    return y;
}

cb_experts_params_t cb_experts_default_params(void) {
    cb_experts_params_t p;
    memset(&p, 0, sizeof p);
    p.mode = CB_EXPERTS_MAPPED;
    p.policy = CB_EXPERTS_LRU;
    p.min_slots = 1;
    p.huge_pages = 1;
    return p;
}

/* ---- file ranges ---- */

static void expert_ranges(const cb_experts_t *s, int32_t g, uint64_t off[3], size_t len[3],
                          const uint8_t *addr[3]) {
    int32_t l = s->layer_of[g];
    const cb_experts_layer_t *L = &s->layers[l];
    size_t e = (size_t)g - s->offsets[l];
    off[0] = L->gate_off + e * L->gate_stride;
    off[1] = L->up_off + e * L->up_stride;
    off[2] = L->down_off + e * L->down_stride;
    for (int i = 0; i < 3; i++) len[i] = s->lay[l].bytes[i];
    addr[0] = L->gate_base + e * L->gate_stride;
    addr[1] = L->up_base + e * L->up_stride;
    addr[2] = L->down_base + e * L->down_stride;
}

static const char *const part_name[3] = {"gate", "up", "down"};

/* Reads matrix `part` of expert g (-1: its whole one-read span), len bytes at file offset off,
 * into dst: short reads continue, EINTR is retried, a read error or the end of the file fails
 * with CB_STATUS_IO naming the file, the layer, the expert and the range (mu may be released:
 * touches only dst and the fd; the detail goes to the calling thread's buffer). */
static cb_status pread_all(const cb_experts_t *s, int32_t g, int part, uint8_t *dst, size_t len,
                           uint64_t off) {
    const uint64_t off0 = off;
    const size_t len0 = len;
    while (len > 0) {
        int64_t r = s->read_fn ? s->read_fn(s->read_user, s->fd, dst, len, off)
                               : (int64_t)pread(s->fd, dst, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || (uint64_t)r > len) {
            int32_t l = s->layer_of[g];
            char why[96];
            if (r == 0)
                snprintf(why, sizeof why, "the file ends before byte %llu (truncated?)",
                         (unsigned long long)off);
            else if (r < 0)
                snprintf(why, sizeof why, "%s", strerror(errno));
            else
                snprintf(why, sizeof why, "the read returned %lld bytes of %zu", (long long)r,
                         len);
            return cb_fail(CB_STATUS_IO,
                           "experts: cannot read expert %d of layer %d from %s (%s, %zu bytes "
                           "at offset %llu): %s", (int)((size_t)g - s->offsets[l]), (int)l,
                           s->path ? s->path : "the model file",
                           part < 0 ? "gate|up|down" : part_name[part], len0,
                           (unsigned long long)off0, why);
        }
        dst += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return CB_OK;
}

/* the whole pages inside [p, p + len) */
static void advise_inner(const cb_experts_t *s, const uint8_t *p, size_t len, int advice) {
    uintptr_t a = align_up((uintptr_t)p, s->page), b = ((uintptr_t)p + len) / s->page * s->page;
    if (b > a) (void)madvise((void *)a, b - a, advice);
}

/* Brings expert g into slot k (cache: read it; mmap: hint it). Runs with mu RELEASED: it only
 * reads immutable tables and writes the slot's pool bytes, which its caller owns. *reads and
 * *bytes receive the pread calls and bytes read. */
static cb_status read_expert(const cb_experts_t *s, int32_t k, int32_t g, uint64_t *reads,
                             uint64_t *bytes) {
    uint64_t off[3];
    size_t len[3];
    const uint8_t *addr[3];
    expert_ranges(s, g, off, len, addr);
    const layout_t *y = &s->lay[s->layer_of[g]];
    *reads = 0;
    *bytes = 0;
    if (s->mode == CB_EXPERTS_CACHE) {
        uint8_t *dst = s->pool + (size_t)k * s->slot_bytes;
        if (y->one_read) {
            *reads = 1;
            *bytes = y->span;
            return pread_all(s, g, -1, dst, y->span, off[0]);
        }
        for (int i = 0; i < 3; i++) {
            (*reads)++;
            cb_status rs = pread_all(s, g, i, dst + y->at[i], len[i], off[i]);
            if (rs != CB_OK) return rs;
            *bytes += len[i];
        }
    } else {
        for (int i = 0; i < 3; i++) advise_inner(s, addr[i], len[i], MADV_WILLNEED);
        *bytes = (uint64_t)len[0] + len[1] + len[2];
    }
    return CB_OK;
}

/* one matrix (part 0 gate, 1 up, 2 down) of g into cache slot k, for the three-read layout */
static cb_status read_part(const cb_experts_t *s, int32_t k, int32_t g, int32_t part,
                           uint64_t *reads, uint64_t *bytes) {
    uint64_t off[3];
    size_t len[3];
    const uint8_t *addr[3];
    expert_ranges(s, g, off, len, addr);
    const layout_t *y = &s->lay[s->layer_of[g]];
    *reads = 1;
    *bytes = len[part];
    return pread_all(s, g, part, s->pool + (size_t)k * s->slot_bytes + y->at[part], len[part],
                     off[part]);
}

static cb_status read_job(const cb_experts_t *s, read_job_t *x) {
    if (x->part < 0) return read_expert(s, x->k, x->g, &x->reads, &x->bytes);
    return read_part(s, x->k, x->g, x->part, &x->reads, &x->bytes);
}

/* a claimed slot whose read failed or never ran goes back to the free stack (mu held) */
static void slot_unclaim(cb_experts_t *s, int32_t k) {
    s->slot_of[s->slots[k].owner] = -1;
    s->slots[k].owner = -1;
    s->slots[k].locked = 0;
    s->free_stack[s->n_free++] = k;
}

/* bookkeeping after a successful read of g into its slot (mu held) */
static void account_read(cb_experts_t *s, int32_t g, uint64_t reads, uint64_t bytes) {
    int32_t l = s->layer_of[g];
    const layout_t *y = &s->lay[l];
    s->stats[l].bytes_read += bytes;
    s->stats[l].reads += reads;
    s->stats[l].resident++;
    s->stats[l].resident_bytes += (uint64_t)y->bytes[0] + y->bytes[1] + y->bytes[2];
}

/* a prefetched expert was used (good) or evicted unused: the recent precision (mu held) */
static void prefetch_outcome(cb_experts_t *s, int good) {
    if (good) s->pf_good++;
    else s->pf_bad++;
    if (s->pf_good + s->pf_bad > 64) {
        s->pf_good /= 2;
        s->pf_bad /= 2;
    }
}

/* the slot k's owner leaves (eviction) (mu held) */
static void drop_owner(cb_experts_t *s, int32_t k) {
    int32_t g = s->slots[k].owner;
    if (g < 0) return;
    int32_t l = s->layer_of[g];
    uint64_t off[3];
    size_t len[3];
    const uint8_t *addr[3];
    expert_ranges(s, g, off, len, addr);
    if (s->mode == CB_EXPERTS_MMAP) {
        for (int i = 0; i < 3; i++) {
            advise_inner(s, addr[i], len[i], MADV_DONTNEED);
            (void)posix_fadvise(s->fd, (off_t)off[i], (off_t)len[i], POSIX_FADV_DONTNEED);
        }
    }
    s->slot_of[g] = -1;
    s->slots[k].owner = -1;
    s->stats[l].resident--;
    s->stats[l].resident_bytes -= (uint64_t)len[0] + len[1] + len[2];
    s->stats[l].evictions++;
    if (s->slots[k].prefetched) {
        s->stats[l].prefetch_wasted++;
        prefetch_outcome(s, 0);
    }
    s->slots[k].prefetched = 0;
}

static void refs_of(const cb_experts_t *s, int32_t g, cb_expert_ref_t *r) {
    int32_t l = s->layer_of[g];
    const cb_experts_layer_t *L = &s->layers[l];
    if (s->mode == CB_EXPERTS_CACHE) {
        const uint8_t *p = s->pool + (size_t)s->slot_of[g] * s->slot_bytes;
        r->gate = p + s->lay[l].at[0];
        r->up = p + s->lay[l].at[1];
        r->down = p + s->lay[l].at[2];
    } else {
        size_t e = (size_t)g - s->offsets[l];
        r->gate = L->gate_base + e * L->gate_stride;
        r->up = L->up_base + e * L->up_stride;
        r->down = L->down_base + e * L->down_stride;
    }
}

/* a free slot or a victim's (emptied), or -1 (mu held) */
static int32_t take_slot(cb_experts_t *s) {
    if (s->n_free > 0) return s->free_stack[--s->n_free];
    int32_t k = cb_evict_pop(s);
    if (k >= 0) drop_owner(s, k);
    return k;
}

/* a slot for the prefetch thread: free, or a victim not named by the current hint; no victim
 * while most recent prefetches were evicted unused (wrong predictions would only push out
 * experts that are used) (mu held) */
static int32_t take_slot_prefetch(cb_experts_t *s) {
    if (s->n_free > 0) return s->free_stack[--s->n_free];
    if (s->pf_bad > s->pf_good) return -1;
    int32_t k = cb_evict_peek(s);
    if (k < 0 || s->slots[k].hint_round == s->round) return -1;
    k = cb_evict_pop(s);
    drop_owner(s, k);
    return k;
}

/* ---- the prefetch thread ---- */

static void *prefetch_main(void *arg) {
    cb_experts_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->q_n == 0) {
            pthread_cond_broadcast(&s->cv_done); /* idle: wakes cb_experts_prefetch_sync */
            pthread_cond_wait(&s->cv_work, &s->mu);
        }
        if (s->stop) break;
        int32_t g = s->queue[s->q_head++];
        s->q_n--;
        if (s->slot_of[g] >= 0) continue; /* resident, or being read by acquire */
        int32_t k = take_slot_prefetch(s);
        if (k < 0) { /* no room left for this hint without evicting itself */
            s->q_n = 0;
            continue;
        }
        slot_t *x = &s->slots[k];
        x->owner = g;
        x->loading = 1;
        x->hint_round = s->round;
        s->slot_of[g] = k;
        s->n_loading++;
        int32_t l = s->layer_of[g];
        s->stats[l].prefetch_issued++;
        pthread_mutex_unlock(&s->mu);
        uint64_t reads = 0, bytes = 0;
        cb_status rs = read_expert(s, k, g, &reads, &bytes);
        pthread_mutex_lock(&s->mu);
        x->loading = 0;
        s->n_loading--;
        if (rs == CB_OK) {
            account_read(s, g, reads, bytes);
            x->prefetched = 1;
            cb_evict_add(s, k);
        } else { /* the compute reads it itself and reports the error */
            slot_unclaim(s, k);
        }
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- creation ---- */

cb_status cb_experts_new(const cb_experts_params_t *p, const cb_experts_layer_t *layers,
                         int32_t n_layers, cb_experts_t **out) {
    if (!out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: out is NULL");
    *out = NULL;
    if (!p) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: params is NULL");
    if (p->mode < CB_EXPERTS_MAPPED || p->mode > CB_EXPERTS_MMAP)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: unknown mode %d", (int)p->mode);
    if (p->policy < CB_EXPERTS_LRU || p->policy > CB_EXPERTS_LFRU)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: unknown policy %d", (int)p->policy);
    if (n_layers < 0 || (n_layers > 0 && !layers))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: %d layers", (int)n_layers);
    const size_t big = (size_t)1 << 40;
    size_t total = 0;
    uint64_t all_bytes = 0;
    size_t slot_bytes = 0;
    for (int32_t l = 0; l < n_layers; l++) {
        const cb_experts_layer_t *L = &layers[l];
        if (L->n_expert < 0 || L->n_expert > (1 << 20))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: layer %d has %d experts", l,
                           (int)L->n_expert);
        if (L->n_expert == 0) continue;
        if (!L->gate_base || !L->up_base || !L->down_base || L->n_ff <= 0 || L->n_embd <= 0)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "experts: layer %d has experts but no tensors or shape", l);
        if (L->gate_stride == 0 || L->up_stride == 0 || L->down_stride == 0 ||
            L->gate_stride > big || L->up_stride > big || L->down_stride > big ||
            L->gate_bytes > L->gate_stride || L->up_bytes > L->up_stride ||
            L->down_bytes > L->down_stride || L->gate_off > ((uint64_t)1 << 62) ||
            L->up_off > ((uint64_t)1 << 62) || L->down_off > ((uint64_t)1 << 62))
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "experts: layer %d has bad strides or sizes (strides %zu/%zu/%zu, "
                           "matrices %zu/%zu/%zu bytes)", l, L->gate_stride, L->up_stride,
                           L->down_stride, L->gate_bytes, L->up_bytes, L->down_bytes);
        total += (size_t)L->n_expert;
        all_bytes += (uint64_t)L->n_expert * layer_expert_bytes(L);
        layout_t y = make_layout(L);
        size_t sb = align_up(y.span, SLOT_ALIGN);
        if (sb > slot_bytes) slot_bytes = sb;
    }
    if (total > (size_t)1 << 30)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: %zu experts", total);
    cb_experts_t *s = cb_calloc(1, sizeof *s);
    if (!s) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: no memory for the store");
    s->fd = -1;
    s->lru_head = s->lru_tail = -1;
    s->n_layers = n_layers;
    s->mode = p->mode;
    s->policy = p->policy;
    s->total = total;
    s->expert_bytes = all_bytes;
    s->page = (size_t)sysconf(_SC_PAGESIZE);
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: cannot create a mutex");
    }
    if (pthread_cond_init(&s->cv_done, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: cannot create a condition variable");
    }
    if (pthread_cond_init(&s->cv_work, NULL) != 0) {
        pthread_cond_destroy(&s->cv_done);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: cannot create a condition variable");
    }
    s->sync_ok = 1;
    s->layers = cb_calloc((size_t)n_layers + 1, sizeof *s->layers);
    s->lay = cb_calloc((size_t)n_layers + 1, sizeof *s->lay);
    s->stats = cb_calloc((size_t)n_layers + 1, sizeof *s->stats);
    s->counts = cb_calloc(total + 1, sizeof *s->counts);
    s->offsets = cb_calloc((size_t)n_layers + 1, sizeof *s->offsets);
    s->hint_of = cb_calloc(total + 1, sizeof *s->hint_of);
    s->hint_pending = cb_calloc((size_t)n_layers + 1, sizeof *s->hint_pending);
    if (!s->layers || !s->lay || !s->stats || !s->counts || !s->offsets || !s->hint_of ||
        !s->hint_pending) {
        cb_experts_free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: no memory for %zu expert counters",
                       total);
    }
    if (n_layers) memcpy(s->layers, layers, (size_t)n_layers * sizeof *layers);
    size_t off = 0;
    for (int32_t l = 0; l < n_layers; l++) {
        s->offsets[l] = off;
        off += (size_t)layers[l].n_expert;
        if (layers[l].n_expert > 0) {
            s->lay[l] = make_layout(&layers[l]);
            s->one_read_layers += s->lay[l].one_read;
        }
    }
    if (p->mode == CB_EXPERTS_MAPPED || total == 0) {
        s->mode = CB_EXPERTS_MAPPED;
        *out = s;
        return CB_OK;
    }

    /* cache / mmap: the file, its ranges, the slots */
    if (!p->path) {
        cb_experts_free(s);
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: mode %d needs the model path",
                       (int)p->mode);
    }
    size_t path_len = strlen(p->path);
    s->path = cb_malloc(path_len + 1);
    if (!s->path) {
        cb_experts_free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: no memory for the path");
    }
    memcpy(s->path, p->path, path_len + 1);
    s->fd = open(p->path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        int err = errno;
        cb_experts_free(s);
        return cb_fail(err == ENOENT ? CB_STATUS_NOT_FOUND : CB_STATUS_IO,
                       "experts: cannot open %s: %s", p->path, strerror(err));
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0) {
        int err = errno;
        cb_experts_free(s);
        return cb_fail(CB_STATUS_IO, "experts: fstat of %s: %s", p->path, strerror(err));
    }
    for (int32_t l = 0; l < n_layers; l++) {
        const cb_experts_layer_t *L = &layers[l];
        if (L->n_expert == 0) continue;
        const uint64_t offs[3] = {L->gate_off, L->up_off, L->down_off};
        const size_t strides[3] = {L->gate_stride, L->up_stride, L->down_stride};
        for (int i = 0; i < 3; i++) {
            /* the last expert's matrix (or one-read span) ends inside the file */
            uint64_t last = offs[i] + (uint64_t)(L->n_expert - 1) * strides[i];
            uint64_t len = s->lay[l].one_read && i == 0 ? s->lay[l].span : s->lay[l].bytes[i];
            if (last > (uint64_t)st.st_size || len > (uint64_t)st.st_size - last) {
                cb_experts_free(s);
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "experts: layer %d's experts (%d x %zu bytes at %llu) extend past "
                               "the end of %s (%lld bytes)", l, (int)L->n_expert, strides[i],
                               (unsigned long long)offs[i], p->path, (long long)st.st_size);
            }
        }
    }
    size_t max_expert = 0;
    for (int32_t l = 0; l < n_layers; l++)
        if (layers[l].n_expert > 0 && layer_expert_bytes(&layers[l]) > max_expert)
            max_expert = (size_t)layer_expert_bytes(&layers[l]);
    s->slot_bytes = p->mode == CB_EXPERTS_CACHE ? slot_bytes : max_expert;
    uint64_t want = p->budget_bytes / s->slot_bytes;
    int32_t min_slots = p->min_slots > 0 ? p->min_slots : 1;
    if ((size_t)min_slots > total) min_slots = (int32_t)total;
    if (want < (uint64_t)min_slots) want = (uint64_t)min_slots;
    if (want > total) want = total;
    s->n_slots = (int32_t)want;
    s->min_slots = min_slots;
    s->slot_of = cb_malloc(total * sizeof *s->slot_of);
    s->layer_of = cb_malloc(total * sizeof *s->layer_of);
    s->freq = cb_calloc(total, sizeof *s->freq);
    s->slots = cb_calloc((size_t)s->n_slots, sizeof *s->slots);
    s->free_stack = cb_malloc((size_t)s->n_slots * sizeof *s->free_stack);
    s->heap = cb_malloc((size_t)s->n_slots * sizeof *s->heap);
    s->queue = cb_malloc(total * sizeof *s->queue);
    s->queued_round = cb_calloc(total, sizeof *s->queued_round);
    s->jobs = cb_malloc(3 * (size_t)s->n_slots * sizeof *s->jobs);
    if (!s->slot_of || !s->layer_of || !s->freq || !s->slots || !s->free_stack || !s->heap ||
        !s->queue || !s->queued_round || !s->jobs) {
        cb_experts_free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: no memory for %d slots",
                       (int)want);
    }
    for (int32_t l = 0; l < n_layers; l++)
        for (int32_t e = 0; e < layers[l].n_expert; e++) {
            s->slot_of[s->offsets[l] + (size_t)e] = -1;
            s->layer_of[s->offsets[l] + (size_t)e] = l;
        }
    for (int32_t k = 0; k < s->n_slots; k++) {
        s->slots[k] = (slot_t){.owner = -1, .prev = -1, .next = -1, .heap_pos = -1};
        s->free_stack[k] = s->n_slots - 1 - k;
    }
    s->n_free = s->n_slots;
    if (p->mode == CB_EXPERTS_CACHE) {
        size_t bytes = align_up((size_t)s->n_slots * s->slot_bytes, POOL_ALIGN);
        void *m = cb_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            cb_experts_free(s);
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: cannot map a pool of %d slots x "
                           "%zu bytes", (int)want, slot_bytes);
        }
        s->pool = m;
        s->pool_map_bytes = bytes;
#ifdef MADV_HUGEPAGE
        if (p->huge_pages) (void)madvise(m, bytes, MADV_HUGEPAGE);
#endif
        if (p->mlock && mlock(m, bytes) != 0) {
            int err = errno;
            cb_experts_free(s);
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: mlock of the %zu-byte pool failed "
                           "(%s; see ulimit -l)", bytes, strerror(err));
        }
    }
    if (p->prefetch) {
        int err = cb_thread_create(&s->thread, prefetch_main, s);
        if (err != 0) {
            cb_experts_free(s);
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: cannot start the prefetch thread: "
                           "%s", strerror(err));
        }
        s->thread_started = 1;
    }
    *out = s;
    return CB_OK;
}

void cb_experts_free(cb_experts_t *s) {
    if (!s) return;
    if (s->thread_started) { /* an in-flight read finishes first; queued hints are dropped */
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->sync_ok) {
        pthread_cond_destroy(&s->cv_work);
        pthread_cond_destroy(&s->cv_done);
        pthread_mutex_destroy(&s->mu);
    }
    cb_experts_unpin_pool(s); /* the registration ends before the memory does */
    if (s->pool) munmap(s->pool, s->pool_map_bytes);
    if (s->fd >= 0) close(s->fd);
    free(s->path);
    free(s->layers);
    free(s->lay);
    free(s->stats);
    free(s->counts);
    free(s->offsets);
    free(s->hint_of);
    free(s->hint_pending);
    free(s->slot_of);
    free(s->layer_of);
    free(s->freq);
    free(s->slots);
    free(s->free_stack);
    free(s->heap);
    free(s->queue);
    free(s->queued_round);
    free(s->jobs);
    free(s);
}

cb_status cb_experts_info(const cb_experts_t *s, cb_experts_info_t *out) {
    if (!s || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: info of NULL");
    memset(out, 0, sizeof *out);
    out->mode = s->mode;
    out->policy = s->policy;
    out->n_slots = s->n_slots;
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    out->n_pinned = s->n_pinned;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
    out->prefetch = s->thread_started;
    out->one_read_layers = s->one_read_layers;
    out->slot_bytes = s->slot_bytes;
    out->pool_bytes = s->pool_map_bytes;
    out->expert_bytes = s->expert_bytes;
    return CB_OK;
}

/* ---- the slot pool ---- */

cb_status cb_experts_pool(const cb_experts_t *s, cb_experts_pool_t *out) {
    if (!s || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: pool of NULL");
    memset(out, 0, sizeof *out);
    if (s->mode != CB_EXPERTS_CACHE || !s->pool)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: only the cache store has a slot "
                       "pool (mode %d)", (int)s->mode);
    out->base = s->pool;
    out->bytes = s->pool_map_bytes;
    out->slot_bytes = s->slot_bytes;
    out->n_slots = s->n_slots;
    out->pinned = s->pool_pinned;
    return CB_OK;
}

cb_status cb_experts_pin_pool(cb_experts_t *s, cb_experts_pool_pin_fn pin,
                              cb_experts_pool_unpin_fn unpin, void *user) {
    if (!s || !pin || !unpin)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: pin_pool needs a store and both "
                       "callbacks");
    if (s->mode != CB_EXPERTS_CACHE || !s->pool)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: only the cache store has a slot "
                       "pool to pin (mode %d)", (int)s->mode);
    if (s->pool_pinned)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: the %zu-byte slot pool is already "
                       "pinned (one registration at a time)", s->pool_map_bytes);
    cb_status st = pin(user, s->pool, s->pool_map_bytes);
    if (st != CB_OK) return st;
    s->unpin = unpin;
    s->unpin_user = user;
    s->pool_pinned = 1;
    return CB_OK;
}

void cb_experts_unpin_pool(cb_experts_t *s) {
    if (!s || !s->pool_pinned) return;
    cb_experts_pool_unpin_fn unpin = s->unpin;
    void *user = s->unpin_user;
    s->pool_pinned = 0;
    s->unpin = NULL;
    s->unpin_user = NULL;
    unpin(user, s->pool, s->pool_map_bytes);
}

/* ---- acquire / release ---- */

/* Parallel miss reads: an acquire with several misses claims their slots first (locked, owner
 * set: no one else reads, writes or evicts them), then reads them with mu released on up to
 * CB_EXPERTS_READERS threads (itself and short-lived helpers), so the disk sees several
 * requests at once: a virtio or NVMe device delivers more bandwidth at a queue depth above
 * one. Each job has its own slot, so the reads share nothing but the file descriptor. */
#define CB_EXPERTS_READERS 8

typedef struct read_batch {
    const cb_experts_t *s;
    read_job_t *jobs;
    int32_t n;
    int32_t next;   /* atomic: the next job to take */
    int32_t failed; /* atomic: a reader failed; the first one's detail is in err */
    cb_status rs;
    char err[512];
} read_batch_t;

static void *read_worker(void *arg) {
    read_batch_t *b = arg;
    for (;;) {
        int32_t j = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (j >= b->n) break;
        read_job_t *x = &b->jobs[j];
        x->rs = read_job(b->s, x);
        if (x->rs != CB_OK && __atomic_exchange_n(&b->failed, 1, __ATOMIC_ACQ_REL) == 0) {
            b->rs = x->rs; /* the detail is thread-local: hand it to the caller */
            snprintf(b->err, sizeof b->err, "%s", cb_last_error());
        }
    }
    return NULL;
}

/* reads every job (mu released); a helper thread that cannot start leaves its share to us.
 * A failure's detail is left in the calling thread's cb_last_error(). */
static void read_jobs(const cb_experts_t *s, read_job_t *jobs, int32_t n) {
    read_batch_t b = {.s = s, .jobs = jobs, .n = n, .next = 0, .failed = 0, .rs = CB_OK};
    pthread_t th[CB_EXPERTS_READERS - 1];
    int started[CB_EXPERTS_READERS - 1] = {0};
    int32_t helpers = n - 1 < CB_EXPERTS_READERS - 1 ? n - 1 : CB_EXPERTS_READERS - 1;
    for (int32_t i = 0; i < helpers; i++)
        started[i] = cb_thread_create(&th[i], read_worker, &b) == 0;
    read_worker(&b);
    for (int32_t i = 0; i < helpers; i++)
        if (started[i]) pthread_join(th[i], NULL);
    if (b.failed) (void)cb_fail(b.rs, "%s", b.err);
}

/* undo the locks taken by a failed acquire: ids[0..n) (mu held) */
static void unlock_ids(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        int32_t e = ids[i];
        if (e < 0 || e >= s->layers[layer].n_expert) continue;
        int32_t k = s->slot_of[s->offsets[layer] + (size_t)e];
        if (k < 0 || !s->slots[k].locked) continue;
        s->slots[k].locked = 0;
        if (!s->slots[k].pinned) cb_evict_add(s, k);
    }
}

/* a resident, loaded, unlocked expert's slot k becomes locked by acquire (mu held) */
static void lock_hit(cb_experts_t *s, int32_t k, cb_experts_layer_stats_t *st) {
    if (!s->slots[k].pinned) cb_evict_remove(s, k);
    s->slots[k].locked = 1;
    st->hits++;
    if (s->slots[k].prefetched) {
        st->prefetch_hits++;
        prefetch_outcome(s, 1);
    }
    s->slots[k].prefetched = 0;
}

/* Scores a layer's pending hint against the experts an acquire wants (callers hold mu, or
 * own the mapped store, where the forward's thread is the only caller). */
static void score_hint(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                       cb_experts_layer_stats_t *st) {
    uint32_t h = s->hint_pending[layer];
    if (!h) return;
    s->hint_pending[layer] = 0;
    st->predicted_acquired += (uint64_t)n;
    for (int32_t i = 0; i < n; i++)
        if (s->hint_of[s->offsets[layer] + (size_t)ids[i]] == h) st->predicted_used++;
}

/* Records a hint for scoring: the layer's next acquire compares it with what it wants. */
static void record_hint(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    if (++s->hint_seq == 0) { /* wrapped: old marks could collide with new ids */
        memset(s->hint_of, 0, s->total * sizeof *s->hint_of);
        memset(s->hint_pending, 0, (size_t)s->n_layers * sizeof *s->hint_pending);
        s->hint_seq = 1;
    }
    uint32_t h = s->hint_seq;
    uint64_t fresh = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t g = s->offsets[layer] + (size_t)ids[i];
        if (s->hint_of[g] != h) { /* a repeated id counts once */
            s->hint_of[g] = h;
            fresh++;
        }
    }
    s->hint_pending[layer] = h;
    s->stats[layer].predicted += fresh;
}

cb_status cb_experts_acquire(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const int32_t *uses, cb_expert_ref_t *out) {
    if (!s || layer < 0 || layer >= s->n_layers || n < 0 || (n > 0 && (!ids || !out)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad acquire (layer %d, n %d)",
                       (int)layer, (int)n);
    const cb_experts_layer_t *L = &s->layers[layer];
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= L->n_expert)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: layer %d has no expert %d",
                           (int)layer, (int)ids[i]);
    cb_experts_layer_stats_t *st = &s->stats[layer];
    if (s->mode == CB_EXPERTS_MAPPED) { /* no thread, no slots: no lock needed */
        score_hint(s, layer, ids, n, st);
        for (int32_t i = 0; i < n; i++) {
            uint64_t u = uses ? (uint64_t)(uses[i] > 0 ? uses[i] : 0) : 1;
            s->counts[s->offsets[layer] + (size_t)ids[i]] += u;
            st->uses += u;
        }
        st->acquired += (uint64_t)n;
        for (int32_t i = 0; i < n; i++) {
            size_t e = (size_t)ids[i];
            out[i].gate = L->gate_base + e * L->gate_stride;
            out[i].up = L->up_base + e * L->up_stride;
            out[i].down = L->down_base + e * L->down_stride;
        }
        st->hits += (uint64_t)n; /* mapped: resident as far as the store knows */
        return CB_OK;
    }
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&s->mu);
    score_hint(s, layer, ids, n, st);
    for (int32_t i = 0; i < n; i++) {
        uint64_t u = uses ? (uint64_t)(uses[i] > 0 ? uses[i] : 0) : 1;
        s->counts[s->offsets[layer] + (size_t)ids[i]] += u;
        st->uses += u;
    }
    st->acquired += (uint64_t)n;
    const size_t base = s->offsets[layer];
    /* pass 1: lock the hits (waiting for those the prefetch thread is reading), so that no
     * miss of this call evicts them */
    for (int32_t i = 0; i < n; i++) {
        size_t g = base + (size_t)ids[i];
        s->freq[g]++;
        int32_t k;
        while ((k = s->slot_of[g]) >= 0 && s->slots[k].loading)
            pthread_cond_wait(&s->cv_done, &s->mu);
        if (k < 0 || s->slots[k].locked) continue;
        lock_hit(s, k, st);
    }
    /* pass 2: claim free slots or victims' for the misses; pass 3 reads them (mu released) */
    int32_t nj = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t g = base + (size_t)ids[i];
        int32_t k;
        for (;;) {
            k = s->slot_of[g];
            if (k >= 0 && s->slots[k].loading) { /* the prefetch thread started it meanwhile */
                pthread_cond_wait(&s->cv_done, &s->mu);
                continue;
            }
            if (k >= 0) break;
            k = take_slot(s);
            if (k >= 0 || s->n_loading == 0) break;
            pthread_cond_wait(&s->cv_done, &s->mu); /* slots in flight become evictable */
        }
        if (k >= 0 && s->slot_of[g] == k) { /* resident: a duplicate id, or prefetched */
            if (!s->slots[k].locked) lock_hit(s, k, st);
            continue;
        }
        if (k < 0) {
            for (int32_t j = 0; j < nj; j++) { /* claimed, not read: back to the free stack */
                read_job_t *x = &s->jobs[j];
                if (x->part <= 0) slot_unclaim(s, x->k); /* an expert's first job stands for it */
            }
            unlock_ids(s, layer, ids, n);
            int32_t np = s->n_pinned;
            pthread_mutex_unlock(&s->mu);
            return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                           "experts: layer %d needs %d experts at once but the store has %d "
                           "slots (%d pinned); raise the budget or lower max_batch",
                           (int)layer, (int)n, (int)s->n_slots, (int)np);
        }
        s->slots[k].owner = (int32_t)g;
        s->slots[k].locked = 1;
        s->slot_of[g] = k;
        if (s->mode == CB_EXPERTS_CACHE && !s->lay[layer].one_read) {
            for (int32_t part = 0; part < 3; part++) /* three reads: each its own job */
                s->jobs[nj++] = (read_job_t){.k = k, .g = (int32_t)g, .part = part};
        } else {
            s->jobs[nj++] = (read_job_t){.k = k, .g = (int32_t)g, .part = -1};
        }
    }
    /* pass 3: read the claimed slots, several at once in cache mode */
    if (nj > 0) {
        pthread_mutex_unlock(&s->mu);
        if (s->mode == CB_EXPERTS_CACHE && nj > 1) {
            read_jobs(s, s->jobs, nj);
        } else {
            for (int32_t j = 0; j < nj; j++) s->jobs[j].rs = read_job(s, &s->jobs[j]);
        }
        pthread_mutex_lock(&s->mu);
        cb_status first = CB_OK;
        for (int32_t j = 0; j < nj; j++) {
            read_job_t *x = &s->jobs[j];
            if (x->part > 0) continue; /* folded into the expert's first job below */
            for (int32_t i = j + 1; i < nj && s->jobs[i].part > 0; i++) {
                if (x->rs == CB_OK) x->rs = s->jobs[i].rs;
                x->reads += s->jobs[i].reads;
                x->bytes += s->jobs[i].bytes;
            }
            if (x->rs == CB_OK) {
                account_read(s, x->g, x->reads, x->bytes);
                st->misses++;
                continue;
            }
            /* the slot was not filled: it goes back to the free stack */
            if (first == CB_OK) first = x->rs;
            slot_unclaim(s, x->k);
        }
        if (first != CB_OK) {
            unlock_ids(s, layer, ids, n); /* the experts read are kept, unlocked */
            pthread_mutex_unlock(&s->mu);
            return first;
        }
    }
    for (int32_t i = 0; i < n; i++) refs_of(s, (int32_t)(base + (size_t)ids[i]), &out[i]);
    st->wait_ns += now_ns() - t0;
    pthread_mutex_unlock(&s->mu);
    return CB_OK;
}

cb_status cb_experts_release(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    if (!s || layer < 0 || layer >= s->n_layers || n < 0 || (n > 0 && !ids))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad release (layer %d)", (int)layer);
    if (s->mode == CB_EXPERTS_MAPPED) return CB_OK;
    pthread_mutex_lock(&s->mu);
    unlock_ids(s, layer, ids, n);
    pthread_mutex_unlock(&s->mu);
    return CB_OK;
}

static cb_status pin_locked(cb_experts_t *s, int32_t layer, int32_t expert) {
    size_t g = s->offsets[layer] + (size_t)expert;
    int32_t k;
    while ((k = s->slot_of[g]) >= 0 && s->slots[k].loading)
        pthread_cond_wait(&s->cv_done, &s->mu);
    if (k >= 0 && s->slots[k].pinned) return CB_OK;
    if (s->n_slots - s->n_pinned - 1 < s->min_slots)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "experts: pinning expert %d of layer %d would leave %d unpinned slots of "
                       "%d, fewer than the %d one layer may need", (int)expert, (int)layer,
                       (int)(s->n_slots - s->n_pinned - 1), (int)s->n_slots, (int)s->min_slots);
    if (k >= 0) {
        if (!s->slots[k].locked) cb_evict_remove(s, k);
        s->slots[k].prefetched = 0;
    } else {
        while ((k = take_slot(s)) < 0 && s->n_loading > 0)
            pthread_cond_wait(&s->cv_done, &s->mu);
        if (k < 0) return cb_fail(CB_STATUS_INTERNAL, "experts: no slot to pin into");
        s->slots[k].owner = (int32_t)g;
        s->slot_of[g] = k;
        uint64_t reads = 0, bytes = 0;
        cb_status rs = read_expert(s, k, (int32_t)g, &reads, &bytes); /* mu held: setup time */
        if (rs != CB_OK) {
            slot_unclaim(s, k);
            return rs;
        }
        account_read(s, (int32_t)g, reads, bytes);
    }
    s->slots[k].pinned = 1;
    s->n_pinned++;
    return CB_OK;
}

cb_status cb_experts_pin(cb_experts_t *s, int32_t layer, int32_t expert) {
    if (!s || layer < 0 || layer >= s->n_layers)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: cannot pin in layer %d", (int)layer);
    if (expert < 0 || expert >= s->layers[layer].n_expert)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: cannot pin: layer %d has no expert %d",
                       (int)layer, (int)expert);
    if (s->mode == CB_EXPERTS_MAPPED)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: the mapped store cannot pin");
    pthread_mutex_lock(&s->mu);
    cb_status rs = pin_locked(s, layer, expert);
    pthread_mutex_unlock(&s->mu);
    return rs;
}

/* ---- prefetch ---- */

cb_status cb_experts_prefetch(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n) {
    if (!s || layer < 0 || layer >= s->n_layers || n < 0 || (n > 0 && !ids))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad prefetch (layer %d, n %d)",
                       (int)layer, (int)n);
    const cb_experts_layer_t *L = &s->layers[layer];
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= L->n_expert)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: layer %d has no expert %d",
                           (int)layer, (int)ids[i]);
    pthread_mutex_lock(&s->mu);
    record_hint(s, layer, ids, n);
    if (!s->thread_started) {
        pthread_mutex_unlock(&s->mu);
        return CB_OK;
    }
    s->round++;
    if (s->round == 0) s->round = 1; /* 0 means "never hinted" */
    s->q_head = 0;
    s->q_n = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t g = s->offsets[layer] + (size_t)ids[i];
        int32_t k = s->slot_of[g];
        if (k >= 0) {
            s->slots[k].hint_round = s->round; /* resident or in flight: protect it */
        } else if (s->queued_round[g] != s->round) {
            s->queued_round[g] = s->round;
            s->queue[s->q_n++] = (int32_t)g;
        }
    }
    if (s->q_n) pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return CB_OK;
}

int32_t cb_experts_prefetching(const cb_experts_t *s) { return s && s->thread_started; }

void cb_experts_set_read_hook(cb_experts_t *s, cb_experts_read_fn fn, void *user) {
    if (!s || s->mode == CB_EXPERTS_MAPPED) return;
    pthread_mutex_lock(&s->mu);
    while (s->n_loading > 0) pthread_cond_wait(&s->cv_done, &s->mu); /* no read in flight */
    s->read_fn = fn;
    s->read_user = fn ? user : NULL;
    pthread_mutex_unlock(&s->mu);
}

void cb_experts_prefetch_sync(cb_experts_t *s) {
    if (!s || !s->thread_started) return;
    pthread_mutex_lock(&s->mu);
    while (s->q_n > 0 || s->n_loading > 0) pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* ---- statistics ---- */

cb_status cb_experts_stats(const cb_experts_t *s, int32_t layer, cb_experts_layer_stats_t *out) {
    if (!s || !out || layer < -1 || layer >= s->n_layers)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: no layer %d", (int)layer);
    pthread_mutex_t *mu = (pthread_mutex_t *)&s->mu; /* bookkeeping lock, not logical state */
    pthread_mutex_lock(mu);
    if (layer >= 0) {
        *out = s->stats[layer];
        pthread_mutex_unlock(mu);
        return CB_OK;
    }
    memset(out, 0, sizeof *out);
    for (int32_t l = 0; l < s->n_layers; l++) {
        const cb_experts_layer_stats_t *x = &s->stats[l];
        out->uses += x->uses;
        out->acquired += x->acquired;
        out->hits += x->hits;
        out->misses += x->misses;
        out->bytes_read += x->bytes_read;
        out->wait_ns += x->wait_ns;
        out->evictions += x->evictions;
        out->resident += x->resident;
        out->resident_bytes += x->resident_bytes;
        out->reads += x->reads;
        out->prefetch_issued += x->prefetch_issued;
        out->prefetch_hits += x->prefetch_hits;
        out->prefetch_wasted += x->prefetch_wasted;
        out->predicted += x->predicted;
        out->predicted_used += x->predicted_used;
        out->predicted_acquired += x->predicted_acquired;
    }
    pthread_mutex_unlock(mu);
    return CB_OK;
}

cb_status cb_experts_route_counts(const cb_experts_t *s, int32_t layer, uint64_t *counts,
                                  int32_t n_expert) {
    if (!s || layer < 0 || layer >= s->n_layers || !counts ||
        n_expert != s->layers[layer].n_expert)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: route counts of layer %d",
                       (int)layer);
    pthread_mutex_t *mu = (pthread_mutex_t *)&s->mu;
    pthread_mutex_lock(mu);
    memcpy(counts, s->counts + s->offsets[layer], (size_t)n_expert * sizeof *counts);
    pthread_mutex_unlock(mu);
    return CB_OK;
}

void cb_experts_reset_stats(cb_experts_t *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    /* the resident set is state, not a statistic: it survives the reset */
    for (int32_t l = 0; l < s->n_layers; l++) {
        uint64_t r = s->stats[l].resident, rb = s->stats[l].resident_bytes;
        memset(&s->stats[l], 0, sizeof s->stats[l]);
        s->stats[l].resident = r;
        s->stats[l].resident_bytes = rb;
    }
    memset(s->counts, 0, s->total * sizeof *s->counts);
    pthread_mutex_unlock(&s->mu);
}
