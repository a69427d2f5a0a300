"""Status names, CPU/SIMD facts of the build, and a hook to test the status mapping: the names that
_status.pxi defines in colibri._core._native, the one extension module."""

from colibri._core._native import (
    _set_simd_cap,
    build_portable,
    cb_status,
    raise_status,
    simd_detected,
    simd_level,
    status_str,
)

__all__ = [
    "status_str", "raise_status", "simd_detected", "simd_level", "build_portable",
    "_set_simd_cap", "cb_status",
]
