"""The colibri container: a GGUF model re-laid out so that one read fetches one expert.

    convert("model.gguf", "model.colibri", quant="keep")     # the writer (tools/convert_gguf.py,
    cf = ContainerFile("model.colibri")                        #  `colibri convert`)
    f = open_model_file(path)                                  # a GGUFFile or a ContainerFile

Layout (docs/ARCHITECTURE.md, "The colibri container", is the full specification):

    [0, 64)           preamble: "COLI", u32 version, u64 header_bytes, u64 file_size,
                      u32 header_crc32, u32 flags, 32 zero bytes
    [64, 64+header)   header: the GGUF metadata key/values (GGUF v3 encoding, types kept), the
                      tensor directory, the expert groups with one crc32 per expert, the dense
                      region and its crc32
    dense region      every non-expert tensor, 64-byte aligned, starting 4096-aligned
    expert region     per MoE layer (layer-major), per expert (expert-minor): gate, up, down
                      ADJACENT (no padding), each expert at base + e * stride with base and
                      stride multiples of 2 MiB; the padding is a hole (seek), not written

The expert store's per-layer descriptor (experts.h) describes this with gate_stride = up_stride
= down_stride = stride and gate/up/down offsets base, base + G, base + G + U.

`ContainerFile` validates as strictly as `colibri.gguf.GGUFFile` (every failure a
`ContainerError`, a ValueError naming the file and the region or tensor) and offers the same
interface (`metadata`, `metadata_types`, `tensors`, `data()`, `architecture`, `close()`, ...)
so that colibri.arch, the tokenizer and colibri.model read either. An expert tensor's `data()`
is a strided (n_expert, bytes per expert) view; `expert_span()` gives the contiguous base view
and the stride the expert store needs.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import stat
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from colibri.gguf import (
    MAX_DIMS,
    MAX_NAME_BYTES,
    MAX_STRING_ELEMENTS,
    SUPPORTED_TYPES,
    GGUFError,
    GGUFFile,
    TensorInfo,
    _Cursor,
    _identity,
    guard_mapping,
)

__all__ = [
    "CONTAINER_MAGIC",
    "CONTAINER_VERSION",
    "EXPERT_ALIGN",
    "QUANTS",
    "ContainerError",
    "ContainerFile",
    "ExpertGroup",
    "ExpertPart",
    "clean_stale_temporaries",
    "convert",
    "is_container",
    "open_model_file",
]

CONTAINER_MAGIC = b"COLI"
CONTAINER_VERSION = 1
PREAMBLE = 64
EXPERT_ALIGN = 2 << 20  # every expert starts at a multiple of 2 MiB
DENSE_START_ALIGN = 4096
DENSE_ALIGN = 64
NO_GROUP = 0xFFFFFFFF
I4_G128 = 1024  # colibri's own block type (include/colibri/quant.h): 128 values in 66 bytes
I4_G128_SIZES = (128, 66)
QUANTS = ("keep", "q8_0", "q4_0", "int4-g128")
MAX_TENSORS = 1 << 20
MAX_GROUPS = 1 << 16
MAX_EXPERTS = 1 << 20
MAX_PARTS = 8
_EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_([a-z0-9_]+)_exps\.weight$")
_PART_ORDER = {"gate": 0, "gate_up": 1, "up": 2, "down": 3}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_log = logging.getLogger("colibri")


class ContainerError(ValueError):
    """A colibri container is malformed, corrupt, or cannot be written."""


def _sizes(ttype: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a block type."""
    if ttype == I4_G128:
        return I4_G128_SIZES
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    return int(bs), int(ts)


def _type_name(ttype: int) -> str:
    if ttype == I4_G128:
        return "I4_G128"
    try:
        return GGMLQuantizationType(ttype).name
    except ValueError:
        return f"type {ttype}"


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class ExpertPart:
    """One stacked expert tensor of a group: expert e's slice is at group.base + e * stride +
    rel, nbytes bytes long."""

    name: str
    rel: int
    nbytes: int


@dataclass(frozen=True)
class ExpertGroup:
    """One MoE layer's experts: n_expert experts at base + e * stride, each `used` bytes (its
    parts, adjacent, in order) followed by a hole up to the stride. crcs[e] is expert e's
    crc32 (over its used bytes)."""

    layer: int
    n_expert: int
    base: int
    stride: int
    used: int
    parts: tuple[ExpertPart, ...]
    crcs: tuple[int, ...]

    def expert_range(self, e: int) -> tuple[int, int]:
        """[start, end) file offsets of expert e's bytes."""
        start = self.base + e * self.stride
        return start, start + self.used


# ---- GGUF key/value encoding (the container's metadata section) ----

_SCALAR_CODES = {"uint8": (0, "<B"), "int8": (1, "<b"), "uint16": (2, "<H"), "int16": (3, "<h"),
                 "uint32": (4, "<I"), "int32": (5, "<i"), "float32": (6, "<f"), "bool": (7, "<B"),
                 "uint64": (10, "<Q"), "int64": (11, "<q"), "float64": (12, "<d")}
_STRING, _ARRAY = 8, 9


