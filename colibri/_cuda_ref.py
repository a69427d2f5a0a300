"""NumPy references and data layouts for colibri's CUDA kernels (cuda/*.cu).

Nothing here needs a GPU or PyCUDA: the CUDA tests and ``tools/bench/cuda_check.py`` compare
the kernels against these functions, and the converter uses the int4-g128 quantizer.

* routing: :func:`route_reference` (float64 gating, top-k with ties to the lower expert id,
  selection bias for choosing only, renormalisation, scale) and :func:`group_reference`
  (per-expert counts, padded segments, the token list sorted by expert) mirror
  ``cuda/routing_logic.h`` and ``cuda/routing.cu``;
* weights: :func:`quantize_int4_g128` / :func:`dequantize_int4_g128` and the expert slot layout
  (:func:`pack_expert`, :func:`unpack_expert`, :func:`build_pool`) that ``cuda/moe_gemm.cu``
  reads, documented at the top of that file and in docs/ARCHITECTURE.md;
* the expert FFN: :func:`moe_ffn_reference` in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from colibri.arch import ACT_GELU_TANH, ACT_SILU, GATING_SIGMOID, GATING_SOFTMAX

GATINGS = {"softmax": GATING_SOFTMAX, "sigmoid": GATING_SIGMOID}
ACTIVATIONS = {"silu": ACT_SILU, "gelu_tanh": ACT_GELU_TANH}
WEIGHT_FORMATS = ("f16", "int4-g128")
INT4_GROUP = 128
SLOT_ALIGN = 256  # bytes; the kernels need 16, 256 keeps slots on cache-line pairs

__all__ = [
    "ACTIVATIONS",
    "GATINGS",
    "INT4_GROUP",
    "WEIGHT_FORMATS",
    "ExpertLayout",
    "activation",
    "build_pool",
    "dequantize_int4_g128",
    "group_reference",
    "matrix_bytes",
    "moe_ffn_reference",
    "pack_expert",
    "quantize_int4_g128",
    "route_reference",
    "routing_capacity",
    "unpack_expert",
]


# ---------------------------------------------------------------------------------- routing
def route_reference(
    logits: np.ndarray,
    k: int,
    gating: str = "softmax",
    bias: np.ndarray | None = None,
    renorm: bool = False,
    scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k routing of ``logits`` [n_tokens, n_experts] in float64.

    Returns ``(ids int32 [n_tokens, k], weights float64 [n_tokens, k])``; ids in descending
    order of the selection value (score + bias), ties to the lower expert id; weights are the
    unbiased scores of the chosen experts, renormalised to sum 1 when ``renorm``, times
    ``scale``.
    """
    lg = np.asarray(logits, dtype=np.float64)
    if lg.ndim != 2:
        raise ValueError(f"logits must be [n_tokens, n_experts], got shape {lg.shape}")
    n_experts = lg.shape[1]
    if not 1 <= k <= n_experts:
        raise ValueError(f"k={k} must be in [1, n_experts={n_experts}]")
    if gating == "softmax":
        ex = np.exp(lg - lg.max(axis=1, keepdims=True))
        score = ex / ex.sum(axis=1, keepdims=True)
    elif gating == "sigmoid":
        score = 1.0 / (1.0 + np.exp(-lg))
    else:
        raise ValueError(f"gating must be one of {sorted(GATINGS)}, got {gating!r}")
    sel = score if bias is None else score + np.asarray(bias, dtype=np.float64)[None, :]
    ids = np.argsort(-sel, axis=1, kind="stable")[:, :k].astype(np.int32)
    w = np.take_along_axis(score, ids.astype(np.intp), axis=1)
    if renorm:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, w * scale


