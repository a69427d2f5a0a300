"""Status names, CPU/SIMD facts of the build, and a hook to test the status mapping."""
include "_check.pxi"

from colibri._core.cpu cimport cb_cpu_detect, cb_cpu_level, cb_simd_level_str, cb_build_portable
from colibri._core.status cimport cb_fail

STATUS_CODES = {
    "ok": CB_OK,
    "invalid argument": CB_STATUS_INVALID_ARGUMENT,
    "out of memory": CB_STATUS_OUT_OF_MEMORY,
    "I/O error": CB_STATUS_IO,
    "not found": CB_STATUS_NOT_FOUND,
    "corrupt input": CB_STATUS_CORRUPT,
    "unsupported": CB_STATUS_UNSUPPORTED,
    "use after close": CB_STATUS_CLOSED,
    "internal error": CB_STATUS_INTERNAL,
    "non-finite values": CB_STATUS_NOT_FINITE,
}


def status_str(int code):
    """The C library's name for a status code."""
    return cb_status_str(<cb_status>code).decode("ascii")


def raise_status(int code, str detail):
    """Fail in C with this status and detail, then map it through check() (used by tests)."""
    b = detail.encode("utf-8")
    cdef const char *p = b
    check(cb_fail(<cb_status>code, "%s", p))


def simd_detected():
    """Best SIMD level this CPU supports: 'scalar', 'avx2', 'avx512' or 'avx512vnni'."""
    return cb_simd_level_str(cb_cpu_detect()).decode("ascii")


def simd_level():
    """SIMD level the kernels use now (detected, capped by set_max_simd)."""
    return cb_simd_level_str(cb_cpu_level()).decode("ascii")


def build_portable():
    """True when built with COLIBRI_PORTABLE=1."""
    return bool(cb_build_portable())
