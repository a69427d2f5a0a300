"""Multi-head latent attention (deepseek2: DeepSeek-V2/V3/R1, Kimi K2) and YaRN, read from a
GGUF file as llama.cpp reads them (src/models/deepseek2.cpp, llama-context.cpp); the forward
pass's MLA kind is colibri/_core/forward_mla.c.

A file written by llama.cpp's converter since 2025 stores the absorbed form: `attn_k_b` [n_head
x kv_lora x nope] and `attn_v_b` [n_head x v x kv_lora], with `attention.key_length_mla` (nope +
rope) and `value_length_mla` (v) beside key_length = kv_lora + rope. Older files have the one
`attn_kv_b` [n_head*(nope + v) x kv_lora]: it is split into the same two here, in float32 (the
product is the same; llama.cpp runs those files as full multi-head attention with a full K/V
cache, colibri keeps the latent cache for both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.arch_read import F32, Mat, UnsupportedModel, _dequantized, _dequantized_f32, _Reader


@dataclass(frozen=True)
class MlaDims:
    kv_lora: int
    q_lora: int   # 0: the queries come from attn_q directly (V2-Lite)
    nope: int
    rope: int
    v: int
    split: bool   # attn_k_b / attn_v_b in the file (else the legacy attn_kv_b)

    @property
    def head_dim(self) -> int:
        return self.nope + self.rope


def mla_dims(r: _Reader, n_head: int) -> MlaDims:
    """The MLA sizes of a deepseek2 file (UnsupportedModel when inconsistent)."""
    p = r.gf.path
    kv_lora = r.int_key("attention.kv_lora_rank", required=True, lo=2, hi=1 << 16)
    q_lora = r.int_key("attention.q_lora_rank", 0, hi=1 << 16)
    rope = r.int_key("rope.dimension_count", required=True, lo=2, hi=1 << 12)
    split = r.has("blk.0.attn_k_b.weight")
    if split:
        hd = r.int_key("attention.key_length_mla", required=True, lo=rope + 1, hi=1 << 12)
        v = r.int_key("attention.value_length_mla", required=True, lo=1, hi=1 << 12)
    else:  # legacy files: key_length and value_length are the per-head ones
        hd = r.int_key("attention.key_length", required=True, lo=rope + 1, hi=1 << 12)
        v = r.int_key("attention.value_length", required=True, lo=1, hi=1 << 12)
    if rope % 2 or kv_lora + rope > 1024 or v > 1024:
        raise UnsupportedModel(f"{p}: MLA with kv_lora_rank {kv_lora}, {rope} rope dims and "
                               f"value length {v} is not supported (rope even, kv_lora + rope "
                               f"and v at most 1024)")
    del n_head
    return MlaDims(kv_lora, q_lora, hd - rope, rope, v, split)


def mla_layer(r: _Reader, i: int, n_embd: int, n_head: int, d: MlaDims) -> dict[str, Any]:
    """The MLA fields of layer i's description (forward.h: wq or wq_a/q_a_norm/wq_b, wkv_a,
    kv_a_norm, wk_b, wv_b, wo and the sizes)."""
    b = f"blk.{i}."
    f: dict[str, Any] = dict(mla_kv_lora=d.kv_lora, mla_nope=d.nope, mla_v_dim=d.v,
                             n_head_kv=1, head_dim=d.head_dim, rope_n_dims=d.rope)
    if d.q_lora:
        f["wq_a"] = r.mat(b + "attn_q_a.weight", d.q_lora, n_embd)
        f["q_a_norm"] = r.vec(b + "attn_q_a_norm.weight", d.q_lora)
        f["wq_b"] = r.mat(b + "attn_q_b.weight", n_head * d.head_dim, d.q_lora)
    else:
        f["wq"] = r.mat(b + "attn_q.weight", n_head * d.head_dim, n_embd)
    f["wkv_a"] = r.mat(b + "attn_kv_a_mqa.weight", d.kv_lora + d.rope, n_embd)
    f["kv_a_norm"] = r.vec(b + "attn_kv_a_norm.weight", d.kv_lora)
    if d.split:
        f["wk_b"] = _stacked(r, b + "attn_k_b.weight", n_head, d.kv_lora, d.nope)
        f["wv_b"] = _stacked(r, b + "attn_v_b.weight", n_head, d.v, d.kv_lora)
    else:
        f["wk_b"], f["wv_b"] = _split_kv_b(r, b + "attn_kv_b.weight", n_head, d)
    f["wo"] = r.mat(b + "attn_output.weight", n_embd, n_head * d.v)
    return f


def _stacked(r: _Reader, name: str, n: int, rows: int, cols: int) -> Mat:
    """A [n x rows x cols] tensor as one matrix of n*rows rows (head h's block from row h*rows),
    read through the mapping (never re-laid: the forward slices it by rows)."""
    if not r.has(name):
        raise UnsupportedModel(f"{r.gf.path}: required tensor {name!r} is missing")
    t = r.info(name)
    if list(t.shape) != [cols, rows, n]:
        raise UnsupportedModel(f"{r.gf.path}: tensor {name!r} has shape {list(t.shape)}, "
                               f"expected {[cols, rows, n]} (GGUF order)")
    raw = r.gf.data(name)
    if r.dequantize and t.type != F32:
        data = _dequantized(raw, t.type, n * rows * cols)
        r.keep.append(data)
        return Mat(F32, n * rows, cols, cols * 4, data)
    return Mat(t.type, n * rows, cols, t.row_nbytes, raw)


def _split_kv_b(r: _Reader, name: str, n_head: int, d: MlaDims) -> tuple[Mat, Mat]:
    """The legacy attn_kv_b [n_head*(nope + v) x kv_lora] as wk_b (each head's K rows
    transposed: [kv_lora x nope]) and wv_b (its V rows), in float32."""
    if not r.has(name):
        raise UnsupportedModel(f"{r.gf.path}: required tensor {name!r} (or attn_k_b and "
                               f"attn_v_b) is missing")
    t = r.info(name)
    rows = n_head * (d.nope + d.v)
    if list(t.shape) != [d.kv_lora, rows]:
        raise UnsupportedModel(f"{r.gf.path}: tensor {name!r} has shape {list(t.shape)}, "
                               f"expected {[d.kv_lora, rows]} (GGUF order)")
    w = _dequantized_f32(r.gf.data(name), t.type, rows * d.kv_lora).reshape(
        n_head, d.nope + d.v, d.kv_lora)
    kb = np.ascontiguousarray(w[:, :d.nope, :].transpose(0, 2, 1)).reshape(-1).view(np.uint8)
    vb = np.ascontiguousarray(w[:, d.nope:, :]).reshape(-1).view(np.uint8)
    r.keep.extend((kb, vb))
    return (Mat(F32, n_head * d.kv_lora, d.nope, d.nope * 4, kb),
            Mat(F32, n_head * d.v, d.kv_lora, d.kv_lora * 4, vb))


@dataclass(frozen=True)
class Yarn:
    ext_factor: float = 0.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    attn_factor: float = 1.0  # the rope's magnitude factor (before ggml's own YaRN mscale)


def _mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0


def log_mul(r: _Reader, arch: str) -> float:
    """rope.scaling.yarn_log_multiplier as llama.cpp uses it (deepseek2: mscale_all_dim; its
    converter wrote 0.1 times that)."""
    v = r.float_key("rope.scaling.yarn_log_multiplier", 0.0, lo=0.0, hi=1e3)
    return v / 0.1 if arch == "deepseek2" else v


def yarn(r: _Reader, arch: str, n_ctx: int, freq_scale: float, rope_attn_factor: float) -> Yarn:
    """YaRN's parameters when rope.scaling.type is "yarn", as llama.cpp sets them up
    (llama-context.cpp): the extrapolation mix 1, the ramp's betas, the original context, and
    the rope's attention factor (which ggml's YaRN then multiplies by 1 + 0.1 ln(factor))."""
    lm = log_mul(r, arch)
    factor = 1.0 / freq_scale
    if lm != 0.0:
        m = lm if arch == "deepseek2" and lm != 1.0 else 1.0
        attn = _mscale(factor, m) / _mscale(factor, lm)
    else:
        attn = _mscale(factor, 1.0)
    attn *= 1.0 / (1.0 + 0.1 * math.log(factor))
    return Yarn(ext_factor=1.0,
                beta_fast=r.float_key("rope.scaling.yarn_beta_fast", 32.0, lo=0.0, hi=1e4),
                beta_slow=r.float_key("rope.scaling.yarn_beta_slow", 1.0, lo=0.0, hi=1e4),
                n_ctx_orig=r.int_key("rope.scaling.original_context_length", n_ctx, lo=1),
                attn_factor=attn * rope_attn_factor)


def mla_attn_scale(d: MlaDims, attn_factor: float, lm: float, freq_scale: float) -> float:
    """deepseek2's score scale (llama.cpp's kq_scale): mscale^2 / sqrt(nope + rope), mscale =
    the rope's attention factor times 1 + 0.1 ln(1/freq_scale) (undoing YaRN's cancellation)
    times 1 + 0.1 log_mul ln(1/freq_scale)."""
    ln = math.log(1.0 / freq_scale)
    m = attn_factor * (1.0 + 0.1 * ln) * (1.0 + 0.1 * lm * ln)
    return m * m / math.sqrt(d.head_dim)
