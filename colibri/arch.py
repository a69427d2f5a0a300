"""Architectures as data: from a validated GGUF file to the model description the C forward pass
runs (include/colibri/forward.h).

Every supported `general.architecture` is one entry of FAMILIES: its quirks are fields (RoPE
pairing, q/k norm kind, activation, gating and renormalisation, embedding scale, which norms
exist), read together with the standard GGUF keys. Nothing here computes; it only finds
tensors, checks their shapes and types, and hands pointers (numpy views of the file mapping)
to C. The behaviour follows llama.cpp's for each family (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colibri._core import _forward, _ops, _quant
from colibri.gguf import GGUFError, GGUFFile, TensorInfo

# enum values of ops.h, forward.h, quant.h and routing_logic.h as plain ints, read from the headers
ACT_SILU, ACT_GELU_TANH = int(_ops.cb_act.CB_ACT_SILU), int(_ops.cb_act.CB_ACT_GELU_TANH)
QK_NONE, QK_HEAD, QK_FULL = (int(_forward.cb_qk_norm[f"CB_QK_NORM_{k}"]) for k in ("NONE", "HEAD", "FULL"))
ROPE_NORMAL, ROPE_NEOX = int(_ops.cb_rope_mode.CB_ROPE_NORMAL), int(_ops.cb_rope_mode.CB_ROPE_NEOX)
GATING_SOFTMAX, GATING_SIGMOID = _forward.GATING_SOFTMAX, _forward.GATING_SIGMOID
F32 = int(_quant.cb_type.CB_TYPE_F32)
MAX_KEY_INT = 2**31 - 1  # sizes and counts reach C as int32
MAX_LAYERS = 1 << 16
MAX_EXPERTS = 1 << 20


@dataclass(frozen=True)
class Family:
    rope_mode: int = ROPE_NEOX
    act: int = ACT_SILU
    qk_norm: int = QK_NONE
    renorm: bool = True          # renormalise the top-k expert weights
    gating: int = GATING_SOFTMAX
    embd_scale: bool = False     # multiply token embeddings by sqrt(n_embd)
    post_norms: bool = False     # gemma: norms after attention and FFN
    swa_pattern: int = 0         # gemma3: every n-th layer is global, the others sliding
    swa_rope_base: float = 0.0   # rope base of sliding-window layers (0: same as global)
    moe: bool = False            # the family can have experts
    shared_expert: bool = False
    gemma4: bool = False         # gemma4: per-layer head dims and rope, V norm, MoE beside the MLP


FAMILIES: dict[str, Family] = {
    "llama": Family(rope_mode=ROPE_NORMAL, moe=True, renorm=True),
    "qwen2": Family(),
    "qwen2moe": Family(moe=True, renorm=False, shared_expert=True),
    "qwen3": Family(qk_norm=QK_HEAD),
    "qwen3moe": Family(qk_norm=QK_HEAD, moe=True, renorm=True),
    "olmoe": Family(qk_norm=QK_FULL, moe=True, renorm=False),
    "gemma3": Family(
        act=ACT_GELU_TANH, qk_norm=QK_HEAD, embd_scale=True, post_norms=True, swa_pattern=6,
        swa_rope_base=10000.0,
    ),
    # gemma4's layer pattern, head dims, rope bases/dims come from per-layer keys (see _gemma4)
    "gemma4": Family(
        act=ACT_GELU_TANH, qk_norm=QK_HEAD, embd_scale=True, post_norms=True, moe=True,
        renorm=True, gemma4=True,
    ),
}


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


@dataclass
class LayerDesc:
    attn_norm: np.ndarray
    wq: Mat
    wk: Mat
    wv: Mat
    wo: Mat
    ffn_norm: np.ndarray
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    attn_post_norm: np.ndarray | None = None
    ffn_post_norm: np.ndarray | None = None
    sliding_window: int = 0
    rope_base: float = 10000.0
    rope_freq_scale: float = 1.0
    ffn_gate: Mat | None = None
    ffn_up: Mat | None = None
    ffn_down: Mat | None = None
    n_expert: int = 0
    n_expert_used: int = 0
    router: Mat | None = None
    router_bias: np.ndarray | None = None
    n_ff_exp: int = 0
    experts: ExpertTensors | None = None
    sh_gate: Mat | None = None
    sh_up: Mat | None = None
    sh_down: Mat | None = None
    sh_gate_inp: Mat | None = None
    # per-layer attention shape (0: the model's), rope frequency divisors, gemma4 extras
    n_head_kv: int = 0
    head_dim: int = 0
    rope_n_dims: int = 0
    rope_freqs: np.ndarray | None = None
    v_norm: bool = False
    v_from_k: bool = False
    out_scale: np.ndarray | None = None
    ffn_post_norm_1: np.ndarray | None = None
    ffn_pre_norm_2: np.ndarray | None = None
    ffn_post_norm_2: np.ndarray | None = None
    router_in_scale: np.ndarray | None = None
    exp_down_scale: np.ndarray | None = None


@dataclass
class ModelDesc:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    act: int
    qk_norm: int
    rope_mode: int
    rope_n_dims: int
    embd_scale: float
    attn_scale: float
    attn_softcap: float
    final_softcap: float
    gating: int
    expert_renorm: bool
    expert_scale: float
    tok_embd: Mat
    output_norm: np.ndarray
    output: Mat
    layers: list[LayerDesc] = field(default_factory=list)

    @property
    def is_moe(self) -> bool:
        return any(layer.n_expert > 0 for layer in self.layers)

    def kv_values_per_token(self) -> int:
        """K and V values one token keeps in the cache, over all layers."""
        return sum(2 * (L.n_head_kv or self.n_head_kv) * (L.head_dim or self.head_dim)
                   for L in self.layers)

    def kv_bytes_per_token(self, kv_dtype: str = "f32") -> int:
        return self.kv_values_per_token() * (4 if kv_dtype == "f32" else 2)

    def kv_dims(self) -> tuple[int, int, int]:
        """(n_layers, n_kv_heads, head_dim) to make the KV cache with: the model's when every
        layer has the same shape, else one flat row per token that the forward splits by layer
        (gemma4's sliding and global layers differ)."""
        if all(L.n_head_kv in (0, self.n_head_kv) and L.head_dim in (0, self.head_dim)
               for L in self.layers):
            return self.n_layer, self.n_head_kv, self.head_dim
        return 1, 1, self.kv_values_per_token() // 2

    def dense_bytes(self) -> int:
        """Bytes of every tensor except the routed experts."""
        return self._bytes(experts=False)

    def expert_bytes(self) -> int:
        return self._bytes(experts=True)

    def _bytes(self, experts: bool) -> int:
        total = 0
        seen: set[int] = set()

        def add(a: np.ndarray | None) -> None:
            nonlocal total
            if a is not None and id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes

        if not experts:
            add(self.tok_embd.data)
            if self.output.data is not self.tok_embd.data:
                add(self.output.data)
            add(self.output_norm)
        for layer in self.layers:
            if experts:
                if layer.experts:  # from the shapes: a container's base views span padding
                    X = layer.experts
                    total += layer.n_expert * sum(m.rows * m.row_bytes
                                                  for m in (X.gate, X.up, X.down))
                continue
            for v in vars(layer).values():
                if isinstance(v, Mat):
                    add(v.data)
                elif isinstance(v, np.ndarray):
                    add(v)
        return total


def _dequantized(raw: np.ndarray, type_: int, n: int) -> np.ndarray:
    """A tensor's bytes dequantized to float32, viewed as bytes (gguf's reference dequantizers)."""
    from gguf import GGMLQuantizationType, quants

    a = np.ascontiguousarray(quants.dequantize(raw, GGMLQuantizationType(type_)).reshape(-1),
                             dtype=np.float32)
    assert a.size == n
    return a.view(np.uint8)


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
    def __init__(self, gf: GGUFFile, arch: str, dequantize: bool = False):
        self.gf = gf
        self.arch = arch
        self.dequantize = dequantize
        self.md = gf.metadata
        self.keep: list[Any] = []  # arrays made here (dequantized vectors)

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
        from gguf import GGMLQuantizationType, quants

        arr = np.ascontiguousarray(
            quants.dequantize(raw, GGMLQuantizationType(t.type)).reshape(-1), dtype=np.float32
        )
        self.keep.append(arr)
        return arr

    def mat(self, name: str, rows: int, cols: int, required: bool = True) -> Mat | None:
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
        return Mat(t.type, rows, cols, t.row_nbytes, self.gf.data(name))

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


def _per_layer(v: Any, n_layer: int, what: str, path: str) -> list[int]:
    """A key that is a scalar or a per-layer array, as n_layer ints."""
    if isinstance(v, list | tuple | np.ndarray):
        if len(v) != n_layer:
            raise UnsupportedModel(f"{path}: {what} has {len(v)} values for {n_layer} layers")
        return [_one_int(x, what, path, 0, MAX_KEY_INT) for x in v]
    return [_one_int(v, what, path, 0, MAX_KEY_INT)] * n_layer


def _gemma4_layers(r: _Reader, n_layer: int, n_head: int, freq_scale: float
                   ) -> tuple[list[_LayerAttn], int]:
    """gemma4's per-layer attention (llama.cpp's reading): a per-layer sliding pattern, SWA
    layers with key_length_swa / rope.dimension_count_swa / rope.freq_base_swa, global layers
    with key_length / rope.dimension_count / rope.freq_base (and rope_freqs); head_count_kv
    scalar or per layer. Returns the layers and the sliding window. Per-layer embeddings and
    KV sharing are refused by name."""
    p = r.gf.path
    ple = r.int_key("embedding_length_per_layer_input", 0)
    if ple > 0 or r.has("per_layer_token_embd.weight"):
        raise UnsupportedModel(
            f"{p}: gemma4 per-layer embeddings (gemma4.embedding_length_per_layer_input = {ple}, "
            f"tensor per_layer_token_embd.weight) are not supported"
        )
    shared = r.int_key("attention.shared_kv_layers", 0)
    if shared > 0:
        raise UnsupportedModel(
            f"{p}: gemma4 KV sharing (gemma4.attention.shared_kv_layers = {shared}) is not supported"
        )
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
    return out, swa


def describe(gf: GGUFFile, dequantize: bool = False) -> ModelDesc:
    """Build the model description of a GGUF file, or raise UnsupportedModel naming what is
    missing or not supported. dequantize=True expands every matrix to float32 at load (4 bytes
    per weight; exact products, used to compare implementations without the rounding of 8-bit
    activations)."""
    arch = gf.architecture
    if arch is None:
        raise UnsupportedModel(f"{gf.path}: no general.architecture key: not a model file")
    fam = FAMILIES.get(arch)
    if fam is None:
        raise UnsupportedModel(
            f"{gf.path}: architecture {arch!r} is not supported; supported: "
            f"{', '.join(sorted(FAMILIES))}"
        )
    r = _Reader(gf, arch, dequantize)
    p = gf.path
    n_embd = r.int_key("embedding_length", required=True, lo=1)
    n_layer = r.int_key("block_count", required=True, lo=1, hi=MAX_LAYERS)
    n_head = r.int_key("attention.head_count", required=True, lo=1)
    g4: list[_LayerAttn] | None = None
    if fam.gemma4:
        g4, _ = _gemma4_layers(r, n_layer, n_head, 1.0)
        # the model-level shape: the first layer's (the per-layer values override it)
        n_head_kv, head_dim, n_rot = g4[0].n_head_kv, g4[0].head_dim, g4[0].n_rot
    else:
        n_head_kv = r.int_key("attention.head_count_kv", n_head, lo=1)
        if n_embd < n_head:
            raise UnsupportedModel(f"{p}: {arch}.embedding_length {n_embd} is smaller than the "
                                   f"{n_head} attention heads")
        head_dim = r.int_key("attention.key_length", n_embd // n_head, lo=1)
        v_dim = r.int_key("attention.value_length", head_dim, lo=1)
        if v_dim != head_dim:
            raise UnsupportedModel(f"{p}: key_length {head_dim} != value_length {v_dim} is not supported")
        n_rot = r.int_key("rope.dimension_count", head_dim)
        if n_rot > head_dim or n_rot % 2:
            raise UnsupportedModel(f"{p}: {arch}.rope.dimension_count {n_rot} must be even and at "
                                   f"most the head dimension {head_dim}")
    # the norm epsilon: positive and finite (NaN or 0 would make every norm NaN / infinite)
    eps = r.float_key("attention.layer_norm_rms_epsilon", required=True, lo=0.0, hi=1.0,
                      lo_open=True)
    n_ctx = r.int_key("context_length", 4096)
    rope_base = r.float_key("rope.freq_base", 10000.0, lo=0.0, lo_open=True)
    scaling_type = r.key("rope.scaling.type", "none")
    if not isinstance(scaling_type, str):
        raise UnsupportedModel(f"{p}: {arch}.rope.scaling.type must be a string, got "
                               f"{_show(scaling_type)}")
    factor = r.float_key("rope.scaling.factor", 0.0, lo=0.0, hi=1e6)
    if scaling_type not in ("none", "linear") and factor not in (0.0, 1.0):
        raise UnsupportedModel(f"{p}: rope scaling {scaling_type!r} is not supported")
    freq_scale = 1.0 / factor if factor > 0 else 1.0
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv or n_embd <= 0 or n_layer <= 0:
        raise UnsupportedModel(f"{p}: bad attention sizes: {n_head} heads, {n_head_kv} KV heads")

    tok = r.info("token_embd.weight")
    n_vocab = tok.shape[1] if len(tok.shape) == 2 else 0
    tok_embd = r.mat("token_embd.weight", n_vocab, n_embd)
    assert tok_embd is not None
    output = r.mat("output.weight", n_vocab, n_embd, required=False) or tok_embd
    output_norm = r.vec("output_norm.weight", n_embd)
    assert output_norm is not None

    n_expert = r.int_key("expert_count", 0, hi=MAX_EXPERTS)
    n_used = r.int_key("expert_used_count", 0, hi=MAX_EXPERTS)
    if n_expert and not fam.moe:
        raise UnsupportedModel(f"{p}: {arch} with experts is not supported")
    if n_expert and not 1 <= n_used <= n_expert:
        raise UnsupportedModel(f"{p}: {arch}.expert_used_count {n_used} must be in [1, "
                               f"{arch}.expert_count = {n_expert}]")
    swa = r.int_key("attention.sliding_window", 0)
    pattern_layers = gf.metadata.get(f"{arch}.attention.sliding_window_pattern_layers")
    if not isinstance(pattern_layers, list | tuple | np.ndarray):
        pattern_layers = None

    # rope_freqs: per-pair frequency divisors (llama3-style scaling; gemma4's proportional
    # rope of the global layers), n_rot/2 values; gemma4 uses them on global layers only
    rope_rot = n_rot if g4 is None else next((a.n_rot for a in g4 if not a.sliding), n_rot)
    rope_freqs = r.vec("rope_freqs.weight", rope_rot // 2, required=False)

    layers = []
    for i in range(n_layer):
        b = f"blk.{i}."
        hd_i, nkv_i = (head_dim, n_head_kv) if g4 is None else (g4[i].head_dim, g4[i].n_head_kv)
        nq, nkv = n_head * hd_i, nkv_i * hd_i
        attn_norm = r.vec(b + "attn_norm.weight", n_embd)
        ffn_norm_name = b + "ffn_norm.weight"
        if not r.has(ffn_norm_name) and r.has(b + "post_attention_norm.weight") and not fam.post_norms:
            ffn_norm_name = b + "post_attention_norm.weight"
        ffn_norm = r.vec(ffn_norm_name, n_embd)
        wq, wk = r.mat(b + "attn_q.weight", nq, n_embd), r.mat(b + "attn_k.weight", nkv, n_embd)
        # gemma4 attention_k_eq_v: no attn_v, V is the K projection
        wv = r.mat(b + "attn_v.weight", nkv, n_embd, required=g4 is None)
        wo = r.mat(b + "attn_output.weight", n_embd, nq)
        assert attn_norm is not None and ffn_norm is not None
        assert wq is not None and wk is not None and wo is not None
        L = LayerDesc(attn_norm=attn_norm, wq=wq, wk=wk, wv=wv or Mat(F32, 0, 0, 0, None), wo=wo,
                      ffn_norm=ffn_norm)
        L.v_from_k = wv is None
        L.bq = r.vec(b + "attn_q.bias", nq, required=False)
        L.bk = r.vec(b + "attn_k.bias", nkv, required=False)
        L.bv = r.vec(b + "attn_v.bias", nkv, required=False)
        L.bo = r.vec(b + "attn_output.bias", n_embd, required=False)
        if fam.qk_norm == QK_HEAD:
            L.q_norm = r.vec(b + "attn_q_norm.weight", hd_i)
            L.k_norm = r.vec(b + "attn_k_norm.weight", hd_i)
        elif fam.qk_norm == QK_FULL:
            L.q_norm = r.vec(b + "attn_q_norm.weight", nq)
            L.k_norm = r.vec(b + "attn_k_norm.weight", nkv)
        if fam.post_norms:
            L.attn_post_norm = r.vec(b + "post_attention_norm.weight", n_embd)
            L.ffn_post_norm = r.vec(b + "post_ffw_norm.weight", n_embd)
        L.rope_base, L.rope_freq_scale, L.rope_freqs = rope_base, freq_scale, rope_freqs
        if g4 is not None:
            a = g4[i]
            L.n_head_kv, L.head_dim, L.rope_n_dims = a.n_head_kv, a.head_dim, a.n_rot
            L.rope_base, L.v_norm = a.rope_base, True
            if a.sliding:
                L.sliding_window, L.rope_freq_scale, L.rope_freqs = swa, 1.0, None
            L.out_scale = r.vec(b + "layer_output_scale.weight", 1, required=False)
        elif fam.swa_pattern and swa > 0:
            if pattern_layers is not None and len(pattern_layers) == n_layer:
                sliding = bool(pattern_layers[i])
            else:
                sliding = (i + 1) % fam.swa_pattern != 0
            if sliding:
                L.sliding_window = swa
                L.rope_base, L.rope_freq_scale = fam.swa_rope_base or rope_base, 1.0
        if n_expert and r.has(b + "ffn_gate_inp.weight"):
            exp_name = b + ("ffn_gate_up_exps.weight" if r.has(b + "ffn_gate_up_exps.weight")
                            else "ffn_gate_exps.weight")
            ff_guess = r.dims(exp_name, 3)[1] // (2 if "gate_up" in exp_name else 1)
            n_ff_exp = r.int_key("expert_feed_forward_length", 0) or ff_guess
            L.n_expert, L.n_expert_used, L.n_ff_exp = n_expert, n_used, n_ff_exp
            L.router = r.mat(b + "ffn_gate_inp.weight", n_expert, n_embd)
            L.router_bias = r.vec(b + "exp_probs_b.bias", n_expert, required=False)
            L.experts = r.experts(i, n_expert, n_embd, n_ff_exp)
            if fam.shared_expert and r.has(b + "ffn_gate_shexp.weight"):
                ff_sh = r.dims(b + "ffn_gate_shexp.weight", 2)[1]
                L.sh_gate = r.mat(b + "ffn_gate_shexp.weight", ff_sh, n_embd)
                L.sh_up = r.mat(b + "ffn_up_shexp.weight", ff_sh, n_embd)
                L.sh_down = r.mat(b + "ffn_down_shexp.weight", n_embd, ff_sh)
                L.sh_gate_inp = r.mat(b + "ffn_gate_inp_shexp.weight", 1, n_embd, required=False)
            if g4 is not None:
                # the MoE block beside the dense MLP: its norms, router input scale and
                # per-expert output scale
                ff = r.dims(b + "ffn_gate.weight", 2)[1]
                L.ffn_gate = r.mat(b + "ffn_gate.weight", ff, n_embd)
                L.ffn_up = r.mat(b + "ffn_up.weight", ff, n_embd)
                L.ffn_down = r.mat(b + "ffn_down.weight", n_embd, ff)
                L.ffn_post_norm_1 = r.vec(b + "post_ffw_norm_1.weight", n_embd)
                L.ffn_pre_norm_2 = r.vec(b + "pre_ffw_norm_2.weight", n_embd)
                L.ffn_post_norm_2 = r.vec(b + "post_ffw_norm_2.weight", n_embd)
                L.router_in_scale = r.vec(b + "ffn_gate_inp.scale", n_embd)
                L.exp_down_scale = r.vec(b + "ffn_down_exps.scale", n_expert, required=False)
        else:
            ff = r.dims(b + "ffn_gate.weight", 2)[1]
            L.ffn_gate = r.mat(b + "ffn_gate.weight", ff, n_embd)
            L.ffn_up = r.mat(b + "ffn_up.weight", ff, n_embd)
            L.ffn_down = r.mat(b + "ffn_down.weight", n_embd, ff)
        layers.append(L)

    desc = ModelDesc(
        arch=arch, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_vocab=n_vocab, n_ctx_train=n_ctx, norm_eps=eps, act=fam.act,
        qk_norm=fam.qk_norm, rope_mode=fam.rope_mode, rope_n_dims=n_rot,
        embd_scale=math.sqrt(n_embd) if fam.embd_scale else 1.0,
        attn_scale=1.0 if fam.gemma4 else 1.0 / math.sqrt(head_dim),
        attn_softcap=r.float_key("attn_logit_softcapping", 0.0, lo=0.0),
        # llama.cpp caps gemma4's logits at 30 when the key is absent
        final_softcap=r.float_key("final_logit_softcapping", 30.0 if fam.gemma4 else 0.0, lo=0.0),
        gating=fam.gating, expert_renorm=fam.renorm, expert_scale=1.0,
        tok_embd=tok_embd, output_norm=output_norm, output=output, layers=layers,
    )
    desc._keep = r.keep  # type: ignore[attr-defined]
    return desc


def open_model(path: str, dequantize: bool = False) -> tuple[GGUFFile, ModelDesc]:
    """Open and describe a model file; errors are GGUFError / UnsupportedModel (ValueErrors)."""
    from colibri.container import open_model_file  # a GGUF or a colibri container, by magic

    gf = open_model_file(path)
    try:
        return gf, describe(gf, dequantize)
    except (GGUFError, UnsupportedModel):
        gf.close()
        raise
