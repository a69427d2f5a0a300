from colibri._core._native cimport (
    cb_status, CB_OK, CB_STATUS_INVALID_ARGUMENT, CB_STATUS_OUT_OF_MEMORY, CB_STATUS_IO,
    CB_STATUS_NOT_FOUND, CB_STATUS_CORRUPT, CB_STATUS_UNSUPPORTED, CB_STATUS_CLOSED,
    CB_STATUS_INTERNAL, CB_STATUS_NOT_FINITE,
)

cdef extern from "colibri/status.h" nogil:
    const char *cb_status_str(cb_status s)
    const char *cb_last_error()
    void cb_clear_error()
    cb_status cb_fail(cb_status s, const char *fmt, ...)
