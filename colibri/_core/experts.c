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
 * then reads them on up to CB_EXPERTS_READERS threads at once (cache mode; see cb_read_jobs).
 * A started acquire (cb_experts_acquire_start / _wait / _finish, what the forward pass uses)
 * returns after the claims with the reads running on reader threads, so the experts before a
 * miss compute while it loads; its bookkeeping (acquire_settle) runs at finish, as a plain
 * acquire's does after its reads.
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
 * Files: this file holds the store kinds, creation, acquire/release/pin and the statistics;
 * experts_io.c the readers, experts_prefetch.c the prefetch thread and the hints,
 * experts_policy.c the eviction structures (LRU, LFRU), experts_impl.h the store's struct and
 * what they share. */
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

/* The O_DIRECT layout of y (alignment dio): each part's region starts aligned and holds its
 * bytes wherever they start inside an aligned block (one-read: the span's region); returns the
 * slot bytes the layer needs. */
static size_t layout_direct(layout_t *y, size_t dio) {
    if (y->one_read) return align_up(y->span, dio) + dio;
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        y->at[i] = at;
        at += align_up(y->bytes[i], dio) + dio;
    }
    y->span = at;
    return at;
}

cb_experts_params_t cb_experts_default_params(void) {
    cb_experts_params_t p;
    memset(&p, 0, sizeof p);
    p.mode = CB_EXPERTS_MAPPED;
    p.policy = CB_EXPERTS_LRU;
    p.min_slots = 1;
    p.huge_pages = 1;
    p.direct_io = 1;
    return p;
}

/* a claimed slot whose read failed or never ran goes back to the free stack (mu held) */
void cb_slot_unclaim(cb_experts_t *s, int32_t k) {
    s->slot_of[s->slots[k].owner] = -1;
    s->slots[k].owner = -1;
    s->slots[k].locked = 0;
    s->free_stack[s->n_free++] = k;
}

/* bookkeeping after a successful read of g into its slot (mu held) */
void cb_account_read(cb_experts_t *s, int32_t g, uint64_t reads, uint64_t bytes) {
    int32_t l = s->layer_of[g];
    const layout_t *y = &s->lay[l];
    s->stats[l].bytes_read += bytes;
    s->stats[l].reads += reads;
    s->stats[l].resident++;
    s->stats[l].resident_bytes += (uint64_t)y->bytes[0] + y->bytes[1] + y->bytes[2];
}

/* the slot k's owner leaves (eviction) (mu held) */
void cb_drop_owner(cb_experts_t *s, int32_t k) {
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
        const layout_t *y = &s->lay[l];
        size_t e = (size_t)g - s->offsets[l];
        uint64_t off[3] = {L->gate_off + e * L->gate_stride, L->up_off + e * L->up_stride,
                           L->down_off + e * L->down_stride};
        size_t d[3];
        for (int i = 0; i < 3; i++) d[i] = dio_delta(s, y->one_read ? off[0] : off[i]);
        r->gate = p + y->at[0] + d[0];
        r->up = p + y->at[1] + d[1];
        r->down = p + y->at[2] + d[2];
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
    if (k >= 0) cb_drop_owner(s, k);
    return k;
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
    s->dfd = -1;
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
    if (pthread_mutex_init(&s->rmu, NULL) != 0 || pthread_cond_init(&s->rcv, NULL) != 0) {
        cb_experts_free(s);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "experts: cannot create the readers' lock");
    }
    s->rsync_ok = 1;
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
    if (p->mode == CB_EXPERTS_CACHE && p->direct_io) {
        /* O_DIRECT where the file system takes it (tmpfs does not: buffered reads then) */
        const size_t dio = 4096; /* a multiple of every logical block size in use, and of the page */
        size_t direct_bytes = 0;
        for (int32_t l = 0; l < n_layers; l++) {
            if (layers[l].n_expert == 0) continue;
            layout_t y = s->lay[l];
            size_t sb = layout_direct(&y, dio);
            if (sb > direct_bytes) direct_bytes = sb;
        }
        if (p->direct_io == 1 && direct_bytes - slot_bytes > slot_bytes / 16) {
            /* small experts: the slack would cost more slots than the reads gain */
        } else {
            s->dfd = open(p->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        }
        if (s->dfd >= 0) {
            s->dio = dio;
            slot_bytes = direct_bytes;
            for (int32_t l = 0; l < n_layers; l++)
                if (layers[l].n_expert > 0) (void)layout_direct(&s->lay[l], dio);
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
        int err = cb_thread_create(&s->thread, cb_prefetch_main, s);
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
    if (s->pend_active) cb_read_jobs_join(s); /* freed mid-acquire: no reader outlives it */
    if (s->rsync_ok) {
        pthread_cond_destroy(&s->rcv);
        pthread_mutex_destroy(&s->rmu);
    }
    if (s->sync_ok) {
        pthread_cond_destroy(&s->cv_work);
        pthread_cond_destroy(&s->cv_done);
        pthread_mutex_destroy(&s->mu);
    }
    cb_experts_unpin_pool(s); /* the registration ends before the memory does */
    if (s->pool) munmap(s->pool, s->pool_map_bytes);
    if (s->fd >= 0) close(s->fd);
    if (s->dfd >= 0) close(s->dfd);
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
    out->direct_io = s->dfd >= 0;
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

cb_status cb_check_layer_ids(const cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const char *what) {
    if (!s || layer < 0 || layer >= s->n_layers || n < 0 || (n > 0 && !ids))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad %s (layer %d, n %d)", what,
                       (int)layer, (int)n);
    const cb_experts_layer_t *L = &s->layers[layer];
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= L->n_expert)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: layer %d has no expert %d",
                           (int)layer, (int)ids[i]);
    return CB_OK;
}

