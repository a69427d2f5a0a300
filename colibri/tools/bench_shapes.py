"""The shapes of colibri.tools.make_bench_model: each a real model's layer shapes and its
architecture's GGUF keys and tensor names, as llama.cpp's converter (convert_hf_to_gguf.py, the
copy vendored by llama-cpp-python 0.3.36) writes them and llama.cpp's loader (src/models/*.cpp)
reads them. Nothing here writes data: plan() lists the tensors, write_keys() the metadata.

- qwen3-30b-a3b (qwen3moe): hidden 2048, 32 query / 4 KV heads of 128, q/k RMSNorm, 128
  experts of FFN 768, top-8 renormalised softmax; vocabulary 151936.
- ernie-4.5-21b-a3b (ernie4_5-moe, ERNIE-4.5-21B-A3B): hidden 2560, 20 / 4 heads of 128, rope
  on adjacent pairs (base 500000), 64 experts of FFN 1536, top-6 softmax with a selection bias
  (exp_probs_b), renormalised; a shared FFN of 3072 (its 2 shared experts, one tensor, as the
  converter writes intermediate_size / num_key_value_heads); first layer dense (FFN 12288);
  tied embeddings (no output.weight: token_embd in the output's type); vocabulary 103424.
- glm-4.5-air (glm4moe, GLM-4.5-Air): hidden 4096, 96 / 8 heads of 128, half of each head
  rotated (rope.dimension_count 64, base 1e6), q/k/v biases, no q/k norms, post_attention_norm,
  128 experts of FFN 1408, top-8 sigmoid with a selection bias, renormalised, scale 1.0, one
  shared expert, first layer dense (FFN 10944), vocabulary 151552. The NextN (MTP) layer is
  counted in block_count with nextn_predict_layers = 1 and its tensors absent: both engines
  skip it (llama.cpp's trunk-only load).
- deepseek-v3 (deepseek2, DeepSeek-V3/R1): hidden 7168, 128 heads of multi-head latent
  attention (q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128;
  attn_k_b / attn_v_b split as the converter writes them today, head_count_kv 1, key_length
  576, value_length 512, key/value_length_mla 192/128), YaRN (factor 40, original context
  4096, mscale_all_dim 1 as yarn_log_multiplier 0.1), 256 experts of FFN 2048, top-8 sigmoid
  with a selection bias in 8 groups (4 used), renormalised, scale 2.5, one shared expert, the
  first layers dense (FFN 18432), vocabulary 129280; no NextN layer (the converter skips it).
- gpt-oss-20b (gpt-oss): hidden 2880, 64 query / 8 KV heads of 64 with biases and attention
  sinks, sliding-window (128, even layers) and full layers alternating, YaRN (factor 32 over
  4096, base 150000), 32 experts of FFN 2880 with biases, top-4 softmax over the chosen
  logits, clamped SwiGLU; vocabulary 201088. The experts are MXFP4 whatever --type says (as
  the published files are: llama-quantize keeps them); --type sets the other matrices, whose
  2880-wide rows take llama.cpp's fallback from the 256-block types (Q4_K -> Q5_0).
- qwen3-next-80b-a3b (qwen3next, Qwen3-Next-80B-A3B): hidden 2048; every 4th layer gated full
  attention (16 query heads, each with its gate rows, 2 KV heads of 256, q/k RMSNorm, 64 of
  256 dims rotated, base 1e7), the others gated DeltaNet (attn_qkv of 16 key heads and 32
  value heads of 128, attn_gate, ssm_ba, a conv of 4 taps in float32, ssm_a negative, ssm_dt,
  ssm_norm, ssm_out); post_attention_norm; 512 experts of FFN 512, top-10 renormalised softmax,
  one shared expert of 512 with its sigmoid gate (ffn_gate_inp_shexp); vocabulary 151936.

With fewer layers than the real model (--layers), the leading dense layers scale down with
the depth: round(real dense * layers / real layers), at least 1 and at most layers - 1 (one
layer alone is an MoE layer): 1 dense layer for ERNIE and GLM below their real depth, and for
DeepSeek-V3 up to 30 layers (3 at its real 61). The `tiny-*` shapes are the same
architectures at a small size (hidden 256, vocabulary 2048), for tests.

Types: a matrix whose row length does not fit its type's block falls back as llama.cpp's
quantizer does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, the 2/3-bit and ternary K types ->
Q4_0, the IQ types -> IQ4_NL): GLM's FFN widths (1408, 10944) and DeepSeek's attn_k_b rows of
128.
"""

