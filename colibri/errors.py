"""Exceptions raised by colibri and the mapping from C status codes to them."""

from __future__ import annotations


class ColibriError(RuntimeError):
    """An error inside colibri that is neither a bad argument, a lack of memory nor an OS error."""


class OutOfRangeError(IndexError, ValueError):
    """An index or id outside its range (a layer, an expert): an IndexError, and a ValueError as
    such bad arguments were before the boundary checks named them (like numpy's AxisError)."""


# C status codes (include/colibri/status.h) -> Python exception class.
_STATUS_EXCEPTIONS: dict[int, type[Exception]] = {
    -1: ValueError,
    -2: MemoryError,
    -3: OSError,
    -4: FileNotFoundError,
    -5: ValueError,
    -6: ColibriError,
    -7: ColibriError,
    -8: ColibriError,
    -9: ColibriError,  # CB_STATUS_NOT_FINITE: NaN/Inf in the forward pass (corrupt weights)
}


def status_exception(code: int, name: str, detail: str) -> Exception:
    """Build the exception for a failed C status: its class from the code, its message from the
    C detail (or the status name when the C code left none)."""
    cls = _STATUS_EXCEPTIONS.get(code, ColibriError)
    return cls(detail if detail else name)