def _enc_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def _enc_payload(value: Any, vtype: str) -> bytes:
    """The bytes of a value of GGUF type vtype (without the type code)."""
    if vtype in _SCALAR_CODES:
        code, fmt = _SCALAR_CODES[vtype]
        return struct.pack(fmt, int(bool(value)) if vtype == "bool" else value)
    if vtype == "string":
        return _enc_str(value)
    if vtype.startswith("array[") and vtype.endswith("]"):
        inner = vtype[6:-1]
        items = list(value)
        if inner in _SCALAR_CODES:
            code, fmt = _SCALAR_CODES[inner]
            arr = np.asarray(value, dtype=np.dtype(fmt) if inner != "bool" else np.uint8)
            return _U32.pack(code) + _U64.pack(arr.size) + arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        if inner == "string":
            return _U32.pack(_STRING) + _U64.pack(len(items)) + b"".join(_enc_str(s) for s in items)
        if inner.startswith("array"):
            # arrays of arrays: each element is an array value; its type is the inner name
            sub = inner if inner != "array" else "array[uint8]"
            return (_U32.pack(_ARRAY) + _U64.pack(len(items))
                    + b"".join(_enc_payload(x, sub) for x in items))
    raise ContainerError(f"cannot encode a metadata value of type {vtype!r}")


def _enc_kv(key: str, value: Any, vtype: str) -> bytes:
    code = (_SCALAR_CODES[vtype][0] if vtype in _SCALAR_CODES
            else _STRING if vtype == "string" else _ARRAY)
    return _enc_str(key) + _U32.pack(code) + _enc_payload(value, vtype)


# ---- the header ----

@dataclass
class _Entry:
    name: str
    shape: tuple[int, ...]
    type: int
    offset: int
    nbytes: int
    group: int


def _enc_header(kv: bytes, n_kv: int, entries: list[_Entry], groups: list[ExpertGroup],
                index: dict[str, int], dense: tuple[int, int, int]) -> bytes:
    out = [_U64.pack(n_kv), kv, _U64.pack(len(entries))]
    for t in entries:
        out.append(_enc_str(t.name) + _U32.pack(len(t.shape))
                   + b"".join(_U64.pack(d) for d in t.shape)
                   + struct.pack("<IQQI", t.type, t.offset, t.nbytes, t.group))
    out.append(_U64.pack(len(groups)))
    for g in groups:
        out.append(struct.pack("<IIQQQI", g.layer, g.n_expert, g.base, g.stride, g.used,
                               len(g.parts)))
        for p in g.parts:
            out.append(struct.pack("<IQQ", index[p.name], p.rel, p.nbytes))
        out.append(np.asarray(g.crcs, dtype="<u4").tobytes())
    out.append(struct.pack("<QQI", *dense))
    return b"".join(out)


def _preamble(header_bytes: int, file_size: int, header: bytes) -> bytes:
    head = CONTAINER_MAGIC + _U32.pack(CONTAINER_VERSION) + _U64.pack(header_bytes) + _U64.pack(file_size)
    crc = zlib.crc32(header, zlib.crc32(head))
    return head + _U32.pack(crc) + _U32.pack(0) + bytes(PREAMBLE - 32)


# ---- the reader ----

