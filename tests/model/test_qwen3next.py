"""Qwen3-Next against `transformers` (Qwen3NextForCausalLM, the oracle) on a tiny random model
converted with colibri's converter as llama.cpp's writes it: gated DeltaNet linear attention
layers (a causal conv and a delta-rule state per sequence) between gated full attention layers
(partial rotary, q/k norms), zero-centred norms, experts with a gated shared expert. Each
mechanism is shown to matter: with it changed in transformers, the logits leave colibri's."""

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
from oracle_models import build, hf_logits, prompt


@pytest.fixture(scope="module")
def q3n(tmp_path_factory):
    return build("qwen3next", tmp_path_factory.mktemp("qwen3next"), ("f32", "f16", "q8_0"))


def test_file_as_llama_cpp_writes_it(q3n):
    _, paths = q3n
    r = gguf.GGUFReader(str(paths["f32"]))
    names = {t.name for t in r.tensors}
    assert {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_ba.weight",
            "blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias",
            "blk.0.ssm_norm.weight", "blk.0.ssm_out.weight", "blk.1.attn_q.weight",
            "blk.1.attn_q_norm.weight", "blk.0.ffn_gate_inp_shexp.weight",
            "blk.0.post_attention_norm.weight"} <= names
    assert "blk.0.attn_q.weight" not in names and "blk.1.ssm_a" not in names
    assert list(r.fields["qwen3next.attention.recurrent_layers"].contents()) == [True, False] * 2
    assert r.fields["qwen3next.ssm.conv_kernel"].contents() == 4
    assert r.fields["qwen3next.ssm.time_step_rank"].contents() == 4
    assert r.fields["qwen3next.ssm.group_count"].contents() == 2


def test_description_and_state(q3n):
    _, paths = q3n
    m = open_model(paths["f32"])
    assert [L.gdn_v_heads for L in m.desc.layers] == [4, 0, 4, 0]
    assert [L.attn_q_gate for L in m.desc.layers] == [0, 1, 0, 1]
    assert m.desc.rope_n_dims == 8
    # per linear layer: 3 conv inputs of 2*2*16 + 4*16 channels, 4 states of 16 x 16
    assert m.desc.state_bytes() == 4 * 2 * (3 * 128 + 4 * 16 * 16)
    assert m.kv.state_bytes == m.desc.state_bytes()
    assert m.desc.kv_values_per_token() == 2 * 2 * 2 * 32  # the 2 full layers only


def test_logits_in_one_batch_token_by_token_greedy_and_q8_0(q3n):
    hf, paths = q3n
    batch_and_steps(open_model(paths["f32"]), hf, prompt(40, seed=1))
    greedy_f32_and_q8_0(hf, paths)


def test_f16_within_its_rounding(q3n):
    hf, paths = q3n
    ids = prompt(40, seed=5)
    got = open_model(paths["f16"]).logits(ids)
    ref = hf_logits(hf, ids)
    assert rel_err(got, ref) < 2e-2
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.95


def test_sequences_batched_equal_each_alone(q3n):
    batched_equal_alone(open_model(q3n[1]["f32"]), seed=40)


def test_the_state_is_per_sequence_and_cannot_be_truncated(q3n):
    """A sequence's state is its own: one run after another (a freed sequence's id reused)
    gives the same logits; truncating a sequence but to 0 is refused (a recurrent state has
    no earlier positions), to 0 restarts it."""
    m = open_model(q3n[1]["f32"])
    ids = prompt(12, seed=6)
    first = m.logits(ids)
    assert np.array_equal(m.logits(ids), first)
    s = m.new_sequence()
    m.eval([s], tokens=ids)
    with pytest.raises(Exception, match="recurrent state cannot be truncated"):
        m.kv.set_length(s, 5)
    m.kv.set_length(s, 0)
    assert np.array_equal(m.eval([s], tokens=ids), first)
    m.free_sequence(s)


@pytest.mark.parametrize("what", ["conv", "attention gate", "decay", "gated norm"])
def test_each_mechanism_is_seen(q3n, what):
    """With the conv's earlier taps, the full attention's gate rows, the decay (A_log) or the
    gated norm's weights changed in transformers, its logits move away from colibri's."""
    hf, paths = q3n
    m = open_model(paths["f32"])
    ids = prompt(30, seed=3)
    got = m.logits(ids)
    assert rel_err(got, hf_logits(hf, ids)) < 1e-4
    hd = 32
    params = {n: p for n, p in hf.named_parameters()
              if {"conv": n.endswith("conv1d.weight"),
                  "attention gate": n.endswith("self_attn.q_proj.weight"),
                  "decay": n.endswith("A_log"),
                  "gated norm": n.endswith("linear_attn.norm.weight")}[what]}
    assert params
    saved = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            for p in params.values():
                if what == "conv":
                    p[..., :-1] = 0.0
                elif what == "attention gate":  # each head's gate rows (the second half)
                    p.view(-1, 2 * hd, p.shape[-1])[:, hd:] = 0.0
                elif what == "decay":
                    p.sub_(3.0)
                else:
                    p.mul_(-1.5)
        assert rel_err(got, hf_logits(hf, ids)) > 1e-3
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])


def test_the_gpu_path_refuses_it_by_name(q3n):
    """Model(device="cuda") does not run the linear attention's model yet: a clear refusal
    naming it."""
    from colibri.arch import UnsupportedModel
    from colibri.cuda_moe import CudaExperts

    d = open_model(q3n[1]["f32"]).desc
    with pytest.raises(UnsupportedModel, match="qwen3next.*does not run on the GPU yet"):
        CudaExperts(d, runtime=object())


def test_plan_counts_the_recurrent_state(q3n):
    """colibri plan: the KV figure is the context times the full attention layers' K/V only,
    the recurrent state of a sequence its own line, both in the projected peak."""
    from colibri.plan import make_plan

    hf, paths = q3n
    c = hf.config
    p = make_plan(str(paths["f32"]), ctx=100, max_batch=4, kv_dtype="f16", available=2**34)
    assert p.kv_bytes == 100 * 2 * 2 * c.num_key_value_heads * c.head_dim * 2  # 2 full layers
    conv = 2 * c.linear_num_key_heads * c.linear_key_head_dim \
        + c.linear_num_value_heads * c.linear_value_head_dim
    per_layer = (c.linear_conv_kernel_dim - 1) * conv + c.linear_num_value_heads \
        * c.linear_key_head_dim * c.linear_value_head_dim
    assert p.state_bytes == 4 * 2 * per_layer
    assert p.peak_bytes == p.dense_bytes + p.kv_bytes + p.state_bytes + p.budget_bytes \
        + p.scratch_bytes
    assert any(line.startswith("recurrent state") for line in p.lines())
