"""Page-locking host memory that someone else owns (cuMemHostRegister), through the CUDA
driver library directly.

PyCUDA's ``register_host_memory`` cannot be used: with NumPy 2 it fails on every array
("Cannot set the NumPy array 'base' dependency more than once", seen with PyCUDA 2026.1 and
NumPy 2.5 on an H200), after the range was registered. So colibri calls the driver's
``cuMemHostRegister_v2`` / ``cuMemHostUnregister`` itself (ctypes, ``libcuda.so.1``, the library
PyCUDA itself runs on) in the context PyCUDA made current, and hands back a NumPy view of the
range whose ``.base`` is the :class:`HostRegistration` (``.base.unregister()`` ends it).

tests/fake_pycuda.py replaces :func:`driver_library` with an emulated driver that keeps the
registered ranges and refuses what the real one refuses.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np

from colibri.errors import ColibriError

CU_MEMHOSTREGISTER_PORTABLE = 0x01  # pinned for every context, not only the current one


@functools.lru_cache(maxsize=1)
def driver_library() -> Any:
    """The CUDA driver library (ctypes), with the prototypes colibri calls."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise ColibriError(f"the CUDA driver library libcuda.so.1 could not be loaded: {e}") from e
    lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for f in (lib.cuMemHostRegister_v2, lib.cuMemHostUnregister, lib.cuGetErrorName):
        f.restype = ctypes.c_int
    return lib


def _error_name(lib: Any, rc: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return f"{name.value.decode()} ({rc})"
    except (AttributeError, OSError):
        pass
    return f"CUDA error {rc}"


class HostRegistration:
    """One registered host range: ``unregister()`` ends it (once; a second call is an error).
    Exposes the range as ``__array_interface__``, so ``np.asarray(reg)`` is a view of it whose
    ``.base`` is this object; the owner's array is kept alive until unregistered."""

    def __init__(self, array: np.ndarray, flags: int = CU_MEMHOSTREGISTER_PORTABLE) -> None:
        if not array.flags.c_contiguous:
            raise ValueError("pin_host_memory needs a C-contiguous array")
        if array.nbytes == 0:
            raise ValueError("pin_host_memory needs a non-empty array")
        self._lib = driver_library()
        self._array: np.ndarray | None = array
        self.ptr, self.nbytes = int(array.ctypes.data), int(array.nbytes)
        self.__array_interface__ = array.__array_interface__
        self._lock = threading.Lock()
        rc = self._lib.cuMemHostRegister_v2(ctypes.c_void_p(self.ptr),
                                            ctypes.c_size_t(self.nbytes), ctypes.c_uint(flags))
        if rc != 0:
            self._array = None
            raise ColibriError(f"cuMemHostRegister of {self.nbytes} bytes at {self.ptr:#x} "
                               f"failed: {_error_name(self._lib, rc)}")

    @property
    def registered(self) -> bool:
        return self._array is not None

    def unregister(self) -> None:
        with self._lock:
            if self._array is None:
                raise ColibriError(f"cuMemHostUnregister of {self.nbytes} bytes at "
                                   f"{self.ptr:#x}: not registered (unregistered twice?)")
            rc = self._lib.cuMemHostUnregister(ctypes.c_void_p(self.ptr))
            if rc != 0:
                raise ColibriError(f"cuMemHostUnregister of {self.nbytes} bytes at "
                                   f"{self.ptr:#x} failed: {_error_name(self._lib, rc)}")
            self._array = None


def pin(array: np.ndarray) -> np.ndarray:
    """Register ``array``'s memory with the driver; returns a view of it whose
    ``.base.unregister()`` undoes that."""
    view: np.ndarray = np.asarray(HostRegistration(array))
    return view
