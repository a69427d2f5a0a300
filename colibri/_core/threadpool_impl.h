/* Private pool API for kernels that run several phases under one lock and reuse the pool's
 * scratch buffer (cb_matmul: quantize activations, then multiply). */
#ifndef COLIBRI_THREADPOOL_IMPL_H
#define COLIBRI_THREADPOOL_IMPL_H

#include <stddef.h>

#include "colibri/threadpool.h"

/* Takes / releases the pool's caller mutex (NULL: no-op). Between them, use
 * cb_threadpool_run_locked and cb_threadpool_scratch. */
cb_status cb_threadpool_lock(cb_threadpool_t *pool);
void cb_threadpool_unlock(cb_threadpool_t *pool);

/* cb_threadpool_run for a caller that holds the lock (pool NULL: runs inline). */
cb_status cb_threadpool_run_locked(cb_threadpool_t *pool, cb_task_fn fn, void *ctx, int n_tasks);

/* The pool's scratch buffer, grown to at least `bytes` (64-byte aligned, contents undefined,
 * owned by the pool, valid until the lock is released). Caller must hold the lock. */
cb_status cb_threadpool_scratch(cb_threadpool_t *pool, size_t bytes, void **out);

#endif
