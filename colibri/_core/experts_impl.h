/* Private to the expert store (include/colibri/experts.h), whose parts are
 *   experts.c           the store kinds (mapped, cache, mmap): creation and free, the slot
 *                       pool, acquire/release/pin, the slot bookkeeping, the statistics; its
 *                       opening comment describes the design and the invariants;
 *   experts_io.c        the readers: pread_all, an expert's or one matrix's read into its slot,
 *                       an acquire's misses read on parallel threads, the read hook;
 *   experts_prefetch.c  the prefetch thread, the hints (cb_experts_prefetch) and their scoring;
 *   experts_policy.c    the eviction structures of the LRU and LFRU policies.
 * Everything here is guarded by the store's mutex mu unless said. */
#ifndef COLIBRI_EXPERTS_IMPL_H
#define COLIBRI_EXPERTS_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "colibri/experts.h"

#define SLOT_ALIGN 64u
#define POOL_ALIGN ((size_t)2 << 20)
#define ONE_READ_MIN_GAP ((size_t)64 << 10)

typedef struct slot {
    int32_t owner;   /* global expert index, -1 free */
    int32_t prev, next; /* LRU links (-1 none) */
    int32_t heap_pos;   /* LFRU position, -1 when not in the heap */
    uint8_t locked, pinned, in_lru;
    uint8_t loading;    /* the prefetch thread is reading it (mu released) */
    uint8_t prefetched; /* loaded by the prefetch thread, not acquired since */
    uint32_t hint_round;/* the last hint round that named it */
    uint64_t key, tick; /* LFRU key and last-use tick */
} slot_t;

/* where one layer's expert matrices go in a slot, and how it is read. With O_DIRECT a read
 * covers the aligned range around its bytes, so a part's region in the slot starts aligned and
 * its data starts dio_delta(offset) into it (one-read: the span's delta, then at[i]). */
typedef struct layout {
    size_t bytes[3];    /* gate, up, down matrix bytes */
    size_t at[3];       /* their offsets in the slot (one-read: in the span) */
    size_t span;        /* bytes a one-read reads (one_read) */
    int one_read;       /* the three ranges are adjacent in the file: one pread */
} layout_t;

/* one miss of an acquire: slot k is filled with expert g (cache mode, mu released) */
typedef struct read_job {
    int32_t k, g;
    int32_t part; /* -1: the whole expert (read_expert); 0..2: one matrix (three-read layout) */
    cb_status rs;
    uint64_t reads, bytes;
    int32_t done; /* set (under rmu) when a started acquire's reader finished it */
} read_job_t;

#define CB_EXPERTS_READERS 8

/* one acquire's reads in flight on reader threads (cb_read_jobs, cb_read_jobs_start) */
typedef struct read_batch {
    const cb_experts_t *s;
    read_job_t *jobs;
    int32_t n;
    int32_t next;   /* atomic: the next job to take */
    int32_t failed; /* atomic: a reader failed; the first one's detail is in err */
    int32_t async;  /* readers report each job's end (done, rcv) */
    cb_status rs;
    char err[512];
    pthread_t th[CB_EXPERTS_READERS];
    int32_t n_threads; /* started */
} read_batch_t;

struct cb_experts {
    int32_t n_layers;
    int32_t mode, policy;
    cb_experts_layer_t *layers;        /* owned copy */
    layout_t *lay;                     /* [n_layers] */
    cb_experts_layer_stats_t *stats;   /* [n_layers] */
    uint64_t *counts;                  /* per (layer, expert) routings */
    size_t *offsets;                   /* [n_layers] start of a layer's counts */
    size_t total;                      /* experts of all layers */
    uint64_t expert_bytes;
    int32_t one_read_layers;
    /* cache / mmap */
    int fd;
    int dfd;                           /* cache: the file opened O_DIRECT, or -1 */
    size_t dio;                        /* O_DIRECT alignment (bytes) when dfd >= 0, else 0 */
    char *path;                        /* the model file (error details name it) */
    cb_experts_read_fn read_fn;        /* test hook in place of pread, or NULL */
    void *read_user;
    int32_t n_slots, n_pinned, min_slots;
    size_t slot_bytes;
    uint8_t *pool;                     /* cache: n_slots * slot_bytes (mapped) */
    size_t pool_map_bytes;
    cb_experts_pool_unpin_fn unpin;    /* set while an external owner pins the pool */
    void *unpin_user;
    int pool_pinned;
    int32_t *slot_of;                  /* [total] */
    int32_t *layer_of;                 /* [total] layer of a global index */
    uint64_t *freq;                    /* [total] acquisitions ever (LFRU) */
    slot_t *slots;                     /* [n_slots] */
    int32_t *free_stack, n_free;
    int32_t lru_head, lru_tail;
    int32_t *heap, n_heap;
    uint64_t age, tick;
    size_t page;
    /* synchronisation and prefetch */
    pthread_mutex_t mu;
    pthread_cond_t cv_done, cv_work;
    int sync_ok;                       /* mu and the condvars were initialised */
    pthread_t thread;
    int thread_started, stop;
    int32_t *queue, q_head, q_n;       /* the current hint's experts not yet started [total] */
    uint32_t *queued_round;            /* [total] round in which g was queued */
    uint32_t round;
    int32_t n_loading;                 /* slots the prefetch thread is reading */
    read_job_t *jobs;                  /* [3 n_slots] one acquire's misses, read in parallel */
    /* a started acquire (cb_experts_acquire_start .. _finish), its reads on reader threads */
    read_batch_t rb;
    pthread_mutex_t rmu;               /* guards the jobs' done flags; rcv signals them */
    pthread_cond_t rcv;
    int rsync_ok;
    int32_t pend_active, pend_layer, pend_n, pend_nj;
    const int32_t *pend_ids;           /* the caller's ids, valid until finish */
    uint64_t pend_t0;                  /* its start time, then the time its caller waited */
    uint32_t pf_good, pf_bad;          /* recent prefetches used / evicted unused (halved at 64) */
    /* prediction scoring: the hint that named g ([total]) and each layer's pending hint */
    uint32_t *hint_of, *hint_pending, hint_seq;
};

