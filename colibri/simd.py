"""Which SIMD kernels colibri uses, and a cap for testing the portable paths.

Every extension module links its own copy of the C library (static linking keeps the wheel
self-contained), so a cap is applied to every extension module of colibri._core (importing
each one).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterator

import colibri._core._status as _status

LEVELS = ("scalar", "avx2", "avx512", "avx512vnni")
_cap = "avx512vnni"


def _core_modules() -> list:
    import colibri._core as core

    mods = []
    for info in pkgutil.iter_modules(core.__path__):
        if info.name.startswith("_"):
            mod = importlib.import_module(f"colibri._core.{info.name}")
            if hasattr(mod, "_set_simd_cap"):
                mods.append(mod)
    return mods


def detected() -> str:
    """Best level this CPU supports."""
    return str(_status.simd_detected())


def level() -> str:
    """Level the kernels use now."""
    return str(_status.simd_level())


def set_max_simd(cap: str) -> str:
    """Cap the SIMD level in every colibri module; returns the previous cap."""
    global _cap
    if cap not in LEVELS:
        raise ValueError(f"unknown SIMD level {cap!r}; expected one of {', '.join(LEVELS)}")
    prev = _cap
    for mod in _core_modules():
        mod._set_simd_cap(LEVELS.index(cap))
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
