/* Persistent thread pool (see include/colibri/threadpool.h).
 *
 * Design: n-1 worker pthreads wait for a new "generation" of work. run() publishes the job
 * (fn, ctx, n_tasks) and bumps the generation under `wake_mtx`, broadcasting only when some
 * worker sleeps. Every thread (the caller as thread 0) then claims task indices until they run
 * out, and the caller waits until every claimed task has *completed* (`completed == n_tasks`)
 * - not until every worker has checked in: a worker that is asleep, still waking or
 * descheduled (another process on its core) and claimed nothing does not hold the caller up,
 * which on a loaded machine was most of a decode step (the caller did all the tasks, then
 * waited a scheduler slice for an idle worker to say so).
 * Claims are a seqlock: one 64-bit word holds (generation << 32 | next index). run() first
 * stores (g, LOCKED), then the job fields, then (g, 0) with release. A claimer loads the word
 * (acquire), reads the job fields, and claims index i with a compare-exchange of (g, i) to
 * (g, i + k): it succeeds only if no new job was published in between, so the fields it read
 * are the claimed tasks' job. A claim takes k = 1/n_threads of the tasks left (at least one;
 * guided self-scheduling): every claim and completion is a cross-core line transfer, and a
 * small matmul's 32 one-task claims cost more than its weights' bandwidth on two threads; and
 * each claim starts a new stream of weight rows, which the prefetchers take a while to follow,
 * so the first claims are as long as the balance allows (1/(2 n_threads) was 10% slower on
 * 0.45-0.9 MB matrices at two threads, docs/benchmarks.md). A late worker thus either helps the
 * current job or claims nothing; it never dereferences ctx without a claim, so run() may return
 * (and its ctx die) while such a worker is still looking.
 * Workers spin ~CB_TP_SPIN polls on the generation before sleeping: a forward pass issues
 * kernels back to back and a sleeping worker costs a futex wake-up (tens of microseconds).
 * `call_mtx` serialises callers; a thread-local marks threads inside a task so that a nested
 * run() on the same pool is refused instead of deadlocking.
 * Ownership: the pool owns its threads and its scratch buffer; ctx is borrowed for one run().
 */
#include "threadpool_impl.h"

#include "alloc.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CB_CPU_RELAX() _mm_pause()
#else
#define CB_CPU_RELAX() ((void)0)
#endif

#define CB_TP_SPIN 20000
#define CB_TP_LOCKED 0xFFFFFFFFu /* the index while a job is being written: no claim succeeds */

struct cb_threadpool {
    int n_threads;
    pthread_t *threads;
    int n_started;

    pthread_mutex_t call_mtx; /* one caller at a time */
    pthread_mutex_t wake_mtx; /* guards sleeping + the condition */
    pthread_cond_t wake_cv;
    int sleeping;

    atomic_int stop;
    uint32_t seq;             /* the current job's sequence number (caller only) */

    /* Each word that every thread writes per task has a cache line of its own, away from the
     * job fields they all read per claim: with one shared line every claim cost two cross-core
     * line transfers (see cb_matmul_ex's task size). */
    _Alignas(64) atomic_uint generation; /* wake-ups: bumped once per job */
    _Alignas(64) _Atomic uint64_t work;  /* claims: job sequence << 32 | next task index (seqlock) */
    _Alignas(64) atomic_int completed;   /* tasks of the current job finished */

    /* the job, written while `work` holds CB_TP_LOCKED (relaxed atomics: see the seqlock) */
    _Alignas(64) _Atomic(cb_task_fn) fn;
    _Atomic(void *) ctx;
    atomic_int n_tasks;

    void *scratch;
    size_t scratch_bytes;
};

typedef struct {
    cb_threadpool_t *pool;
    int index;
} worker_arg;

static _Thread_local const cb_threadpool_t *tp_current = NULL;

/* Claim and run tasks of whichever job is current until it has none left. */
static void tp_work(cb_threadpool_t *p, int thread) {
    const cb_threadpool_t *saved = tp_current;
    tp_current = p;
    uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
    for (;;) {
        uint32_t i = (uint32_t)w;
        cb_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        int n = atomic_load_explicit(&p->n_tasks, memory_order_relaxed);
        if (i == CB_TP_LOCKED || i >= (uint32_t)n) break; /* being written, or all claimed */
        atomic_thread_fence(memory_order_acquire);       /* the reads above before the claim */
        /* guided: a claim takes 1/n_threads of the tasks left (at least one) */
        uint32_t k = ((uint32_t)n - i) / (uint32_t)p->n_threads;
        k = k ? k : 1;
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + k, memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* w reloaded: another claim, or a new job */
        for (uint32_t j = 0; j < k; j++) fn(ctx, (int)(i + j), thread);
        atomic_fetch_add_explicit(&p->completed, (int)k, memory_order_release);
        w = atomic_load_explicit(&p->work, memory_order_acquire);
    }
    tp_current = saved;
}

static void *tp_worker(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    cb_threadpool_t *p = wa.pool;
    /* Generation 0 is the pool's initial one (not the current value: a run() may already
     * have bumped it before this thread started). */
    unsigned seen = 0;
    for (;;) {
        unsigned g = seen;
        for (int i = 0; i < CB_TP_SPIN; i++) {
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
            if (g != seen) break;
            CB_CPU_RELAX();
        }
        if (g == seen) {
            pthread_mutex_lock(&p->wake_mtx);
            p->sleeping++;
            while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake_cv, &p->wake_mtx);
            p->sleeping--;
            pthread_mutex_unlock(&p->wake_mtx);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        tp_work(p, wa.index);
    }
    return NULL;
}

