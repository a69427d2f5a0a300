#!/usr/bin/env python3
"""Convert a Hugging Face checkpoint (config.json + *.safetensors [+ tokenizer.json]) to GGUF.

    python -m colibri.tools.convert_hf MODEL_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0] [--pre NAME]
    (from a checkout also: python tools/convert_hf.py ...)

Supported `model_type`s: llama, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, olmoe, phi3, phimoe, dots1,
glm4_moe, ernie4_5_moe, granitemoe, granitemoeshared, hunyuan_v1_moe, gemma2, gemma3_text,
deepseek_v2, deepseek_v3 (convert_hf_deepseek), gpt_oss (convert_hf_gptoss), llama4_text
(convert_hf_llama4), qwen3_next (convert_hf_qwen3next), gemma4_text (and gemma3 / gemma4 whose text_config is one: the text part only). Tensor names come from the `gguf` package's
TensorNameMap, and the layout follows llama.cpp's convert_hf_to_gguf.py so that colibri and
llama.cpp read the files the same way:

- llama/mixtral: q and k projection rows are permuted from HF's rotate-half order to the
  interleaved order llama.cpp's "normal" RoPE expects;
- gemma2, gemma3: RMSNorm weights are stored as (1 + w) (Gemma's norm scales by 1 + w); gemma4: no
  shift (its norm scales by w); router.scale -> ffn_gate_inp.scale, router.per_expert_scale ->
  ffn_down_exps.scale, layer_scalar -> layer_output_scale.weight, experts.gate_up_proj kept
  fused as ffn_gate_up_exps; the global layers' proportional rope is written as a rope_freqs
  tensor (1 for rotated pairs, 1e30 for the others) with the global head dim taken from
  per_layer_config;
- llama with rope_type "llama3": the per-pair frequency divisors go into rope_freqs.weight;
- experts are stacked into 3-D tensors ffn_{gate,up,down}_exps of numpy shape
  [n_expert, rows, cols] (GGUF ne = [cols, rows, n_expert]), from per-expert tensors or from
  transformers 5's fused `experts.gate_up_proj` / `experts.down_proj`;
- 1-D tensors, routers (ffn_gate_inp, ffn_gate_inp_shexp) stay F32; everything else takes the
  output type (Q8_0 falls back to F16 for rows not a multiple of 32).

This is the converter the oracle tests use; it is also usable on real checkpoints that fit in
memory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from colibri.tokenizer import bytes_to_unicode
from colibri.tools import (
    convert_hf_deepseek,
    convert_hf_gemma4,
    convert_hf_gptoss,
    convert_hf_llama4,
    convert_hf_qwen3next,
)

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("convert_hf.py needs the gguf package: pip install gguf")

ARCHES = {
    "llama": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen2_moe": "qwen2moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "olmoe": "olmoe",
    "gemma2": "gemma2",
    "phi3": "phi3",
    "phimoe": "phimoe",
    "bailing_moe_v2": "bailingmoe2",
    "dots1": "dots1",
    "glm4_moe": "glm4moe",
    "ernie4_5_moe": "ernie4_5-moe",
    "granitemoe": "granitemoe",
    "granitemoeshared": "granitemoe",
    "hunyuan_v1_moe": "hunyuan-moe",  # llama.cpp's granitemoe with shared-expert tensors
    "gemma3_text": "gemma3",
    "gemma4_text": "gemma4",
    "deepseek_v2": "deepseek2",
    "deepseek_v3": "deepseek2",
    "gpt_oss": "gpt-oss",
    "llama4_text": "llama4",
    "qwen3_next": "qwen3next",
}
GGUF_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen2moe": gguf.MODEL_ARCH.QWEN2MOE,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE,
    "olmoe": gguf.MODEL_ARCH.OLMOE,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "phimoe": gguf.MODEL_ARCH.PHIMOE,
    "bailingmoe2": gguf.MODEL_ARCH.BAILINGMOE2,
    "dots1": gguf.MODEL_ARCH.DOTS1,
    "glm4moe": gguf.MODEL_ARCH.GLM4_MOE,
    "ernie4_5-moe": gguf.MODEL_ARCH.ERNIE4_5_MOE,
    "granitemoe": gguf.MODEL_ARCH.GRANITE_MOE,
    "hunyuan-moe": gguf.MODEL_ARCH.HUNYUAN_MOE,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "gemma4": gguf.MODEL_ARCH.GEMMA4,
    "deepseek2": gguf.MODEL_ARCH.DEEPSEEK2,
    "gpt-oss": gguf.MODEL_ARCH.GPT_OSS,
    "llama4": gguf.MODEL_ARCH.LLAMA4,
    "qwen3next": gguf.MODEL_ARCH.QWEN3NEXT,
}
OUTTYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}

# Per-expert HF names -> which stacked GGUF tensor they belong to.
_EXPERT_RE = re.compile(
    r"^(?P<prefix>model\.layers\.(?P<bid>\d+)\.(?:mlp|block_sparse_moe))\.experts\.(?P<xid>\d+)\."
    r"(?P<w>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
_EXPERT_KIND = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down",
                "down_proj": "down"}
_FUSED_RE = re.compile(
    r"^model\.layers\.(?P<bid>\d+)\.(?:mlp|block_sparse_moe)\.experts\.(?P<w>gate_up_proj|down_proj)$"
)


class ConvertError(ValueError):
    pass


def load_config(model_dir: Path) -> dict[str, Any]:
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") in ("gemma3", "gemma4") and "text_config" in cfg:
        text = dict(cfg["text_config"])
        text.setdefault("model_type", cfg["model_type"] + "_text")
        return text
    return cfg


def _llama3_rope_freqs(cfg: dict[str, Any], scaling: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's rope scaling as per-pair frequency divisors (rope_freqs.weight): 1 for
    short wavelengths, `factor` for long ones, a smooth blend between."""
    base = _rope_theta(cfg)
    dim = _head_dim(cfg)
    factor = float(scaling.get("factor", 8.0))
    lo = float(scaling.get("low_freq_factor", 1.0))
    hi = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    lo_wavelen, hi_wavelen = old_ctx / lo, old_ctx / hi
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < hi_wavelen:
            out.append(1.0)
        elif wavelen > lo_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _rope_theta(cfg: dict[str, Any], layer_kind: str | None = None, default: float = 10000.0) -> float:
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        if layer_kind and isinstance(rp.get(layer_kind), dict):
            return float(rp[layer_kind].get("rope_theta", default))
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
    if layer_kind == "sliding_attention" and "rope_local_base_freq" in cfg:
        return float(cfg["rope_local_base_freq"])
    return float(cfg.get("rope_theta", default))


