/* The fault counter of the allocation wrappers (alloc.h), compiled only into test builds
 * (-DCB_FAULT_INJECTION); the release library has no counter and no cost. */
#include "alloc.h"

#ifdef CB_FAULT_INJECTION
static long fault_at;       /* the counted call that fails first (0: disarmed) */
static int fault_persist;   /* every call after it fails too */
static long fault_calls;    /* counted calls since arm */
static long fault_failed;   /* calls made to fail since arm */

int cb_fault_hit(void) {
    long at = __atomic_load_n(&fault_at, __ATOMIC_ACQUIRE);
    if (at <= 0) return 0;
    long n = __atomic_add_fetch(&fault_calls, 1, __ATOMIC_ACQ_REL);
    if (n == at || (n > at && __atomic_load_n(&fault_persist, __ATOMIC_RELAXED))) {
        __atomic_add_fetch(&fault_failed, 1, __ATOMIC_ACQ_REL);
        return 1;
    }
    return 0;
}

void cb_fault_arm(long k, int persistent) {
    __atomic_store_n(&fault_at, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&fault_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fault_failed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fault_persist, persistent, __ATOMIC_RELAXED);
    __atomic_store_n(&fault_at, k > 0 ? k : 0, __ATOMIC_RELEASE);
}

long cb_fault_calls(void) { return __atomic_load_n(&fault_calls, __ATOMIC_ACQUIRE); }

long cb_fault_failed(void) { return __atomic_load_n(&fault_failed, __ATOMIC_ACQUIRE); }
#else
typedef int cb_alloc_no_fault_counter; /* ISO C wants a non-empty translation unit */
#endif
