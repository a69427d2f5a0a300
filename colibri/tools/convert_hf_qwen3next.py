"""qwen3_next (Qwen3-Next) for colibri.tools.convert_hf, as llama.cpp's converter writes it
(conversion/qwen.py Qwen3NextModel): the linear attention's sizes as ssm keys (conv kernel,
state size = key head dim, group count = key heads, time step rank = value heads, inner size =
value heads x value head dim), the recurrent layers and full_attention_interval; `A_log` stored
as -exp(A_log) (`ssm_a`), `dt_bias` as `ssm_dt.bias`, the conv weight squeezed to [channels x
kernel], the zero-centred RMSNorms (every `norm.weight` but the linear attention's gated one)
plus 1, and `in_proj_qkvz` ([q, k, v, z] per key head group) reordered into `attn_qkv` (all q
heads, all k heads, all v heads) and `attn_gate` (z)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def write_metadata(w: gguf.GGUFWriter, cfg: dict[str, Any]) -> None:
    arch = "qwen3next"
    w.add_uint32(f"{arch}.ssm.conv_kernel", int(cfg["linear_conv_kernel_dim"]))
    w.add_uint32(f"{arch}.ssm.state_size", int(cfg["linear_key_head_dim"]))
    w.add_uint32(f"{arch}.ssm.group_count", int(cfg["linear_num_key_heads"]))
    w.add_uint32(f"{arch}.ssm.time_step_rank", int(cfg["linear_num_value_heads"]))
    w.add_uint32(f"{arch}.ssm.inner_size",
                 int(cfg["linear_value_head_dim"]) * int(cfg["linear_num_value_heads"]))
    types = cfg.get("layer_types")
    if types is not None:
        if len(types) != int(cfg["num_hidden_layers"]):
            raise ValueError(f"layer_types has {len(types)} entries, expected num_hidden_layers "
                             f"({cfg['num_hidden_layers']})")
        w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in types])
    w.add_uint32(f"{arch}.full_attention_interval", int(cfg.get("full_attention_interval", 4)))


def tensors(hf_name: str, data: np.ndarray, cfg: dict[str, Any]
            ) -> Iterator[tuple[str, np.ndarray]] | None:
    """The GGUF tensors of one HF tensor that needs more than the name map; None: map it
    (after norm_adjust)."""
    m = _LAYER.match(hf_name)
    if not m or ".linear_attn." not in hf_name:
        return None
    b = m[1]
    if hf_name.endswith(".A_log"):
        return iter([(f"blk.{b}.ssm_a", -np.exp(data.astype(np.float32)))])
    if hf_name.endswith(".dt_bias"):
        return iter([(f"blk.{b}.ssm_dt.bias", data)])
    if hf_name.endswith(".conv1d.weight"):
        return iter([(f"blk.{b}.ssm_conv1d.weight", data.reshape(data.shape[0], -1))])
    if hf_name.endswith(".in_proj_qkvz.weight"):
        dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        nk, nv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        vs = nv // nk * dv
        g = data.reshape(nk, 2 * dk + 2 * vs, -1)  # per key head group: q, k, v, z rows
        q, k = g[:, :dk], g[:, dk:2 * dk]
        v, z = g[:, 2 * dk:2 * dk + vs], g[:, 2 * dk + vs:]
        E = data.shape[-1]
        qkv = np.concatenate([q.reshape(-1, E), k.reshape(-1, E), v.reshape(-1, E)])
        return iter([(f"blk.{b}.attn_qkv.weight", qkv), (f"blk.{b}.attn_gate.weight", z.reshape(-1, E))])
    return None


def norm_adjust(hf_name: str, data: np.ndarray) -> np.ndarray:
    """Qwen3-Next's RMSNorms are zero-centred (x * (1 + w)): stored plus 1, but the linear
    attention's gated norm (x * w)."""
    if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        return data + 1.0
    return data
