"""Reading a model's tensors and keys out of a validated GGUF file, for colibri.arch: the checked
key readers (_Reader), the matrices and stacked experts handed to C (Mat, ExpertTensors) and the
per-layer attention readers a family can name (gemma4_layer_attn). Nothing here computes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri._core import _quant
from colibri.dense import DenseCopies, packs_r16
from colibri.gguf import GGUFFile, TensorInfo

F32 = int(_quant.cb_type.CB_TYPE_F32)
MAX_KEY_INT = 2**31 - 1  # sizes and counts reach C as int32


class UnsupportedModel(ValueError):
    """The file is a valid GGUF, but its architecture or a required key/tensor is missing or
    not supported."""


@dataclass
class Mat:
    """A weight matrix for C: rows x cols of GGML type `type`, row r at data[r*row_bytes:]."""

    type: int
    rows: int
    cols: int
    row_bytes: int
    data: np.ndarray | None  # uint8 view (None: an expert template, data from the store)


@dataclass
class ExpertTensors:
    """One layer's stacked experts: three 3-D tensors, expert e at base + e*stride. With
    `fused` (gemma4's ffn_gate_up_exps), gate and up point into one tensor: expert e's gate rows
    then its up rows, so up_base = gate_base + n_ff rows and both strides span the pair."""

    gate: Mat
    up: Mat
    down: Mat
    gate_base: np.ndarray
    up_base: np.ndarray
    down_base: np.ndarray
    gate_stride: int
    up_stride: int
    down_stride: int
    gate_info: TensorInfo
    up_info: TensorInfo
    down_info: TensorInfo
    fused: bool = False


def _dequantized(raw: np.ndarray, type_: int, n: int) -> np.ndarray:
    """A tensor's bytes dequantized to float32, viewed as bytes (gguf's reference dequantizers;
    colibri's, bit-equal where both exist, for a type gguf cannot dequantize: Q8_K)."""
    return _dequantized_f32(raw, type_, n).view(np.uint8)


def _dequantized_f32(raw: np.ndarray, type_: int, n: int) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    try:
        a = quants.dequantize(raw, GGMLQuantizationType(type_))
    except NotImplementedError:
        a = _quant.dequantize(type_, raw.reshape(-1).view(np.uint8), (1, n))
    a = np.ascontiguousarray(a.reshape(-1), dtype=np.float32)
    assert a.size == n
    return a


def _expert_span(gf: GGUFFile, name: str, t: TensorInfo, n_expert: int) -> tuple[np.ndarray, int]:
    """(base view, stride in bytes) of a stacked expert tensor. A GGUF stores the experts one
    after the other (stride = nbytes / n_expert); a colibri container (colibri.container)
    interleaves each expert's gate/up/down at a 2 MiB-aligned stride and says so through
    expert_span(). (Hook owned by the container code: keep it.)"""
    span = getattr(gf, "expert_span", None)
    got = span(name) if span is not None else None
    if got is not None:
        return got[0], int(got[1])
    return gf.data(name), t.nbytes // n_expert


class _Reader:
    def __init__(self, gf: GGUFFile, arch: str, dequantize: bool = False,
                 dense: DenseCopies | None = None):
        self.gf = gf
        self.arch = arch
        self.dequantize = dequantize
        self.dense = dense  # matrices copied to huge pages (colibri.dense), or None: mapped
        self.md = gf.metadata
        self.keep: list[Any] = [dense] if dense is not None else []  # what arrays here live in

    def key(self, name: str, default: Any = None, required: bool = False) -> Any:
        full = f"{self.arch}.{name}"
        if full in self.md:
            return self.md[full]
        if required:
            raise UnsupportedModel(f"{self.gf.path}: required key {full!r} is missing")
        return default

    def has(self, name: str) -> bool:
        return name in self.gf.tensors

    def int_key(self, name: str, default: int | None = None, required: bool = False,
                lo: int = 0, hi: int = MAX_KEY_INT) -> int:
        """An integer key in [lo, hi] (a per-layer array must hold one value), else
        UnsupportedModel naming the key and its value."""
        v = self.key(name, None, required)
        if v is None:
            assert default is not None
            return default
        return _int(v, f"{self.arch}.{name}", self.gf.path, lo, hi)

    def float_key(self, name: str, default: float | None = None, required: bool = False,
                  lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False) -> float:
        """A finite number in [lo, hi] ((lo, hi] with lo_open), else UnsupportedModel naming
        the key and its value."""
        v = self.key(name, None, required)
        if v is None:
            assert default is not None
            return default
        full = f"{self.arch}.{name}"
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.integer | np.floating):
            raise UnsupportedModel(f"{self.gf.path}: {full} must be a number, got {_show(v)}")
        f = float(v)
        if not math.isfinite(f) or f < lo or f > hi or (lo_open and f == lo):
            rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise UnsupportedModel(f"{self.gf.path}: {full} = {f!r} is not a finite number in {rng}")
        return f

    def dims(self, name: str, ndim: int) -> tuple[int, ...]:
        """A tensor's shape, which must have ndim dimensions."""
        t = self.info(name)
        if len(t.shape) != ndim:
            raise UnsupportedModel(f"{self.gf.path}: tensor {name!r} has shape {list(t.shape)}, "
                                   f"expected {ndim} dimensions")
        return tuple(t.shape)

    def info(self, name: str) -> TensorInfo:
        t = self.gf.tensors.get(name)
        if t is None:
            raise UnsupportedModel(f"{self.gf.path}: required tensor {name!r} is missing")
        return t

    def vec(self, name: str, n: int, required: bool = True) -> np.ndarray | None:
        """A 1-D float32 vector of n values (dequantized to a new array if not F32)."""
        if not self.has(name):
            if required:
                raise UnsupportedModel(f"{self.gf.path}: required tensor {name!r} is missing")
            return None
        t = self.info(name)
        if t.n_elements != n:
            raise UnsupportedModel(
                f"{self.gf.path}: tensor {name!r} has {t.n_elements} values, expected {n}"
            )
        raw = self.gf.data(name)
        if t.type == F32:
            return raw.view(np.float32)
        arr = _dequantized_f32(raw, t.type, n)
        self.keep.append(arr)
        return arr

    def mat(self, name: str, rows: int, cols: int, required: bool = True,
            copy: bool = True) -> Mat | None:
        """A dense matrix: its bytes in the mapping, or (with a DenseCopies and copy=True) in
        anonymous huge-page memory, the mapping's pages of it dropped."""
        if not self.has(name):
            if required:
                raise UnsupportedModel(f"{self.gf.path}: required tensor {name!r} is missing")
            return None
        t = self.info(name)
        if len(t.shape) != 2 or t.shape[0] != cols or t.shape[1] != rows:
            raise UnsupportedModel(
                f"{self.gf.path}: tensor {name!r} has shape {list(t.shape)}, expected "
                f"[{cols}, {rows}] (GGUF order)"
            )
        if self.dequantize and t.type != F32:
            data = _dequantized(self.gf.data(name), t.type, rows * cols)
            self.keep.append(data)
            return Mat(F32, rows, cols, cols * 4, data)
        data = self.gf.data(name)
        if self.dense is not None and copy:
            if name not in self.dense:
                if packs_r16() and _quant.r16_layout(t.type) is not None:
                    self.dense.pack_r16(name, t.type, data, rows, cols)
                else:
                    self.dense.copy(name, data)
                self.gf.drop_pages(name)
            if name in self.dense.packed:  # the same row bytes, in groups of 16 rows
                layout = _quant.r16_layout(t.type)
                assert layout is not None
                return Mat(_quant.type_id(layout), rows, cols, t.row_nbytes, self.dense.get(name))
            data = self.dense.get(name)
        return Mat(t.type, rows, cols, t.row_nbytes, data)

    def mat_rows(self, name: str, parts: list[int], cols: int) -> list[Mat]:
        """A fused dense matrix split by rows (phi3's attn_qkv: q, k, v; its ffn_up: gate, up):
        one Mat per part, each a view of its rows in the mapping (not copied: a copy's 16-row
        packing would straddle the parts)."""
        whole = self.mat(name, sum(parts), cols, copy=False)
        assert whole is not None and whole.data is not None
        out, start = [], 0
        for n in parts:
            data = whole.data[start * whole.row_bytes:(start + n) * whole.row_bytes]
            out.append(Mat(whole.type, n, cols, whole.row_bytes, data))
            start += n
        return out

    def experts(self, bid: int, n_expert: int, n_embd: int, n_ff: int) -> ExpertTensors:
        if self.has(f"blk.{bid}.ffn_gate_up_exps.weight"):
            return self.fused_experts(bid, n_expert, n_embd, n_ff)
        mats = {kind: self._stacked(f"blk.{bid}.ffn_{kind}_exps.weight", rows, cols, n_expert)
                for kind, rows, cols in (("gate", n_ff, n_embd), ("up", n_ff, n_embd),
                                         ("down", n_embd, n_ff))}
        return ExpertTensors(
            gate=mats["gate"][1], up=mats["up"][1], down=mats["down"][1],
            gate_base=mats["gate"][2], up_base=mats["up"][2], down_base=mats["down"][2],
            gate_stride=mats["gate"][3],
            up_stride=mats["up"][3],
            down_stride=mats["down"][3],
            gate_info=mats["gate"][0], up_info=mats["up"][0], down_info=mats["down"][0],
        )

    def _stacked(self, name: str, rows: int, cols: int, n_expert: int
                 ) -> tuple[TensorInfo, Mat, np.ndarray, int]:
        """A 3-D expert tensor [cols, rows, n_expert]: (info, one expert's template, bytes,
        stride in bytes from one expert to the next)."""
        t = self.info(name)
        if tuple(t.shape) != (cols, rows, n_expert):
            raise UnsupportedModel(
                f"{self.gf.path}: tensor {name!r} has shape {list(t.shape)}, expected "
                f"[{cols}, {rows}, {n_expert}] (GGUF order)"
            )
        if self.dequantize and t.type != F32:
            data = _dequantized(self.gf.data(name), t.type, rows * cols * n_expert)
            self.keep.append(data)
            return t, Mat(F32, rows, cols, cols * 4, None), data, rows * cols * 4
        return (t, Mat(t.type, rows, cols, t.row_nbytes, None),
                *_expert_span(self.gf, name, t, n_expert))

    def fused_experts(self, bid: int, n_expert: int, n_embd: int, n_ff: int) -> ExpertTensors:
        """gemma4's ffn_gate_up_exps [n_embd, 2*n_ff, n_expert] (expert e: n_ff gate rows, then
        n_ff up rows) and ffn_down_exps: gate and up point into the fused tensor."""
        gu_info, gu, gu_data, gu_stride = self._stacked(
            f"blk.{bid}.ffn_gate_up_exps.weight", 2 * n_ff, n_embd, n_expert)
        d_info, down, d_data, d_stride = self._stacked(
            f"blk.{bid}.ffn_down_exps.weight", n_embd, n_ff, n_expert)
        half = n_ff * gu.row_bytes  # bytes of one expert's gate rows
        gate = Mat(gu.type, n_ff, n_embd, gu.row_bytes, None)
        up = Mat(gu.type, n_ff, n_embd, gu.row_bytes, None)
        up_info = dataclasses.replace(gu_info, offset=gu_info.offset + half,
                                      nbytes=gu_info.nbytes - half)
        return ExpertTensors(
            gate=gate, up=up, down=down, gate_base=gu_data, up_base=gu_data[half:],
            down_base=d_data, gate_stride=gu_stride, up_stride=gu_stride, down_stride=d_stride,
            gate_info=gu_info, up_info=up_info, down_info=d_info, fused=True,
        )