#define CHECK_OK(expr)                  \
    do {                                \
        cb_status rs_ = (expr);         \
        if (rs_ != CB_OK) return rs_;   \
    } while (0)

static inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---- file ranges (experts.c, experts_io.c) ---- */

/* the file offsets, lengths and mapped addresses of expert g's gate, up and down matrices */
static inline void expert_ranges(const cb_experts_t *s, int32_t g, uint64_t off[3], size_t len[3],
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

/* where a byte at file offset off lands past the start of its O_DIRECT-aligned read (0 when
 * the store reads buffered): a part's data sits that far into its slot region */
static inline size_t dio_delta(const cb_experts_t *s, uint64_t off) {
    return s->dio ? (size_t)(off % s->dio) : 0;
}

/* the whole pages inside [p, p + len) */
static inline void advise_inner(const cb_experts_t *s, const uint8_t *p, size_t len, int advice) {
    uintptr_t a = align_up((uintptr_t)p, s->page), b = ((uintptr_t)p + len) / s->page * s->page;
    if (b > a) (void)madvise((void *)a, b - a, advice);
}

/* a prefetched expert was used (good) or evicted unused: the recent precision (mu held) */
static inline void prefetch_outcome(cb_experts_t *s, int good) {
    if (good) s->pf_good++;
    else s->pf_bad++;
    if (s->pf_good + s->pf_bad > 64) {
        s->pf_good /= 2;
        s->pf_bad /= 2;
    }
}

/* the arguments of an acquire or a prefetch (`what`): a layer of the store and n expert ids of
 * it (INVALID_ARGUMENT naming the first one wrong) */
cb_status cb_check_layer_ids(const cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const char *what);

/* ---- slot bookkeeping (experts.c; mu held) ---- */

/* a claimed slot whose read failed or never ran goes back to the free stack */
void cb_slot_unclaim(cb_experts_t *s, int32_t k);
/* bookkeeping after a successful read of g into its slot */
void cb_account_read(cb_experts_t *s, int32_t g, uint64_t reads, uint64_t bytes);
/* the slot k's owner leaves (eviction) */
void cb_drop_owner(cb_experts_t *s, int32_t k);

/* ---- readers (experts_io.c; mu RELEASED, on slots their caller owns) ---- */

/* Brings expert g into slot k (cache: read it; mmap: hint it); *reads and *bytes receive the
 * pread calls and bytes read. */
cb_status cb_read_expert(const cb_experts_t *s, int32_t k, int32_t g, uint64_t *reads,
                         uint64_t *bytes);
/* one job of an acquire: the whole expert (part -1) or one matrix */
cb_status cb_read_job(const cb_experts_t *s, read_job_t *x);
/* reads every job, on up to CB_EXPERTS_READERS threads; a failure's detail is left in the
 * calling thread's cb_last_error() and in each job's rs */
void cb_read_jobs(const cb_experts_t *s, read_job_t *jobs, int32_t n);
/* starts reading every job on reader threads (s->rb) and returns (reads them inline when no
 * thread starts); cb_read_job_wait waits for job j (its rs, with the batch's first error
 * detail); cb_read_jobs_join waits for all and joins the threads (the detail of a failure in
 * the calling thread's cb_last_error()) */
void cb_read_jobs_start(cb_experts_t *s, read_job_t *jobs, int32_t n);
cb_status cb_read_job_wait(cb_experts_t *s, int32_t j);
void cb_read_jobs_join(cb_experts_t *s);

/* ---- prefetch and hints (experts_prefetch.c) ---- */

/* the prefetch thread (started by cb_experts_new; arg is the store) */
void *cb_prefetch_main(void *arg);
/* scores a layer's pending hint against the experts an acquire wants (callers hold mu, or own
 * the mapped store, where the forward's thread is the only caller) */
void cb_score_hint(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                   cb_experts_layer_stats_t *st);

/* ---- eviction structures (experts_policy.c; mu held) ----
 * LRU: a doubly linked list of slots, least recently released first; LFRU: a min-heap on
 * (age + acquisitions, tick). Only unlocked, unpinned, loaded resident slots are in them. */

/* k becomes evictable (it was just released or loaded and unlocked) */
void cb_evict_add(cb_experts_t *s, int32_t k);
/* k leaves the structure (it is locked or pinned); nothing when it is not in it */
void cb_evict_remove(cb_experts_t *s, int32_t k);
/* the victim (removed from the structure), or -1 when every slot is locked or pinned */
int32_t cb_evict_pop(cb_experts_t *s);
/* the victim cb_evict_pop would choose, without removing it, or -1 */
int32_t cb_evict_peek(const cb_experts_t *s);

#endif