def _rope_scaling(cfg: dict[str, Any], layer_kind: str | None = None) -> dict[str, Any] | None:
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        sub = rp.get(layer_kind) if layer_kind and isinstance(rp.get(layer_kind), dict) else rp
        if isinstance(sub, dict) and sub.get("rope_type", "default") != "default":
            return sub
        return None
    rs = cfg.get("rope_scaling")
    return rs if isinstance(rs, dict) and rs.get("rope_type", rs.get("type")) != "default" else None


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{model_dir}: no *.safetensors files")
    try:
        import torch  # noqa: F401

        framework = "pt"
    except ImportError:
        framework = "np"
    for f in files:
        with safe_open(str(f), framework=framework) as st:
            for name in st.keys():
                t = st.get_tensor(name)
                if framework == "pt":
                    t = t.float().numpy() if t.is_floating_point() else t.numpy()
                yield name, np.asarray(t, dtype=np.float32)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half row order -> interleaved pairs (llama.cpp's permute for LLaMA q/k)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _partial_rotary(cfg: dict[str, Any]) -> float:
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "partial_rotary_factor" in rp:
        return float(rp["partial_rotary_factor"])
    return float(cfg.get("partial_rotary_factor") or 1.0)


def _n_experts(cfg: dict[str, Any]) -> int:
    return int(cfg.get("num_local_experts") or cfg.get("num_experts")
               or cfg.get("n_routed_experts") or cfg.get("moe_num_experts") or 0)


def _head_dim(cfg: dict[str, Any]) -> int:
    hd = cfg.get("head_dim")
    return int(hd) if hd else cfg["hidden_size"] // cfg["num_attention_heads"]


def write_metadata(w: gguf.GGUFWriter, arch: str, cfg: dict[str, Any], outtype: str) -> None:
    n_layer = int(cfg["num_hidden_layers"])
    w.add_name(cfg.get("_name_or_path") or f"colibri-converted-{arch}")
    w.add_file_type(FILE_TYPES[outtype])
    w.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    w.add_embedding_length(int(cfg["hidden_size"]))
    nextn = int(cfg.get("num_nextn_predict_layers") or 0) if arch == "glm4moe" else 0
    w.add_block_count(n_layer + nextn)  # glm4moe: the NextN layers counted, as llama.cpp does
    if nextn:
        w.add_nextn_predict_layers(nextn)
    w.add_head_count(int(cfg["num_attention_heads"]))
    if arch not in ("gemma4", "deepseek2"):  # (theirs below)
        w.add_head_count_kv(int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(int(cfg["vocab_size"]))
    hd = _head_dim(cfg)
    if arch == "deepseek2":
        convert_hf_deepseek.write_metadata(w, cfg)
    elif arch != "gemma4":
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_dimension_count(int(hd * _partial_rotary(cfg)))
    scaling: dict[str, Any] | None
    if arch == "gemma4":
        convert_hf_gemma4.write_metadata(w, cfg, _rope_theta(cfg, "full_attention", 1_000_000.0),
                                         _rope_theta(cfg, "sliding_attention", 10_000.0))
        scaling = None
    elif arch == "gemma2":  # as llama.cpp writes it: the layers alternate, no pattern key
        w.add_rope_freq_base(_rope_theta(cfg))
        scaling = None
        w.add_sliding_window(int(cfg["sliding_window"]))
        w.add_attn_logit_softcapping(float(cfg["attn_logit_softcapping"]))
        w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
    elif arch in ("phi3", "phimoe"):  # as llama.cpp writes it: the sliding window always (0: none)
        w.add_rope_freq_base(_rope_theta(cfg))
        scaling = _rope_scaling(cfg)
        w.add_sliding_window(int(cfg.get("sliding_window") or 0))
    elif arch == "gemma3":
        w.add_rope_freq_base(_rope_theta(cfg, "full_attention", 1_000_000.0))
        scaling = _rope_scaling(cfg, "full_attention")
        sw = cfg.get("sliding_window")
        if sw:
            w.add_sliding_window(int(sw))
        pattern = cfg.get("_sliding_window_pattern") or cfg.get("sliding_window_pattern")
        if pattern:
            w.add_uint32(f"{arch}.attention.sliding_window_pattern", int(pattern))
        if cfg.get("layer_types"):
            w.add_array(
                f"{arch}.attention.sliding_window_pattern_layers",
                [lt == "sliding_attention" for lt in cfg["layer_types"]],
            )
        if cfg.get("query_pre_attn_scalar"):
            w.add_float32(f"{arch}.attention.query_pre_attn_scalar", float(cfg["query_pre_attn_scalar"]))
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
        if cfg.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(float(cfg["attn_logit_softcapping"]))
    else:
        w.add_rope_freq_base(_rope_theta(cfg))
        scaling = _rope_scaling(cfg)
        if cfg.get("sliding_window") and cfg.get("use_sliding_window"):
            w.add_sliding_window(int(cfg["sliding_window"]))
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "llama3" and arch in ("llama", "llama4"):
            pass  # written as the rope_freqs tensor (Converter.tensors), no scaling keys
        elif kind == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling["factor"]))
        elif kind in ("longrope", "su") and arch in ("phi3", "phimoe"):
            # the factors are tensors (Converter.tensors); the attention factor as llama.cpp
            # computes it, or the checkpoint's own (phimoe's short_mscale, which its
            # transformers model applies)
            orig = int(scaling["original_max_position_embeddings"])
            scale = int(cfg["max_position_embeddings"]) / orig
            attn = scaling.get("attention_factor") or scaling.get("short_mscale") or (
                math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
            w.add_rope_scaling_orig_ctx_len(orig)
            w.add_rope_scaling_attn_factors(float(attn))
        elif kind == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(scaling["factor"]))
            w.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
        else:
            raise ConvertError(f"unsupported rope scaling {kind!r}")

    if arch == "gpt-oss":
        convert_hf_gptoss.write_metadata(w, cfg)
    if arch == "llama4":
        convert_hf_llama4.write_metadata(w, cfg)
    if arch == "qwen3next":
        convert_hf_qwen3next.write_metadata(w, cfg)
    n_expert = _n_experts(cfg)
    if arch == "gemma4":
        return  # written by convert_hf_gemma4.write_metadata
    if n_expert:
        w.add_expert_count(int(n_expert))
        w.add_expert_used_count(int(cfg.get("num_experts_per_tok") or cfg.get("moe_k")
                                    or cfg["moe_topk"]))
        moe_ff = cfg.get("moe_intermediate_size")
        if isinstance(moe_ff, list):  # hunyuan: one per layer
            moe_ff = moe_ff[0]
        if arch == "hunyuan-moe" and not moe_ff:  # its experts are intermediate_size wide
            moe_ff = cfg["intermediate_size"]
        w.add_feed_forward_length(int(cfg.get("intermediate_size", moe_ff or 0)))
        if moe_ff:
            w.add_expert_feed_forward_length(int(moe_ff))
        if cfg.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(int(cfg["shared_expert_intermediate_size"]))
        if "norm_topk_prob" in cfg:
            w.add_expert_weights_norm(bool(cfg["norm_topk_prob"]))
        if arch == "granitemoe":  # Granite's multipliers, as llama.cpp names them
            if cfg.get("shared_intermediate_size"):
                w.add_expert_shared_feed_forward_length(int(cfg["shared_intermediate_size"]))
            w.add_embedding_scale(float(cfg["embedding_multiplier"]))
            w.add_residual_scale(float(cfg["residual_multiplier"]))
            w.add_attention_scale(float(cfg["attention_multiplier"]))
            w.add_logit_scale(float(cfg["logits_scaling"]))
        if arch == "hunyuan-moe":  # the shared MLP: intermediate_size x num_shared_expert
            n_sh = int(cfg.get("num_shared_expert") or 1)
            w.add_expert_shared_count(n_sh)
            w.add_expert_shared_feed_forward_length(int(cfg["intermediate_size"]) * n_sh)
        if arch == "ernie4_5-moe":
            w.add_expert_shared_count(int(cfg["moe_num_shared_experts"]))
            w.add_expert_shared_feed_forward_length(
                int(cfg["moe_intermediate_size"]) * int(cfg["moe_num_shared_experts"]))
            w.add_leading_dense_block_count(int(cfg["moe_layer_start_index"]))
            w.add_uint32(f"{arch}.interleave_moe_layer_step", int(cfg.get("moe_layer_interval") or 1))
        if arch == "bailingmoe2":  # as llama.cpp's BailingMoeV2 converter writes it
            n_sh = int(cfg["num_shared_experts"])
            w.add_expert_shared_count(n_sh)
            w.add_expert_shared_feed_forward_length(int(cfg.get(
                "moe_shared_expert_intermediate_size", int(cfg["moe_intermediate_size"]) * n_sh)))
            w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
            w.add_leading_dense_block_count(int(cfg["first_k_dense_replace"]))
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID
                                     if cfg.get("score_function", "sigmoid") == "sigmoid"
                                     else gguf.ExpertGatingFuncType.SOFTMAX)
            if int(cfg.get("n_group") or 1) > 1:
                w.add_expert_group_count(int(cfg["n_group"]))
                w.add_expert_group_used_count(int(cfg["topk_group"]))
        if arch in ("dots1", "glm4moe"):  # as llama.cpp writes them: DeepSeek-V3's routing
            w.add_expert_shared_count(int(cfg["n_shared_experts"]))
            w.add_expert_weights_scale(float(cfg["routed_scaling_factor"]))
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
            w.add_leading_dense_block_count(int(cfg["first_k_dense_replace"]))
        if arch in ("qwen2moe",) and (
            cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers")
        ):
            raise ConvertError("qwen2moe with dense layers (decoder_sparse_step/mlp_only_layers) "
                               "is not supported")
    else:
        w.add_feed_forward_length(int(cfg["intermediate_size"]))