def _show(v: Any) -> str:
    r = repr(v.tolist() if isinstance(v, np.ndarray) else v)
    return r if len(r) <= 60 else r[:57] + "..."


def _one_int(x: Any, what: str, path: str, lo: int, hi: int) -> int:
    if isinstance(x, bool | np.bool_):
        raise UnsupportedModel(f"{path}: {what} must be an integer, got {x!r}")
    if isinstance(x, float | np.floating):
        if not math.isfinite(x) or x != int(x):
            raise UnsupportedModel(f"{path}: {what} must be an integer, got {x!r}")
        if not lo <= x <= hi:
            raise UnsupportedModel(f"{path}: {what} = {x!r} is out of range [{lo}, {hi}]")
        x = int(x)
    if not isinstance(x, int | np.integer):
        raise UnsupportedModel(f"{path}: {what} must be an integer, got {_show(x)}")
    if not lo <= int(x) <= hi:
        raise UnsupportedModel(f"{path}: {what} = {int(x)} is out of range [{lo}, {hi}]")
    return int(x)


def _int(v: Any, what: str, path: str, lo: int = 0, hi: int = MAX_KEY_INT) -> int:
    """A key's integer value (a per-layer array of one repeated value is that value), checked
    to lie in [lo, hi]; anything else is an UnsupportedModel naming the key."""
    if isinstance(v, list | tuple | np.ndarray):
        vals = {_one_int(x, what, path, lo, hi) for x in v}
        if len(vals) != 1:
            raise UnsupportedModel(f"{path}: per-layer {what} values {sorted(vals)[:8]} are not "
                                   "supported")
        return vals.pop()
    return _one_int(v, what, path, lo, hi)


