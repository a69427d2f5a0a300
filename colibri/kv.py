"""The KV arena and the KV cache (C: include/colibri/arena.h, Cython: colibri/_core/_arena.pxi).

`KVArena` is one mmap'd region managed by a binary buddy allocator; `KVCache` keeps each
sequence's K and V for all layers in one block of it. Both are the Cython classes themselves,
re-exported here so that `colibri.KVArena` / `colibri.KVCache` are the public names.
"""

from __future__ import annotations

import colibri._core._arena as _arena

KVArena = _arena.KVArena
KVCache = _arena.KVCache

__all__ = ["KVArena", "KVCache"]
