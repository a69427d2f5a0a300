"""gemma4 for colibri.tools.convert_hf: its per-layer attention shapes, the global layers'
proportional rope as a rope_freqs tensor, its metadata, and the tensors the gguf name map does
not name as llama.cpp does."""

from __future__ import annotations

import re
from typing import Any

import gguf
import numpy as np


def _layer(cfg: dict[str, Any], i: int) -> dict[str, Any]:
    """gemma4's per-layer overrides (transformers saves `per_layer_config` keyed by layer
    index; older configs give global_head_dim / num_global_key_value_heads)."""
    plc = cfg.get("per_layer_config") or {}
    over = dict(plc.get(str(i)) or plc.get(i) or {})  # type: ignore[call-overload]
    if cfg["layer_types"][i] == "full_attention":
        if "head_dim" not in over and cfg.get("global_head_dim"):
            over["head_dim"] = int(cfg["global_head_dim"])
        if ("num_key_value_heads" not in over and cfg.get("num_global_key_value_heads")
                and cfg.get("attention_k_eq_v")):
            over["num_key_value_heads"] = int(cfg["num_global_key_value_heads"])
    return over


def _dims(cfg: dict[str, Any]) -> tuple[int, int, list[int]]:
    """(global head dim, sliding head dim, KV heads per layer)."""
    hd_swa = int(cfg["head_dim"])
    hd = hd_swa
    n_kv = []
    for i, lt in enumerate(cfg["layer_types"]):
        over = _layer(cfg, i)
        if lt == "full_attention":
            hd = int(over.get("head_dim", hd_swa))
        n_kv.append(int(over.get("num_key_value_heads", cfg.get("num_key_value_heads", 1))))
    return hd, hd_swa, n_kv


def rope_freqs(cfg: dict[str, Any]) -> np.ndarray | None:
    """The global layers' proportional rope as llama.cpp reads it: NeoX rope over the whole
    global head dim whose pairs past partial_rotary_factor get divisor 1e30 (angle 0)."""
    full = (cfg.get("rope_parameters") or {}).get("full_attention") or {}
    if full.get("rope_type") != "proportional":
        return None
    hd = _dims(cfg)[0]
    n_rot = int(float(full.get("partial_rotary_factor", 1.0)) * hd // 2)
    return np.array([1.0] * n_rot + [1e30] * (hd // 2 - n_rot), dtype=np.float32)


def write_metadata(w: gguf.GGUFWriter, cfg: dict[str, Any], theta: float, theta_swa: float) -> None:
    """gemma4's keys as llama.cpp's converter writes them (head dims, rope bases and dims per
    layer kind, per-layer sliding pattern, head_count_kv per layer when it differs)."""
    a = "gemma4"
    n_layer = int(cfg["num_hidden_layers"])
    if not cfg.get("layer_types"):
        cfg["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention"
                              for i in range(n_layer)]
    hd, hd_swa, n_kv = _dims(cfg)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_uint32(f"{a}.attention.key_length_swa", hd_swa)
    w.add_uint32(f"{a}.attention.value_length_swa", hd_swa)
    if len(set(n_kv)) == 1:
        w.add_head_count_kv(n_kv[0])
    else:
        w.add_array(f"{a}.attention.head_count_kv", n_kv)
    w.add_rope_freq_base(theta)
    w.add_float32(f"{a}.rope.freq_base_swa", theta_swa)
    w.add_rope_dimension_count(hd)
    w.add_uint32(f"{a}.rope.dimension_count_swa",
                 int(hd_swa * float(cfg.get("partial_rotary_factor", 1.0))))
    w.add_sliding_window(int(cfg["sliding_window"]))
    w.add_array(f"{a}.attention.sliding_window_pattern",
                [lt == "sliding_attention" for lt in cfg["layer_types"]])
    w.add_uint32(f"{a}.attention.shared_kv_layers", int(cfg.get("num_kv_shared_layers") or 0))
    w.add_uint32(f"{a}.embedding_length_per_layer_input",
                 int(cfg.get("hidden_size_per_layer_input") or 0))
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    if cfg.get("enable_moe_block"):
        w.add_expert_count(int(cfg["num_experts"]))
        w.add_expert_used_count(int(cfg["top_k_experts"]))
        w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))


_G4_RE = re.compile(r"^model\.layers\.(?P<bid>\d+)\.(?P<w>router\.scale|router\.per_expert_scale|"
                    r"experts\.gate_up_proj|experts\.down_proj|layer_scalar)$")
_G4_NAMES = {"router.scale": "ffn_gate_inp.scale", "router.per_expert_scale": "ffn_down_exps.scale",
             "experts.gate_up_proj": "ffn_gate_up_exps.weight",
             "experts.down_proj": "ffn_down_exps.weight", "layer_scalar": "layer_output_scale.weight"}

def tensor(hf_name: str, data: np.ndarray) -> tuple[str, np.ndarray] | None:
    """gemma4 tensors the gguf name map does not name as llama.cpp does (None: map it)."""
    m = _G4_RE.match(hf_name)
    if not m:
        return None
    return f"blk.{m['bid']}.{_G4_NAMES[m['w']]}", data
