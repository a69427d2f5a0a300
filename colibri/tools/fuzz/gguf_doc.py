"""A GGUF model as editable data (`Doc`: key/values with their type codes, tensors with raw
bytes) and its serializer, which writes anything - no validation - so a fuzzer can produce
files that break every rule (colibri.tools.fuzz.mutate)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
        U64: "<Q", I64: "<q", F64: "<d"}
_NAME2CODE = {"uint8": U8, "int8": I8, "uint16": U16, "int16": I16, "uint32": U32, "int32": I32,
              "float32": F32, "bool": BOOL, "string": STR, "uint64": U64, "int64": I64,
              "float64": F64}
_DT = {U8: np.uint8, I8: np.int8, U16: np.uint16, I16: np.int16, U32: np.uint32, I32: np.int32,
       F32: np.float32, BOOL: np.uint8, U64: np.uint64, I64: np.int64, F64: np.float64}



@dataclass
class Tensor:
    name: str
    shape: list[int]  # GGUF order (ne0 first)
    type: int
    data: bytes


@dataclass
class Doc:
    kvs: list[tuple[str, int, Any]]  # (key, type code, value); arrays: (itype, list/ndarray)
    tensors: list[Tensor]
    version: int = 3
    alignment: int = 32
    notes: list[str] = field(default_factory=list)


def load_doc(path: str) -> Doc:
    from colibri.gguf import GGUFFile

    kvs: list[tuple[str, int, Any]] = []
    with GGUFFile(path) as g:
        for k, v in g.metadata.items():
            t = g.metadata_types[k]
            if t.startswith("array["):
                inner = t[6:-1]
                kvs.append((k, ARR, (_NAME2CODE[inner], v if inner == "string" else np.array(v))))
            else:
                kvs.append((k, _NAME2CODE[t], v))
        tensors = [Tensor(t.name, list(t.shape), t.type, bytes(g.data(t.name)))
                   for t in sorted(g.tensors.values(), key=lambda t: t.offset)]
    return Doc(kvs, tensors)


def _enc_str(s: str | bytes) -> bytes:
    b = s if isinstance(s, bytes) else s.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(b)) + b


def _enc_value(code: int, v: Any) -> bytes:
    if code == STR:
        return _enc_str(v)
    if code == ARR:
        itype, items = v
        if itype == STR:
            return struct.pack("<IQ", STR, len(items)) + b"".join(_enc_str(s) for s in items)
        if itype == ARR:
            return struct.pack("<IQ", ARR, len(items)) + b"".join(_enc_value(ARR, x) for x in items)
        with np.errstate(all="ignore"):
            vals = [x if not (isinstance(x, float) and not math.isfinite(x)) or itype in (F32, F64)
                    else 0 for x in items] if not isinstance(items, np.ndarray) else items
            if itype in (F32, F64):
                arr = np.asarray(vals, dtype=np.float64).astype(_DT[itype])
            else:
                arr = np.array([int(x) % (1 << 64) for x in np.asarray(vals).ravel().tolist()],
                               dtype=np.uint64).astype(_DT[itype])
        return struct.pack("<IQ", itype, arr.size) + arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    fmt = _FMT[code]
    if code in (F32, F64):
        with np.errstate(all="ignore"):
            return np.array([float(v)], dtype="<f4" if code == F32 else "<f8").tobytes()
    bits = struct.calcsize(fmt) * 8
    iv = int(v) if not (isinstance(v, float) and not math.isfinite(v)) else 0
    if fmt[1].isupper():
        iv %= 1 << bits
    else:
        iv = (iv + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    return struct.pack(fmt, iv)


def serialize(doc: Doc) -> bytes:
    out = [b"GGUF", struct.pack("<IQQ", doc.version, len(doc.tensors), len(doc.kvs))]
    for k, code, v in doc.kvs:
        out.append(_enc_str(k) + struct.pack("<I", code) + _enc_value(code, v))
    offsets = []
    pos = 0
    for t in doc.tensors:
        pos = -(-pos // doc.alignment) * doc.alignment
        offsets.append(pos)
        pos += len(t.data)
    for t, off in zip(doc.tensors, offsets, strict=True):
        out.append(_enc_str(t.name) + struct.pack("<I", len(t.shape))
                   + b"".join(struct.pack("<Q", d % (1 << 64)) for d in t.shape)
                   + struct.pack("<IQ", t.type, off))
    head = b"".join(out)
    head += bytes(-len(head) % doc.alignment)
    body = bytearray(pos)
    for t, off in zip(doc.tensors, offsets, strict=True):
        body[off:off + len(t.data)] = t.data
    return head + bytes(body)



def _arch(doc: Doc) -> str:
    for k, _, v in doc.kvs:
        if k == "general.architecture":
            return str(v)
    return "llama"


def _set(doc: Doc, key: str, code: int, value: Any) -> None:
    for i, (k, _, _) in enumerate(doc.kvs):
        if k == key:
            doc.kvs[i] = (key, code, value)
            return
    doc.kvs.append((key, code, value))


def _get(doc: Doc, key: str) -> tuple[int, Any] | None:
    for k, c, v in doc.kvs:
        if k == key:
            return c, v
    return None