def write_tokenizer(w: gguf.GGUFWriter, model_dir: Path, cfg: dict[str, Any], pre: str) -> None:
    """Byte-level BPE vocabulary from tokenizer.json (gguf model 'gpt2'). Without one, a
    placeholder vocabulary of `vocab_size` byte-level tokens is written, so that the file is
    complete; oracle tests drive such models with token ids."""
    tok_path = model_dir / "tokenizer.json"
    vocab_size = int(cfg["vocab_size"])
    tokens: list[str]
    merges: list[str] = []
    types: list[int]
    special: dict[str, int] = {}
    if tok_path.exists():
        tj = json.loads(tok_path.read_text(encoding="utf-8"))
        model = tj.get("model", {})
        if model.get("type") != "BPE":
            raise ConvertError(f"{tok_path}: only BPE tokenizers are supported, got {model.get('type')}")
        vocab: dict[str, int] = dict(model["vocab"])
        for at in tj.get("added_tokens", []):
            vocab[at["content"]] = at["id"]
            if at.get("special"):
                special[at["content"]] = at["id"]
        tokens = [f"[PAD{i}]" for i in range(vocab_size)]
        types = [gguf.TokenType.UNUSED] * vocab_size
        for t, i in vocab.items():
            if i >= vocab_size:
                raise ConvertError(f"{tok_path}: token id {i} >= vocab_size {vocab_size}")
            tokens[i] = t
            types[i] = gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
        for m in model.get("merges", []):
            merges.append(m if isinstance(m, str) else " ".join(m))
    else:
        # Placeholder: the 256 byte tokens, then merges of byte pairs up to vocab_size.
        byte_chars = bytes_to_unicode()
        tokens = [byte_chars[i] for i in range(min(256, vocab_size))]
        letters = [byte_chars[b] for b in range(ord("a"), ord("z") + 1)]
        pairs = ((a, b) for a in letters for b in letters)
        while len(tokens) < vocab_size:
            a, b = next(pairs)
            tokens.append(a + b)
            merges.append(f"{a} {b}")
        types = [gguf.TokenType.NORMAL] * vocab_size
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges:
        w.add_token_merges(merges)
    for key, adder in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        v = cfg.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None and 0 <= int(v) < vocab_size:
            adder(int(v))
    w.add_add_bos_token(False)


