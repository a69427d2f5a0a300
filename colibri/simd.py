"""Which SIMD kernels colibri uses, and a cap for testing the portable paths.

The cap is process-wide: colibri._core._native is the one extension module, holding the one
copy of the C library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import colibri._core._status as _status

LEVELS = ("scalar", "avx2", "avx512", "avx512vnni")
_cap = "avx512vnni"


def detected() -> str:
    """Best level this CPU supports."""
    return str(_status.simd_detected())


def level() -> str:
    """Level the kernels use now."""
    return str(_status.simd_level())


def set_max_simd(cap: str) -> str:
    """Cap the SIMD level of the C kernels; returns the previous cap."""
    global _cap
    if cap not in LEVELS:
        raise ValueError(f"unknown SIMD level {cap!r}; expected one of {', '.join(LEVELS)}")
    prev = _cap
    _status._set_simd_cap(LEVELS.index(cap))
    _cap = cap
    return prev


@contextlib.contextmanager
def max_simd(cap: str) -> Iterator[None]:
    """Context manager: run the body with kernels capped at `cap` ('scalar' for the portable path)."""
    prev = set_max_simd(cap)
    try:
        yield
    finally:
        set_max_simd(prev)