@dataclass
class _LayerAttn:
    """One layer's attention shape and rope (gemma4 has two kinds of layers)."""

    sliding: bool
    head_dim: int
    n_head_kv: int
    n_rot: int
    rope_base: float
    freq_scale: float
    kv_from: int = 0  # 1 + the layer whose K/V it attends to (KV sharing), 0: its own


def _per_layer(v: Any, n_layer: int, what: str, path: str) -> list[int]:
    """A key that is a scalar or a per-layer array, as n_layer ints."""
    if isinstance(v, list | tuple | np.ndarray):
        if len(v) != n_layer:
            raise UnsupportedModel(f"{path}: {what} has {len(v)} values for {n_layer} layers")
        return [_one_int(x, what, path, 0, MAX_KEY_INT) for x in v]
    return [_one_int(v, what, path, 0, MAX_KEY_INT)] * n_layer


def gemma4_layer_attn(r: _Reader, n_layer: int, n_head: int, freq_scale: float
                   ) -> tuple[list[_LayerAttn], int]:
    """gemma4's per-layer attention (llama.cpp's reading): a per-layer sliding pattern, SWA
    layers with key_length_swa / rope.dimension_count_swa / rope.freq_base_swa, global layers
    with key_length / rope.dimension_count / rope.freq_base (and rope_freqs); head_count_kv
    scalar or per layer. Returns the layers and the sliding window. KV sharing
    (attention.shared_kv_layers, Gemma 4 E2B/E4B): each of the last shared layers attends to
    the K/V of the last layer of its kind (sliding or global) before them."""
    p = r.gf.path
    shared = r.int_key("attention.shared_kv_layers", 0, hi=n_layer)
    swa = r.int_key("attention.sliding_window", required=True)
    pattern = r.key("attention.sliding_window_pattern", required=True)
    if not isinstance(pattern, list | tuple | np.ndarray) or len(pattern) != n_layer:
        raise UnsupportedModel(
            f"{p}: gemma4.attention.sliding_window_pattern must be a per-layer array of "
            f"{n_layer} booleans"
        )
    hd = r.int_key("attention.key_length", required=True, lo=1)
    hd_swa = r.int_key("attention.key_length_swa", required=True, lo=1)
    for k, want in (("attention.value_length", hd), ("attention.value_length_swa", hd_swa)):
        if r.int_key(k, want) != want:
            raise UnsupportedModel(f"{p}: gemma4.{k} != the key length is not supported")
    rot = r.int_key("rope.dimension_count", hd)
    rot_swa = r.int_key("rope.dimension_count_swa", hd_swa)
    base = r.float_key("rope.freq_base", 10000.0, lo=0.0, lo_open=True)
    base_swa = r.float_key("rope.freq_base_swa", base, lo=0.0, lo_open=True)
    n_kv = _per_layer(r.key("attention.head_count_kv", n_head), n_layer, "head_count_kv", p)
    out = []
    for i in range(n_layer):
        if bool(pattern[i]):
            out.append(_LayerAttn(True, hd_swa, n_kv[i], rot_swa, base_swa, 1.0))
        else:
            out.append(_LayerAttn(False, hd, n_kv[i], rot, base, freq_scale))
        a = out[-1]
        if a.n_head_kv <= 0 or n_head % a.n_head_kv or a.n_rot > a.head_dim or a.n_rot % 2:
            raise UnsupportedModel(
                f"{p}: layer {i}: {a.n_head_kv} KV heads for {n_head} heads, {a.n_rot} rope "
                f"dims for head_dim {a.head_dim} are not supported"
            )
    first = n_layer - shared
    for i in range(first, n_layer):
        src = [j for j in range(first) if out[j].sliding == out[i].sliding]
        if not src:
            raise UnsupportedModel(f"{p}: layer {i} shares the K/V of an earlier layer of its "
                                   f"kind, and none of the first {first} layers is one")
        s = out[src[-1]]
        if (s.head_dim, s.n_head_kv) != (out[i].head_dim, out[i].n_head_kv):
            raise UnsupportedModel(f"{p}: layer {i} shares the K/V of layer {src[-1]}, of "
                                   "another shape")
        out[i].kv_from = src[-1] + 1
    return out, swa
