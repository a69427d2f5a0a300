"""deepseek2 (DeepSeek-V2/V3/R1, Kimi K2) for colibri.tools.convert_hf, as llama.cpp's converter
writes it (conversion/deepseek.py): the MLA keys (key_length = kv_lora + rope and value_length
= kv_lora for the latent cache; key_length_mla and value_length_mla for the heads), one K/V
head, the routing keys, and `kv_b_proj` split into `attn_k_b` (each head's K rows transposed:
[n_head, kv_lora, nope]) and `attn_v_b` ([n_head, v, kv_lora])."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np


def write_metadata(w: gguf.GGUFWriter, cfg: dict[str, Any]) -> None:
    kv_lora = int(cfg.get("kv_lora_rank") or 512)
    rope, nope, v = (int(cfg[k]) for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    w.add_head_count_kv(1)  # the latent: multi-query attention with one K/V head
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_kv_lora_rank(kv_lora)
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(int(cfg["q_lora_rank"]))
    w.add_rope_dimension_count(rope)
    n_dense = cfg.get("first_k_dense_replace")
    w.add_leading_dense_block_count(int(n_dense if n_dense is not None else 0))
    w.add_expert_shared_count(int(cfg.get("n_shared_experts") or 0))
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(int(cfg["n_group"]))
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(int(cfg["topk_group"]))
    score = cfg.get("scoring_func")
    if score is not None:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if score == "sigmoid"
                                 else gguf.ExpertGatingFuncType.SOFTMAX)
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(rp, dict) and rp.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * float(rp["mscale_all_dim"]))


def split_kv_b(name: str, data: np.ndarray, cfg: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """blk.N.attn_kv_b.weight [n_head*(nope + v), kv_lora] -> attn_k_b, attn_v_b."""
    n_head = int(cfg["num_attention_heads"])
    nope, v = int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
    kv_b = data.reshape(n_head, nope + v, data.shape[-1])
    yield name.replace("attn_kv_b", "attn_k_b"), kv_b[:, :nope, :].transpose(0, 2, 1)
    yield name.replace("attn_kv_b", "attn_v_b"), kv_b[:, nope:, :]