from __future__ import annotations

from typing import Any

import gguf
from gguf import GGMLQuantizationType as QT

_QWEN = dict(arch="qwen3moe", rope_base=1_000_000.0, eps=1e-6, pre="qwen2")
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": dict(_QWEN, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                          n_expert=128, n_used=8, n_ff_exp=768, n_ff=6144, n_vocab=151936,
                          n_ctx=40960),
    "tiny": dict(_QWEN, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=32, n_used=4,
                 n_ff_exp=256, n_ff=1024, n_vocab=2048, n_ctx=4096),
    "ernie-4.5-21b-a3b": dict(arch="ernie4_5-moe", n_embd=2560, n_head=20, n_head_kv=4,
                              head_dim=128, n_expert=64, n_used=6, n_ff_exp=1536, n_ff=12288,
                              n_shared=2, n_ff_shexp=3072, n_vocab=103424, n_ctx=131072,
                              rope_base=500_000.0, eps=1e-5, real_layers=28, dense_lead=1,
                              tied=True, pre="default"),
    "glm-4.5-air": dict(arch="glm4moe", n_embd=4096, n_head=96, n_head_kv=8, head_dim=128,
                        n_rot=64, n_expert=128, n_used=8, n_ff_exp=1408, n_ff=10944, n_shared=1,
                        n_vocab=151552, n_ctx=131072, rope_base=1_000_000.0, eps=1e-5,
                        real_layers=46, dense_lead=1, nextn=1, expert_scale=1.0, n_group=1,
                        group_used=1, pre="qwen2"),
    "deepseek-v3": dict(arch="deepseek2", n_embd=7168, n_head=128, q_lora=1536, kv_lora=512,
                        qk_nope=128, qk_rope=64, v_head=128, n_expert=256, n_used=8,
                        n_ff_exp=2048, n_ff=18432, n_shared=1, n_group=8, group_used=4,
                        expert_scale=2.5, n_vocab=129280, n_ctx=163840, rope_base=10000.0,
                        yarn_factor=40.0, yarn_orig_ctx=4096, yarn_beta_fast=32.0,
                        yarn_beta_slow=1.0, yarn_log_mul=0.1, eps=1e-6, real_layers=61,
                        dense_lead=3, pre="deepseek-v3"),
}
SHAPES["qwen3-next-80b-a3b"] = dict(
    arch="qwen3next", n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_rot=64,
    n_expert=512, n_used=10, n_ff_exp=512, n_ff=5632, n_shared=1, n_ff_shexp=512,
    n_vocab=151936, n_ctx=262144, rope_base=10_000_000.0, eps=1e-6, ssm_conv=4,
    ssm_k_heads=16, ssm_v_heads=32, ssm_head=128, full_attn_every=4, pre="qwen2")
# the tiny shape at about the least size where every row is whole 256-blocks (so
# llama-quantize's i-quants and K-quants apply to every matrix): 4 experts of FFN 256, top-2,
# a 512-token vocabulary (the first 254 letter-pair merges); one layer is ~0.5 MB at 2-3 bits:
# the files llama.cpp quantizes for tests/model/test_lowbit_llama_refs.py
# (tools/quantize_lowbit_refs.py)
SHAPES["tiny-lowbit"] = dict(SHAPES["tiny"], n_expert=4, n_used=2, n_vocab=512)
SHAPES["tiny-ernie4_5-moe"] = dict(SHAPES["ernie-4.5-21b-a3b"], n_embd=256, n_head=4, n_head_kv=2,
                                   head_dim=64, n_expert=16, n_used=4, n_ff_exp=256, n_ff=512,
                                   n_ff_shexp=512, n_vocab=2048, n_ctx=4096)
