# The one status -> exception mapping. Included (not cimported) by every .pyx so that it reads
# the thread-local error detail of the C library copy linked into that same extension module.
from colibri._core.status cimport (
    cb_status, cb_status_str, cb_last_error, cb_clear_error, CB_OK,
    CB_STATUS_INVALID_ARGUMENT, CB_STATUS_OUT_OF_MEMORY, CB_STATUS_IO, CB_STATUS_NOT_FOUND,
    CB_STATUS_CORRUPT, CB_STATUS_UNSUPPORTED, CB_STATUS_CLOSED, CB_STATUS_INTERNAL,
    CB_STATUS_NOT_FINITE,
)
from colibri.errors import ColibriError, status_exception


cdef inline int check(cb_status s) except -1:
    """Raise the Python exception for a failed status, with the C detail message."""
    if s == CB_OK:
        return 0
    detail = cb_last_error().decode("utf-8", "replace")
    name = cb_status_str(s).decode("ascii")
    cb_clear_error()
    raise status_exception(<int>s, name, detail)

from colibri._core.cpu cimport cb_simd_level as _cb_simd_level, cb_cpu_set_max_level as _cb_cpu_set_max_level


def _set_simd_cap(int cap):
    """Cap the SIMD level in this module's copy of the C library (see colibri.simd)."""
    return <int>_cb_cpu_set_max_level(<_cb_simd_level>cap)
