"""llama4 (Llama 4 Scout / Maverick) against `transformers` (Llama4ForCausalLM, the oracle) on
a tiny random model converted with colibri's converter as llama.cpp's writes it: interleaved
MoE layers with a shared expert and top-1 sigmoid routing applied to the expert's input,
chunked attention with RoPE (Llama 3.1 scaling) and q/k RMS norms on three layers of four,
the fourth global without RoPE and its queries temperature-tuned. Each mechanism is shown to
matter: with it changed in transformers, the logits leave colibri's."""

from __future__ import annotations

import gguf
import pytest
from oracle_checks import (
    batch_and_steps,
    batched_equal_alone,
    greedy_f32_and_q8_0,
    open_model,
    rel_err,
)
from oracle_models import build, hf_logits, prompt

from colibri.model import Model


@pytest.fixture(scope="module")
def l4(tmp_path_factory):
    return build("llama4", tmp_path_factory.mktemp("llama4"), ("f32", "q8_0"))


def test_file_and_description(l4):
    hf, paths = l4
    r = gguf.GGUFReader(str(paths["f32"]))
    names = {t.name for t in r.tensors}
    assert {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_gate_shexp.weight", "blk.0.ffn_gate.weight",
            "rope_freqs.weight"} <= names and "blk.0.ffn_gate_inp.weight" not in names
    assert r.fields["llama4.interleave_moe_layer_step"].contents() == 2
    d = Model(paths["f32"], threads=2, ctx=256, max_batch=64).desc
    assert [L.attn_chunk for L in d.layers] == [8, 8, 8, 0]
    assert [L.no_rope for L in d.layers] == [0, 0, 0, 1]
    assert [L.qk_rms for L in d.layers] == [1, 1, 1, 0]
    assert d.layers[3].attn_temp_floor == 4 and d.layers[3].attn_temp_scale == pytest.approx(0.1)
    assert [L.n_expert for L in d.layers] == [0, 8, 0, 8] and d.expert_weight_in == 1


def test_logits_in_one_batch_token_by_token_greedy_and_q8_0(l4):
    hf, paths = l4
    m = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    batch_and_steps(m, hf, prompt(40, seed=1))
    greedy_f32_and_q8_0(hf, paths)


def test_sequences_batched_equal_each_alone(l4):
    batched_equal_alone(open_model(l4[1]["f32"]), seed=40)


@pytest.mark.parametrize("what", ["chunks", "temperature", "qk norm"])
def test_each_mechanism_is_seen(l4, what):
    """transformers without the chunks (one chunk of 8192), the temperature tuning or the q/k
    norms gives other logits than colibri's: the comparison above depends on each."""
    hf, paths = l4
    ids = prompt(40, seed=3)
    got = Model(paths["f32"], threads=2, ctx=256, max_batch=64).logits(ids)
    attn = [lay.self_attn for lay in hf.model.layers]
    norms = {i: a.qk_norm for i, a in enumerate(attn) if hasattr(a, "qk_norm")}
    assert len(norms) == 3
    try:
        if what == "chunks":
            hf.config.attention_chunk_size = 8192
        elif what == "temperature":
            for a in attn:
                a.attn_temperature_tuning = False
        else:
            for i in norms:
                del attn[i].qk_norm
        assert rel_err(got, hf_logits(hf, ids)) > 1e-3
    finally:
        hf.config.attention_chunk_size = 8
        for a in attn:
            a.attn_temperature_tuning = True
        for i, n in norms.items():
            attn[i].qk_norm = n


def test_the_gpu_path_refuses_it_by_name(l4):
    """Model(device="cuda")'s experts do not weight the input yet: a clear refusal."""
    from colibri.arch import UnsupportedModel
    from colibri.cuda_moe import CudaExperts

    d = Model(l4[1]["f32"], threads=2, ctx=64, max_batch=8).desc
    with pytest.raises(UnsupportedModel, match="does not run on the GPU yet"):
        CudaExperts(d, runtime=object())
