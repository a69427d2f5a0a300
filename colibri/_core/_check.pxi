# The one status -> exception mapping, included first by _native.pyx (the one extension module,
# holding the one copy of the C library) so every concept's .pxi after it calls check().
from colibri._core.status cimport (
    cb_status, cb_status_str, cb_last_error, cb_clear_error, CB_OK,
    CB_STATUS_INVALID_ARGUMENT, CB_STATUS_OUT_OF_MEMORY, CB_STATUS_IO, CB_STATUS_NOT_FOUND,
    CB_STATUS_CORRUPT, CB_STATUS_UNSUPPORTED, CB_STATUS_CLOSED, CB_STATUS_INTERNAL,
    CB_STATUS_NOT_FINITE,
)
from colibri.errors import ColibriError

# The exception class of each failed status (include/colibri/status.h); any other: ColibriError.
_STATUS_EXCEPTIONS = {
    CB_STATUS_INVALID_ARGUMENT: ValueError,
    CB_STATUS_OUT_OF_MEMORY: MemoryError,
    CB_STATUS_IO: OSError,
    CB_STATUS_NOT_FOUND: FileNotFoundError,
    CB_STATUS_CORRUPT: ValueError,
}


cdef inline int check(cb_status s) except -1:
    """Raise the Python exception for a failed status, with the C detail message (or the
    status name when the C code left none)."""
    if s == CB_OK:
        return 0
    detail = cb_last_error().decode("utf-8", "replace")
    name = cb_status_str(s).decode("ascii")
    cb_clear_error()
    raise _STATUS_EXCEPTIONS.get(<int>s, ColibriError)(detail if detail else name)
