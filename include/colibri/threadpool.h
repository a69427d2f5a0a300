/* A small persistent thread pool for the kernels (no OpenMP).
 *
 * A pool of n threads is the calling thread plus n-1 persistent pthreads. cb_threadpool_run()
 * hands out task indices 0..n_tasks-1 through one atomic counter; every thread (the caller
 * included, as thread 0) takes the next index until none are left, and run() returns when every
 * task has finished. Idle workers spin briefly on an atomic generation counter (low dispatch
 * latency for back-to-back kernels), then sleep on a condition variable.
 *
 * One caller at a time: run() takes the pool's mutex, so two threads that share a pool are
 * serialised (not an error). A task function must not call run() on the same pool (it would
 * deadlock); the pool checks and refuses that with CB_STATUS_INVALID_ARGUMENT.
 *
 * The pool also owns a scratch buffer that kernels (cb_matmul) reuse between calls to hold
 * quantized activations, so that a forward pass does not allocate per matmul.
 */
#ifndef COLIBRI_THREADPOOL_H
#define COLIBRI_THREADPOOL_H

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cb_threadpool cb_threadpool_t;

/* A task: ctx is the pointer given to run() (borrowed), task is the task index in
 * [0, n_tasks), thread is the index of the executing thread in [0, n_threads) (0 = caller),
 * so a task may use per-thread scratch indexed by it. */
typedef void (*cb_task_fn)(void *ctx, int task, int thread);

/* Most threads a pool may have. */
#define CB_THREADPOOL_MAX_THREADS 256

/* Creates a pool of n_threads threads in total (1..CB_THREADPOOL_MAX_THREADS; 1 = the caller
 * alone, no pthread is started). *out is owned by the caller: free it with cb_threadpool_free. */
cb_status cb_threadpool_new(int n_threads, cb_threadpool_t **out);

/* Stops and joins the workers, frees the pool. NULL is accepted. Must not run concurrently with
 * run() on the same pool. */
void cb_threadpool_free(cb_threadpool_t *pool);

/* Number of threads of the pool (the caller included); 1 for NULL. */
int cb_threadpool_n_threads(const cb_threadpool_t *pool);

/* Runs fn(ctx, task, thread) for every task in [0, n_tasks) on the pool's threads and the
 * calling thread, and returns when all have finished. pool NULL runs every task on the calling
 * thread (thread index 0). n_tasks 0 returns at once; negative is an error. */
cb_status cb_threadpool_run(cb_threadpool_t *pool, cb_task_fn fn, void *ctx, int n_tasks);

#ifdef __cplusplus
}
#endif
#endif