def routing_capacity(n_tokens: int, k: int, n_experts: int, tile: int) -> int:
    """Rows the sorted token list needs for any routing: every pair, plus at most tile-1
    padding rows for each expert that gets at least one pair, rounded up to a tile."""
    pairs = n_tokens * k
    cap = pairs + min(n_experts, pairs) * (tile - 1)
    return max(tile, -(-cap // tile) * tile)


def group_reference(
    ids: np.ndarray, weights: np.ndarray, n_experts: int, tile: int, cap: int | None = None
) -> dict[str, np.ndarray]:
    """What cb_route_topk writes besides ids and weights, computed the obvious way.

    Keys: counts [E], seg_offset [E+1], sorted_token [cap] (-1 padding), sorted_weight [cap]
    (0 padding), pair_pos [T*k], tile_expert [cap/tile] (-1 past the end).
    """
    ids = np.asarray(ids)
    n_tokens, k = ids.shape
    if cap is None:
        cap = routing_capacity(n_tokens, k, n_experts, tile)
    counts = np.bincount(ids.ravel(), minlength=n_experts).astype(np.int32)
    padded = -(-counts // tile) * tile
    seg = np.zeros(n_experts + 1, dtype=np.int32)
    seg[1:] = np.cumsum(padded)
    sorted_token = np.full(cap, -1, dtype=np.int32)
    sorted_weight = np.zeros(cap, dtype=np.float64)
    pair_pos = np.full(n_tokens * k, -1, dtype=np.int32)
    tile_expert = np.full(cap // tile, -1, dtype=np.int32)
    fill = seg[:-1].copy()
    for t in range(n_tokens):  # ascending tokens: each segment ends up sorted by token
        for j in range(k):
            e = int(ids[t, j])
            row = fill[e]
            fill[e] += 1
            sorted_token[row] = t
            sorted_weight[row] = weights[t, j]
            pair_pos[t * k + j] = row
    for e in range(n_experts):
        tile_expert[seg[e] // tile : seg[e + 1] // tile] = e
    return {
        "counts": counts,
        "seg_offset": seg,
        "sorted_token": sorted_token,
        "sorted_weight": sorted_weight,
        "pair_pos": pair_pos,
        "tile_expert": tile_expert,
    }


# ---------------------------------------------------------------------------- int4-g128
def quantize_int4_g128(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize a [rows, cols] matrix (cols a multiple of 128) to int4 with one fp16 scale
    per row and group of 128 consecutive columns, symmetric: value = (q - 8) * scale.

    scale = fp16(max|w| / 7) of the group, q = clip(round(w / scale) + 8, 0, 15), so the
    group's largest magnitude maps to q = 1 or 15 and every value is within about scale / 2.
    Returns ``(quants uint8 [rows, cols/2], scales float16 [rows, cols/128])``: byte i of a
    row holds column 2i in its low nibble and column 2i+1 in its high nibble.
    """
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % INT4_GROUP:
        raise ValueError(f"int4-g128 needs a 2-D matrix with cols % 128 == 0, got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("int4-g128: the matrix holds NaN or infinite values")
    rows, cols = w.shape
    g = w.reshape(rows, cols // INT4_GROUP, INT4_GROUP)
    with np.errstate(over="ignore"):
        scales = (np.abs(g).max(axis=2) / 7.0).astype(np.float16)
    if not np.all(np.isfinite(scales)):
        raise ValueError("int4-g128: a group's scale overflows fp16 (|w| above about 458000)")
    s32 = scales.astype(np.float32)[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s32 > 0, np.rint(g / np.where(s32 > 0, s32, 1.0)), 0.0)
    q = (np.clip(q, -8, 7) + 8).astype(np.uint8).reshape(rows, cols)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed, scales


def dequantize_int4_g128(quants: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The values the kernels use: fp16((q - 8) * scale) as float32, [rows, cols]."""
    quants = np.asarray(quants, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.float16)
    rows, half = quants.shape
    cols = half * 2
    if scales.shape != (rows, cols // INT4_GROUP):
        raise ValueError(f"scales shape {scales.shape} does not match quants {quants.shape}")
    q = np.empty((rows, cols), dtype=np.int32)
    q[:, 0::2] = quants & 0x0F
    q[:, 1::2] = quants >> 4
    s = np.repeat(scales.astype(np.float32), INT4_GROUP, axis=1)
    return ((q - 8).astype(np.float32) * s).astype(np.float16).astype(np.float32)


# --------------------------------------------------------------------------- expert slots
def matrix_bytes(rows: int, cols: int, fmt: str) -> int:
    """Bytes of one [rows, cols] weight matrix in the pool format ``fmt``."""
    if fmt == "f16":
        return rows * cols * 2
    if fmt == "int4-g128":
        if cols % INT4_GROUP:
            raise ValueError(f"int4-g128 needs cols % 128 == 0, got {cols}")
        return rows * cols // 2 + rows * (cols // INT4_GROUP) * 2
    raise ValueError(f"weight format must be one of {WEIGHT_FORMATS}, got {fmt!r}")


@dataclass(frozen=True)
class ExpertLayout:
    """Shape and format of the experts in a pool: hidden size D, expert FFN size F.

    A slot holds gate [F, D], up [F, D], down [D, F], each ``matrix_bytes`` long, in that
    order; ``slot_bytes`` rounds the three up to SLOT_ALIGN.
    """

    hidden: int
    ffn: int
    fmt: str = "f16"

    def __post_init__(self) -> None:
        if self.fmt not in WEIGHT_FORMATS:
            raise ValueError(f"weight format must be one of {WEIGHT_FORMATS}, got {self.fmt!r}")
        mult = INT4_GROUP if self.fmt == "int4-g128" else 64  # the m16 kernels' K slice
        for name, v in (("hidden", self.hidden), ("ffn", self.ffn)):
            if v <= 0 or v % mult:
                raise ValueError(f"{name}={v} must be a positive multiple of {mult} for {self.fmt}")

    @property
    def matrix_bytes(self) -> int:
        return matrix_bytes(self.ffn, self.hidden, self.fmt)

    @property
    def slot_bytes(self) -> int:
        return -(-3 * self.matrix_bytes // SLOT_ALIGN) * SLOT_ALIGN


def _matrix_to_bytes(w: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "f16":
        return np.ascontiguousarray(w, dtype=np.float16).view(np.uint8).ravel()
    q, s = quantize_int4_g128(w)
    return np.concatenate([q.ravel(), s.view(np.uint8).ravel()])


def pack_expert(
    gate: np.ndarray, up: np.ndarray, down: np.ndarray, layout: ExpertLayout
) -> np.ndarray:
    """One expert slot (uint8 [layout.slot_bytes]) from float weights gate/up [F, D] and
    down [D, F], converted (fp16) or quantized (int4-g128) to ``layout.fmt``."""
    d, f = layout.hidden, layout.ffn
    for name, m, shape in (("gate", gate, (f, d)), ("up", up, (f, d)), ("down", down, (d, f))):
        if np.shape(m) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {np.shape(m)}")
    slot = np.zeros(layout.slot_bytes, dtype=np.uint8)
    mb = layout.matrix_bytes
    for i, m in enumerate((gate, up, down)):
        slot[i * mb : (i + 1) * mb] = _matrix_to_bytes(m, layout.fmt)
    return slot


def unpack_expert(
    slot: np.ndarray, layout: ExpertLayout
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (gate, up, down) float32 weights that a slot holds, exactly as the kernels see
    them (fp16 values, or int4 dequantized and rounded to fp16)."""
    d, f = layout.hidden, layout.ffn
    mb = layout.matrix_bytes
    slot = np.asarray(slot, dtype=np.uint8)
    if slot.size < 3 * mb:
        raise ValueError(f"slot has {slot.size} bytes, the layout needs {3 * mb}")
    out = []
    for i, (rows, cols) in enumerate(((f, d), (f, d), (d, f))):
        b = slot[i * mb : (i + 1) * mb]
        if layout.fmt == "f16":
            out.append(b.view(np.float16).reshape(rows, cols).astype(np.float32))
        else:
            nq = rows * cols // 2
            q = b[:nq].reshape(rows, cols // 2)
            s = b[nq:].view(np.float16).reshape(rows, cols // INT4_GROUP)
            out.append(dequantize_int4_g128(q, s))
    return out[0], out[1], out[2]


def build_pool(
    experts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], layout: ExpertLayout
) -> tuple[np.ndarray, np.ndarray]:
    """Pack experts into one pool: ``(pool uint8 [n * slot_bytes], offsets int64 [n])``,
    expert e in slot e. (The expert store fills its own slots in any order; the kernels only
    read ``offsets``.)"""
    sb = layout.slot_bytes
    pool = np.zeros(len(experts) * sb, dtype=np.uint8)
    for e, (g, u, dn) in enumerate(experts):
        pool[e * sb : (e + 1) * sb] = pack_expert(g, u, dn, layout)
    return pool, np.arange(len(experts), dtype=np.int64) * sb


# ------------------------------------------------------------------------------ expert FFN
def activation(x: np.ndarray, name: str) -> np.ndarray:
    """SiLU or tanh-approximated GELU, in the input's precision."""
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))
    raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")


def moe_ffn_reference(
    x: np.ndarray,
    experts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    ids: np.ndarray,
    weights: np.ndarray,
    act: str = "silu",
) -> np.ndarray:
    """out[t] = sum_j weights[t, j] * down_e (act(gate_e x_t) * (up_e x_t)), e = ids[t, j],
    in float64. ``experts[e]`` = (gate [F, D], up [F, D], down [D, F])."""
    x64 = np.asarray(x, dtype=np.float64)
    ids = np.asarray(ids)
    out = np.zeros((x64.shape[0], x64.shape[1]), dtype=np.float64)
    for e in np.unique(ids):
        if e < 0:
            continue
        rows, slots = np.nonzero(ids == e)
        g, u, dn = (np.asarray(m, dtype=np.float64) for m in experts[int(e)])
        xe = x64[rows]
        h = activation(xe @ g.T, act) * (xe @ u.T)
        np.add.at(out, rows, (h @ dn.T) * np.asarray(weights, np.float64)[rows, slots][:, None])
    return out
