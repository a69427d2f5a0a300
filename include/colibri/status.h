/* colibri status codes and the thread-local error detail.
 *
 * Every fallible C call returns a cb_status: CB_OK (0) or a negative code. When it fails it
 * also leaves a human-readable detail in a thread-local buffer (cb_last_error()), which the
 * Cython boundary copies into the Python exception. The C core never prints and never exits.
 */
#ifndef COLIBRI_STATUS_H
#define COLIBRI_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cb_status {
    CB_OK = 0,
    CB_STATUS_INVALID_ARGUMENT = -1, /* a bad value from the caller: maps to ValueError */
    CB_STATUS_OUT_OF_MEMORY = -2,    /* an allocation or a block that cannot fit: MemoryError */
    CB_STATUS_IO = -3,               /* a system call on a file failed: OSError */
    CB_STATUS_NOT_FOUND = -4,        /* a file or a named thing is missing: FileNotFoundError */
    CB_STATUS_CORRUPT = -5,          /* malformed input data (file, UTF-8): ValueError */
    CB_STATUS_UNSUPPORTED = -6,      /* valid but not supported (type, arch): ColibriError */
    CB_STATUS_CLOSED = -7,           /* use of a handle after close: ColibriError */
    CB_STATUS_INTERNAL = -8,         /* a broken invariant: ColibriError */
    CB_STATUS_NOT_FINITE = -9,       /* a computation produced NaN or Inf: ColibriError */
} cb_status;

/* Static name of a status ("invalid argument", ...). Never NULL. */
const char *cb_status_str(cb_status s);

/* Detail of the last failure on this thread; "" when none. Borrowed, valid until the next
 * colibri call on this thread. */
const char *cb_last_error(void);

/* Clears the detail on this thread. */
void cb_clear_error(void);

/* Records a printf-style detail for this thread and returns s, so that a failing path reads
 * `return cb_fail(CB_STATUS_INVALID_ARGUMENT, "size %zu is zero", n);`. */
cb_status cb_fail(cb_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
