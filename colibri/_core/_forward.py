"""The expert store and the forward pass (include/colibri/experts.h, forward.h): the names that
_forward.pxi defines in colibri._core._native, the one extension module."""

from colibri._core._native import (
    ExpertStore,
    Forward,
)

__all__ = [
    "ExpertStore", "Forward",
]
