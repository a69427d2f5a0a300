/* Status names and the thread-local error detail (see include/colibri/status.h).
 * Each thread has its own 512-byte buffer; cb_fail truncates longer messages. */
#include "colibri/status.h"

#include <stdio.h>

static _Thread_local char last_error[512];

const char *cb_status_str(cb_status s) {
    switch (s) {
    case CB_OK: return "ok";
    case CB_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case CB_STATUS_OUT_OF_MEMORY: return "out of memory";
    case CB_STATUS_IO: return "I/O error";
    case CB_STATUS_NOT_FOUND: return "not found";
    case CB_STATUS_CORRUPT: return "corrupt input";
    case CB_STATUS_UNSUPPORTED: return "unsupported";
    case CB_STATUS_CLOSED: return "use after close";
    case CB_STATUS_INTERNAL: return "internal error";
    case CB_STATUS_NOT_FINITE: return "non-finite values";
    }
    return "unknown status";
}

const char *cb_last_error(void) { return last_error; }

void cb_clear_error(void) { last_error[0] = '\0'; }

cb_status cb_fail(cb_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}
