from colibri._core.status cimport cb_status

cdef extern from "colibri/threadpool.h" nogil:
    ctypedef struct cb_threadpool_t:
        pass
    ctypedef void (*cb_task_fn)(void *ctx, int task, int thread)
    int CB_THREADPOOL_MAX_THREADS
    cb_status cb_threadpool_new(int n_threads, cb_threadpool_t **out)
    void cb_threadpool_free(cb_threadpool_t *pool)
    int cb_threadpool_n_threads(const cb_threadpool_t *pool)
    cb_status cb_threadpool_run(cb_threadpool_t *pool, cb_task_fn fn, void *ctx, int n_tasks)