# FFN widths of 32-multiples (not 256): the type fallback of the real GLM's 1408 and 10944
SHAPES["tiny-glm4moe"] = dict(SHAPES["glm-4.5-air"], n_embd=256, n_head=4, n_head_kv=2,
                              head_dim=64, n_rot=32, n_expert=32, n_used=4, n_ff_exp=160,
                              n_ff=352, n_vocab=2048, n_ctx=4096)
SHAPES["tiny-qwen3next"] = dict(SHAPES["qwen3-next-80b-a3b"], n_embd=256, n_head=4, head_dim=64,
                                n_rot=16, n_expert=32, n_used=4, n_ff_exp=256, n_ff=512,
                                n_ff_shexp=256, n_vocab=2048, n_ctx=4096, ssm_k_heads=2,
                                ssm_v_heads=4, ssm_head=64)
SHAPES["tiny-deepseek2"] = dict(SHAPES["deepseek-v3"], n_embd=256, n_head=4, q_lora=256,
                                kv_lora=256, qk_nope=64, qk_rope=32, v_head=64, n_expert=32,
                                n_used=4, n_ff_exp=256, n_ff=512, n_group=4, group_used=2,
                                n_vocab=2048, n_ctx=4096, yarn_orig_ctx=256)

SHAPES["gpt-oss-20b"] = dict(arch="gpt-oss", n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
                             n_expert=32, n_used=4, n_ff_exp=2880, n_ff=2880, n_vocab=201088,
                             n_ctx=131072, rope_base=150000.0, eps=1e-5, swa=128,
                             yarn_factor=32.0, yarn_orig_ctx=4096, yarn_beta_fast=32.0,
                             yarn_beta_slow=1.0, real_layers=24, pre="gpt-4o")
SHAPES["tiny-gpt-oss"] = dict(SHAPES["gpt-oss-20b"], n_embd=256, n_head=4, n_head_kv=2,
                              head_dim=64, n_expert=16, n_used=4, n_ff_exp=256, n_ff=256,
                              n_vocab=2048, n_ctx=4096, swa=16, yarn_orig_ctx=256)

Plan = list[tuple[str, tuple[int, ...], "QT | None"]]

# llama.cpp's tensor_type_fallback (src/llama-quant.cpp): a row that does not fit the type's block
_FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0, QT.Q2_K: QT.Q4_0,
             QT.Q3_K: QT.Q4_0, QT.TQ1_0: QT.Q4_0, QT.TQ2_0: QT.Q4_0,
             **{t: QT.IQ4_NL for t in (QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S,
                                       QT.IQ3_XXS, QT.IQ3_S, QT.IQ4_XS)}}


def fit(qt: QT, cols: int) -> QT:
    """qt, or llama.cpp's fallback when a row of `cols` values is not whole blocks of qt."""
    if cols % gguf.GGML_QUANT_SIZES[qt][0] == 0:
        return qt
    fb = _FALLBACK.get(qt, QT.Q8_0)
    if cols % gguf.GGML_QUANT_SIZES[fb][0]:
        raise ValueError(f"a row of {cols} values fits neither {qt.name} nor {fb.name}")
    return fb


def n_dense(s: dict[str, Any], n_layers: int) -> int:
    """The leading dense layers of an n_layers model of shape s (the module docstring)."""
    lead = s.get("dense_lead", 0)
    if not lead or n_layers < 2:
        return 0
    return min(n_layers - 1, max(1, round(lead * n_layers / s["real_layers"])))


def block_count(s: dict[str, Any], n_layers: int) -> int:
    """The file's block_count: the layers, and glm4moe's NextN layer (tensors absent)."""
    return n_layers + int(s.get("nextn", 0))