/* Checks an acquire's arguments; the mapped store's whole acquire (*done set). */
static cb_status acquire_check_mapped(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                                     const int32_t *uses, cb_expert_ref_t *out, int *done) {
    *done = 0;
    if (n > 0 && !out)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: bad acquire (layer %d, n %d)",
                       (int)layer, (int)n);
    CHECK_OK(cb_check_layer_ids(s, layer, ids, n, "acquire"));
    const cb_experts_layer_t *L = &s->layers[layer];
    cb_experts_layer_stats_t *st = &s->stats[layer];
    if (s->mode == CB_EXPERTS_MAPPED) { /* no thread, no slots: no lock needed */
        cb_score_hint(s, layer, ids, n, st);
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
        *done = 1;
        return CB_OK;
    }
    return CB_OK;
}

/* Passes 1-2 of an acquire (cache/mmap): with mu held on return when CB_OK (*nj jobs claimed,
 * out[] filled: a claimed slot's address is known before its bytes are), released otherwise. */
static cb_status acquire_claim(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                               const int32_t *uses, cb_expert_ref_t *out, int32_t *nj_out) {
    cb_experts_layer_stats_t *st = &s->stats[layer];
    pthread_mutex_lock(&s->mu);
    cb_score_hint(s, layer, ids, n, st);
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
                if (x->part <= 0) cb_slot_unclaim(s, x->k); /* an expert's first job stands for it */
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
    *nj_out = nj;
    for (int32_t i = 0; i < n; i++) refs_of(s, (int32_t)(base + (size_t)ids[i]), &out[i]);
    return CB_OK;
}

/* Pass 3's bookkeeping after the nj jobs were read (mu held on entry, released on return): the
 * experts read become resident; a failed one's slot goes back, and then the whole acquire
 * fails with nothing left locked. */
static cb_status acquire_settle(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                                int32_t nj, uint64_t t0) {
    cb_experts_layer_stats_t *st = &s->stats[layer];
    if (nj > 0) {
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
                cb_account_read(s, x->g, x->reads, x->bytes);
                st->misses++;
                continue;
            }
            /* the slot was not filled: it goes back to the free stack */
            if (first == CB_OK) first = x->rs;
            cb_slot_unclaim(s, x->k);
        }
        if (first != CB_OK) {
            unlock_ids(s, layer, ids, n); /* the experts read are kept, unlocked */
            pthread_mutex_unlock(&s->mu);
            return first;
        }
    }
    st->wait_ns += now_ns() - t0;
    pthread_mutex_unlock(&s->mu);
    return CB_OK;
}

