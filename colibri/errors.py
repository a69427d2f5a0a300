"""Exceptions raised by colibri. The C status codes map to them in one place,
colibri/_core/_check.pxi (keyed by the names of include/colibri/status.h)."""

from __future__ import annotations


class ColibriError(RuntimeError):
    """An error inside colibri that is neither a bad argument, a lack of memory nor an OS error."""


class OutOfRangeError(IndexError, ValueError):
    """An index or id outside its range (a layer, an expert): an IndexError, and a ValueError as
    such bad arguments were before the boundary checks named them (like numpy's AxisError)."""
