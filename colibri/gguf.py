"""Reading GGUF model files safely.

`GGUFFile(path)` maps a GGUF file read-only, parses its header (metadata key/values and the
tensor directory) with bounds checks on every read, validates every tensor against the file
and its block type, and exposes zero-copy views of tensor bytes. Nothing reaches C before this
validation has passed.

Why not `gguf.GGUFReader` for parsing: it trusts the header. An array length of 2**63 makes it
loop (nearly) forever without reading a byte (reads past the end return empty slices), counts are
used before they are checked, and it builds two numpy objects per vocabulary string (20 s and
hundreds of MB for Gemma 3's 262k-token vocabulary). This module reads the same format with the
`gguf` package's constants (value types, GGML type ids, `GGML_QUANT_SIZES`), and the tests check
it against `gguf.GGUFReader` on valid files, real and synthetic.

Guarantees, for any file content:
- every failure is a `GGUFError` (a `ValueError`) naming the file, and the key or tensor when
  known; no other exception escapes, the process never crashes;
- work and memory are bounded by the file size and by the limits below (a count in the header is
  checked against the bytes that remain before anything is allocated or looped over);
- an exposed tensor has a supported type (unless `lenient=True`), 1 to 4 dimensions each >= 1,
  a row length (ne0) that is a multiple of its type's block size, a byte size equal to what its
  type implies, an offset aligned to the file's alignment, a byte range inside the file that
  overlaps no other tensor, and a unique UTF-8 name.

Metadata values (`GGUFFile.metadata`): strings -> `str` (strict UTF-8), integers -> `int`,
floats -> `float`, bools -> `bool`; arrays of numbers or bools -> 1-D numpy arrays of the stored
dtype (little-endian, owned copies, read-only); arrays of strings -> `list[str]`; arrays of arrays
-> `list` of those. `GGUFFile.metadata_types` gives each key's stored type ("uint32",
"array[string]", ...).

The file must not be truncated or rewritten by another process while it is mapped (that is
SIGBUS territory for any mmap reader).
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType

__all__ = [
    "GGUFError",
    "GGUFFile",
    "TensorInfo",
    "SUPPORTED_TYPES",
    "MAX_DIMS",
    "MAX_STRING_ELEMENTS",
]

GGUF_MAGIC_BYTES = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
# Bounds that no real model file comes near; they keep hostile files from costing much memory.
MAX_KV = 1 << 16  # metadata keys
MAX_TENSORS = 1 << 20
MAX_NAME_BYTES = 1 << 12  # key and tensor names
MAX_STRING_ELEMENTS = 1 << 23  # strings in all metadata arrays together (~0.5 GB as Python str)
MAX_NESTING = 2  # arrays of arrays of scalars at most
MAX_ALIGNMENT = 1 << 24

# GGML type ids colibri has kernels for (include/colibri/quant.h).
SUPPORTED_TYPES: frozenset[int] = frozenset(
    int(t)
    for t in (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
        GGMLQuantizationType.MXFP4,
        # the low-bit types (colibri/_core/quant_lowbit.c, quant_iq.c)
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q8_K,
        GGMLQuantizationType.TQ1_0,
        GGMLQuantizationType.TQ2_0,
        GGMLQuantizationType.IQ1_S,
        GGMLQuantizationType.IQ1_M,
        GGMLQuantizationType.IQ2_XXS,
        GGMLQuantizationType.IQ2_XS,
        GGMLQuantizationType.IQ2_S,
        GGMLQuantizationType.IQ3_XXS,
        GGMLQuantizationType.IQ3_S,
        GGMLQuantizationType.IQ4_NL,
        GGMLQuantizationType.IQ4_XS,
    )
)

# GGUF value types (gguf.constants.GGUFValueType): id -> (name, struct format or None).
_VT_UINT8, _VT_INT8, _VT_UINT16, _VT_INT16, _VT_UINT32, _VT_INT32 = 0, 1, 2, 3, 4, 5
_VT_FLOAT32, _VT_BOOL, _VT_STRING, _VT_ARRAY, _VT_UINT64, _VT_INT64, _VT_FLOAT64 = (
    6, 7, 8, 9, 10, 11, 12)
_SCALARS: dict[int, tuple[str, str, str]] = {
    # id: (name, struct format, numpy dtype)
    _VT_UINT8: ("uint8", "<B", "<u1"),
    _VT_INT8: ("int8", "<b", "<i1"),
    _VT_UINT16: ("uint16", "<H", "<u2"),
    _VT_INT16: ("int16", "<h", "<i2"),
    _VT_UINT32: ("uint32", "<I", "<u4"),
    _VT_INT32: ("int32", "<i", "<i4"),
    _VT_FLOAT32: ("float32", "<f", "<f4"),
    _VT_BOOL: ("bool", "<B", "?"),
    _VT_UINT64: ("uint64", "<Q", "<u8"),
    _VT_INT64: ("int64", "<q", "<i8"),
    _VT_FLOAT64: ("float64", "<d", "<f8"),
}


class GGUFError(ValueError):
    """A GGUF file is malformed, hostile, or uses something colibri does not support."""


@dataclass(frozen=True)
class TensorInfo:
    """One validated entry of the tensor directory.

    shape is in GGUF order: shape[0] (ne0) is the innermost dimension, the row length in
    elements; numpy's shape of the same tensor is reversed(shape). offset is absolute (from
    the start of the file); nbytes is the exact size of the tensor's data.
    """

    name: str
    type: int
    type_name: str
    shape: tuple[int, ...]
    n_elements: int
    offset: int
    nbytes: int

    @property
    def block_size(self) -> int:
        """Elements per block of this type (1 for float types)."""
        return int(GGML_QUANT_SIZES[GGMLQuantizationType(self.type)][0])

    @property
    def n_rows(self) -> int:
        """Number of rows of ne0 elements."""
        return self.n_elements // self.shape[0]

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row of ne0 elements."""
        return self.nbytes // self.n_rows


