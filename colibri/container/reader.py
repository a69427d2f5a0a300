"""The colibri container's reader: ContainerFile validates a container as strictly as
colibri.gguf.GGUFFile validates a GGUF file, and offers its interface."""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from typing import Any

import numpy as np

from colibri.container.format import (
    _U32,
    _U64,
    CONTAINER_MAGIC,
    CONTAINER_VERSION,
    DENSE_ALIGN,
    EXPERT_ALIGN,
    I4_G128,
    MAX_EXPERTS,
    MAX_GROUPS,
    MAX_PARTS,
    MAX_TENSORS,
    NO_GROUP,
    PREAMBLE,
    ContainerError,
    ExpertGroup,
    ExpertPart,
    _Entry,
    _sizes,
    _type_name,
)
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
    advise_pages,
    guard_mapping,
)
from colibri.inputs import regular_file


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
            advise_pages(self._mm, huge=True)
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
        off, n = self.expert_extent(name)
        span = np.frombuffer(self._mm, dtype=np.uint8, count=n, offset=off)
        return np.lib.stride_tricks.as_strided(span, shape=(g.n_expert, p.nbytes),
                                               strides=(g.stride, 1), writeable=False)

    def expert_span(self, name: str) -> tuple[np.ndarray, int] | None:
        """For an expert tensor: (a contiguous read-only view from expert 0's slice to the end
        of the last expert's slice, the stride between experts); None for a dense tensor.
        This is how colibri.arch hands the expert store its (base, stride) descriptor."""
        gp = self._group_of.get(name)
        if gp is None or self._mm is None:
            return None
        off, n = self.expert_extent(name)
        return np.frombuffer(self._mm, dtype=np.uint8, count=n, offset=off), gp[0].stride

    def expert_extent(self, name: str) -> tuple[int, int]:
        """(offset, bytes) from expert 0's slice to the end of the last expert's slice."""
        gp = self._group_of.get(name)
        if gp is None:
            return super().expert_extent(name)
        g, p = gp
        return self.tensors[name].offset, (g.n_expert - 1) * g.stride + p.nbytes

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
    """Whether the file is a regular file that starts with the container magic (a FIFO or a
    device is not opened: False)."""
    if not os.path.isfile(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"file not found: {os.fspath(path)}")
        return False
    with open(path, "rb") as f:
        return f.read(4) == CONTAINER_MAGIC


def open_model_file(path: str | os.PathLike[str], verify: bool = True) -> GGUFFile | ContainerFile:
    """A GGUFFile or a ContainerFile, chosen by the file's magic. A path that is not a regular
    file (a FIFO, a device, a directory) is refused before it is opened (ValueError)."""
    regular_file(path, "model file")
    if is_container(path):
        return ContainerFile(path, verify=verify)
    return GGUFFile(path)