def plan(n_layers: int, types: tuple[QT, QT, QT, QT], shape: str) -> Plan:
    """(name, numpy shape (rows last), type or None for float32) of every tensor of the shape,
    in file order. types: (main, attn_v, ffn_down, output) as the kind gives them."""
    s = SHAPES[shape]
    main, attn_v, down, out = types
    E, X, V = s["n_embd"], s["n_expert"], s["n_vocab"]
    arch = s["arch"]

    def q(name: str, shape_: tuple[int, ...], qt: QT) -> tuple[str, tuple[int, ...], QT]:
        return name, shape_, fit(qt, shape_[-1])

    tied = s.get("tied", False)
    t: Plan = [q("token_embd.weight", (V, E), out if tied else main)]
    dense = n_dense(s, n_layers)
    for i in range(n_layers):
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", (E,), None))
        if arch == "qwen3next" and (i + 1) % s["full_attn_every"]:  # gated DeltaNet
            NK, NV, D = s["ssm_k_heads"], s["ssm_v_heads"], s["ssm_head"]
            C = (2 * NK + NV) * D
            t += [q(b + "attn_qkv.weight", (C, E), main), q(b + "attn_gate.weight", (NV * D, E), main),
                  q(b + "ssm_ba.weight", (2 * NV, E), main),
                  (b + "ssm_conv1d.weight", (C, s["ssm_conv"]), None),
                  (b + "ssm_a", (NV,), None), (b + "ssm_dt.bias", (NV,), None),
                  (b + "ssm_norm.weight", (D,), None), q(b + "ssm_out.weight", (E, NV * D), main)]
        elif arch == "deepseek2":
            H, QL, KL, R = s["n_head"], s["q_lora"], s["kv_lora"], s["qk_rope"]
            NP, VH = s["qk_nope"], s["v_head"]
            t += [q(b + "attn_q_a.weight", (QL, E), main), (b + "attn_q_a_norm.weight", (QL,), None),
                  q(b + "attn_q_b.weight", (H * (NP + R), QL), main),
                  q(b + "attn_kv_a_mqa.weight", (KL + R, E), main),
                  (b + "attn_kv_a_norm.weight", (KL,), None),
                  q(b + "attn_k_b.weight", (H, KL, NP), main),
                  q(b + "attn_v_b.weight", (H, VH, KL), main),
                  q(b + "attn_output.weight", (E, H * VH), main)]
        else:
            H, KV, D = s["n_head"], s["n_head_kv"], s["head_dim"]
            bias = arch in ("glm4moe", "gpt-oss")
            gq = 2 if arch == "qwen3next" else 1  # each head's query and gate rows
            for name, rows, qt in (("attn_q", gq * H * D, main), ("attn_k", KV * D, main),
                                   ("attn_v", KV * D, attn_v)):
                t.append(q(b + name + ".weight", (rows, E), qt))
                if bias:
                    t.append((b + name + ".bias", (rows,), None))
            t.append(q(b + "attn_output.weight", (E, H * D), main))
            if arch == "gpt-oss":
                t += [(b + "attn_output.bias", (E,), None), (b + "attn_sinks.weight", (H,), None)]
            if arch in ("qwen3moe", "qwen3next"):
                t += [(b + "attn_q_norm.weight", (D,), None), (b + "attn_k_norm.weight", (D,), None)]
        t.append((b + ("post_attention_norm.weight" if arch in ("glm4moe", "gpt-oss", "qwen3next")
                       else "ffn_norm.weight"), (E,), None))
        if i < dense:
            F = s["n_ff"]
            t += [q(b + "ffn_gate.weight", (F, E), main), q(b + "ffn_up.weight", (F, E), main),
                  q(b + "ffn_down.weight", (E, F), down)]
            continue
        F = s["n_ff_exp"]
        t.append((b + "ffn_gate_inp.weight", (X, E), None))
        if arch == "gpt-oss":
            t += [(b + "ffn_gate_inp.bias", (X,), None)]
            t += [q(b + "ffn_gate_exps.weight", (X, F, E), QT.MXFP4),
                  (b + "ffn_gate_exps.bias", (X, F), None),
                  q(b + "ffn_up_exps.weight", (X, F, E), QT.MXFP4),
                  (b + "ffn_up_exps.bias", (X, F), None),
                  q(b + "ffn_down_exps.weight", (X, E, F), QT.MXFP4),
                  (b + "ffn_down_exps.bias", (X, E), None)]
            continue
        if arch not in ("qwen3moe", "qwen3next"):
            t.append((b + "exp_probs_b.bias", (X,), None))
        t += [q(b + "ffn_gate_exps.weight", (X, F, E), main),
              q(b + "ffn_up_exps.weight", (X, F, E), main),
              q(b + "ffn_down_exps.weight", (X, E, F), down)]
        if s.get("n_shared"):
            S = s.get("n_ff_shexp") or F * s["n_shared"]
            t += [q(b + "ffn_gate_shexp.weight", (S, E), main),
                  q(b + "ffn_up_shexp.weight", (S, E), main),
                  q(b + "ffn_down_shexp.weight", (E, S), down)]
            if arch == "qwen3next":
                t.append((b + "ffn_gate_inp_shexp.weight", (1, E), None))
    t.append(("output_norm.weight", (E,), None))
    if not tied:
        t.append(q("output.weight", (V, E), out))
    return t