def _type_name(t: int) -> str:
    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return f"type {t}"


class _Cursor:
    """Bounds-checked little-endian reads from the mapped header."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: mmap.mmap, end: int) -> None:
        self.buf = buf
        self.pos = 0
        self.end = end

    def remaining(self) -> int:
        return self.end - self.pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.end - self.pos:
            raise GGUFError(
                f"{what} needs {n} bytes at offset {self.pos} but the file has "
                f"{max(self.end - self.pos, 0)} left"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return int(v)

    def raw(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if max_len is not None and n > max_len:
            raise GGUFError(f"{what} is {n} bytes long (limit {max_len})")
        self.need(n, what)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _identity(fd: int) -> tuple[int, int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size


def advise_pages(mm: mmap.mmap | None, huge: bool) -> bool:
    """Advise a model file's mapping MADV_HUGEPAGE (or MADV_NOHUGEPAGE), before its tensors are
    first read: where the kernel keeps files in large folios (6.x, ext4/xfs/btrfs; THP "always"
    or "madvise"), readahead then fills the page cache with 2 MiB folios and faults map them with
    one page-table entry each, so the experts, read in place a few MiB at a time all over the
    file, cost no TLB miss per 4 KiB (experts/head time 0.52 -> 0.45 on the bench MoE model,
    docs/benchmarks.md). The mmap expert store advises the opposite: it faults single experts
    in and evicts them, and a 2 MiB readahead would read around each. Returns whether the
    kernel took the advice (False without madvise or THP)."""
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if mm is None or advice is None:
        return False
    try:
        mm.madvise(advice)
    except (OSError, ValueError):
        return False
    return True


def guard_mapping(mm: mmap.mmap, path: str) -> None:
    """Register a file mapping with the SIGBUS guard (colibri._core._mapguard), so that a read
    of it after the file was truncated under us dies with a line naming the file instead of a
    bare "Bus error". Unregistered when the mapping goes (its last view). Best effort: without
    the extension, or past its table size, nothing is registered."""
    try:
        from colibri._core import _mapguard
    except ImportError:
        return
    try:
        _mapguard.install()
        view = np.frombuffer(mm, dtype=np.uint8)
        addr, n = int(view.ctypes.data), int(view.size)
        del view
        gid = _mapguard.register(addr, n, os.path.abspath(path))
    except (MemoryError, RuntimeError, ValueError):
        return
    weakref.finalize(mm, _mapguard.unregister, gid)


class GGUFFile:
    """A GGUF file opened read-only and validated (see the module docstring).

    Use as a context manager or call close(). Views returned by data() stay valid after close():
    they keep the mapping alive until they are garbage collected.

    lenient=True accepts tensor types the gguf package knows but colibri has no kernels for
    (for inspection tools); every other check still applies.
    """

    def __init__(self, path: str | os.PathLike[str], *, lenient: bool = False) -> None:
        self.path = os.fspath(path)
        self.lenient = lenient
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.version = 0
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        self.data_offset = 0
        self._mm: mmap.mmap | None = None
        try:
            with open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size < 24:
                    raise GGUFError(f"file is {self.file_size} bytes, too short for a GGUF header")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                advise_pages(self._mm, huge=True)
                self._ident = _identity(f.fileno())
                guard_mapping(self._mm, self.path)
        except GGUFError as e:
            raise GGUFError(f"{self.path}: {e}") from None
        except OSError:
            raise  # missing file, permissions: an OSError, not a format error
        try:
            self._parse()
        except GGUFError as e:
            self.close()
            raise GGUFError(f"{self.path}: {e}") from None
        except (ValueError, IndexError, KeyError, OverflowError, struct.error, MemoryError,
                RecursionError, TypeError) as e:
            self.close()
            raise GGUFError(f"{self.path}: corrupt GGUF ({type(e).__name__}: {e})") from None

    # ---- public API ----

    @property
    def architecture(self) -> str | None:
        """general.architecture ("llama", "gemma3", "qwen3moe", ...), or None when absent."""
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None

    def data(self, name: str) -> np.ndarray:
        """Read-only uint8 view of the tensor's bytes in the file mapping (no copy)."""
        if self._mm is None:
            raise GGUFError(f"{self.path}: file is closed")
        t = self.tensors.get(name)
        if t is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def drop_pages(self, name: str) -> int:
        """Drop this process's mapping of the whole pages of a tensor's bytes (colibri.dense
        copied them): the page cache keeps them, and data() still reads them. Returns bytes."""
        from colibri.dense import drop_pages

        t = self.tensors.get(name)
        if self._mm is None or t is None:
            return 0
        return drop_pages(self._mm, t.offset, t.nbytes)

    def expert_extent(self, name: str) -> tuple[int, int]:
        """(offset, bytes) of an expert tensor's bytes in the file, every expert's."""
        t = self.tensors[name]
        return t.offset, t.nbytes

    def advise_copied(self) -> int:
        """Before the dense matrices are copied and their pages dropped (colibri.dense): no
        huge pages outside the routed experts (dense.no_huge_outside). Returns the ranges."""
        from colibri.dense import no_huge_outside

        return no_huge_outside(self._mm, [self.expert_extent(n) for n in self.tensors
                                          if "_exps" in n])

    def check_unchanged(self) -> None:
        """Raise OSError if the mapped file was truncated in place since it was opened: its
        tensors are read through the mapping, and a page past the new end would be a SIGBUS.
        (A file replaced by a rename is fine: the mapping keeps the old one.) Cheap: one stat."""
        ident = getattr(self, "_ident", None)
        if ident is None or self._mm is None:
            return
        try:
            st = os.stat(self.path)
        except OSError:
            return  # unlinked or renamed away: the mapped inode lives on, intact
        if (st.st_dev, st.st_ino) == ident[:2] and st.st_size < ident[2]:
            raise OSError(f"{self.path}: the model file was truncated from {ident[2]} "
                          f"to {st.st_size} bytes while in use (it is read through a mapping: "
                          "replace model files with a new file and a rename, never in place)")

    def advise(self, huge: bool) -> bool:
        """advise_pages() on this file's mapping."""
        return advise_pages(self._mm, huge)

    def close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views from data() still exist; the mapping goes when they do

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, v{self.version}, arch={self.architecture!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")

    # ---- parsing ----

    def _parse(self) -> None:
        assert self._mm is not None
        cur = _Cursor(self._mm, self.file_size)
        magic = cur.raw(4, "magic")
        if magic != GGUF_MAGIC_BYTES:
            raise GGUFError(f"bad magic {magic!r}, expected {GGUF_MAGIC_BYTES!r}: not a GGUF file")
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                raise GGUFError("big-endian GGUF files are not supported")
            raise GGUFError(f"unsupported GGUF version {version} (supported: 2, 3)")
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata key/value count")
        # Each key/value takes at least 13 bytes (length, type, one byte), each tensor info at
        # least 32 (length, n_dims, one dim, type, offset): a count beyond that is a lie.
        if n_kv > MAX_KV or n_kv * 13 > cur.remaining():
            raise GGUFError(f"metadata key/value count {n_kv} is impossible for a file of "
                            f"{self.file_size} bytes (limit {MAX_KV})")
        if n_tensors > MAX_TENSORS or n_tensors * 32 + n_kv * 13 > cur.remaining():
            raise GGUFError(f"tensor count {n_tensors} is impossible for a file of "
                            f"{self.file_size} bytes (limit {MAX_TENSORS})")
        self._string_budget = MAX_STRING_ELEMENTS
        for i in range(n_kv):
            key = cur.string(f"key of metadata entry {i}", MAX_NAME_BYTES)
            if key in self.metadata:
                raise GGUFError(f"metadata key {key!r} appears twice")
            vtype = cur.u32(f"value type of {key!r}")
            self.metadata[key], self.metadata_types[key] = self._value(cur, vtype, key, 0)

        align = self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if "general.alignment" in self.metadata:
            if self.metadata_types["general.alignment"] != "uint32":
                raise GGUFError("general.alignment must be a uint32, got "
                                f"{self.metadata_types['general.alignment']}")
            if align == 0 or align & (align - 1) or align > MAX_ALIGNMENT:
                raise GGUFError(f"general.alignment {align} is not a power of two "
                                f"<= {MAX_ALIGNMENT}")
        self.alignment = int(align)

        raw: list[tuple[str, tuple[int, ...], int, int]] = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = cur.string(f"name of tensor {i}", MAX_NAME_BYTES)
            if name in seen:
                raise GGUFError(f"tensor {name!r} appears twice")
            seen.add(name)
            n_dims = cur.u32(f"dimension count of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
            shape = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
            ttype = cur.u32(f"type of tensor {name!r}")
            rel = cur.u64(f"offset of tensor {name!r}")
            raw.append((name, shape, ttype, rel))

        data_offset = -(-cur.pos // self.alignment) * self.alignment
        if raw and data_offset > self.file_size:
            raise GGUFError(f"tensor data would start at {data_offset}, past the end of the "
                            f"file ({self.file_size} bytes)")
        self.data_offset = data_offset
        for name, shape, ttype, rel in raw:
            self.tensors[name] = self._tensor(name, shape, ttype, rel)
        self._check_overlaps()

    def _value(self, cur: _Cursor, vtype: int, key: str, depth: int) -> tuple[Any, str]:
        sc = _SCALARS.get(vtype)
        if sc is not None:
            name, fmt, _ = sc
            size = struct.calcsize(fmt)
            cur.need(size, f"value of {key!r}")
            (v,) = struct.unpack_from(fmt, cur.buf, cur.pos)
            cur.pos += size
            if vtype == _VT_BOOL:
                v = v != 0
            return v, name
        if vtype == _VT_STRING:
            return cur.string(f"value of {key!r}"), "string"
        if vtype == _VT_ARRAY:
            if depth >= MAX_NESTING:
                raise GGUFError(f"value of {key!r}: arrays nested deeper than {MAX_NESTING}")
            itype = cur.u32(f"element type of array {key!r}")
            n = cur.u64(f"length of array {key!r}")
            sc = _SCALARS.get(itype)
            if sc is not None:
                name, fmt, dt = sc
                nbytes = n * struct.calcsize(fmt)
                cur.need(nbytes, f"array {key!r} of {n} {name}")
                arr = np.frombuffer(cur.buf, dtype=np.dtype(dt), count=n, offset=cur.pos).copy()
                arr.flags.writeable = False
                cur.pos += nbytes
                return arr, f"array[{name}]"
            if itype == _VT_STRING:
                # every string takes at least its 8-byte length
                if n * 8 > cur.remaining():
                    raise GGUFError(f"array {key!r} of {n} strings cannot fit in the "
                                    f"{cur.remaining()} bytes left")
                self._string_budget -= n
                if self._string_budget < 0:
                    raise GGUFError(f"array {key!r}: more than {MAX_STRING_ELEMENTS} metadata "
                                    "strings in the file")
                return [cur.string(f"element {j} of {key!r}") for j in range(n)], "array[string]"
            if itype == _VT_ARRAY:
                if n * 12 > cur.remaining():
                    raise GGUFError(f"array {key!r} of {n} arrays cannot fit in the "
                                    f"{cur.remaining()} bytes left")
                items = []
                sub = "array"
                for _ in range(n):
                    v, sub = self._value(cur, _VT_ARRAY, key, depth + 1)
                    items.append(v)
                return items, f"array[{sub}]"
            raise GGUFError(f"array {key!r} has unknown element type {itype}")
        raise GGUFError(f"value of {key!r} has unknown type {vtype}")

    def _tensor(self, name: str, shape: tuple[int, ...], ttype: int, rel: int) -> TensorInfo:
        where = f"tensor {name!r}"
        try:
            qt = GGMLQuantizationType(ttype)
        except ValueError:
            raise GGUFError(f"{where} has unknown type id {ttype}") from None
        if ttype not in SUPPORTED_TYPES and not self.lenient:
            supported = ", ".join(sorted(_type_name(t) for t in SUPPORTED_TYPES))
            raise GGUFError(f"{where} has type {qt.name}, which colibri does not support "
                            f"(supported: {supported})")
        block, type_size = GGML_QUANT_SIZES[qt]
        if any(d < 1 for d in shape):
            raise GGUFError(f"{where} has shape {list(shape)}: every dimension must be >= 1")
        if shape[0] % block:
            raise GGUFError(f"{where} ({qt.name}) has row length {shape[0]}, not a multiple of "
                            f"its block size {block}")
        n_elements = 1
        for d in shape:
            n_elements *= d  # Python ints: no overflow; bounded just below
            if n_elements > self.file_size * block:
                raise GGUFError(f"{where} has shape {list(shape)}: more elements than the file "
                                "could hold")
        nbytes = n_elements // block * type_size
        offset = self.data_offset + rel
        if rel % self.alignment:
            raise GGUFError(f"{where} offset {rel} is not a multiple of the alignment "
                            f"{self.alignment}")
        if offset + nbytes > self.file_size:
            raise GGUFError(f"{where} ({qt.name}, shape {list(shape)}, {nbytes} bytes at file "
                            f"offset {offset}) extends past the end of the file "
                            f"({self.file_size} bytes)")
        return TensorInfo(name, ttype, qt.name, shape, n_elements, offset, nbytes)

    def _check_overlaps(self) -> None:
        prev: TensorInfo | None = None
        for t in sorted(self.tensors.values(), key=lambda t: (t.offset, t.nbytes)):
            if prev is not None and t.offset < prev.offset + prev.nbytes:
                raise GGUFError(f"tensor {t.name!r} (bytes {t.offset}..{t.offset + t.nbytes}) "
                                f"overlaps tensor {prev.name!r} "
                                f"(bytes {prev.offset}..{prev.offset + prev.nbytes})")
            prev = t
