/* The C core's one allocation point: every malloc/calloc/realloc/posix_memalign, every mmap
 * that obtains memory and every pthread_create of the core goes through these wrappers.
 *
 * Release build: each wrapper is a static inline call of the libc function (no cost).
 * Test build (-DCB_FAULT_INJECTION, the C tests' objects only): each call first asks the fault
 * counter (alloc.c) whether it is the one to fail; a failing wrapper behaves like the libc call
 * that ran out of memory (NULL, ENOMEM, MAP_FAILED with errno ENOMEM, EAGAIN for threads) and
 * touches nothing. tests/c/test_oom.c arms the counter to fail the k-th call for k = 1, 2, ...
 * (SQLite's method) and checks that every failure reaches the caller as
 * CB_STATUS_OUT_OF_MEMORY, leaks nothing and leaves the object usable or cleanly freeable.
 * free() needs no wrapper: memory from these wrappers is released with plain free()/munmap(). */
#ifndef COLIBRI_ALLOC_H
#define COLIBRI_ALLOC_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>

#ifdef CB_FAULT_INJECTION
/* 1 when the counted call now being made must fail (counts it). Thread-safe. */
int cb_fault_hit(void);
/* Arms the counter: the k-th counted call from now fails (k >= 1); with persistent != 0 every
 * later call fails too. k = 0 disarms. Resets the count and the fired flag. */
void cb_fault_arm(long k, int persistent);
/* Calls counted since the last arm, and how many of them failed. */
long cb_fault_calls(void);
long cb_fault_failed(void);
#define CB_FAULT_HIT() cb_fault_hit()
#else
#define CB_FAULT_HIT() 0
#endif

static inline void *cb_malloc(size_t n) {
    if (CB_FAULT_HIT()) return NULL;
    return malloc(n);
}

static inline void *cb_calloc(size_t n, size_t size) {
    if (CB_FAULT_HIT()) return NULL;
    return calloc(n, size);
}

/* like realloc: on failure p is left allocated and unchanged */
static inline void *cb_realloc(void *p, size_t n) {
    if (CB_FAULT_HIT()) return NULL;
    return realloc(p, n);
}

static inline int cb_posix_memalign(void **p, size_t align, size_t n) {
    if (CB_FAULT_HIT()) return ENOMEM;
    return posix_memalign(p, align, n);
}

/* an mmap that obtains memory (anonymous, or a /dev/shm file) */
static inline void *cb_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (CB_FAULT_HIT()) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return mmap(addr, len, prot, flags, fd, off);
}

/* a thread is memory too (its stack): pthread_create's EAGAIN */
static inline int cb_thread_create(pthread_t *t, void *(*fn)(void *), void *arg) {
    if (CB_FAULT_HIT()) return EAGAIN;
    return pthread_create(t, NULL, fn, arg);
}

#endif
