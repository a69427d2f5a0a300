"""Tiny random models of every supported family, built with `transformers` (the oracle) and
converted to GGUF with colibri.tools.convert_hf. Seeded, small enough for seconds on 2 cores, but
with several layers, GQA, more than 8 experts where the family has experts, and a shared
expert where it has one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 320


def _convert_module():
    """The converter (colibri/tools/convert_hf.py; tools/convert_hf.py is its command line)."""
    from colibri.tools import convert_hf

    return convert_hf


def _gemma4_multimodal_config(**text):
    import transformers as T

    vision = T.Gemma4VisionConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    cfg = T.Gemma4Config(text_config=T.Gemma4TextConfig(**text).to_dict(),
                         vision_config=vision.to_dict(), audio_config=None)
    cfg.text_config._attn_implementation = "eager"
    return cfg


def family_configs():
    import transformers as T

    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.08,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  tie_word_embeddings=False)
    return {
        "llama": (T.LlamaConfig, T.LlamaForCausalLM, dict(intermediate_size=96)),
        "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                    dict(intermediate_size=48, num_local_experts=10, num_experts_per_tok=2)),
        "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, dict(intermediate_size=96)),
        "qwen2_moe": (T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM,
                      dict(intermediate_size=96, moe_intermediate_size=32,
                           shared_expert_intermediate_size=80, num_experts=10,
                           num_experts_per_tok=4, norm_topk_prob=False)),
        "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM, dict(intermediate_size=96, head_dim=32)),
        "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                      dict(intermediate_size=96, moe_intermediate_size=32, num_experts=10,
                           num_experts_per_tok=4, head_dim=32, norm_topk_prob=True)),
        # llama.cpp's olmoe reads q/k norms over the whole projection with n_kv == n_head
        "olmoe": (T.OlmoeConfig, T.OlmoeForCausalLM,
                  dict(intermediate_size=48, num_experts=12, num_experts_per_tok=4,
                       num_key_value_heads=4)),
        # 6 layers: gemma3's pattern makes layer 5 global, 0-4 sliding (window 8 < prompts)
        "gemma3": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                   dict(intermediate_size=96, head_dim=32, sliding_window=8,
                        query_pre_attn_scalar=32, num_hidden_layers=6)),
        # 7 layers: 5 and 6 global (head_dim 32, partial proportional rope: 4 of 16 pairs
        # rotate), the others sliding (head_dim 16, window 6 < prompts); the MoE block beside
        # the dense MLP in every layer (12 experts, top 3); no per-layer embeddings
        "gemma4": (T.Gemma4TextConfig, T.Gemma4ForCausalLM,
                   dict(intermediate_size=96, head_dim=16, global_head_dim=32, sliding_window=6,
                        num_hidden_layers=7, hidden_size_per_layer_input=0,
                        num_kv_shared_layers=0, enable_moe_block=True, num_experts=12,
                        final_logit_softcapping=30.0,
                        top_k_experts=3, moe_intermediate_size=32,
                        layer_types=["sliding_attention"] * 5 + ["full_attention"] * 2)),
        # gemma4 as Gemma 4 E2B/E4B: per-layer embeddings (PLE, 16 values per layer) and KV
        # sharing (the last 3 of 7 layers attend to the K/V of layer 2, the last sliding one,
        # or 3, the last global one, before them), dense
        "gemma4_ple": (T.Gemma4TextConfig, T.Gemma4ForCausalLM,
                       dict(intermediate_size=96, head_dim=16, global_head_dim=32,
                            sliding_window=6, num_hidden_layers=7, hidden_size_per_layer_input=16,
                            vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=3,
                            final_logit_softcapping=30.0,
                            layer_types=["sliding_attention"] * 3 + ["full_attention"]
                            + ["sliding_attention"] * 2 + ["full_attention"])),
        # gemma4 variant as the text part of a Gemma4ForConditionalGeneration (tiny vision
        # tower, not converted): dense (no MoE block), attention_k_eq_v (global layers have no
        # v_proj: V is the K projection) with 1 KV head on global layers, 2 on sliding ones
        "gemma4_mm": (_gemma4_multimodal_config, T.Gemma4ForConditionalGeneration,
                      dict(intermediate_size=96, head_dim=16, global_head_dim=32,
                           sliding_window=6, num_hidden_layers=6,
                           hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                           attention_k_eq_v=True, num_global_key_value_heads=1,
                           final_logit_softcapping=30.0)),
        # 4 layers: 1 and 3 global, 0 and 2 sliding (window 8 < prompts); attention scores
        # capped at 50, logits at 30 (tanh softcaps); the head is the embedding (llama.cpp's
        # gemma2 has no output tensor)
        "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
                   dict(intermediate_size=96, head_dim=32, sliding_window=8,
                        tie_word_embeddings=True,
                        query_pre_attn_scalar=32, num_hidden_layers=4,
                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
        # fused qkv_proj and gate_up_proj; no sliding window (llama.cpp does not apply Phi's)
        "phi3": (T.Phi3Config, T.Phi3ForCausalLM,
                 dict(intermediate_size=96, sliding_window=None)),
        # layer 0 dense, 1-2 MoE: 10 experts, top 3 by sigmoid score + a selection bias
        # (randomised in build), weights renormalised and scaled by 2.5, one shared expert
        "dots1": (T.Dots1Config, T.Dots1ForCausalLM,
                  dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=10,
                       n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
                       routed_scaling_factor=2.5, norm_topk_prob=True, head_dim=16)),
        # dots1's routing; half the head dims rotate; q/k/v biases; one NextN layer counted in
        # the file's block_count (its tensors absent: colibri must not read them)
        "glm4moe": (T.Glm4MoeConfig, T.Glm4MoeForCausalLM,
                    dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=10,
                         n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
                         routed_scaling_factor=2.5, norm_topk_prob=True, head_dim=16,
                         attention_bias=True, num_nextn_predict_layers=1)),
        # layer 0 dense, 1-2 MoE (10 experts, top 3 by softmax score + a selection bias,
        # randomised in build), one shared expert; rope on adjacent pairs
        "ernie4_5_moe": (T.Ernie4_5_MoeConfig, T.Ernie4_5_MoeForCausalLM,
                         dict(intermediate_size=96, moe_intermediate_size=32, num_experts=10,
                              moe_num_shared_experts=1, num_experts_per_tok=3,
                              moe_layer_start_index=1, head_dim=16)),
        # Mixtral with Granite's multipliers: embeddings x 6, attention scale 0.2 (not
        # 1/sqrt(16)), branch outputs x 0.5 before the residual add, logits / 3
        "granitemoe": (T.GraniteMoeConfig, T.GraniteMoeForCausalLM,
                       dict(intermediate_size=48, num_local_experts=10, num_experts_per_tok=3,
                            embedding_multiplier=6.0, attention_multiplier=0.2,
                            residual_multiplier=0.5, logits_scaling=3.0)),
        # the same with a shared expert (shared_mlp: fused [gate; up], no gate of its own)
        "granitemoeshared": (T.GraniteMoeSharedConfig, T.GraniteMoeSharedForCausalLM,
                             dict(intermediate_size=48, num_local_experts=10,
                                  num_experts_per_tok=3, shared_intermediate_size=40,
                                  embedding_multiplier=6.0, attention_multiplier=0.2,
                                  residual_multiplier=0.5, logits_scaling=3.0)),
        # per-head q/k norms after RoPE; 10 experts, top 3, renormalised; a shared MLP
        "hunyuan_v1_moe": (T.HunYuanMoEV1Config, T.HunYuanMoEV1ForCausalLM,
                           dict(intermediate_size=32, num_experts=10, moe_topk=3, head_dim=16)),
        # PhiMoE (Phi-3.5-MoE): LayerNorms with biases, q/k/v/o and head biases, sparsemixer
        # routing over 10 experts (top 2)
        "phimoe": (T.PhimoeConfig, T.PhimoeForCausalLM,
                   dict(intermediate_size=48, num_local_experts=10, num_experts_per_tok=2,
                        attention_bias=True, lm_head_bias=True, sliding_window=None)),
        # phi3 with LongRoPE (Phi-3.5-mini's 128k scaling): original context 32, so prompts
        # of up to 32 tokens use the short factors, longer ones the long factors, each with
        # the attention factor sqrt(1 + ln(512/32) / ln(32))
        "phi3_longrope": (T.Phi3Config, T.Phi3ForCausalLM,
                          dict(intermediate_size=96, sliding_window=None,
                               original_max_position_embeddings=32, rope_parameters=dict(
                                   rope_type="longrope", rope_theta=10000.0,
                                   original_max_position_embeddings=32,
                                   short_factor=[1.0 + 0.15 * i for i in range(8)],
                                   long_factor=[1.0 + 1.3 * i for i in range(8)]))),
        # DeepSeek-V3 shape (deepseek2): MLA with a low-rank q (q_lora 32), kv_lora 32, 16
        # nope + 8 rope dims per head, v 24; YaRN (factor 4 over an original context of 16,
        # mscale_all_dim 1); layer 0 dense, 1-2 MoE: 16 experts in 4 groups (2 compete), top 3
        # by sigmoid score + a selection bias, renormalised, times 2.5, one shared expert
        "deepseek_v3": (T.DeepseekV3Config, T.DeepseekV3ForCausalLM,
                        dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16,
                             n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
                             n_group=4, topk_group=2, routed_scaling_factor=2.5,
                             norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=32,
                             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
                             num_key_value_heads=4, scoring_func="sigmoid", topk_method="noaux_tc",
                             max_position_embeddings=64,
                             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                  original_max_position_embeddings=16,
                                                  beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                                  mscale_all_dim=1.0))),
        # DeepSeek-V2-Lite shape: the queries straight from attn_q (no q_lora), softmax
        # routing over 10 experts (top 3, not renormalised), no groups, mscale 0.707
        "deepseek_v2": (T.DeepseekV2Config, T.DeepseekV2ForCausalLM,
                        dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=10,
                             n_shared_experts=2, num_experts_per_tok=3, first_k_dense_replace=1,
                             routed_scaling_factor=1.0, norm_topk_prob=False, q_lora_rank=None,
                             kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16, num_key_value_heads=4, topk_method="greedy",
                             max_position_embeddings=64,
                             scoring_func="softmax",
                             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                  original_max_position_embeddings=16,
                                                  beta_fast=32.0, beta_slow=1.0, mscale=0.707,
                                                  mscale_all_dim=0.707))),
        # gpt-oss: sinks, sliding-window (8 < prompts; even layers) and full layers, biases on
        # attention, router and experts, clamped SwiGLU, softmax over the top 3 of 10 experts,
        # YaRN (factor 4 over an original context of 16)
        "gpt_oss": (T.GptOssConfig, T.GptOssForCausalLM,
                    dict(intermediate_size=32, num_local_experts=10, num_experts_per_tok=3,
                         head_dim=16, sliding_window=8, num_hidden_layers=4,
                         max_position_embeddings=64,
                         layer_types=["sliding_attention", "full_attention"] * 2,
                         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                              original_max_position_embeddings=16,
                                              beta_fast=32.0, beta_slow=1.0))),
        # llama4: layers 1 and 3 MoE (8 experts, top-1 sigmoid on the input, a shared expert),
        # 0 and 2 dense; layers 0-2 chunked attention (chunks of 8 < prompts) with RoPE (Llama
        # 3.1 scaling) and q/k RMS norms, layer 3 global without RoPE, its queries
        # temperature-tuned (floor 4, so it varies within the prompts)
        "llama4": (T.Llama4TextConfig, T.Llama4ForCausalLM,
                   dict(intermediate_size=32, intermediate_size_mlp=96, num_local_experts=8,
                        num_experts_per_tok=1, interleave_moe_layer_step=2, head_dim=16,
                        num_hidden_layers=4, attention_chunk_size=8, floor_scale=4,
                        attn_scale=0.1, use_qk_norm=True, attn_temperature_tuning=True,
                        max_position_embeddings=512,
                        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                             low_freq_factor=1.0, high_freq_factor=4.0,
                                             original_max_position_embeddings=16))),
        # the same with Llama 4's own chunk (8192) and temperature floor (8192), the values
        # llama.cpp uses whatever the file says: the model its outputs are recorded on
        "llama4_8k": (T.Llama4TextConfig, T.Llama4ForCausalLM,
                      dict(intermediate_size=32, intermediate_size_mlp=96, num_local_experts=8,
                           num_experts_per_tok=1, interleave_moe_layer_step=2, head_dim=16,
                           num_hidden_layers=4, max_position_embeddings=512,
                           rope_parameters=dict(rope_type="llama3", rope_theta=10000.0,
                                                factor=8.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0,
                                                original_max_position_embeddings=16))),
        # qwen3next: gated DeltaNet layers (2 key heads, 4 value heads of 16, conv 4) and gated
        # full attention (partial rotary: 8 of 32 dims) alternating, zero-centred norms, 10
        # experts top-3 (softmax, renormalised) with a sigmoid-gated shared expert
        "qwen3next": (T.Qwen3NextConfig, T.Qwen3NextForCausalLM,
                      dict(intermediate_size=96, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48, num_experts=10,
                           num_experts_per_tok=3, head_dim=32, num_hidden_layers=4,
                           layer_types=["linear_attention", "full_attention"] * 2,
                           linear_conv_kernel_dim=4, linear_key_head_dim=16,
                           linear_value_head_dim=16, linear_num_key_heads=2,
                           linear_num_value_heads=4, norm_topk_prob=True,
                           rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                partial_rotary_factor=0.25))),
        # llama with Llama 3.1 rope scaling (converted to a rope_freqs tensor): head_dim 16,
        # original context 64, so short, medium and long wavelengths all occur in 40 tokens
        "llama3_rope": (T.LlamaConfig, T.LlamaForCausalLM,
                        dict(intermediate_size=96, rope_parameters=dict(
                            rope_type="llama3", rope_theta=10000.0, factor=8.0,
                            low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=64))),
    }, common


FAMILIES = ["llama", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmoe", "gemma3",
            "gemma4", "gemma2", "phi3", "dots1", "glm4moe", "ernie4_5_moe",
            "granitemoe", "granitemoeshared", "hunyuan_v1_moe", "phimoe"]
EXTRA = ["llama3_rope", "gemma4_mm", "phi3_longrope", "gemma4_ple", "deepseek_v3", "deepseek_v2", "gpt_oss",
         "llama4", "llama4_8k", "qwen3next"]  # built on demand by their own tests
# each model's seed: its place here (a family added at the end leaves the others' weights)
SEED_ORDER = ["llama", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmoe", "gemma3",
              "gemma4", "llama3_rope", "gemma4_mm", "gemma2", "phi3", "dots1", "glm4moe", "ernie4_5_moe",
              "granitemoe", "granitemoeshared", "hunyuan_v1_moe", "phimoe", "phi3_longrope", "gemma4_ple",
              "deepseek_v3", "deepseek_v2", "gpt_oss", "llama4", "llama4_8k", "qwen3next"]


def add_bigram_path(model, seed: int, strength: float = 0.5) -> None:
    """Give the random model a confident next-token rule, as a trained model has: embeddings of
    norm about 4 and an output layer whose row for token perm[t] is token t's embedding (plus the
    random init), so the residual stream's copy of the current token votes for perm[token]
    while the layers still move the logits. Random models otherwise have near-ties everywhere,
    and any rounding (8-bit weights) flips greedy choices; real models have margins."""
    import torch

    g = torch.Generator().manual_seed(seed)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    perm = torch.randperm(emb.shape[0], generator=g)
    with torch.no_grad():
        emb.copy_(torch.randn(emb.shape, generator=g) * strength)
        out[perm] += emb.detach().clone()


def build(family: str, out_dir: Path, outtypes=("f32",)):
    """Build the seeded tiny model of a family (with a bigram path, see add_bigram_path) and
    convert it to GGUF in each outtype; returns (torch model, {outtype: gguf path})."""
    import torch

    configs, common = family_configs()
    cfg_cls, model_cls, extra = configs[family]
    cfg = cfg_cls(**{**common, **extra})
    cfg._attn_implementation = "eager"
    seed = SEED_ORDER.index(family)
    torch.manual_seed(1234 + seed)
    model = model_cls(cfg).eval()
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # non-trivial norms and biases, so that a missing one is caught
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("e_score_correction_bias"):  # ernie's (a parameter), init 0
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            elif name.endswith(("router.scale", "per_expert_scale")):  # gemma4, init 1
                p.mul_(1.0 + torch.rand(p.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):  # gemma4, init 1
                buf.mul_(0.5 + torch.rand(buf.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):  # dots1, init 0: choose experts
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.3)
    add_bigram_path(model, seed=seed)
    conv = _convert_module()
    paths = {}
    for t in outtypes:
        hf_dir = out_dir / f"{family}-{t}-hf"
        model.save_pretrained(hf_dir)
        paths[t] = conv.convert(hf_dir, out_dir / f"{family}-{t}.gguf", t)
    return model, paths


def prompt(n: int, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.RandomState(seed).randint(3, VOCAB, size=n)]


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=0)
    return [int(x) for x in out[0, len(ids):]]


def build_moe(out: Path, n_layers: int = 2) -> str:
    """A tiny qwen3moe model with n_layers layers (10 experts, top 4), f32 GGUF."""
    import torch

    configs, common = family_configs()
    cfg_cls, model_cls, extra = configs["qwen3_moe"]
    cfg = cfg_cls(**{**common, **extra, "num_hidden_layers": n_layers})
    torch.manual_seed(7)
    model = model_cls(cfg).eval()
    model.save_pretrained(out / "hf")
    return str(_convert_module().convert(out / "hf", out / "moe.gguf", "f32"))


def build_bailingmoe2(out: Path, outtypes=("f32",), seed: int = 7) -> dict[str, Path]:
    """A tiny Ling/Ring 2.0 (bailingmoe2) model: transformers has no BailingMoeV2 class, so the
    checkpoint is written directly (config.json and seeded random safetensors under the HF
    names llama.cpp's converter reads) and converted; llama.cpp is its reference. 4 layers (the
    first dense), fused qkv, per-head q/k norms, half the head dims rotated, 16 experts in 4
    groups of which 2 compete, top 4 by sigmoid score plus a selection bias, renormalised and
    scaled by 2.5, one shared expert; a bigram path as add_bigram_path gives."""
    import json

    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    E, H, KV, HD, FF, MFF, NE, L = 64, 4, 2, 16, 96, 32, 16, 4
    cfg = dict(model_type="bailing_moe_v2", architectures=["BailingMoeV2ForCausalLM"],
               vocab_size=VOCAB, hidden_size=E, num_hidden_layers=L, num_attention_heads=H,
               num_key_value_heads=KV, head_dim=HD, intermediate_size=FF,
               moe_intermediate_size=MFF, num_experts=NE, num_experts_per_tok=4,
               num_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
               routed_scaling_factor=2.5, norm_topk_prob=True, score_function="sigmoid",
               partial_rotary_factor=0.5, rope_theta=10000.0, rms_norm_eps=1e-6,
               max_position_embeddings=512, use_qk_norm=True, tie_word_embeddings=False)

    def w(*shape, s=0.08):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    t: dict[str, np.ndarray] = {}
    emb = w(VOCAB, E, s=0.5)
    t["model.word_embeddings.weight"] = emb
    head = w(VOCAB, E)
    head[rng.permutation(VOCAB)] += emb
    t["lm_head.weight"], t["model.norm.weight"] = head, norm(E)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(E)
        t[p + "post_attention_layernorm.weight"] = norm(E)
        t[p + "attention.query_key_value.weight"] = w((H + 2 * KV) * HD, E)
        t[p + "attention.dense.weight"] = w(E, H * HD)
        t[p + "attention.query_layernorm.weight"] = norm(HD)
        t[p + "attention.key_layernorm.weight"] = norm(HD)
        if i == 0:
            for k in ("gate_proj", "up_proj"):
                t[p + f"mlp.{k}.weight"] = w(FF, E)
            t[p + "mlp.down_proj.weight"] = w(E, FF)
            continue
        t[p + "mlp.gate.weight"] = w(NE, E, s=0.5)
        t[p + "mlp.gate.expert_bias"] = (rng.standard_normal(NE) * 0.3).astype(np.float32)
        for x in range(NE):
            for k in ("gate_proj", "up_proj"):
                t[p + f"mlp.experts.{x}.{k}.weight"] = w(MFF, E)
            t[p + f"mlp.experts.{x}.down_proj.weight"] = w(E, MFF)
        for k in ("gate_proj", "up_proj"):
            t[p + f"mlp.shared_experts.{k}.weight"] = w(MFF, E)
        t[p + "mlp.shared_experts.down_proj.weight"] = w(E, MFF)
    hf = out / "bailingmoe2-hf"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(hf / "model.safetensors"))
    conv = _convert_module()
    return {o: conv.convert(hf, out / f"bailingmoe2-{o}.gguf", o) for o in outtypes}
