"""Status names (the IntEnum cb_status, from include/colibri/status.h), CPU/SIMD facts of the
build, and a hook to test the status mapping."""

from colibri._core.cpu cimport (
    cb_build_portable, cb_cpu_detect, cb_cpu_level, cb_cpu_set_max_level, cb_simd_level,
    cb_simd_level_str,
)
from colibri._core.status cimport cb_fail


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


def _set_simd_cap(int cap):
    """Cap the SIMD level (see colibri.simd)."""
    return <int>cb_cpu_set_max_level(<cb_simd_level>cap)
