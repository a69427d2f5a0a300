"""The KV arena and the KV cache (include/colibri/arena.h): the names that _arena.pxi defines in
colibri._core._native, the one extension module."""

from colibri._core._native import (
    KVArena,
    KVCache,
)

__all__ = [
    "KVArena", "KVCache",
]
