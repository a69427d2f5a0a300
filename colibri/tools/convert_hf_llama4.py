"""llama4 for colibri.tools.convert_hf, as llama.cpp's converter writes it
(conversion/llama.py Llama4Model): the dense layers' width is `intermediate_size_mlp` and the
experts' `intermediate_size`; the experts' fused `gate_up_proj` ([n_expert, n_embd, 2 n_ff],
gate first) split and transposed, `down_proj` transposed; the MoE interleave step; no q/k
permutation (Llama 4's rope pairs are adjacent). Beyond llama.cpp's keys (which it ignores,
using 8192 for both): the chunk size as attention.sliding_window and the temperature tuning's
floor and scale, so that a checkpoint with other values converts faithfully."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)$")


def adjust_config(cfg: dict[str, Any]) -> None:
    """The generic writer's view: feed_forward_length the dense width, the experts' apart."""
    cfg["moe_intermediate_size"] = cfg["intermediate_size"]
    cfg["intermediate_size"] = cfg["intermediate_size_mlp"]


def write_metadata(w: gguf.GGUFWriter, cfg: dict[str, Any]) -> None:
    w.add_interleave_moe_layer_step(int(cfg.get("interleave_moe_layer_step") or 1))
    types = cfg.get("layer_types") or []
    if types and all(t == "full_attention" for t in types):
        w.add_sliding_window(0)  # (MobileLLM: no chunked layers)
    elif cfg.get("attention_chunk_size"):
        w.add_sliding_window(int(cfg["attention_chunk_size"]))
    if cfg.get("attn_temperature_tuning", True):
        w.add_attn_temperature_length(int(cfg.get("floor_scale") or 8192))
        w.add_attn_temperature_scale(float(cfg.get("attn_scale") or 0.1))


def tensors(hf_name: str, data: np.ndarray) -> Iterator[tuple[str, np.ndarray]] | None:
    """The GGUF tensors of the experts' fused weights; None: map the name."""
    m = _EXPERTS.match(hf_name)
    if not m:
        return None
    b = m[1]
    if m[2] == "down_proj":
        return iter([(f"blk.{b}.ffn_down_exps.weight", data.transpose(0, 2, 1))])
    half = data.shape[-1] // 2
    return iter([(f"blk.{b}.ffn_gate_exps.weight", data[..., :half].transpose(0, 2, 1)),
                 (f"blk.{b}.ffn_up_exps.weight", data[..., half:].transpose(0, 2, 1))])