cb_status cb_experts_acquire(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const int32_t *uses, cb_expert_ref_t *out) {
    int done;
    CHECK_OK(acquire_check_mapped(s, layer, ids, n, uses, out, &done));
    if (done) return CB_OK;
    if (s->pend_active)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: acquire while a started acquire "
                       "(layer %d) is not finished", (int)s->pend_layer);
    uint64_t t0 = now_ns();
    int32_t nj;
    CHECK_OK(acquire_claim(s, layer, ids, n, uses, out, &nj));
    /* pass 3: read the claimed slots, several at once in cache mode */
    if (nj > 0) {
        pthread_mutex_unlock(&s->mu);
        if (s->mode == CB_EXPERTS_CACHE && nj > 1) {
            cb_read_jobs(s, s->jobs, nj);
        } else {
            for (int32_t j = 0; j < nj; j++) s->jobs[j].rs = cb_read_job(s, &s->jobs[j]);
        }
        pthread_mutex_lock(&s->mu);
    }
    return acquire_settle(s, layer, ids, n, nj, t0);
}

cb_status cb_experts_acquire_start(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                                   const int32_t *uses, cb_expert_ref_t *out) {
    if (s && s->pend_active)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: acquire_start while a started "
                       "acquire (layer %d) is not finished", (int)s->pend_layer);
    int done;
    CHECK_OK(acquire_check_mapped(s, layer, ids, n, uses, out, &done));
    s->pend_layer = layer;
    s->pend_ids = ids;
    s->pend_n = n;
    s->pend_nj = 0;
    if (done) { /* mapped: nothing to read */
        s->pend_active = 1;
        return CB_OK;
    }
    s->pend_t0 = now_ns();
    int32_t nj;
    CHECK_OK(acquire_claim(s, layer, ids, n, uses, out, &nj));
    s->pend_nj = nj;
    s->pend_active = 1;
    pthread_mutex_unlock(&s->mu);
    s->pend_t0 = now_ns() - s->pend_t0; /* from here: the time the caller waited */
    if (nj > 0) {
        if (s->mode == CB_EXPERTS_CACHE) {
            cb_read_jobs_start(s, s->jobs, nj);
        } else { /* mmap: madvise hints, done at once */
            for (int32_t j = 0; j < nj; j++) {
                s->jobs[j].rs = cb_read_job(s, &s->jobs[j]);
                s->jobs[j].done = 1;
            }
        }
    }
    return CB_OK;
}

cb_status cb_experts_wait(cb_experts_t *s, int32_t i) {
    if (!s || !s->pend_active || i < 0 || i >= s->pend_n)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: wait for %d outside a started "
                       "acquire", (int)i);
    if (s->pend_nj == 0 || s->mode != CB_EXPERTS_CACHE) {
        for (int32_t j = 0; j < s->pend_nj; j++) /* mmap: the hints' outcome */
            if (s->jobs[j].rs != CB_OK) return cb_fail(s->jobs[j].rs, "experts: read failed");
        return CB_OK;
    }
    int32_t g = (int32_t)(s->offsets[s->pend_layer] + (size_t)s->pend_ids[i]);
    uint64_t t0 = now_ns();
    cb_status rs = CB_OK;
    for (int32_t j = 0; j < s->pend_nj && rs == CB_OK; j++)
        if (s->jobs[j].g == g) rs = cb_read_job_wait(s, j);
    s->pend_t0 += now_ns() - t0;
    return rs;
}

cb_status cb_experts_acquire_finish(cb_experts_t *s) {
    if (!s || !s->pend_active)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "experts: finish without a started acquire");
    s->pend_active = 0;
    if (s->mode == CB_EXPERTS_MAPPED) return CB_OK;
    uint64_t t0 = now_ns();
    if (s->pend_nj > 0 && s->mode == CB_EXPERTS_CACHE) cb_read_jobs_join(s);
    pthread_mutex_lock(&s->mu);
    /* wait_ns: claiming, the waits and this join, not the compute between them */
    return acquire_settle(s, s->pend_layer, s->pend_ids, s->pend_n, s->pend_nj,
                          t0 - s->pend_t0);
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
        cb_status rs = cb_read_expert(s, k, (int32_t)g, &reads, &bytes); /* mu held: setup time */
        if (rs != CB_OK) {
            cb_slot_unclaim(s, k);
            return rs;
        }
        cb_account_read(s, (int32_t)g, reads, bytes);
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
