"""gpt-oss for colibri.tools.convert_hf, as llama.cpp's converter writes it: the experts' fused,
interleaved `gate_up_proj` ([n_expert, n_embd, 2 n_ff], gate in the even columns, up in the odd)
split and transposed into ffn_gate_exps / ffn_up_exps ([n_expert, n_ff, n_embd]) with their
biases, `down_proj` ([n_expert, n_ff, n_embd]) transposed, the sinks named
`blk.N.attn_sinks.weight`, and the expert width and sliding window keys."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

_EXPERTS = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")


def write_metadata(w: gguf.GGUFWriter, cfg: dict[str, Any]) -> None:
    w.add_expert_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_sliding_window(int(cfg["sliding_window"]))


def tensors(hf_name: str, data: np.ndarray) -> Iterator[tuple[str, np.ndarray]] | None:
    """The GGUF tensors of one HF tensor that needs more than the name map; None: map it."""
    if hf_name.endswith(".self_attn.sinks"):
        return iter([(f"blk.{hf_name.split('.')[2]}.attn_sinks.weight", data)])
    m = _EXPERTS.match(hf_name)
    if not m:
        return None
    b, what, bias = m[1], m[2], m[3]
    if what == "down_proj":
        out = data if bias else data.transpose(0, 2, 1)
        return iter([(f"blk.{b}.ffn_down_exps.{'bias' if bias else 'weight'}", out)])
    gate, up = data[..., ::2], data[..., 1::2]
    if not bias:
        gate, up = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
    kind = "bias" if bias else "weight"
    return iter([(f"blk.{b}.ffn_gate_exps.{kind}", gate), (f"blk.{b}.ffn_up_exps.{kind}", up)])