cb_status cb_threadpool_new(int n_threads, cb_threadpool_t **out) {
    if (!out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "threadpool_new: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > CB_THREADPOOL_MAX_THREADS)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "threadpool_new: n_threads %d not in [1, %d]",
                       n_threads, CB_THREADPOOL_MAX_THREADS);
    void *mem = NULL; /* 64-byte aligned: the struct's cache-line members */
    if (cb_posix_memalign(&mem, 64, sizeof(cb_threadpool_t)) != 0)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "threadpool_new: no memory for the pool");
    cb_threadpool_t *p = mem;
    memset(p, 0, sizeof *p);
    p->n_threads = n_threads;
    pthread_mutex_init(&p->call_mtx, NULL);
    pthread_mutex_init(&p->wake_mtx, NULL);
    pthread_cond_init(&p->wake_cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->work, (uint64_t)CB_TP_LOCKED);
    atomic_init(&p->completed, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->fn, (cb_task_fn)NULL);
    atomic_init(&p->ctx, (void *)NULL);
    atomic_init(&p->n_tasks, 0);
    if (n_threads > 1) {
        p->threads = cb_calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            cb_threadpool_free(p);
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "threadpool_new: no memory for %d threads",
                           n_threads);
        }
        for (int i = 1; i < n_threads; i++) {
            worker_arg *wa = cb_malloc(sizeof *wa);
            if (!wa) {
                cb_threadpool_free(p);
                return cb_fail(CB_STATUS_OUT_OF_MEMORY, "threadpool_new: no memory");
            }
            wa->pool = p;
            wa->index = i;
            int rc = cb_thread_create(&p->threads[i - 1], tp_worker, wa);
            if (rc != 0) {
                free(wa);
                cb_threadpool_free(p);
                return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                               "threadpool_new: pthread_create failed for thread %d (error %d)",
                               i, rc);
            }
            p->n_started++;
        }
    }
    *out = p;
    return CB_OK;
}

void cb_threadpool_free(cb_threadpool_t *p) {
    if (!p) return;
    pthread_mutex_lock(&p->wake_mtx);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->wake_mtx);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->scratch);
    pthread_cond_destroy(&p->wake_cv);
    pthread_mutex_destroy(&p->wake_mtx);
    pthread_mutex_destroy(&p->call_mtx);
    free(p);
}

int cb_threadpool_n_threads(const cb_threadpool_t *pool) { return pool ? pool->n_threads : 1; }

cb_status cb_threadpool_lock(cb_threadpool_t *pool) {
    if (!pool) return CB_OK;
    if (tp_current == pool)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "threadpool: run() called from inside a task of the same pool");
    pthread_mutex_lock(&pool->call_mtx);
    return CB_OK;
}

void cb_threadpool_unlock(cb_threadpool_t *pool) {
    if (pool) pthread_mutex_unlock(&pool->call_mtx);
}

cb_status cb_threadpool_run_locked(cb_threadpool_t *p, cb_task_fn fn, void *ctx, int n_tasks) {
    if (!fn) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "threadpool_run: fn is NULL");
    if (n_tasks < 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "threadpool_run: n_tasks %d < 0", n_tasks);
    if (n_tasks == 0) return CB_OK;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        const cb_threadpool_t *saved = tp_current;
        tp_current = p;
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        tp_current = saved;
        return CB_OK;
    }
    /* seqlock write: lock the claims, write the job, open it (every earlier job's tasks have
     * completed, so no claimer runs one of them now) */
    uint64_t seq = (uint64_t)(++p->seq) << 32;
    atomic_store_explicit(&p->work, seq | CB_TP_LOCKED, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->completed, 0, memory_order_relaxed);
    atomic_store_explicit(&p->work, seq, memory_order_release);
    pthread_mutex_lock(&p->wake_mtx);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (p->sleeping) pthread_cond_broadcast(&p->wake_cv);
    pthread_mutex_unlock(&p->wake_mtx);
    tp_work(p, 0);
    /* wait for the tasks other threads claimed (none: no wait) */
    for (long spins = 0; atomic_load_explicit(&p->completed, memory_order_acquire) < n_tasks;
         spins++) {
        if (spins < CB_TP_SPIN) CB_CPU_RELAX();
        else sched_yield();
    }
    return CB_OK;
}

cb_status cb_threadpool_run(cb_threadpool_t *pool, cb_task_fn fn, void *ctx, int n_tasks) {
    cb_status s = cb_threadpool_lock(pool);
    if (s != CB_OK) return s;
    s = cb_threadpool_run_locked(pool, fn, ctx, n_tasks);
    cb_threadpool_unlock(pool);
    return s;
}

cb_status cb_threadpool_scratch(cb_threadpool_t *p, size_t bytes, void **out) {
    if (!p) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "threadpool_scratch: pool is NULL");
    if (bytes > p->scratch_bytes) {
        size_t want = bytes + bytes / 4 + 64;
        want = (want + 63) & ~(size_t)63;
        void *nb = NULL;
        if (cb_posix_memalign(&nb, 64, want) != 0)
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "threadpool: no memory for %zu scratch bytes",
                           want);
        free(p->scratch);
        p->scratch = nb;
        p->scratch_bytes = want;
    }
    *out = p->scratch;
    return CB_OK;
}
