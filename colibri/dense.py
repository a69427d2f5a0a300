"""Dense weights copied into anonymous memory on transparent huge pages.

`Model(dense_weights="copy")` (COLIBRI_DENSE_WEIGHTS, the default) copies every dense matrix
(attention, router, dense FFN, shared experts, the output head) at load into anonymous memory
advised MADV_HUGEPAGE; `"mapped"` reads them through the file mapping as before.

Why: a decode step streams every dense matrix once (Gemma 3 270M's tied head alone is 178 MB a
token). Through the file mapping those bytes lie on 4 KiB page-cache pages: a TLB miss every
4 KiB, and the hardware prefetchers stop at every page boundary. In 2 MiB pages (where the
kernel allows them: transparent_hugepage "always" or "madvise") the same kernels stream them
faster (`tools/bench/decode_rate.py` A/B, docs/benchmarks.md).

Q8_0, Q5_0, Q6_K and Q4_K matrices are not copied byte for byte where the kernels run at the
AVX512-VNNI level: they are packed into colibri's R16 layouts (include/colibri/quant.h: rows in
groups of 16, in as many bytes, so that the decode matvec needs no reduction per row and streams
at memory speed), with bit-identical products (`pack_r16`; Gemma 3's tied Q8_0 head, 72% of its
bytes a token, and its Q5_0 attention and FFN matrices are; so are the Q6_K output head and the
Q4_K attention of every Q4_K_M file). The choice is made at load: a model loaded
at the VNNI level and then run with the SIMD level capped below it (colibri.simd, tests) reads
its R16 matrices with the scalar tile, correct and slow.

Memory: each copied tensor's whole file pages are then dropped from this process's mapping
(MADV_DONTNEED: they stay in the page cache, clean and reclaimable), so the resident size counts
the dense weights once, as the plan (colibri.plan) already assumes ("dense weights: resident").
Routed experts are never copied: the expert store owns them. A model whose dense matrices
total less than COPY_MIN bytes is not copied at all (`worth_copying`): a TLB miss per 4 KiB costs
nothing measurable there, and a huge page per tiny model would only add resident memory. What the copy gives up: processes
running the same file no longer share the dense weights through the page cache; "mapped" is for
that case. Chunks are 64-byte aligned runs inside 2 MiB-aligned anonymous mappings of at least
CHUNK bytes; the arrays are read-only and keep their chunk alive.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

import colibri._core._quant as _quant
from colibri import simd
from colibri.meminfo import mem_available

COPY_MIN = 32 << 20  # models with fewer dense matrix bytes stay mapped (nothing to gain there)
HUGE = 2 << 20   # a transparent huge page
CHUNK = 64 << 20  # the smallest anonymous mapping the copies are cut from
ALIGN = 64        # each copy starts on a cache line

MODES = ("copy", "mapped")


class DenseCopies:
    """Copies of tensors in anonymous huge-page-advised memory (a bump allocator over chunks)."""

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []
        self._buf: np.ndarray | None = None
        self._used = 0
        self.bytes = 0
        self._copies: dict[str, np.ndarray] = {}
        self.packed: set[str] = set()  # the copies in an R16 layout

    @property
    def names(self) -> set[str]:
        """The tensors copied."""
        return set(self._copies)

    def __contains__(self, name: str) -> bool:
        return name in self._copies

    def get(self, name: str) -> np.ndarray:
        """The copy of a tensor (KeyError if it was not copied)."""
        return self._copies[name]

    def _take(self, n: int) -> np.ndarray:
        """n bytes of the current chunk (a new one when full), 64-byte aligned."""
        if self._buf is None or self._used + n > self._buf.size:
            self._new_chunk(n)
        assert self._buf is not None
        out = self._buf[self._used:self._used + n]
        self._used = -(-(self._used + n) // ALIGN) * ALIGN
        self.bytes += n
        return out

    def _new_chunk(self, n: int) -> None:
        need = -(-n // HUGE) * HUGE
        size = max(CHUNK, need)
        avail = mem_available()
        if avail and need > avail:  # a clear error, not the OOM killer
            raise MemoryError(f"not enough memory to copy the dense weights ({n / 2**30:.2f} GiB "
                              f"more, {avail / 2**30:.2f} GiB available): "
                              "dense_weights='mapped' reads them through the file mapping")
        # private anonymous (Python's default for -1 is shared memory, which THP leaves alone);
        # the extra huge page aligns the start
        mm = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                mm.madvise(advice)
            except OSError:  # THP "never" or not built in: 4 KiB pages, still correct
                pass
        base = np.frombuffer(mm, dtype=np.uint8)
        skip = (-int(base.ctypes.data)) % HUGE
        self._maps.append(mm)
        self._buf = base[skip:skip + size]
        self._used = 0

    def copy(self, name: str, view: np.ndarray) -> np.ndarray:
        """A read-only copy of the bytes of `view` (any shape), 64-byte aligned."""
        src = np.ascontiguousarray(view).reshape(-1).view(np.uint8)
        out = self._take(int(src.size))
        np.copyto(out, src)
        out.flags.writeable = False
        arr = out.view(view.dtype).reshape(view.shape)
        self._copies[name] = arr
        return arr

    def pack_r16(self, name: str, typ: int, view: np.ndarray, rows: int, cols: int) -> np.ndarray:
        """The Q8_0 / Q5_0 / Q6_K / Q4_K matrix `view` (rows x cols) packed in its R16 layout
        (flat uint8, read-only)."""
        layout = _quant.r16_layout(typ)
        assert layout is not None, typ
        out = self._take(_quant.r16_bytes(layout, rows, cols))
        _quant.pack_r16(typ, view, rows, cols, out=out, pool=_pack_pool())
        out.flags.writeable = False
        self._copies[name] = out
        self.packed.add(name)
        return out


def packs_r16() -> bool:
    """Whether copies of Q8_0, Q5_0, Q6_K and Q4_K matrices are packed in their R16 layouts:
    where the kernels run at the AVX512-VNNI level (its tile reads the layouts in place; the
    scalar one that serves the other levels is a reference, not fast)."""
    return simd.level() == "avx512vnni"


_POOL: list[Any] = []


def _pack_pool() -> Any:
    """A thread pool for packing at load (every core; made once, kept for later loads)."""
    if not _POOL:
        _POOL.append(_quant.ThreadPool(max(1, min(os.cpu_count() or 1, 16))))
    return _POOL[0]


def worth_copying(tensors: dict[str, Any]) -> bool:
    """Whether a file's dense matrices (2-D and up, not routed experts, not the token embedding
    unless it is also the head) total at least COPY_MIN bytes. `tensors`: name -> TensorInfo."""
    total = 0
    for name, t in tensors.items():
        if "_exps" in name or len(t.shape) < 2:
            continue
        if name == "token_embd.weight" and "output.weight" in tensors:
            continue
        total += t.nbytes
    return total >= COPY_MIN


def drop_pages(mm: mmap.mmap, offset: int, nbytes: int) -> int:
    """Drop this process's mapping of the whole pages inside [offset, offset + nbytes) of a
    read-only file mapping (MADV_DONTNEED: the page cache keeps them; a later read faults them
    back in). Returns the bytes dropped (0 where the platform has no madvise)."""
    page = mmap.PAGESIZE
    start = -(-offset // page) * page
    end = (offset + nbytes) // page * page
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if end <= start or advice is None:
        return 0
    try:
        mm.madvise(advice, start, end - start)
    except (OSError, ValueError):
        return 0
    return end - start


def no_huge_outside(mm: mmap.mmap | None, spans: list[tuple[int, int]]) -> int:
    """Advise a file mapping MADV_NOHUGEPAGE everywhere but the (offset, nbytes) spans (the
    routed experts, read in place), before the dense matrices are copied and dropped. The
    mapping was advised for huge pages (colibri.gguf.advise_pages): a read of a tensor left
    mapped (a norm) next to a dropped one would map its whole 2 MiB page cache folio, the
    dropped bytes with it. One advice per gap between expert spans, not one per dropped
    tensor: the mapping stays one VMA for a dense model, about two per layer for an MoE one,
    never one per tensor (vm.max_map_count). Returns the ranges advised."""
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if mm is None or advice is None:
        return 0
    page, size, at, n = mmap.PAGESIZE, len(mm), 0, 0
    for off, nbytes in sorted(spans) + [(size, 0)]:
        start = -(-at // page) * page
        end = size if off >= size else off // page * page
        if end > start:
            try:
                mm.madvise(advice, start, end - start)
            except (OSError, ValueError):
                return n
            n += 1
        at = max(at, off + nbytes)
    return n


__all__ = ["COPY_MIN", "DenseCopies", "MODES", "drop_pages", "no_huge_outside", "packs_r16",
           "worth_copying"]