class ContainerFile(GGUFFile):
    """A colibri container opened read-only and validated (see the module docstring). A
    subclass of GGUFFile for its interface (metadata, tensors, data(), architecture, close());
    nothing of GGUFFile's parsing is used.

    verify=True (default) checks the crc32 of the dense region and of every expert while
    opening (the header's own crc32 is always checked); verify=False skips the data checksums
    (every structural check still applies). Views returned by data() keep the mapping alive.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True) -> None:
        self.path = os.fspath(path)
        self.verify = verify
        self.lenient = False
        self.alignment = DENSE_ALIGN
        self.data_offset = 0
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.groups: list[ExpertGroup] = []
        self.version = 0
        self.header_bytes = 0
        self.dense_start = self.dense_end = self.dense_crc = 0
        self.verify_s = 0.0
        self._kv_range = (0, 0)
        self._group_of: dict[str, tuple[ExpertGroup, ExpertPart]] = {}
        self._mm: mmap.mmap | None = None
        with open(self.path, "rb") as f:
            self.file_size = os.fstat(f.fileno()).st_size
            if self.file_size < PREAMBLE:
                raise ContainerError(f"{self.path}: file is {self.file_size} bytes, too short "
                                     f"for a colibri container preamble ({PREAMBLE})")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._ident = _identity(f.fileno())
            guard_mapping(self._mm, self.path)
        try:
            self._parse()
            if verify:
                t0 = time.perf_counter()
                self._verify()
                self.verify_s = time.perf_counter() - t0
        except ContainerError as e:
            self.close()
            raise ContainerError(f"{self.path}: {e}") from None
        except GGUFError as e:
            self.close()
            raise ContainerError(f"{self.path}: header: {e}") from None
        except (ValueError, IndexError, KeyError, OverflowError, struct.error, MemoryError,
                RecursionError, TypeError) as e:
            self.close()
            raise ContainerError(f"{self.path}: corrupt container ({type(e).__name__}: {e})") from None

    # ---- the GGUFFile interface ----

    def data(self, name: str) -> np.ndarray:
        """Read-only uint8 view of a tensor's bytes (no copy): 1-D for a dense tensor; for an
        expert tensor (n_expert, bytes per expert) with a row stride of the group's stride."""
        if self._mm is None:
            raise ContainerError(f"{self.path}: file is closed")
        t = self.tensors.get(name)
        if t is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        gp = self._group_of.get(name)
        if gp is None:
            return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        g, p = gp
        span = np.frombuffer(self._mm, dtype=np.uint8, count=(g.n_expert - 1) * g.stride + p.nbytes,
                             offset=t.offset)
        return np.lib.stride_tricks.as_strided(span, shape=(g.n_expert, p.nbytes),
                                               strides=(g.stride, 1), writeable=False)

    def expert_span(self, name: str) -> tuple[np.ndarray, int] | None:
        """For an expert tensor: (a contiguous read-only view from expert 0's slice to the end
        of the last expert's slice, the stride between experts); None for a dense tensor.
        This is how colibri.arch hands the expert store its (base, stride) descriptor."""
        gp = self._group_of.get(name)
        if gp is None or self._mm is None:
            return None
        g, p = gp
        view = np.frombuffer(self._mm, dtype=np.uint8, count=(g.n_expert - 1) * g.stride + p.nbytes,
                             offset=self.tensors[name].offset)
        return view, g.stride

    def gguf_metadata_image(self) -> bytes:
        """The metadata as the start of a GGUF v3 file with no tensors (magic, version, counts,
        the key/values): what the tokenizer's metadata reader parses."""
        a, b = self._kv_range
        assert self._mm is not None
        return b"GGUF" + _U32.pack(3) + _U64.pack(0) + self._mm[a:b]

    def __enter__(self) -> ContainerFile:
        return self

    def __repr__(self) -> str:
        return (f"ContainerFile({self.path!r}, v{self.version}, arch={self.architecture!r}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors, "
                f"{len(self.groups)} expert groups)")

    # ---- parsing ----

    def _parse(self) -> None:
        mm = self._mm
        assert mm is not None
        if mm[0:4] != CONTAINER_MAGIC:
            raise ContainerError(f"bad magic {mm[0:4]!r}, expected {CONTAINER_MAGIC!r}: "
                                 "not a colibri container")
        version, hbytes, fsize, hcrc, flags = struct.unpack_from("<IQQII", mm, 4)
        if version != CONTAINER_VERSION:
            raise ContainerError(f"unsupported container version {version} "
                                 f"(supported: {CONTAINER_VERSION})")
        self.version = version
        if fsize != self.file_size:
            raise ContainerError(f"the header says the file is {fsize} bytes but it is "
                                 f"{self.file_size} (truncated or extended)")
        if hbytes > self.file_size - PREAMBLE:
            raise ContainerError(f"header of {hbytes} bytes does not fit in the file "
                                 f"({self.file_size} bytes)")
        if flags != 0 or any(mm[32:PREAMBLE]):
            raise ContainerError("reserved preamble bytes are not zero")
        end = PREAMBLE + hbytes
        crc = zlib.crc32(memoryview(mm)[PREAMBLE:end], zlib.crc32(mm[0:24]))
        if crc != hcrc:
            raise ContainerError(f"header checksum mismatch (crc32 {crc:08x}, recorded "
                                 f"{hcrc:08x}): the header is corrupt")
        self.header_bytes = hbytes
        cur = _Cursor(mm, end)
        cur.pos = PREAMBLE
        # metadata: GGUF key/values, parsed by GGUFFile's validated value reader
        n_kv = cur.u64("metadata key/value count")
        if n_kv * 13 > cur.remaining():
            raise ContainerError(f"metadata key/value count {n_kv} cannot fit in the header")
        self._string_budget = MAX_STRING_ELEMENTS
        kv_start = cur.pos
        for i in range(n_kv):
            key = cur.string(f"key of metadata entry {i}", MAX_NAME_BYTES)
            if key in self.metadata:
                raise ContainerError(f"metadata key {key!r} appears twice")
            vtype = cur.u32(f"value type of {key!r}")
            self.metadata[key], self.metadata_types[key] = self._value(cur, vtype, key, 0)
        self._kv_range = (kv_start - 8, cur.pos)

        n_t = cur.u64("tensor count")
        if n_t > MAX_TENSORS or n_t * 37 > cur.remaining():
            raise ContainerError(f"tensor count {n_t} cannot fit in the header")
        entries: list[_Entry] = []
        seen: set[str] = set()
        for i in range(n_t):
            name = cur.string(f"name of tensor {i}", MAX_NAME_BYTES)
            if name in seen:
                raise ContainerError(f"tensor {name!r} appears twice")
            seen.add(name)
            nd = cur.u32(f"dimension count of tensor {name!r}")
            if not 1 <= nd <= MAX_DIMS:
                raise ContainerError(f"tensor {name!r} has {nd} dimensions (1 to {MAX_DIMS})")
            shape = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(nd))
            cur.need(24, f"type/offset/size of tensor {name!r}")
            ttype, off, nbytes, grp = struct.unpack_from("<IQQI", mm, cur.pos)
            cur.pos += 24
            entries.append(_Entry(name, shape, ttype, off, nbytes, grp))

        n_g = cur.u64("expert group count")
        if n_g > MAX_GROUPS or n_g * 36 > cur.remaining():
            raise ContainerError(f"expert group count {n_g} cannot fit in the header")
        raw_groups = []
        for gi in range(n_g):
            cur.need(36, f"expert group {gi}")
            layer, n_exp, base, stride, used, n_parts = struct.unpack_from("<IIQQQI", mm, cur.pos)
            cur.pos += 36
            what = f"expert group {gi} (layer {layer})"
            if not 1 <= n_exp <= MAX_EXPERTS:
                raise ContainerError(f"{what} has {n_exp} experts (1 to {MAX_EXPERTS})")
            if not 1 <= n_parts <= MAX_PARTS:
                raise ContainerError(f"{what} has {n_parts} tensors per expert (1 to {MAX_PARTS})")
            parts = []
            for _ in range(n_parts):
                cur.need(20, f"tensors of {what}")
                ti, rel, pb = struct.unpack_from("<IQQ", mm, cur.pos)
                cur.pos += 20
                if ti >= len(entries):
                    raise ContainerError(f"{what} names tensor #{ti} of {len(entries)}")
                parts.append(ExpertPart(entries[ti].name, rel, pb))
            cur.need(4 * n_exp, f"expert checksums of {what}")
            crcs = tuple(int(c) for c in np.frombuffer(mm, dtype="<u4", count=n_exp, offset=cur.pos))
            cur.pos += 4 * n_exp
            raw_groups.append(ExpertGroup(layer, n_exp, base, stride, used, tuple(parts), crcs))
        cur.need(20, "dense region")
        self.dense_start, self.dense_end, self.dense_crc = struct.unpack_from("<QQI", mm, cur.pos)
        self.data_offset = self.dense_start
        cur.pos += 20
        if cur.pos != end:
            raise ContainerError(f"{end - cur.pos} unexplained bytes at the end of the header")
        self._check_layout(entries, raw_groups, end)

    def _check_layout(self, entries: list[_Entry], groups: list[ExpertGroup], header_end: int) -> None:
        fsize = self.file_size
        if not (header_end <= self.dense_start <= self.dense_end <= fsize):
            raise ContainerError(f"dense region [{self.dense_start}, {self.dense_end}) is not "
                                 f"between the header's end ({header_end}) and the file's end "
                                 f"({fsize})")
        layers: set[int] = set()
        group_end = self.dense_end
        by_name = {e.name: e for e in entries}
        for g in sorted(groups, key=lambda g: g.base):
            what = f"expert group of layer {g.layer}"
            if g.layer in layers:
                raise ContainerError(f"layer {g.layer} has two expert groups")
            layers.add(g.layer)
            if g.base % EXPERT_ALIGN or g.stride % EXPERT_ALIGN or g.stride == 0:
                raise ContainerError(f"{what}: base {g.base} / stride {g.stride} are not "
                                     f"multiples of {EXPERT_ALIGN} (misaligned experts)")
            if not 0 < g.used <= g.stride:
                raise ContainerError(f"{what}: {g.used} bytes per expert do not fit the stride "
                                     f"{g.stride}")
            if g.base < group_end:
                raise ContainerError(f"{what} at {g.base} overlaps the dense region or the "
                                     f"previous expert group (ending at {group_end})")
            last_end = g.base + (g.n_expert - 1) * g.stride + g.used
            if last_end > fsize:
                raise ContainerError(f"{what}: its {g.n_expert} experts (stride {g.stride}) end "
                                     f"at {last_end}, past the end of the file ({fsize} bytes)")
            group_end = last_end
            rel = 0
            for p in g.parts:
                if p.rel != rel:
                    raise ContainerError(f"{what}: tensor {p.name!r} is at +{p.rel} in each "
                                         f"expert, expected +{rel} (adjacent to the previous)")
                if p.name in self._group_of:
                    raise ContainerError(f"tensor {p.name!r} is in two expert groups")
                self._group_of[p.name] = (g, p)
                e = by_name[p.name]
                if e.offset != g.base + p.rel or e.nbytes != g.n_expert * p.nbytes:
                    raise ContainerError(f"tensor {p.name!r}: offset {e.offset} / {e.nbytes} "
                                         f"bytes disagree with its expert group")
                if e.shape[-1] != g.n_expert:
                    raise ContainerError(f"tensor {p.name!r} has shape {list(e.shape)}, the "
                                         f"last dimension must be the {g.n_expert} experts")
                rel += p.nbytes
            if rel != g.used:
                raise ContainerError(f"{what}: its tensors take {rel} bytes per expert, the "
                                     f"group says {g.used}")
        self.groups = sorted(groups, key=lambda g: g.layer)
        prev: _Entry | None = None
        dense = []
        for e in entries:
            gi = self._group_of.get(e.name)
            if (e.group == NO_GROUP) != (gi is None):
                raise ContainerError(f"tensor {e.name!r}: expert group #{e.group} disagrees with "
                                     "the expert groups")
            self.tensors[e.name] = self._check_tensor(e, gi is not None)
            if gi is None:
                dense.append(e)
        for e in sorted(dense, key=lambda e: (e.offset, e.nbytes)):
            if e.offset < self.dense_start or e.offset + e.nbytes > self.dense_end:
                raise ContainerError(f"tensor {e.name!r} (bytes {e.offset}..{e.offset + e.nbytes})"
                                     f" is outside the dense region [{self.dense_start}, "
                                     f"{self.dense_end})")
            if e.offset % DENSE_ALIGN:
                raise ContainerError(f"tensor {e.name!r} offset {e.offset} is not a multiple of "
                                     f"{DENSE_ALIGN}")
            if prev is not None and e.offset < prev.offset + prev.nbytes:
                raise ContainerError(f"tensor {e.name!r} (bytes {e.offset}..{e.offset + e.nbytes})"
                                     f" overlaps tensor {prev.name!r} (bytes {prev.offset}.."
                                     f"{prev.offset + prev.nbytes})")
            prev = e

    def _check_tensor(self, e: _Entry, expert: bool) -> TensorInfo:
        where = f"tensor {e.name!r}"
        if e.type != I4_G128 and e.type not in SUPPORTED_TYPES:
            raise ContainerError(f"{where} has type {_type_name(e.type)}, which colibri does not "
                                 "support")
        if e.type == I4_G128 and not expert:
            raise ContainerError(f"{where}: I4_G128 is only used for expert tensors")
        block, bbytes = _sizes(e.type)
        if any(d < 1 for d in e.shape):
            raise ContainerError(f"{where} has shape {list(e.shape)}: every dimension must be >= 1")
        if e.shape[0] % block:
            raise ContainerError(f"{where} ({_type_name(e.type)}) has row length {e.shape[0]}, "
                                 f"not a multiple of its block size {block}")
        n = 1
        for d in e.shape:
            n *= d
            if n > self.file_size * block:
                raise ContainerError(f"{where} has shape {list(e.shape)}: more elements than the "
                                     "file could hold")
        if n // block * bbytes != e.nbytes:
            raise ContainerError(f"{where} ({_type_name(e.type)}, shape {list(e.shape)}) should "
                                 f"take {n // block * bbytes} bytes, the directory says {e.nbytes}")
        if not expert and e.offset + e.nbytes > self.file_size:
            raise ContainerError(f"{where} extends past the end of the file")
        return TensorInfo(e.name, e.type, _type_name(e.type), e.shape, n, e.offset, e.nbytes)

    def _verify(self) -> None:
        mm = self._mm
        assert mm is not None
        view = memoryview(mm)
        crc = zlib.crc32(view[self.dense_start:self.dense_end])
        if crc != self.dense_crc:
            raise ContainerError(f"checksum mismatch in the dense region [{self.dense_start}, "
                                 f"{self.dense_end}) (crc32 {crc:08x}, recorded "
                                 f"{self.dense_crc:08x}): the file is corrupt")
        # experts on a thread pool: zlib.crc32 releases the GIL on large buffers
        jobs = [(g, e) for g in self.groups for e in range(g.n_expert)]

        def crc_of(job: tuple[ExpertGroup, int]) -> int:
            a, b = job[0].expert_range(job[1])
            return zlib.crc32(view[a:b])

        total = sum(g.used * g.n_expert for g in self.groups)
        workers = min(os.cpu_count() or 1, 8, max(1, len(jobs)))
        if workers > 1 and len(jobs) > 1 and total > (64 << 20):
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(workers) as ex:
                crcs = list(ex.map(crc_of, jobs, chunksize=max(1, len(jobs) // (4 * workers))))
        else:
            crcs = [crc_of(j) for j in jobs]
        for (g, e), crc in zip(jobs, crcs, strict=True):
            if crc != g.crcs[e]:
                a, b = g.expert_range(e)
                raise ContainerError(f"checksum mismatch in expert {e} of layer {g.layer} "
                                     f"(bytes {a}..{b}, crc32 {crc:08x}, recorded "
                                     f"{g.crcs[e]:08x}): the file is corrupt")
        view.release()


def is_container(path: str | os.PathLike[str]) -> bool:
    """Whether the file starts with the container magic."""
    with open(path, "rb") as f:
        return f.read(4) == CONTAINER_MAGIC


def open_model_file(path: str | os.PathLike[str], verify: bool = True) -> GGUFFile | ContainerFile:
    """A GGUFFile or a ContainerFile, chosen by the file's magic."""
    if is_container(path):
        return ContainerFile(path, verify=verify)
    return GGUFFile(path)


# ---- the writer ----

def _quantizer(quant: str) -> tuple[int, Callable[[np.ndarray], np.ndarray]]:
    """(target type, f32 [rows, cols] -> uint8 [rows, row_bytes])."""
    if quant in ("q8_0", "q4_0"):
        from gguf import quants

        qt = GGMLQuantizationType.Q8_0 if quant == "q8_0" else GGMLQuantizationType.Q4_0
        return int(qt), lambda w: np.asarray(quants.quantize(w, qt), dtype=np.uint8)
    if quant == "int4-g128":
        import colibri.quant as cq

        fn = getattr(cq, "quantize_i4g128", None) or getattr(cq, "quantize_i4_g128", None)
        if fn is None:
            raise ContainerError("int4-g128 needs colibri.quant's I4_G128 quantizer, which this "
                                 "build does not have")

        def q(w: np.ndarray) -> np.ndarray:
            rows, cols = w.shape
            out = np.asarray(fn(np.ascontiguousarray(w, dtype=np.float32).reshape(-1)), dtype=np.uint8)
            return out.reshape(rows, cols // 128 * 66)

        return I4_G128, q
    raise ContainerError(f"unknown quant {quant!r}: expected one of {', '.join(QUANTS)}")


def _dequant(raw: np.ndarray, ttype: int, rows: int, cols: int) -> np.ndarray:
    from gguf import quants

    if ttype == int(GGMLQuantizationType.F32):
        return raw.view(np.float32).reshape(rows, cols)
    return np.asarray(quants.dequantize(raw.reshape(rows, -1), GGMLQuantizationType(ttype)),
                      dtype=np.float32).reshape(rows, cols)


@dataclass
class _Plan:
    entries: list[_Entry]
    groups: list[ExpertGroup]
    src_types: dict[str, int]
    file_size: int
    header_bytes: int
    dense: tuple[int, int]


def _expert_tensors(gf: GGUFFile) -> dict[int, list[TensorInfo]]:
    """The stacked expert tensors (blk.N.ffn_*_exps.weight, 3-D) of each layer, in the order
    gate, gate_up, up, down, then any other by name."""
    layers: dict[int, list[tuple[int, str, TensorInfo]]] = {}
    for t in gf.tensors.values():
        m = _EXPERT_RE.match(t.name)
        if m and len(t.shape) == 3:
            layers.setdefault(int(m.group(1)), []).append((_PART_ORDER.get(m.group(2), 9), t.name, t))
    return {layer: [t for _, _, t in sorted(v, key=lambda x: x[:2])] for layer, v in layers.items()}


def _plan(gf: GGUFFile, kv: bytes, n_kv: int, quant: str) -> _Plan:
    layers = _expert_tensors(gf)
    expert_names = {t.name for parts in layers.values() for t in parts}
    target = _quantizer(quant)[0] if quant != "keep" else None
    block_t = _sizes(target) if target is not None else (1, 1)
    entries: list[_Entry] = []
    src_types: dict[str, int] = {}
    for t in gf.tensors.values():
        ttype, nbytes = t.type, t.nbytes
        if t.name in expert_names and target is not None and t.type != target:
            if t.shape[0] % block_t[0]:
                raise ContainerError(
                    f"{gf.path}: tensor {t.name!r} has rows of {t.shape[0]} values, not a "
                    f"multiple of {block_t[0]}: it cannot be quantized to {quant}")
            ttype, nbytes = target, t.n_elements // block_t[0] * block_t[1]
        src_types[t.name] = t.type
        entries.append(_Entry(t.name, t.shape, ttype, 0, nbytes, NO_GROUP))
    index = {e.name: i for i, e in enumerate(entries)}
    by_name = {e.name: e for e in entries}
    # sizes first (offsets do not change the header's length: every field is fixed width)
    groups: list[ExpertGroup] = []
    for layer in sorted(layers):
        parts = layers[layer]
        n_exp = parts[0].shape[2]
        if any(p.shape[2] != n_exp for p in parts):
            raise ContainerError(f"{gf.path}: layer {layer}'s expert tensors disagree on the "
                                 f"number of experts: {[list(p.shape) for p in parts]}")
        rel = 0
        eparts = []
        for p in parts:
            pb = by_name[p.name].nbytes // n_exp
            eparts.append(ExpertPart(p.name, rel, pb))
            rel += pb
        groups.append(ExpertGroup(layer, n_exp, 0, _align(rel, EXPERT_ALIGN), rel, tuple(eparts),
                                  (0,) * n_exp))
    header = _enc_header(kv, n_kv, entries, groups, index, (0, 0, 0))
    pos = dense_start = _align(PREAMBLE + len(header), DENSE_START_ALIGN)
    for e in entries:
        if e.name not in expert_names:
            e.offset = _align(pos, DENSE_ALIGN)
            pos = e.offset + e.nbytes
    dense_end = pos
    pos = _align(pos, EXPERT_ALIGN)
    placed: list[ExpertGroup] = []
    end = pos
    for g0 in groups:
        g = ExpertGroup(g0.layer, g0.n_expert, pos, g0.stride, g0.used, g0.parts, g0.crcs)
        for part in g.parts:
            ent = by_name[part.name]
            ent.offset, ent.group = pos + part.rel, len(placed)
        placed.append(g)
        end = pos + (g.n_expert - 1) * g.stride + g.used
        pos = _align(end, EXPERT_ALIGN)
    file_size = end if placed else dense_end
    return _Plan(entries, placed, src_types, file_size, len(header), (dense_start, dense_end))


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], quant: str = "keep",
            progress: bool | Callable[[str], None] = True, verify: bool = True,
            check_model: bool = True, force: bool = False,
            _fail_after: int | None = None) -> dict[str, Any]:
    """Write the container of GGUF file src to dst (atomically: a temporary file in dst's
    directory, fsync, rename; on any error or interrupt no file is left under either name).

    The output (see _check_output): a new name; an existing regular file or symbolic link only
    with force=True (a link is replaced by the container, its target is never written); never
    anything else (a device such as /dev/null, a FIFO, a socket, a directory), force or not.
    Without force the container is published with link(2), which fails when any file appeared
    under the name meanwhile (a concurrent converter, say), so nothing is ever overwritten.
    Stale temporaries of earlier runs for the same output whose writer process is dead (killed
    with SIGKILL, a power cut) are removed first, each named with its size on stderr (or to the
    progress callable); a live converter's temporary is never touched.

    quant: "keep" (every tensor keeps its block type), or "q8_0" / "q4_0" / "int4-g128": the
    routed expert tensors are requantized (from their dequantized values; a tensor already of
    the target type is copied as is), dense tensors are kept. progress: True logs a line per
    layer (logger "colibri", INFO), a callable receives the lines, False is quiet. verify: re-open the written
    file and check every checksum before the rename. check_model: refuse a GGUF colibri cannot
    run (colibri.arch.describe: architecture, keys, tensor shapes), naming what is wrong.
    Returns a summary dict (sizes, seconds, removed_temporaries: [(path, bytes)]).
    _fail_after (tests): raise after that many experts were written."""
    if quant not in QUANTS:
        raise ContainerError(f"unknown quant {quant!r}: expected one of {', '.join(QUANTS)}")
    src, dst = os.fspath(src), os.fspath(dst)
    say: Callable[[str], None]
    if callable(progress):
        say = progress
    elif progress:
        def say(msg: str) -> None:
            _log.info("convert: %s", msg)
    else:
        def say(msg: str) -> None:
            pass
    if not os.path.exists(src):
        raise FileNotFoundError(f"input file not found: {src}")
    if is_container(src):
        raise ContainerError(f"{src} is already a colibri container")
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise FileNotFoundError(f"output directory {os.path.dirname(os.path.abspath(dst))} "
                                "does not exist")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise ContainerError(f"output {dst} is the input file")
    if os.path.realpath(src) == os.path.realpath(dst):
        raise ContainerError(f"output {dst} is the input file")
    _check_output(dst, force)
    t0 = time.perf_counter()
    gf = GGUFFile(src)
    try:
        if check_model:
            from colibri.arch import describe

            describe(gf)  # UnsupportedModel (a ValueError) naming the key or tensor
        removed = clean_stale_temporaries(dst, say if callable(progress) else _warn)
        summary = _write(gf, src, dst, quant, say, verify, _fail_after, t0, force)
        summary["removed_temporaries"] = removed
        return summary
    finally:
        gf.close()


def _warn(msg: str) -> None:
    _log.warning("convert: %s", msg)


_TMP_TAG = ".colibri-tmp-"


def _tmp_prefix(dst: str) -> str:
    """The name prefix of this process's temporaries for dst: hidden, colibri-specific, and
    carrying the writer's pid, so that a later run can tell a dead writer's leftover from a
    live one's (mkstemp adds a random part and the suffix)."""
    return "." + os.path.basename(dst) + _TMP_TAG + f"{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we wrote: never treat it as dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    except OSError:
        return True
    return True


def stale_temporaries(dst: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """colibri's temporaries for output dst in its directory: [(path, writer pid, bytes)],
    regular files only (never followed through a link)."""
    dst = os.fspath(dst)
    dirname = os.path.dirname(os.path.abspath(dst))
    pat = re.compile(re.escape("." + os.path.basename(dst) + _TMP_TAG) + r"(\d+)-[A-Za-z0-9_]+\.tmp$")
    out = []
    try:
        names = os.listdir(dirname)
    except OSError:
        return []
    for name in names:
        m = pat.fullmatch(name)
        if m is None:
            continue
        path = os.path.join(dirname, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((path, int(m.group(1)), st.st_blocks * 512))
    return sorted(out)


def clean_stale_temporaries(dst: str | os.PathLike[str],
                            say: Callable[[str], None] = _warn) -> list[tuple[str, int]]:
    """Remove colibri's temporaries for output dst whose writer process no longer exists
    (a converter killed with SIGKILL cannot remove its own). A temporary of a live process -
    a concurrent converter of the same output - is kept. Each removal is reported through say
    with its size on disk; returns [(path, bytes)]."""
    removed = []
    for path, pid, nbytes in stale_temporaries(dst):
        if pid == os.getpid() or _pid_alive(pid):
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue  # another converter cleaned it first
        except OSError as e:
            say(f"cannot remove stale temporary {path} ({e})")
            continue
        removed.append((path, nbytes))
        say(f"removed stale temporary {path} ({nbytes / 2**20:.1f} MiB) left by converter "
            f"process {pid}, which no longer runs")
    return removed


def _check_output(dst: str, force: bool) -> None:
    """Refuse an output name that is not safe to replace (the rule, also in convert's
    docstring): absent - fine; a regular file or a symbolic link - only with force (the link
    itself is replaced, its target is left alone: rename(2) never follows the last component);
    anything else - a device node like /dev/null, a FIFO, a socket, a directory - never."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        return
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        if not force:
            raise ContainerError(f"output {dst} is a symbolic link (to "
                                 f"{os.readlink(dst)!r}); refusing to replace it without "
                                 "--force (force replaces the link itself, not its target)")
        return
    if stat.S_ISDIR(mode):
        raise ContainerError(f"output {dst} is a directory")
    if not stat.S_ISREG(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
                if stat.S_ISBLK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise ContainerError(f"output {dst} exists and is {kind}; refusing to replace it "
                             "(even with --force): give a regular file's path")
    if not force:
        raise ContainerError(f"output {dst} already exists; refusing to overwrite it without "
                             "--force")


def _publish(tmp: str, dst: str, force: bool) -> None:
    """Move the finished temporary to dst. Without force: link(2), which fails if anything
    exists under dst by now (so a file that appeared since the start - another converter's -
    is never overwritten), then unlink the temporary. With force: rename(2) over a regular
    file or a link, after checking the name again right before (_check_output)."""
    if not force:
        try:
            os.link(tmp, dst)
        except FileExistsError:
            raise ContainerError(f"output {dst} appeared while converting (another converter?); "
                                 "not overwritten (use --force to replace it)") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                               errno.EMLINK):
                raise
            # a filesystem without hard links: check once more, then rename
            _check_output(dst, False)
            os.replace(tmp, dst)
            return
        os.unlink(tmp)
        return
    _check_output(dst, True)
    os.replace(tmp, dst)


def _write(gf: GGUFFile, src: str, dst: str, quant: str, say: Callable[[str], None],
           verify: bool, fail_after: int | None, t0: float, force: bool) -> dict[str, Any]:
    if gf.architecture is None:
        raise ContainerError(f"{src}: no general.architecture key: not a model file")
    kv = b"".join(_enc_kv(k, gf.metadata[k], gf.metadata_types[k]) for k in gf.metadata)
    plan = _plan(gf, kv, len(gf.metadata), quant)
    quantize = _quantizer(quant)[1] if quant != "keep" else None
    index = {e.name: i for i, e in enumerate(plan.entries)}
    by_name = {e.name: e for e in plan.entries}
    dense_start, dense_end = plan.dense
    n_experts = sum(g.n_expert for g in plan.groups)
    say(f"{os.path.basename(src)} -> {os.path.basename(dst)}: {len(plan.entries)} tensors, "
        f"{len(plan.groups)} MoE layers, {n_experts} experts, quant {quant}")
    dirname = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(dst), suffix=".tmp", dir=dirname)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a model file is as readable as any
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(PREAMBLE + plan.header_bytes))
            # dense region (padding written as zeros: it is small and inside the checksum)
            f.seek(dense_start)
            pos, crc = dense_start, 0
            for e in plan.entries:
                if e.group != NO_GROUP:
                    continue
                pad = bytes(e.offset - pos)
                f.write(pad)
                crc = zlib.crc32(pad, crc)
                data = gf.data(e.name)
                f.write(data.data)
                crc = zlib.crc32(data.data, crc)
                pos = e.offset + e.nbytes
            assert pos == dense_end
            say(f"dense: {(dense_end - dense_start) / 2**20:.1f} MiB")
            dense = (dense_start, dense_end, crc)
            groups = []
            written = 0
            for gi, g in enumerate(plan.groups):
                crcs = []
                srcs = []
                for p in g.parts:
                    t = gf.tensors[p.name]
                    srcs.append((t, gf.data(p.name), t.nbytes // g.n_expert))
                for x in range(g.n_expert):
                    f.seek(g.base + x * g.stride)
                    c = 0
                    for (t, raw, sb), p in zip(srcs, g.parts, strict=True):
                        piece = raw[x * sb:(x + 1) * sb]
                        if quantize is not None and by_name[p.name].type != t.type:
                            cols, rows = t.shape[0], t.shape[1]
                            piece = quantize(_dequant(piece, t.type, rows, cols)).reshape(-1)
                        assert piece.nbytes == p.nbytes
                        f.write(piece.data)
                        c = zlib.crc32(piece.data, c)
                    crcs.append(c)
                    written += 1
                    if fail_after is not None and written >= fail_after:
                        raise RuntimeError(f"simulated failure after {written} experts")
                groups.append(ExpertGroup(g.layer, g.n_expert, g.base, g.stride, g.used, g.parts,
                                          tuple(crcs)))
                say(f"layer {g.layer}: {g.n_expert} experts of {g.used / 2**20:.2f} MiB "
                    f"({gi + 1}/{len(plan.groups)} MoE layers, "
                    f"{100 * (gi + 1) / len(plan.groups):.0f}%)")
            f.truncate(plan.file_size)
            header = _enc_header(kv, len(gf.metadata), plan.entries, groups, index, dense)
            assert len(header) == plan.header_bytes
            f.seek(0)
            f.write(_preamble(len(header), plan.file_size, header))
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        verify_s = 0.0
        if verify:
            t1 = time.perf_counter()
            with ContainerFile(tmp, verify=True) as cf:
                if set(cf.tensors) != set(gf.tensors):
                    raise ContainerError(f"{tmp}: the written directory differs from the input")
            verify_s = time.perf_counter() - t1
            say(f"verified every checksum in {verify_s:.2f} s")
        _publish(tmp, dst, force)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(dirname, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    st = os.stat(dst)
    summary: dict[str, Any] = {"path": dst, "file_size": plan.file_size, "disk_bytes": st.st_blocks * 512,
               "dense_bytes": dense_end - dense_start,
               "expert_bytes": sum(g.used * g.n_expert for g in plan.groups),
               "n_experts": n_experts, "seconds": time.perf_counter() - t0, "verify_s": verify_s}
    say(f"wrote {dst}: {plan.file_size / 2**20:.1f} MiB ({summary['disk_bytes'] / 2**20:.1f} MiB "
        f"on disk) in {summary['seconds']:.1f} s")
    return summary


# ---- command line (tools/convert_gguf.py and `colibri convert`) ----

def add_convert_args(p: Any) -> None:
    """The arguments of the convert command on an argparse parser."""
    p.add_argument("input", help="the GGUF file to convert")
    p.add_argument("output", help="the container to write (a new file; see --force)")
    p.add_argument("--quant", choices=QUANTS, default="keep",
                   help="routed experts: keep their block types, or requantize them "
                        "(dense tensors are always kept)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--no-verify", action="store_true",
                   help="skip re-reading the written file's checksums before the rename")
    p.add_argument("-f", "--force", action="store_true",
                   help="replace an existing output file or symbolic link (the link itself, "
                        "never its target); devices, FIFOs and directories are always refused")


def run_convert(args: Any) -> int:
    import signal

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through convert(): the temporary file goes

    def say(msg: str) -> None:  # the command line's progress lines
        print(f"convert: {msg}", file=sys.stderr, flush=True)

    old = signal.signal(signal.SIGTERM, terminated)
    try:
        convert(args.input, args.output, args.quant, progress=False if args.quiet else say,
                verify=not args.no_verify, force=getattr(args, "force", False))
    finally:
        signal.signal(signal.SIGTERM, old)
    return 0
