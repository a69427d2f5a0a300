"""gpt-oss against `transformers` (GptOssForCausalLM, the oracle) on a tiny random model
converted with colibri's converter as llama.cpp's writes it: attention sinks, sliding-window
and full layers alternating, biases on attention, router and experts, the clamped SwiGLU with
its alpha, softmax over the chosen experts, YaRN. Each mechanism is shown to matter: with it
changed in transformers, the logits leave colibri's."""

from __future__ import annotations

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
from oracle_models import _convert_module, build, hf_greedy, hf_logits, prompt

from colibri.model import Model


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    hf, paths = build("gpt_oss", tmp_path_factory.mktemp("gpt_oss"), ("f32", "q8_0"))
    return hf, paths


def test_file_as_llama_cpp_writes_it(oss):
    hf, paths = oss
    r = gguf.GGUFReader(str(paths["f32"]))
    names = {t.name for t in r.tensors}
    assert {"blk.0.attn_sinks.weight", "blk.0.ffn_gate_inp.bias", "blk.0.ffn_gate_exps.bias",
            "blk.0.ffn_up_exps.bias", "blk.0.ffn_down_exps.bias", "blk.0.attn_q.bias",
            "blk.0.post_attention_norm.weight"} <= names
    assert r.fields["gpt-oss.expert_feed_forward_length"].contents() == 32
    assert r.fields["gpt-oss.attention.sliding_window"].contents() == 8


def test_logits_in_one_batch_token_by_token_greedy_and_q8_0(oss):
    hf, paths = oss
    m = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    assert [L.sliding_window for L in m.desc.layers] == [8, 0, 8, 0]
    assert all(L.rope_ext_factor == 1.0 for L in m.desc.layers)  # YaRN on the sliding ones too
    batch_and_steps(m, hf, prompt(40, seed=1))
    greedy_f32_and_q8_0(hf, paths)


def test_sequences_batched_equal_each_alone(oss):
    batched_equal_alone(open_model(oss[1]["f32"]), seed=30)


@pytest.mark.parametrize("what", ["sinks", "expert biases", "router bias"])
def test_each_mechanism_is_seen(oss, what):
    """With the sinks (or the experts' or router's biases) zeroed in transformers, its logits
    move away from colibri's: the comparison above depends on each."""
    hf, paths = oss
    m = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    ids = prompt(30, seed=3)
    got = m.logits(ids)
    params = {n: p for n, p in hf.named_parameters()
              if {"sinks": n.endswith("sinks"),
                  "expert biases": n.endswith(("gate_up_proj_bias", "down_proj_bias")),
                  "router bias": n.endswith("router.bias")}[what]}
    assert params
    saved = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            for p in params.values():
                p.zero_()
        assert rel_err(got, hf_logits(hf, ids)) > 1e-3
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])


def test_the_swiglu_clamp(oss, tmp_path):
    """Experts whose gate and up run past the clamp (+-7): the gate_up weights scaled by 40;
    colibri still matches transformers, and a share of the values is clamped."""
    hf, _ = oss
    saved = {n: p.detach().clone() for n, p in hf.named_parameters()
             if n.endswith("experts.gate_up_proj")}
    try:
        with torch.no_grad():
            for n, p in hf.named_parameters():
                if n in saved:
                    p.mul_(40.0)
        hf.save_pretrained(tmp_path / "hf")
        path = _convert_module().convert(tmp_path / "hf", tmp_path / "clamped.gguf", "f32")
        m = Model(path, threads=2, ctx=256, max_batch=64)
        ids = prompt(30, seed=4)
        seen = []
        hook = hf.model.layers[1].mlp.experts.register_forward_hook(
            lambda mod, args, out: seen.append(args[0].detach()))
        try:
            ref = hf_logits(hf, ids)
        finally:
            hook.remove()
        h = seen[0].reshape(-1, seen[0].shape[-1])
        gu = h @ hf.model.layers[1].mlp.experts.gate_up_proj[0]
        assert float((gu.abs() > 7).float().mean()) > 0.05  # the clamp bites
        assert rel_err(m.logits(ids), ref) < 1e-4
    finally:
        with torch.no_grad():
            for n, p in hf.named_parameters():
                if n in saved:
                    p.copy_(saved[n])


def test_mxfp4_experts(oss, tmp_path):
    """The experts in MXFP4, as gpt-oss ships them (the gguf package's quantizer): colibri's
    MXFP4 kernels against the same file dequantized to float32 at load (exact products), and
    the greedy tokens of transformers' model kept."""
    hf, paths = oss
    r = gguf.GGUFReader(str(paths["f32"]))
    out = tmp_path / "mxfp4.gguf"
    w = gguf.GGUFWriter(str(out), "gpt-oss")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(f.name, f.contents())
        else:
            w.add_key_value(f.name, f.contents(), f.types[0])
    n_mx = 0
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        if t.name.endswith("_exps.weight"):
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.MXFP4)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            n_mx += 1
        else:
            w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert n_mx == 12
    ids = prompt(30, seed=6)
    exact = Model(str(out), threads=2, ctx=256, max_batch=64, dequantize=True).logits(ids)
    m = Model(str(out), threads=2, ctx=256, max_batch=64)
    assert rel_err(m.logits(ids), exact) < 0.02
    start = prompt(12, seed=2)
    want = hf_greedy(hf, start, 16)
    s = m.new_sequence()
    lg = m.eval([s], tokens=start)
    got = []
    for _ in range(16):
        got.append(int(np.argmax(lg[-1])))
        lg = m.eval([s], tokens=[got[-1]])
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= 14


def test_the_gpu_path_refuses_it_by_name(oss):
    """Model(device="cuda")'s experts do not run biased experts or the clamped SwiGLU yet: a
    clear refusal before any device work (the CPU runs them)."""
    from colibri.arch import UnsupportedModel
    from colibri.cuda_moe import CudaExperts

    d = Model(oss[1]["f32"], threads=2, ctx=64, max_batch=8).desc
    with pytest.raises(UnsupportedModel, match="biased experts and clamped SwiGLU"):
        CudaExperts(d, runtime=object())
