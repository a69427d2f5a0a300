/* Thread pool: every task runs exactly once for any thread count, errors are refused, a nested
 * run on the same pool is refused instead of deadlocking, back-to-back runs do not lose work. */
#include <stdatomic.h>
#include <string.h>

#include "colibri/threadpool.h"
#include "testutil.h"

typedef struct {
    atomic_int hits[1000];
    atomic_int bad_thread;
    int n_threads;
    cb_threadpool_t *pool;
    atomic_int nested_status;
} ctx_t;

static void count_task(void *vctx, int task, int thread) {
    ctx_t *c = vctx;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_store(&c->bad_thread, 1);
}

static void nested_task(void *vctx, int task, int thread) {
    (void)task;
    (void)thread;
    ctx_t *c = vctx;
    atomic_store(&c->nested_status, (int)cb_threadpool_run(c->pool, count_task, c, 1));
}

int main(void) {
    static ctx_t c;
    cb_threadpool_t *p = NULL;
    CHECK(cb_threadpool_new(0, &p) == CB_STATUS_INVALID_ARGUMENT && p == NULL);
    CHECK(cb_threadpool_new(CB_THREADPOOL_MAX_THREADS + 1, &p) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_threadpool_n_threads(NULL) == 1);
    cb_threadpool_free(NULL);

    int counts[] = {1, 2, 3, 8};
    for (int k = 0; k < 4; k++) {
        int nt = counts[k];
        CHECK(cb_threadpool_new(nt, &p) == CB_OK);
        CHECK(cb_threadpool_n_threads(p) == nt);
        c.n_threads = nt;
        for (int round = 0; round < 200; round++) {
            int n_tasks = (round * 37) % 1000;
            for (int i = 0; i < 1000; i++) atomic_store(&c.hits[i], 0);
            CHECK(cb_threadpool_run(p, count_task, &c, n_tasks) == CB_OK);
            int ok = 1;
            for (int i = 0; i < 1000; i++) ok &= atomic_load(&c.hits[i]) == (i < n_tasks);
            CHECK(ok);
        }
        CHECK(atomic_load(&c.bad_thread) == 0);
        CHECK(cb_threadpool_run(p, count_task, &c, -1) == CB_STATUS_INVALID_ARGUMENT);
        CHECK(cb_threadpool_run(p, NULL, &c, 1) == CB_STATUS_INVALID_ARGUMENT);
        c.pool = p;
        atomic_store(&c.nested_status, 0);
        CHECK(cb_threadpool_run(p, nested_task, &c, 2) == CB_OK);
        CHECK(atomic_load(&c.nested_status) == CB_STATUS_INVALID_ARGUMENT);
        cb_threadpool_free(p);
    }
    /* NULL pool: inline on the caller */
    c.n_threads = 1;
    for (int i = 0; i < 1000; i++) atomic_store(&c.hits[i], 0);
    CHECK(cb_threadpool_run(NULL, count_task, &c, 10) == CB_OK);
    CHECK(atomic_load(&c.hits[9]) == 1 && atomic_load(&c.hits[10]) == 0);
    /* create and free at once, and free right after a run (workers may still be starting) */
    for (int i = 0; i < 20; i++) {
        CHECK(cb_threadpool_new(3, &p) == CB_OK);
        if (i & 1) CHECK(cb_threadpool_run(p, count_task, &c, 5) == CB_OK);
        cb_threadpool_free(p);
    }
    TEST_MAIN_END("test_threadpool");
}
