"""Architectures as data: from a validated GGUF file to the model description the C forward pass
runs (include/colibri/forward.h).

Every supported `general.architecture` is one row of FAMILIES: what differs between families is
data (RoPE pairing, q/k norm kind, activation, gating and renormalisation, embedding scale,
which norms exist, a per-layer attention reader, V norm, an MoE block beside the MLP, ...),
read together with the standard GGUF keys; adding a family is adding a row. The description is
written once: ModelDesc and LayerDesc hold the C structs of include/colibri/forward.h
themselves, and describe() sets their fields by name (colibri/_core/_desc.pxi). Nothing here computes; it only finds
tensors, checks their shapes and types, and hands pointers (numpy views of the file mapping)
to C. The behaviour follows llama.cpp's for each family (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri._core import _forward, _ops
from colibri.arch_gdn import gdn_dims, gdn_layer
from colibri.arch_mla import log_mul, mla_attn_scale, mla_dims, mla_layer, yarn
from colibri.arch_read import (
    F32,
    ExpertTensors,
    Mat,
    UnsupportedModel,
    _LayerAttn,
    _Reader,
    _show,
    gemma4_layer_attn,
)
from colibri.dense import MODES, DenseCopies, worth_copying
from colibri.gguf import GGUFError, GGUFFile

__all__ = ["FAMILIES", "ExpertTensors", "Family", "LayerDesc", "Mat", "ModelDesc",
           "UnsupportedModel", "describe", "open_model"]

# enum values of ops.h, forward.h and routing_logic.h as plain ints, read from the headers
ACT_SILU, ACT_GELU_TANH = int(_ops.cb_act.CB_ACT_SILU), int(_ops.cb_act.CB_ACT_GELU_TANH)
ACT_SWIGLU_OAI = int(_ops.cb_act.CB_ACT_SWIGLU_OAI)
QK_NONE, QK_HEAD, QK_FULL, QK_HEAD_POST = (int(_forward.cb_qk_norm[f"CB_QK_NORM_{k}"])
                                           for k in ("NONE", "HEAD", "FULL", "HEAD_POST"))
ROPE_NORMAL, ROPE_NEOX = int(_ops.cb_rope_mode.CB_ROPE_NORMAL), int(_ops.cb_rope_mode.CB_ROPE_NEOX)
GATING_SOFTMAX, GATING_SIGMOID = _forward.GATING_SOFTMAX, _forward.GATING_SIGMOID
GATING_SPARSEMIXER, GATING_SOFTMAX_WEIGHT = _forward.GATING_SPARSEMIXER, _forward.GATING_SOFTMAX_WEIGHT
MAX_LAYERS = 1 << 16
MAX_EXPERTS = 1 << 20

# A per-layer attention reader: (reader, n_layer, n_head, freq_scale) -> (each layer's
# attention shape and rope, the sliding window).
LayerAttnReader = Callable[[_Reader, int, int, float], tuple[list[_LayerAttn], int]]


@dataclass(frozen=True)
class Family:
    """What one architecture does differently; every field has the common behaviour as default."""

    rope_mode: int = ROPE_NEOX
    act: int = ACT_SILU
    qk_norm: int = QK_NONE
    renorm: bool = True          # renormalise the top-k expert weights
    gating: int = GATING_SOFTMAX
    embd_scale: bool = False     # multiply token embeddings by sqrt(n_embd)
    post_norms: bool = False     # gemma: norms after attention and FFN
    swa_pattern: int = 0         # gemma3: every n-th layer is global, the others sliding
    swa_rope_base: float = 0.0   # rope base of sliding-window layers (0: same as global)
    moe: bool = False            # the family can have experts
    shared_expert: bool = False
    # per-layer head dims, KV heads, rope and sliding window from per-layer keys (None: the
    # model-wide keys)
    layer_attn: LayerAttnReader | None = None
    v_norm: bool = False         # RMSNorm of each V head (no weight)
    v_from_k: bool = False       # a layer may have no attn_v: V is the K projection
    out_scale: bool = False      # optional per-layer output scale (layer_output_scale)
    moe_beside_mlp: bool = False  # MoE layers also have a dense MLP, with their own norms
    attn_scale: float = 0.0      # attention score scale (0: 1/sqrt(head_dim))
    final_softcap: float = 0.0   # logit softcap when final_logit_softcapping is absent
    # llama.cpp's Gemma 2 27B (this many layers) scales queries by 1/sqrt(n_embd / n_head), its
    # query_pre_attn_scalar, not 1/sqrt(head_dim)
    big_attn_scale_layers: int = 0
    default_swa: int = 0         # the sliding window when attention.sliding_window is absent
    fused_gate_up: bool = False  # phi3: ffn_up is [gate; up] (and attn_qkv is [q; k; v])
    no_swa: bool = False         # phi3: attention.sliding_window ignored, as llama.cpp does
    # the routing from the file's keys: expert_gating_func (1 softmax, 2 sigmoid),
    # expert_weights_norm, expert_weights_scale (the family's values when absent)
    keyed_routing: bool = False
    qk_norm_if_present: bool = False  # qk_norm applies when blk.0.attn_q_norm exists
    # granite: embedding_scale, attention.scale, residual_scale and logit_scale (divides) keys
    granite_scales: bool = False
    layer_norm: bool = False  # LayerNorms with biases instead of RMSNorms (phimoe)
    mla: bool = False  # multi-head latent attention (arch_mla, forward_mla.c)
    swa_same_rope: bool = False  # sliding-window layers keep the global rope scaling (gpt-oss)
    # every n-th layer global without RoPE (queries temperature-tuned), the others chunked
    # attention (the chunk: attention.sliding_window, 8192 when absent, as llama.cpp) (llama4)
    chunked_pattern: int = 0
    qk_rms: bool = False      # q/k heads RMS-normed (no weight) after RoPE on rope layers
    weight_in: bool = False   # the routing weight scales the expert's input (top-1)
    # gated DeltaNet linear attention layers (arch_gdn) between gated full attention ones
    # (attn_q: each head's query and its sigmoid gate)
    gdn: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family(rope_mode=ROPE_NORMAL, moe=True, renorm=True),
    "qwen2": Family(),
    "qwen2moe": Family(moe=True, renorm=False, shared_expert=True),
    "qwen3": Family(qk_norm=QK_HEAD),
    "qwen3moe": Family(qk_norm=QK_HEAD, moe=True, renorm=True),
    "olmoe": Family(qk_norm=QK_FULL, moe=True, renorm=False),
    # gemma2: sliding and global layers alternate (window from the file, 4096 when absent),
    # attention scores and logits capped (tanh softcaps, from the file)
    "gemma2": Family(act=ACT_GELU_TANH, embd_scale=True, post_norms=True, swa_pattern=2,
                     big_attn_scale_layers=46, default_swa=4096),
    # phi3 (Phi-3, Phi-4 mini): fused qkv and gate-up; its sliding window is not applied
    # (llama.cpp disables Phi SWA); LongRoPE (rope_factors_long/short) as llama.cpp applies it
    "phi3": Family(fused_gate_up=True, no_swa=True),
    # phimoe (Phi-3.5-MoE): LayerNorms with biases, attention and head biases, sparsemixer
    # routing (routing_logic.h; llama.cpp approximates it by a renormalised softmax top-2)
    "phimoe": Family(moe=True, renorm=False, gating=GATING_SPARSEMIXER, layer_norm=True,
                     no_swa=True),
    # dots1 (dots.llm1): qwen3's attention, DeepSeek-V3's MoE: sigmoid scores, a selection
    # bias, renormalised weights times expert_weights_scale, shared experts, dense first layers
    "dots1": Family(qk_norm=QK_HEAD, moe=True, renorm=True, gating=GATING_SIGMOID,
                    shared_expert=True, keyed_routing=True),
    # glm4moe (GLM-4.5, 4.6, 4.5-Air): dots1's routing, partial rotary (rope.dimension_count),
    # attention biases, optional q/k norms, the NextN layers skipped
    "glm4moe": Family(qk_norm=QK_HEAD, qk_norm_if_present=True, moe=True, renorm=True,
                      gating=GATING_SIGMOID, shared_expert=True, keyed_routing=True),
    # ernie4_5-moe (ERNIE 4.5 MoE): llama's rope pairs, softmax scores with a selection bias
    # (its moe_statics), renormalised weights, shared experts, dense first layers
    "ernie4_5-moe": Family(rope_mode=ROPE_NORMAL, moe=True, renorm=True, shared_expert=True),
    # granitemoe (Granite 3.x MoE, and its shared-expert variant): Mixtral with Granite's four
    # multipliers (embedding, attention, residual, logits) from the file's keys
    "granitemoe": Family(rope_mode=ROPE_NORMAL, moe=True, renorm=True, granite_scales=True,
                         shared_expert=True),  # (the shared-expert variant: ffn_*_shexp)
    # hunyuan-moe (Hunyuan-A13B): per-head q/k norms after RoPE, softmax routing renormalised,
    # a shared expert in every layer
    "hunyuan-moe": Family(qk_norm=QK_HEAD_POST, moe=True, renorm=True, shared_expert=True),
    # bailingmoe2 (Ling/Ring 2.0): fused qkv, per-head q/k norms, partial rotary, dots1's
    # routing with expert groups, shared experts, dense first layers, NextN layers skipped
    "bailingmoe2": Family(qk_norm=QK_HEAD, moe=True, renorm=True, gating=GATING_SIGMOID,
                          shared_expert=True, keyed_routing=True),
    # deepseek2 (DeepSeek-V2/V3/R1, Kimi K2): multi-head latent attention with the latent KV
    # cache, YaRN, dense first layers, shared experts, routing from the file's keys (V3:
    # sigmoid with a selection bias and expert groups; V2: softmax), llama's rope pairs
    "deepseek2": Family(rope_mode=ROPE_NORMAL, moe=True, renorm=False, shared_expert=True,
                        keyed_routing=True, mla=True),
    # gpt-oss: attention sinks, sliding-window (even) and full layers alternating, biases on
    # attention, router and experts, the clamped SwiGLU, softmax over the chosen experts, YaRN
    # on every layer
    "gpt-oss": Family(moe=True, act=ACT_SWIGLU_OAI, gating=GATING_SOFTMAX_WEIGHT, renorm=False,
                      swa_pattern=2, swa_same_rope=True),
    # llama4 (Llama 4 Scout, Maverick): MoE layers (every interleave_moe_layer_step-th) with a
    # shared expert and top-1 sigmoid routing on the input, chunked attention with RoPE and
    # q/k norms, every 4th layer global without RoPE; llama's rope pairs, not permuted
    "llama4": Family(rope_mode=ROPE_NORMAL, moe=True, shared_expert=True, gating=GATING_SIGMOID,
                     renorm=False, no_swa=True, chunked_pattern=4, qk_rms=True, weight_in=True),
    # qwen3next (Qwen3-Next): gated DeltaNet layers, every full_attention_interval-th layer
    # gated full attention with q/k norms and partial rotary; qwen2moe's MoE with a gated
    # shared expert, renormalised softmax top-k
    "qwen3next": Family(qk_norm=QK_HEAD, moe=True, renorm=True, shared_expert=True, gdn=True),
    "gemma3": Family(
        act=ACT_GELU_TANH, qk_norm=QK_HEAD, embd_scale=True, post_norms=True, swa_pattern=6,
        swa_rope_base=10000.0,
    ),
    # llama.cpp's gemma4: logits capped at 30 when the key is absent
    "gemma4": Family(
        act=ACT_GELU_TANH, qk_norm=QK_HEAD, embd_scale=True, post_norms=True, moe=True,
        renorm=True, layer_attn=gemma4_layer_attn, v_norm=True, v_from_k=True, out_scale=True,
        moe_beside_mlp=True, attn_scale=1.0, final_softcap=30.0,
    ),
}


class LayerDesc(_forward.CLayerDesc):
    """One layer's cb_layer_desc_t (forward.h; its fields by name), plus `experts` (the stacked
    expert tensors the expert store reads, or None)."""

    def __init__(self, **fields: Any) -> None:
        self.rope_base, self.rope_freq_scale, self.experts = 10000.0, 1.0, None
        for name, value in fields.items():
            _set_known(self, name, value)

    @property
    def experts(self) -> ExpertTensors | None:
        return self.__dict__.get("_experts")

    @experts.setter
    def experts(self, X: ExpertTensors | None) -> None:
        """The stacked experts; the struct's one-expert templates (exp_gate, exp_up, exp_down:
        type, shape and row stride) are theirs."""
        self.__dict__["_experts"] = X
        mats: tuple[Mat | None, ...] = (X.gate, X.up, X.down) if X else (None,) * 3
        self.exp_gate, self.exp_up, self.exp_down = mats


class ModelDesc(_forward.CModelDesc):
    """The model's cb_model_desc_t (forward.h; its fields by name), plus what Python alone
    needs: `arch`, `n_ctx_train` and `layers` (Forward joins their structs)."""

    arch: str
    n_ctx_train: int
    layers: list[LayerDesc]
    _keep: list[Any]  # arrays describe() made (dequantized vectors, dense copies)
    dense_copied: set[str]  # tensors read from copies on huge pages (colibri.dense), not the file
    dense_packed: set[str]  # those of them in an R16 layout (colibri.dense.packs_r16)

    def __init__(self, **fields: Any) -> None:
        self.arch, self.n_ctx_train, self.layers = "", 0, []
        self.dense_copied = set()
        self.dense_packed = set()
        self.expert_scale = 1.0
        for name, value in fields.items():
            _set_known(self, name, value)

    @property
    def is_moe(self) -> bool:
        return any(layer.n_expert > 0 for layer in self.layers)

    def kv_values_per_token(self) -> int:
        """K and V values one token keeps in the cache, over all layers."""
        return sum(L.mla_kv_lora + (L.rope_n_dims or self.rope_n_dims) if L.mla_kv_lora
                   else 2 * (L.n_head_kv or self.n_head_kv) * (L.head_dim or self.head_dim)
                   for L in self.layers if not L.kv_from  # a sharing layer keeps none
                   and not L.gdn_v_heads)  # nor a linear attention layer (a state instead)

    def state_bytes(self) -> int:
        """Recurrent state bytes of one sequence (linear attention layers: forward.h)."""
        return 4 * sum((L.gdn_conv - 1) * (2 * L.gdn_k_heads * L.gdn_head_k
                                           + L.gdn_v_heads * L.gdn_head_v)
                       + L.gdn_v_heads * L.gdn_head_k * L.gdn_head_v
                       for L in self.layers if L.gdn_v_heads)

    def kv_bytes_per_token(self, kv_dtype: str = "f32") -> int:
        return self.kv_values_per_token() * (4 if kv_dtype == "f32" else 2)

    def kv_dims(self) -> tuple[int, int, int]:
        """(n_layers, n_kv_heads, head_dim) to make the KV cache with: the model's when every
        layer has the same shape, else one flat row per token that the forward splits by layer
        (gemma4's sliding and global layers differ)."""
        if self._kv_uniform():
            return (sum(not L.gdn_v_heads for L in self.layers) or 1), self.n_head_kv, \
                self.head_dim
        return 1, 1, self.kv_values_per_token() // 2

    def _kv_uniform(self) -> bool:
        return all(L.n_head_kv in (0, self.n_head_kv) and L.head_dim in (0, self.head_dim)
                   and not L.kv_from and not L.mla_kv_lora for L in self.layers
                   if not L.gdn_v_heads)

    def kv_page_tokens(self) -> int:
        """Tokens per page of the KV cache's layout (include/colibri/arena.h): 256, so that
        attention reads each K/V head's rows in runs of 256 tokens; 1 (position-major) for the
        flat row of kv_dims(), whose rows are not one head each."""
        return 256 if self._kv_uniform() else 1

    def dense_bytes(self) -> int:
        """Bytes of every tensor except the routed experts."""
        return self._bytes(experts=False)

    def expert_bytes(self) -> int:
        return self._bytes(experts=True)

    def _bytes(self, experts: bool) -> int:
        total = 0
        seen: set[int] = set()

        def add(a: np.ndarray | None) -> None:
            nonlocal total
            if a is not None and id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes

        if not experts:  # every model-wide tensor: embeddings, head, norms, biases, PLE
            for v in self.c_fields().values():
                if isinstance(v, Mat):
                    add(v.data)
                elif isinstance(v, np.ndarray):
                    add(v)
        for layer in self.layers:
            if experts:
                if layer.experts:  # from the shapes: a container's base views span padding
                    X = layer.experts
                    total += layer.n_expert * sum(m.rows * m.row_bytes
                                                  for m in (X.gate, X.up, X.down))
                continue
            for v in layer.c_fields().values():
                if isinstance(v, Mat):
                    add(v.data)
                elif isinstance(v, np.ndarray):
                    add(v)
        return total

def _set_known(d: Any, name: str, value: Any) -> None:
    """d.name = value for a field of the C struct or an attribute the class declares (a typo is
    an error, not a silent new attribute)."""
    if name not in d.c_fields() and name not in getattr(type(d), "__annotations__", {}) \
            and not hasattr(type(d), name):
        raise TypeError(f"{type(d).__name__} has no field {name!r}")
    setattr(d, name, value)


def describe(gf: GGUFFile, dequantize: bool = False, dense_weights: str = "mapped",
             ctx: int | None = None) -> ModelDesc:
    """Build the model description of a GGUF file, or raise UnsupportedModel naming what is
    missing or not supported. dequantize=True expands every matrix to float32 at load (4 bytes
    per weight; exact products, used to compare implementations without the rounding of 8-bit
    activations). dense_weights="copy" copies the dense matrices to huge pages (colibri.dense;
    `desc.dense_copied` names them), "mapped" reads them through the file mapping. ctx: the
    context the model will run with (LongRoPE files choose their factors by it)."""
    if dense_weights not in MODES:
        raise ValueError(f"dense_weights must be one of {', '.join(MODES)}, got {dense_weights!r}")
    arch = gf.architecture
    if arch is None:
        raise UnsupportedModel(f"{gf.path}: no general.architecture key: not a model file")
    fam = FAMILIES.get(arch)
    if fam is None:
        raise UnsupportedModel(
            f"{gf.path}: architecture {arch!r} is not supported; supported: "
            f"{', '.join(sorted(FAMILIES))}"
        )
    copy = dense_weights == "copy" and not dequantize and worth_copying(gf.tensors)
    r = _Reader(gf, arch, dequantize, DenseCopies() if copy else None)
    if copy:  # before any tensor is read: the drops below then stay dropped
        gf.advise_copied()
    p = gf.path
    n_embd = r.int_key("embedding_length", required=True, lo=1)
    n_layer = r.int_key("block_count", required=True, lo=1, hi=MAX_LAYERS)
    # glm4moe: the last blocks are NextN (multi-token prediction) layers, skipped as llama.cpp
    # does (not read, not run)
    nextn = r.int_key("nextn_predict_layers", 0, hi=n_layer - 1)
    n_layer -= nextn
    n_head = r.int_key("attention.head_count", required=True, lo=1)
    per_layer: list[_LayerAttn] | None = None  # the family's per-layer attention, if it has one
    mla = mla_dims(r, n_head) if fam.mla else None
    gdn = gdn_dims(r, n_layer) if fam.gdn else None
    if mla is not None:  # one latent K/V row per token (arch_mla)
        n_head_kv, head_dim, n_rot = 1, mla.head_dim, mla.rope
    elif fam.layer_attn is not None:
        per_layer, _ = fam.layer_attn(r, n_layer, n_head, 1.0)
        # the model-level shape: the first layer's (the per-layer values override it)
        n_head_kv, head_dim, n_rot = per_layer[0].n_head_kv, per_layer[0].head_dim, per_layer[0].n_rot
    else:
        n_head_kv = r.int_key("attention.head_count_kv", n_head, lo=1)
        if n_embd < n_head:
            raise UnsupportedModel(f"{p}: {arch}.embedding_length {n_embd} is smaller than the "
                                   f"{n_head} attention heads")
        head_dim = r.int_key("attention.key_length", n_embd // n_head, lo=1)
        v_dim = r.int_key("attention.value_length", head_dim, lo=1)
        if v_dim != head_dim:
            raise UnsupportedModel(f"{p}: key_length {head_dim} != value_length {v_dim} is not supported")
        n_rot = r.int_key("rope.dimension_count", head_dim)
        if n_rot > head_dim or n_rot % 2:
            raise UnsupportedModel(f"{p}: {arch}.rope.dimension_count {n_rot} must be even and at "
                                   f"most the head dimension {head_dim}")
    # the norm epsilon: positive and finite (NaN or 0 would make every norm NaN / infinite)
    eps = r.float_key("attention.layer_norm_rms_epsilon", required=True, lo=0.0, hi=1.0,
                      lo_open=True)
    n_ctx = r.int_key("context_length", 4096)
    rope_base = r.float_key("rope.freq_base", 10000.0, lo=0.0, lo_open=True)
    scaling_type = r.key("rope.scaling.type", "none")
    if not isinstance(scaling_type, str):
        raise UnsupportedModel(f"{p}: {arch}.rope.scaling.type must be a string, got "
                               f"{_show(scaling_type)}")
    factor = r.float_key("rope.scaling.factor", 0.0, lo=0.0, hi=1e6)
    if scaling_type not in ("none", "linear", "yarn") and factor not in (0.0, 1.0):
        raise UnsupportedModel(f"{p}: rope scaling {scaling_type!r} is not supported")
    freq_scale = 1.0 / factor if factor > 0 else 1.0
    # LongRoPE (Phi-3/3.5 128k): the long factors when the context runs past the original
    # one, as llama.cpp chooses (by the context asked for: ctx, else the trained one)
    longrope = r.has("rope_factors_long.weight") or r.has("rope_factors_short.weight")
    rope_attn_factor = r.float_key("rope.scaling.attn_factor", 1.0, lo=0.0, hi=1e3, lo_open=True)
    y = yarn(r, arch, n_ctx, freq_scale, rope_attn_factor) if scaling_type == "yarn" else None
    if y is not None:  # the rope's magnitude as llama.cpp sets it for YaRN
        rope_attn_factor = y.attn_factor
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv or n_embd <= 0 or n_layer <= 0:
        raise UnsupportedModel(f"{p}: bad attention sizes: {n_head} heads, {n_head_kv} KV heads")

    tok = r.info("token_embd.weight")
    n_vocab = tok.shape[1] if len(tok.shape) == 2 else 0
    # the embedding is read a row per token: not copied, unless it is also the head (tied),
    # which streams it whole every token
    tok_embd = r.mat("token_embd.weight", n_vocab, n_embd, copy=False)
    output = r.mat("output.weight", n_vocab, n_embd, required=False)
    if output is None:
        output = tok_embd = r.mat("token_embd.weight", n_vocab, n_embd)
    assert tok_embd is not None and output is not None
    output_norm = r.vec("output_norm.weight", n_embd)
    assert output_norm is not None

    n_expert = r.int_key("expert_count", 0, hi=MAX_EXPERTS)
    n_used = r.int_key("expert_used_count", 0, hi=MAX_EXPERTS)
    if n_expert and not fam.moe:
        raise UnsupportedModel(f"{p}: {arch} with experts is not supported")
    if n_expert and not 1 <= n_used <= n_expert:
        raise UnsupportedModel(f"{p}: {arch}.expert_used_count {n_used} must be in [1, "
                               f"{arch}.expert_count = {n_expert}]")
    embd_scale = math.sqrt(n_embd) if fam.embd_scale else 1.0
    attn_scale = fam.attn_scale or 1.0 / math.sqrt(
        n_embd // n_head if n_layer == fam.big_attn_scale_layers else head_dim)
    if mla is not None:
        attn_scale = mla_attn_scale(mla, rope_attn_factor, log_mul(r, arch), freq_scale)
    residual_scale = logit_scale = 1.0
    if fam.granite_scales:
        embd_scale = r.float_key("embedding_scale", 1.0, lo=0.0, hi=1e6, lo_open=True)
        attn_scale = r.float_key("attention.scale", attn_scale, lo=0.0, hi=1e6, lo_open=True)
        residual_scale = r.float_key("residual_scale", 1.0, lo=0.0, hi=1e6, lo_open=True)
        logit_scale = 1.0 / r.float_key("logit_scale", 1.0, lo=0.0, hi=1e6, lo_open=True)
    qk_norm = fam.qk_norm
    if fam.qk_norm_if_present and not r.has("blk.0.attn_q_norm.weight"):
        qk_norm = QK_NONE  # glm4moe: GLM-4.5 has none, other files per-head norms
    gating, renorm, expert_scale = fam.gating, fam.renorm, 1.0
    if fam.keyed_routing:
        func = r.int_key("expert_gating_func", 2 if fam.gating == GATING_SIGMOID else 1,
                         lo=1, hi=2)
        gating = GATING_SOFTMAX if func == 1 else GATING_SIGMOID
        norm = r.key("expert_weights_norm", fam.renorm)
        if not isinstance(norm, bool | np.bool_):
            raise UnsupportedModel(f"{p}: {arch}.expert_weights_norm must be a bool, got "
                                   f"{_show(norm)}")
        renorm = bool(norm)
        expert_scale = r.float_key("expert_weights_scale", 1.0, lo=0.0, hi=1e6, lo_open=True)
    # group-limited routing (DeepSeek-V3, Ling): only the best expert_group_used_count groups
    # of experts compete (routing_logic.h cb_route_token_grouped)
    n_group = r.int_key("expert_group_count", 0, hi=64)
    n_group_used = r.int_key("expert_group_used_count", n_group, hi=max(n_group, 1)) if n_group > 1 else 0
    if n_group > 1 and (n_expert % n_group or n_expert < 2 * n_group or n_group_used < 1
                        or n_used > n_group_used * (n_expert // n_group)):
        raise UnsupportedModel(f"{p}: {n_expert} experts in {n_group} groups ({n_group_used} "
                               f"used) for top-{n_used} routing")
    swa = 0 if fam.no_swa else r.int_key("attention.sliding_window", fam.default_swa)
    chunk = nope_step = 0
    if fam.chunked_pattern:  # as llama.cpp: a window key of 0 means no chunks, and RoPE but on
        chunk = r.int_key("attention.sliding_window", 8192, hi=1 << 30) or 0  # the last layer
        nope_step = fam.chunked_pattern if chunk else n_layer
    temp = (r.float_key("attention.temperature_length", 8192.0, lo=1.0),
            r.float_key("attention.temperature_scale", 0.1, lo=0.0)) if chunk else (0.0, 0.0)
    qk_rms = fam.qk_rms and n_expert != 128  # llama.cpp: Llama 4 Maverick (128 experts) has none
    pattern_layers = gf.metadata.get(f"{arch}.attention.sliding_window_pattern_layers")
    if not isinstance(pattern_layers, list | tuple | np.ndarray):
        pattern_layers = None

    # rope_freqs: per-pair frequency divisors (llama3-style scaling; gemma4's proportional
    # rope of the global layers), n_rot/2 values; with per-layer attention, on global layers only
    rope_rot = n_rot if per_layer is None else next((a.n_rot for a in per_layer if not a.sliding), n_rot)
    rope_freqs = r.vec("rope_freqs.weight", rope_rot // 2, required=False)
    if longrope and rope_freqs is None:
        orig = r.int_key("rope.scaling.original_context_length", n_ctx, lo=1)
        which = "long" if (ctx or n_ctx) > orig else "short"
        rope_freqs = r.vec(f"rope_factors_{which}.weight", rope_rot // 2)

    layers = []
    for i in range(n_layer):
        b = f"blk.{i}."
        hd_i, nkv_i = (head_dim, n_head_kv) if per_layer is None else (per_layer[i].head_dim, per_layer[i].n_head_kv)
        kv_from = 0 if per_layer is None else per_layer[i].kv_from
        nq, nkv = n_head * hd_i, nkv_i * hd_i
        attn_norm = r.vec(b + "attn_norm.weight", n_embd)
        ffn_norm_name = b + "ffn_norm.weight"
        if not r.has(ffn_norm_name) and r.has(b + "post_attention_norm.weight") and not fam.post_norms:
            ffn_norm_name = b + "post_attention_norm.weight"
        ffn_norm = r.vec(ffn_norm_name, n_embd)
        wq: Mat | None
        wk: Mat | None
        wv: Mat | None
        mla_f = mla_layer(r, i, n_embd, n_head, mla) if mla is not None else {}
        if gdn is not None and gdn.recurrent[i]:  # linear attention (arch_gdn): no q/k/v
            mla_f = gdn_layer(r, i, n_embd, gdn)
            none0 = Mat(F32, 0, 0, 0, None)
            wq, wk, wv = none0, none0, none0
        elif mla_f:  # queries and keys from the latent (the fields below); no attn_k / attn_v
            none0 = Mat(F32, 0, 0, 0, None)
            wq, wk, wv = mla_f.pop("wq", none0), none0, none0
        elif r.has(b + "attn_qkv.weight"):  # phi3: q, k and v rows in one tensor
            wq, wk, wv = r.mat_rows(b + "attn_qkv.weight", [nq, nkv, nkv], n_embd)
        else:  # a layer sharing another's K/V (kv_from) has no K/V projections
            wq = r.mat(b + "attn_q.weight", 2 * nq if fam.gdn else nq, n_embd)
            wk = r.mat(b + "attn_k.weight", nkv, n_embd, required=not kv_from)
            # gemma4 attention_k_eq_v: no attn_v, V is the K projection
            wv = r.mat(b + "attn_v.weight", nkv, n_embd, required=not (fam.v_from_k or kv_from))
        wo = mla_f.pop("wo") if mla_f else r.mat(b + "attn_output.weight", n_embd, nq)
        assert attn_norm is not None and ffn_norm is not None
        assert wq is not None and wo is not None and (wk is not None or kv_from)
        none = Mat(F32, 0, 0, 0, None)
        L = LayerDesc(attn_norm=attn_norm, wq=wq, wk=wk or none, wv=wv or none, wo=wo,
                      ffn_norm=ffn_norm, **mla_f)
        L.v_from_k, L.kv_from = wv is None and not kv_from, kv_from
        L.bq = r.vec(b + "attn_q.bias", nq, required=False)
        L.bk = r.vec(b + "attn_k.bias", nkv, required=False)
        L.bv = r.vec(b + "attn_v.bias", nkv, required=False)
        L.bo = r.vec(b + "attn_output.bias", n_embd, required=False)
        L.attn_sinks = r.vec(b + "attn_sinks.weight", n_head, required=False)
        if nope_step and (i + 1) % nope_step:
            L.attn_chunk, L.qk_rms = chunk, qk_rms
        elif nope_step:
            L.no_rope, (L.attn_temp_floor, L.attn_temp_scale) = 1, temp
        L.attn_q_gate = fam.gdn and not L.gdn_v_heads
        if L.gdn_v_heads:
            pass
        elif qk_norm in (QK_HEAD, QK_HEAD_POST):
            L.q_norm = r.vec(b + "attn_q_norm.weight", hd_i)
            L.k_norm = r.vec(b + "attn_k_norm.weight", hd_i, required=not kv_from)
        elif qk_norm == QK_FULL:
            L.q_norm = r.vec(b + "attn_q_norm.weight", nq)
            L.k_norm = r.vec(b + "attn_k_norm.weight", nkv)
        if fam.post_norms:
            L.attn_post_norm = r.vec(b + "post_attention_norm.weight", n_embd)
            L.ffn_post_norm = r.vec(b + "post_ffw_norm.weight", n_embd)
        L.rope_base, L.rope_freq_scale, L.rope_freqs = rope_base, freq_scale, rope_freqs
        L.rope_attn_factor = rope_attn_factor
        if y is not None:
            L.rope_ext_factor, L.rope_beta_fast, L.rope_beta_slow = y.ext_factor, y.beta_fast, y.beta_slow
            L.rope_n_ctx_orig = y.n_ctx_orig
        if fam.layer_norm:
            L.attn_norm_b = r.vec(b + "attn_norm.bias", n_embd, required=False)
            L.ffn_norm_b = r.vec(ffn_norm_name[:-len("weight")] + "bias", n_embd, required=False)
        L.v_norm = fam.v_norm
        if fam.out_scale:
            L.out_scale = r.vec(b + "layer_output_scale.weight", 1, required=False)
        if per_layer is not None:
            a = per_layer[i]
            L.n_head_kv, L.head_dim, L.rope_n_dims = a.n_head_kv, a.head_dim, a.n_rot
            L.rope_base = a.rope_base
            if a.sliding:
                L.sliding_window, L.rope_freq_scale, L.rope_freqs = swa, 1.0, None
        elif fam.swa_pattern and swa > 0:
            if pattern_layers is not None and len(pattern_layers) == n_layer:
                sliding = bool(pattern_layers[i])
            else:
                sliding = (i + 1) % fam.swa_pattern != 0
            if sliding:
                L.sliding_window = swa
                if not fam.swa_same_rope:
                    L.rope_base, L.rope_freq_scale = fam.swa_rope_base or rope_base, 1.0
                    L.rope_ext_factor = 0.0
        if n_expert and r.has(b + "ffn_gate_inp.weight"):
            exp_name = b + ("ffn_gate_up_exps.weight" if r.has(b + "ffn_gate_up_exps.weight")
                            else "ffn_gate_exps.weight")
            ff_guess = r.dims(exp_name, 3)[1] // (2 if "gate_up" in exp_name else 1)
            n_ff_exp = r.int_key("expert_feed_forward_length", 0) or ff_guess
            L.n_expert, L.n_expert_used, L.n_ff_exp = n_expert, n_used, n_ff_exp
            L.router = r.mat(b + "ffn_gate_inp.weight", n_expert, n_embd)
            L.router_bias = r.vec(b + "exp_probs_b.bias", n_expert, required=False)
            L.router_b = r.vec(b + "ffn_gate_inp.bias", n_expert, required=False)
            L.exp_gate_b, L.exp_up_b, L.exp_down_b = (  # gpt-oss
                r.vec(b + f"ffn_{w}_exps.bias", n_expert * k, required=False)
                for w, k in (("gate", n_ff_exp), ("up", n_ff_exp), ("down", n_embd)))
            L.experts = r.experts(i, n_expert, n_embd, n_ff_exp)
            if fam.shared_expert and r.has(b + "ffn_gate_shexp.weight"):
                ff_sh = r.dims(b + "ffn_gate_shexp.weight", 2)[1]
                L.sh_gate = r.mat(b + "ffn_gate_shexp.weight", ff_sh, n_embd)
                L.sh_up = r.mat(b + "ffn_up_shexp.weight", ff_sh, n_embd)
                L.sh_down = r.mat(b + "ffn_down_shexp.weight", n_embd, ff_sh)
                L.sh_gate_inp = r.mat(b + "ffn_gate_inp_shexp.weight", 1, n_embd, required=False)
            if fam.moe_beside_mlp:
                # the MoE block beside the dense MLP: its norms, router input scale and
                # per-expert output scale
                ff = r.dims(b + "ffn_gate.weight", 2)[1]
                L.ffn_gate = r.mat(b + "ffn_gate.weight", ff, n_embd)
                L.ffn_up = r.mat(b + "ffn_up.weight", ff, n_embd)
                L.ffn_down = r.mat(b + "ffn_down.weight", n_embd, ff)
                L.ffn_post_norm_1 = r.vec(b + "post_ffw_norm_1.weight", n_embd)
                L.ffn_pre_norm_2 = r.vec(b + "pre_ffw_norm_2.weight", n_embd)
                L.ffn_post_norm_2 = r.vec(b + "post_ffw_norm_2.weight", n_embd)
                L.router_in_scale = r.vec(b + "ffn_gate_inp.scale", n_embd)
                L.exp_down_scale = r.vec(b + "ffn_down_exps.scale", n_expert, required=False)
        elif fam.fused_gate_up:  # phi3: ffn_up holds the gate rows, then the up rows
            ff = r.dims(b + "ffn_down.weight", 2)[0]
            L.ffn_gate, L.ffn_up = r.mat_rows(b + "ffn_up.weight", [ff, ff], n_embd)
            L.ffn_down = r.mat(b + "ffn_down.weight", n_embd, ff)
        else:
            ff = r.dims(b + "ffn_gate.weight", 2)[1]
            L.ffn_gate = r.mat(b + "ffn_gate.weight", ff, n_embd)
            L.ffn_up = r.mat(b + "ffn_up.weight", ff, n_embd)
            L.ffn_down = r.mat(b + "ffn_down.weight", n_embd, ff)
        layers.append(L)
    # gemma4's per-layer embeddings (forward.h n_embd_per_layer)
    n_pl = r.int_key("embedding_length_per_layer_input", 0, hi=1 << 16)
    if n_pl > 0 or r.has("per_layer_token_embd.weight"):
        if n_pl <= 0:
            raise UnsupportedModel(f"{p}: per_layer_token_embd.weight without "
                                   f"{arch}.embedding_length_per_layer_input")
        for i, L in enumerate(layers):
            b = f"blk.{i}."
            L.pl_inp_gate = r.mat(b + "inp_gate.weight", n_pl, n_embd)
            L.pl_proj = r.mat(b + "proj.weight", n_embd, n_pl)
            L.pl_post_norm = r.vec(b + "post_norm.weight", n_embd)
    pl_model = dict(
        n_embd_per_layer=n_pl,
        per_layer_tok_embd=r.mat("per_layer_token_embd.weight", n_vocab, n_layer * n_pl, copy=False),
        per_layer_model_proj=r.mat("per_layer_model_proj.weight", n_layer * n_pl, n_embd),
        per_layer_proj_norm=r.vec("per_layer_proj_norm.weight", n_pl)) if n_pl > 0 else {}

    desc = ModelDesc(
        arch=arch, n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_vocab=n_vocab, n_ctx_train=n_ctx, norm_eps=eps, act=fam.act,
        qk_norm=qk_norm, rope_mode=fam.rope_mode, rope_n_dims=n_rot,
        embd_scale=embd_scale, attn_scale=attn_scale, residual_scale=residual_scale,
        logit_scale=logit_scale,
        attn_softcap=r.float_key("attn_logit_softcapping", 0.0, lo=0.0),
        final_softcap=r.float_key("final_logit_softcapping", fam.final_softcap, lo=0.0),
        gating=gating, expert_renorm=renorm, expert_scale=expert_scale,
        expert_groups=n_group if n_group > 1 else 0, expert_groups_used=n_group_used,
        expert_weight_in=fam.weight_in,
        tok_embd=tok_embd, output_norm=output_norm, output=output, layers=layers,
        output_b=r.vec("output.bias", n_vocab, required=False), layer_norm=fam.layer_norm,
        output_norm_b=r.vec("output_norm.bias", n_embd, required=False) if fam.layer_norm else None,
        **pl_model,
    )
    desc._keep = r.keep
    desc.dense_copied = r.dense.names if r.dense is not None else set()
    desc.dense_packed = set(r.dense.packed) if r.dense is not None else set()
    return desc


def open_model(path: str, dequantize: bool = False) -> tuple[GGUFFile, ModelDesc]:
    """Open and describe a model file; errors are GGUFError / UnsupportedModel (ValueErrors)."""
    from colibri.container import open_model_file  # a GGUF or a colibri container, by magic

    gf = open_model_file(path)
    try:
        return gf, describe(gf, dequantize)
    except (GGUFError, UnsupportedModel):
        gf.close()
        raise
