"""The colibri container's format (the layout is specified in colibri/container/__init__.py and
docs/ARCHITECTURE.md): constants, the expert groups, the header's encoding and the preamble."""

from __future__ import annotations

import logging
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

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
