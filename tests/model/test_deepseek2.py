"""deepseek2 (DeepSeek-V2/V3/R1, Kimi K2): multi-head latent attention with the latent KV cache
(colibri/_core/forward_mla.c), YaRN, group-limited sigmoid routing, dense first layers and
shared experts, against `transformers` (DeepseekV3ForCausalLM, DeepseekV2ForCausalLM: the
oracle) on tiny random models converted with colibri's converter as llama.cpp's writes them.
llama.cpp's own outputs on the same files are checked in test_family_llama_refs.py."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from oracle_checks import (
    batch_and_steps,
    batched_equal_alone,
    greedy_f32_and_q8_0,
    open_model,
    rel_err,
)
from oracle_models import build, hf_logits, prompt

from colibri.model import Model


@pytest.fixture(scope="module", params=["deepseek_v3", "deepseek_v2"])
def ds(request, tmp_path_factory):
    hf, paths = build(request.param, tmp_path_factory.mktemp(request.param), ("f32", "q8_0"))
    return request.param, hf, paths


def test_file_as_llama_cpp_writes_it(ds):
    """The absorbed form: attn_k_b / attn_v_b (no attn_kv_b), one K/V head, key_length =
    kv_lora + rope for the latent cache and the per-head lengths in the _mla keys."""
    name, hf, paths = ds
    r = gguf.GGUFReader(str(paths["f32"]))
    names = {t.name for t in r.tensors}
    assert {"blk.1.attn_k_b.weight", "blk.1.attn_v_b.weight", "blk.1.attn_kv_a_mqa.weight",
            "blk.1.attn_kv_a_norm.weight"} <= names
    assert not any("attn_kv_b" in n for n in names)
    assert ("blk.0.attn_q_a.weight" in names) == (name == "deepseek_v3")

    def val(key):
        return r.fields[f"deepseek2.{key}"].contents()

    c = hf.config
    assert val("attention.head_count_kv") == 1
    assert val("attention.key_length") == c.kv_lora_rank + c.qk_rope_head_dim
    assert val("attention.value_length") == c.kv_lora_rank
    assert val("attention.key_length_mla") == c.qk_nope_head_dim + c.qk_rope_head_dim
    assert val("attention.value_length_mla") == c.v_head_dim


def test_logits_match_transformers_in_one_batch_and_token_by_token(ds):
    name, hf, paths = ds
    ids = prompt(40, seed=1)  # past the original context (16) YaRN stretches
    ref = batch_and_steps(open_model(paths["f32"]), hf, ids)
    # f16 cache: the latent rows rounded, still within llama.cpp's usual distance
    h = Model(paths["f32"], threads=2, ctx=256, max_batch=64, kv_dtype="f16")
    assert rel_err(h.logits(ids), ref) < 5e-3


def test_greedy_and_q8_0(ds):
    greedy_f32_and_q8_0(ds[1], ds[2])


def test_sequences_batched_equal_each_alone(ds):
    """Several sequences in one batch, each at its own positions, through the latent cache."""
    batched_equal_alone(open_model(ds[2]["f32"]), seed=20)


def test_the_cache_keeps_the_latent(ds):
    """KV values per token: kv_lora + rope per layer, not the heads' full K and V; the plan
    and the cache's size say so."""
    name, hf, paths = ds
    c = hf.config
    m = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    latent = c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim)
    full = c.num_hidden_layers * c.num_attention_heads * (
        c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
    assert m.desc.kv_values_per_token() == latent
    assert m.desc.kv_bytes_per_token("f16") == 2 * latent < 2 * full
    assert all(L.mla_kv_lora == c.kv_lora_rank for L in m.desc.layers)


def test_scale_and_yarn_from_the_config(ds):
    """The score scale is transformers' (1/sqrt(qk head dim) times YaRN's mscale(factor,
    mscale_all_dim)^2) and the rope runs YaRN over the original context (the logits past it
    match transformers' in the test above)."""
    name, hf, paths = ds
    rp = hf.config.rope_parameters
    m = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    ms = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0
    hd = hf.config.qk_nope_head_dim + hf.config.qk_rope_head_dim
    assert m.desc.attn_scale == pytest.approx(ms * ms / math.sqrt(hd), rel=1e-6)
    L = m.desc.layers[0]
    assert L.rope_ext_factor == 1.0 and L.rope_n_ctx_orig == rp["original_max_position_embeddings"]
    assert L.rope_freq_scale == pytest.approx(1 / rp["factor"])


def _legacy(path, out, cfg):
    """The same model as an older llama.cpp converter wrote it: one attn_kv_b per layer
    ([n_head*(nope + v), kv_lora]) and the per-head key/value lengths, no _mla keys."""
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(out), "deepseek2")
    H, N, V = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or "_mla" in f.name:
            continue
        v = f.contents()
        if f.name == "deepseek2.attention.key_length":
            v = N + cfg.qk_rope_head_dim
        elif f.name == "deepseek2.attention.value_length":
            v = V
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, v)
        else:
            w.add_key_value(f.name, v, vt)
    kb = {}
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("attn_k_b.weight"):
            kb[t.name] = a
            continue
        if t.name.endswith("attn_v_b.weight"):
            k = kb.pop(t.name.replace("attn_v_b", "attn_k_b"))  # [H, kv_lora, N]
            kv = np.concatenate([k.transpose(0, 2, 1), a], axis=1)  # [H, N + V, kv_lora]
            w.add_tensor(t.name.replace("attn_v_b", "attn_kv_b"), kv.reshape(H * (N + V), -1))
            continue
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_legacy_kv_b_files_keep_the_latent_cache(ds, tmp_path):
    """A file with the unsplit attn_kv_b (older conversions) runs the same MLA: its logits are
    the split file's, with the same latent cache."""
    _, hf, paths = ds
    old = _legacy(paths["f32"], tmp_path / "legacy.gguf", hf.config)
    assert "blk.1.attn_kv_b.weight" in {t.name for t in gguf.GGUFReader(str(old)).tensors}
    a = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    b = Model(str(old), threads=2, ctx=256, max_batch=64)
    ids = prompt(30, seed=4)
    assert rel_err(b.logits(ids), a.logits(ids)) < 1e-5
    assert b.desc.kv_values_per_token() == a.desc.kv_values_per_token()


def test_mla_tensors_are_used(ds):
    """Zeroing the absorbed V projection in transformers moves its logits: the test compares
    against a model in which the MLA path matters."""
    _, hf, paths = ds
    m = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    ids = prompt(20, seed=5)
    got = m.logits(ids)
    assert rel_err(got, hf_logits(hf, ids)) < 1e-4
    saved = [layer.self_attn.kv_b_proj.weight.clone() for layer in hf.model.layers]
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.kv_b_proj.weight[:, :].mul_(0.5)
    try:
        assert rel_err(got, hf_logits(hf, ids)) > 1e-3
    finally:
        with torch.no_grad():
            for layer, w in zip(hf.model.layers, saved, strict=True):
                layer.self_attn.kv_b_proj.weight.copy_(w)


def test_plan_counts_the_latent_cache(ds):
    """colibri plan's KV figure: the context times the latent row of every layer."""
    from colibri.plan import make_plan

    _, hf, paths = ds
    c = hf.config
    p = make_plan(str(paths["f32"]), ctx=100, max_batch=4, kv_dtype="f16", available=2**34)
    assert p.kv_bytes == 100 * 2 * c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim)
