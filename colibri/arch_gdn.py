"""Gated DeltaNet linear attention (qwen3next: Qwen3-Next) read from a GGUF file as llama.cpp
reads it (src/models/qwen3next.cpp); the forward pass's kind is colibri/_core/forward_gdn.c.

Sizes from the ssm keys as llama.cpp's converter writes them: conv_kernel, state_size (the
key head dim), group_count (key heads), time_step_rank (value heads), inner_size (value heads
x value head dim). The recurrent layers: `attention.recurrent_layers` (one bool per layer),
else every layer but each full_attention_interval-th (4 when absent). A linear layer has
`attn_qkv` (q heads, k heads, v heads), `attn_gate` (z), `ssm_ba` (b | a per key head group),
`ssm_conv1d` [channels x kernel], `ssm_a` (-exp(A_log)), `ssm_dt.bias`, `ssm_norm` (the gated
RMSNorm of a value head) and `ssm_out`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.arch_read import UnsupportedModel, _Reader


@dataclass(frozen=True)
class GdnDims:
    conv: int
    k_heads: int
    v_heads: int
    head_k: int
    head_v: int
    recurrent: tuple[bool, ...]

    @property
    def channels(self) -> int:
        return 2 * self.k_heads * self.head_k + self.v_heads * self.head_v

    def state_floats(self) -> int:
        """Recurrent state floats of one linear layer for one sequence (forward.h)."""
        return (self.conv - 1) * self.channels + self.v_heads * self.head_k * self.head_v


def gdn_dims(r: _Reader, n_layer: int) -> GdnDims:
    p = r.gf.path
    conv = r.int_key("ssm.conv_kernel", required=True, lo=1, hi=16)
    head_k = r.int_key("ssm.state_size", required=True, lo=1, hi=1024)
    k_heads = r.int_key("ssm.group_count", required=True, lo=1, hi=1 << 12)
    v_heads = r.int_key("ssm.time_step_rank", required=True, lo=1, hi=1 << 12)
    inner = r.int_key("ssm.inner_size", required=True, lo=1, hi=1 << 24)
    if v_heads % k_heads or inner % v_heads or inner // v_heads > 1024:
        raise UnsupportedModel(f"{p}: linear attention with {k_heads} key heads, {v_heads} value "
                               f"heads and inner size {inner} is not supported (value heads a "
                               f"multiple of key heads, value head dim at most 1024)")
    flags = r.key("attention.recurrent_layers")
    if flags is not None:
        # (one per block: the NextN / MTP blocks after the n_layer run ones included)
        if not isinstance(flags, Sequence | np.ndarray) or len(flags) < n_layer or \
                not all(isinstance(f, bool | np.bool_) for f in flags):
            raise UnsupportedModel(f"{p}: {r.arch}.attention.recurrent_layers must be "
                                   f"at least {n_layer} bools")
        recurrent = tuple(bool(f) for f in flags[:n_layer])
    else:
        step = r.int_key("full_attention_interval", 4, lo=1, hi=1 << 16)
        recurrent = tuple((i + 1) % step != 0 for i in range(n_layer))
    return GdnDims(conv, k_heads, v_heads, head_k, inner // v_heads, recurrent)


def gdn_layer(r: _Reader, i: int, n_embd: int, d: GdnDims) -> dict[str, Any]:
    """The linear attention fields of layer i's description (forward.h gdn_*; wo: ssm_out)."""
    b = f"blk.{i}."
    nv, vd = d.v_heads, d.v_heads * d.head_v
    return dict(
        gdn_k_heads=d.k_heads, gdn_v_heads=nv, gdn_head_k=d.head_k, gdn_head_v=d.head_v,
        gdn_conv=d.conv,
        gdn_qkv=r.mat(b + "attn_qkv.weight", d.channels, n_embd),
        gdn_z=r.mat(b + "attn_gate.weight", vd, n_embd),
        gdn_ba=r.mat(b + "ssm_ba.weight", 2 * nv, n_embd),
        gdn_conv_w=r.vec(b + "ssm_conv1d.weight", d.channels * d.conv),
        gdn_a=r.vec(b + "ssm_a", nv), gdn_dt=r.vec(b + "ssm_dt.bias", nv),
        gdn_norm=r.vec(b + "ssm_norm.weight", d.head_v),
        wo=r.mat(b + "ssm_out.weight", n_embd, vd))