class Converter:
    def __init__(self, model_dir: Path, outtype: str = "f32", pre: str = "default"):
        self.dir = Path(model_dir)
        self.cfg = load_config(self.dir)
        mt = self.cfg.get("model_type")
        if mt not in ARCHES:
            raise ConvertError(
                f"{self.dir}: model_type {mt!r} is not supported; supported: {', '.join(sorted(ARCHES))}"
            )
        if outtype not in OUTTYPES:
            raise ConvertError(f"unknown outtype {outtype!r}; choose from {', '.join(OUTTYPES)}")
        self.model_type = mt
        self.arch = ARCHES[mt]
        self.outtype = outtype
        self.pre = pre
        self.n_layer = int(self.cfg["num_hidden_layers"])
        self.tmap = gguf.get_tensor_name_map(GGUF_ARCH[self.arch], self.n_layer)
        if self.arch == "llama4":
            convert_hf_llama4.adjust_config(self.cfg)
        self.n_expert = _n_experts(self.cfg)
        self.multimodal = json.loads((self.dir / "config.json").read_text()).get("model_type") \
            != mt
        if self.arch == "gemma4" and int(self.cfg.get("hidden_size_per_layer_input") or 0) > 0 \
                and int(self.cfg.get("vocab_size_per_layer_input") or self.cfg["vocab_size"]) \
                != int(self.cfg["vocab_size"]):
            raise ConvertError(f"{self.dir}: gemma4 per-layer embeddings over a vocabulary of "
                               "their own (vocab_size_per_layer_input) are not supported")

    def _qtype(self, name: str, data: np.ndarray) -> gguf.GGMLQuantizationType:
        if data.ndim == 1 or ".ffn_gate_inp" in name or ".ssm_conv1d" in name or \
                name.endswith(("_norm.weight", ".bias")):
            return gguf.GGMLQuantizationType.F32
        q = OUTTYPES[self.outtype]
        if q == gguf.GGMLQuantizationType.Q8_0 and data.shape[-1] % 32 != 0:
            return gguf.GGMLQuantizationType.F16
        return q

    def _add(self, w: gguf.GGUFWriter, name: str, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data, dtype=np.float32)
        q = self._qtype(name, data)
        if q == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        elif q == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            raw = gguf.quants.quantize(data, q)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=q)

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """GGUF name and float32 data of every tensor, transformed as llama.cpp does."""
        cfg = self.cfg
        n_head = int(cfg["num_attention_heads"])
        n_head_kv = int(cfg.get("num_key_value_heads", n_head))
        experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
        if self.arch == "gemma4":
            rf = convert_hf_gemma4.rope_freqs(cfg)
            if rf is not None:
                yield "rope_freqs.weight", rf
        scaling = _rope_scaling(cfg)
        if self.arch in ("phi3", "phimoe") and scaling and scaling.get("long_factor"):
            yield "rope_factors_long.weight", np.asarray(scaling["long_factor"], np.float32)
            yield "rope_factors_short.weight", np.asarray(scaling["short_factor"], np.float32)
        if self.arch in ("llama", "llama4") and scaling and \
                scaling.get("rope_type", scaling.get("type")) == "llama3":
            yield "rope_freqs.weight", _llama3_rope_freqs(cfg, scaling)
        for hf_name, data in iter_safetensors(self.dir):
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue
            if self.multimodal:
                # the text part of a multimodal checkpoint (gemma3/gemma4 ...ForConditionalGeneration)
                if hf_name.startswith("model.language_model."):
                    hf_name = "model." + hf_name[len("model.language_model."):]
                elif not hf_name.startswith("lm_head."):
                    continue
            oss = (convert_hf_gptoss.tensors(hf_name, data) if self.arch == "gpt-oss" else
                   convert_hf_llama4.tensors(hf_name, data) if self.arch == "llama4" else
                   convert_hf_qwen3next.tensors(hf_name, data, cfg) if self.arch == "qwen3next"
                   else None)
            if oss is not None:
                yield from oss
                continue
            if self.arch == "gemma4":
                g4 = convert_hf_gemma4.tensor(hf_name, data)
                if g4 is not None:
                    yield g4
                    continue
            if hf_name.endswith(".shared_mlp.input_linear.weight"):  # granite's shared [gate; up]
                layer, half = hf_name.split(".")[2], data.shape[0] // 2
                yield f"blk.{layer}.ffn_gate_shexp.weight", data[:half]
                yield f"blk.{layer}.ffn_up_shexp.weight", data[half:]
                continue
            if hf_name.endswith(".shared_mlp.output_linear.weight"):
                yield f"blk.{hf_name.split('.')[2]}.ffn_down_shexp.weight", data
                continue
            if hf_name.endswith(".block_sparse_moe.input_linear.weight"):  # granite: [gate; up]
                hf_name = hf_name.replace(".input_linear.weight", ".experts.gate_up_proj")
            if hf_name.endswith((".mlp.gate.e_score_correction_bias",  # dots1, glm4moe
                                 ".mlp.gate.expert_bias",  # bailingmoe2
                                 ".mlp.gate.moe_statics.e_score_correction_bias",  # ernie
                                 ".mlp.moe_statics.e_score_correction_bias")):  # (saved)
                yield f"blk.{hf_name.split('.')[2]}.exp_probs_b.bias", data.reshape(-1)
                continue
            m = _EXPERT_RE.match(hf_name)
            if m:
                key = (int(m["bid"]), _EXPERT_KIND[m["w"]])
                experts.setdefault(key, {})[int(m["xid"])] = data
                if len(experts[key]) == self.n_expert:
                    stacked = np.stack([experts[key][e] for e in range(self.n_expert)])
                    del experts[key]
                    yield f"blk.{key[0]}.ffn_{key[1]}_exps.weight", stacked
                continue
            m = _FUSED_RE.match(hf_name)
            if m:
                bid = int(m["bid"])
                if m["w"] == "gate_up_proj":
                    half = data.shape[1] // 2
                    yield f"blk.{bid}.ffn_gate_exps.weight", data[:, :half, :]
                    yield f"blk.{bid}.ffn_up_exps.weight", data[:, half:, :]
                else:
                    yield f"blk.{bid}.ffn_down_exps.weight", data
                continue
            name = self.tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise ConvertError(f"{self.dir}: cannot map tensor {hf_name!r} for {self.arch}")
            if self.arch in ("llama", "granitemoe"):  # llama's rope pairs: q/k rows permuted
                if name.endswith("attn_q.weight"):
                    data = permute_qk(data, n_head)
                elif name.endswith("attn_k.weight"):
                    data = permute_qk(data, n_head_kv)
            if self.arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
                data = data + 1.0
            if self.arch == "qwen3next":
                data = convert_hf_qwen3next.norm_adjust(hf_name, data)
            if name.endswith("attn_kv_b.weight"):  # deepseek2: the absorbed form's halves
                yield from convert_hf_deepseek.split_kv_b(name, data, cfg)
                continue
            yield name, data
        if experts:
            missing = ", ".join(f"layer {b} {k}: {sorted(v)}" for (b, k), v in experts.items())
            raise ConvertError(f"{self.dir}: incomplete experts ({missing})")

    def convert(self, out_path: Path) -> Path:
        out_path = Path(out_path)
        tmp = out_path.with_name(out_path.name + ".tmp")
        w = gguf.GGUFWriter(str(tmp), self.arch)
        try:
            write_metadata(w, self.arch, self.cfg, self.outtype)
            write_tokenizer(w, self.dir, self.cfg, self.pre)
            names = set()
            for name, data in self.tensors():
                names.add(name)
                self._add(w, name, data)
            if "token_embd.weight" not in names:
                raise ConvertError(f"{self.dir}: no token embedding")
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            os.replace(tmp, out_path)
        except BaseException:
            w.close()
            if tmp.exists():
                tmp.unlink()
            raise
        return out_path


def convert(model_dir: str | os.PathLike[str], out_path: str | os.PathLike[str],
            outtype: str = "f32", pre: str = "default") -> Path:
    """Convert MODEL_DIR to OUT_PATH (atomically: a temporary file renamed at the end)."""
    return Converter(Path(model_dir), outtype, pre).convert(Path(out_path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", default="f16", choices=sorted(OUTTYPES))
    ap.add_argument("--pre", default="default", help="tokenizer.ggml.pre value for a BPE vocabulary")
    args = ap.parse_args(argv)
    try:
        path = convert(args.model_dir, args.out, args.outtype, args.pre)
    except (ConvertError, OSError) as e:
        print(f"convert_hf: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({math.ceil(path.stat().st_size / 1024)} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