def write_keys(w: gguf.GGUFWriter, s: dict[str, Any], n_layers: int) -> None:
    """The architecture's keys (after general.*, before the tokenizer's) of the non-qwen3moe
    shapes, as llama.cpp's converter writes them."""
    arch = s["arch"]
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(block_count(s, n_layers))
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["n_used"])
    w.add_expert_feed_forward_length(s["n_ff_exp"])
    if arch != "qwen3next":
        w.add_leading_dense_block_count(n_dense(s, n_layers))
    w.add_vocab_size(s["n_vocab"])
    if arch == "deepseek2":
        w.add_head_count_kv(1)  # MLA as MQA over the latent
        w.add_q_lora_rank(s["q_lora"])
        w.add_kv_lora_rank(s["kv_lora"])
        w.add_key_length(s["kv_lora"] + s["qk_rope"])
        w.add_value_length(s["kv_lora"])
        w.add_key_length_mla(s["qk_nope"] + s["qk_rope"])
        w.add_value_length_mla(s["v_head"])
        w.add_rope_dimension_count(s["qk_rope"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["yarn_factor"])
        w.add_rope_scaling_orig_ctx_len(s["yarn_orig_ctx"])
        w.add_rope_scaling_yarn_beta_fast(s["yarn_beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(s["yarn_beta_slow"])
        w.add_rope_scaling_yarn_log_mul(s["yarn_log_mul"])
    else:
        w.add_head_count_kv(s["n_head_kv"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_dimension_count(s.get("n_rot", s["head_dim"]))
    if arch == "gpt-oss":
        w.add_sliding_window(s["swa"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["yarn_factor"])
        w.add_rope_scaling_orig_ctx_len(s["yarn_orig_ctx"])
        return
    if arch == "qwen3next":  # as llama.cpp's converter (conversion/qwen.py Qwen3NextModel)
        w.add_expert_shared_feed_forward_length(s["n_ff_shexp"])
        w.add_uint32(f"{arch}.ssm.conv_kernel", s["ssm_conv"])
        w.add_uint32(f"{arch}.ssm.state_size", s["ssm_head"])
        w.add_uint32(f"{arch}.ssm.group_count", s["ssm_k_heads"])
        w.add_uint32(f"{arch}.ssm.time_step_rank", s["ssm_v_heads"])
        w.add_uint32(f"{arch}.ssm.inner_size", s["ssm_v_heads"] * s["ssm_head"])
        w.add_array(f"{arch}.attention.recurrent_layers",
                    [(i + 1) % s["full_attn_every"] != 0 for i in range(n_layers)])
        w.add_uint32(f"{arch}.full_attention_interval", s["full_attn_every"])
        return
    if arch == "ernie4_5-moe":
        w.add_interleave_moe_layer_step(1)
        w.add_expert_shared_count(s["n_shared"])
        w.add_expert_shared_feed_forward_length(s["n_ff_shexp"])
        return
    w.add_expert_shared_count(s["n_shared"])
    w.add_expert_group_count(s["n_group"])
    w.add_expert_group_used_count(s["group_used"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(s["expert_scale"])
    w.add_expert_weights_norm(True)
    if s.get("nextn"):
        w.add_nextn_predict_layers(s["nextn"])
