"""The C forward pass against `transformers` (the oracle) on tiny random models of every
supported family: F32 logits within 1e-4 relative error at every position (one batch, and token
by token through the KV cache), identical greedy continuations, sequences batched together
equal to each alone, and Q8_0 files that keep the greedy continuation."""

from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: F401  the oracle: torch + transformers (test extras)
import transformers  # noqa: F401
from oracle_checks import batch_and_steps  # noqa: E402
from oracle_models import FAMILIES, build, hf_greedy, hf_logits, prompt  # noqa: E402

from colibri.model import Model  # noqa: E402


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle")
    hf, paths = build(request.param, out, ("f32", "q8_0"))
    model = Model(paths["f32"], threads=2, ctx=2048, max_batch=64)
    return request.param, hf, model, paths


def test_f32_logits_match_in_one_batch_and_token_by_token(fam):
    name, hf, model, _ = fam
    ids = prompt(40, seed=1)
    ref = hf_logits(hf, ids)
    batch = model.logits(ids)
    assert rel_err(batch, ref) < 1e-4, name
    seq = model.new_sequence()
    steps = np.concatenate([model.eval([seq], tokens=[t]) for t in ids])
    model.free_sequence(seq)
    assert rel_err(steps, ref) < 1e-4, name
    assert rel_err(steps, batch) < 1e-5, name


def test_greedy_continuation_identical(fam):
    name, hf, model, _ = fam
    ids = prompt(12, seed=2)
    want = hf_greedy(hf, ids, 32)
    seq = model.new_sequence()
    got: list[int] = []
    logits = model.eval([seq], tokens=ids, logits=[False] * (len(ids) - 1) + [True])
    for _ in range(32):
        nxt = int(np.argmax(logits[-1]))
        got.append(nxt)
        logits = model.eval([seq], tokens=[nxt])
    model.free_sequence(seq)
    assert got == want, name


def test_sequences_of_different_lengths_batched_equal_each_alone(fam):
    name, _, model, _ = fam
    prompts = [prompt(n, seed=10 + n) for n in (5, 17, 11)]
    alone = [model.logits(p) for p in prompts]
    seqs = [model.new_sequence() for _ in prompts]
    # interleave the three sequences in one batch, each at its own positions
    order = [(i, t) for t in range(17) for i, p in enumerate(prompts) if t < len(p)]
    out = model.eval([seqs[i] for i, _ in order], tokens=[prompts[i][t] for i, t in order])
    for row, (i, t) in enumerate(order):
        assert rel_err(out[row], alone[i][t]) < 1e-5, (name, i, t)
    # decode steps for all three at once, at three different positions
    nxt = [int(np.argmax(out[max(r for r, (i2, _) in enumerate(order) if i2 == i)]))
           for i in range(3)]
    step = model.eval(seqs, tokens=nxt)
    for i, p in enumerate(prompts):
        ref = model.logits(p + [nxt[i]])[-1]
        assert rel_err(step[i], ref) < 1e-5, (name, i)
    for s in seqs:
        model.free_sequence(s)


def test_q8_0_keeps_the_greedy_continuation(fam):
    """A Q8_0 file of the same model: its greedy continuation, free-running, matches the f32
    oracle's for at least 30 of 32 tokens."""
    name, hf, _, paths = fam
    ids = prompt(12, seed=2)
    want = hf_greedy(hf, ids, 32)
    q8 = Model(paths["q8_0"], threads=2, ctx=256, max_batch=64)
    seq = q8.new_sequence()
    step = q8.eval([seq], tokens=ids)
    got = []
    for _ in range(32):
        got.append(int(np.argmax(step[-1])))
        step = q8.eval([seq], tokens=[got[-1]])
    same = sum(a == b for a, b in zip(got, want, strict=True))
    assert same >= 30, (name, same, got, want)


def test_llama3_rope_freqs_match(tmp_path):
    """Llama 3.1 rope scaling: the converter writes the per-pair divisors as rope_freqs.weight
    (as llama.cpp's converter does) and the forward divides the angles by them."""
    import gguf

    hf, paths = build("llama3_rope", tmp_path, ("f32",))
    names = [t.name for t in gguf.GGUFReader(str(paths["f32"])).tensors]
    assert "rope_freqs.weight" in names
    model = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    ids = prompt(40, seed=1)
    ref = hf_logits(hf, ids)
    assert rel_err(model.logits(ids), ref) < 1e-4
    freqs = model.desc.layers[0].rope_freqs
    assert freqs is not None and freqs.min() == 1.0 and freqs.max() == 8.0  # all three bands
    assert ((freqs > 1) & (freqs < 8)).any()


def test_gemma4_per_layer_embeddings_and_kv_sharing(tmp_path):
    """Gemma 4 E2B/E4B's per-layer embeddings (PLE): per_layer_token_embd, the model projection
    and its norm, each layer's gate, projection and post norm, as llama.cpp's converter names
    them; and KV sharing: the last layers attend to the cached K/V of the last earlier layer of
    their kind and keep none of their own; logits in one batch and token by token, greedy tokens, and a Q8_0 file. The block is
    seen: with its projections zeroed transformers' logits move by more than 1e-3."""
    import gguf

    hf, paths = build("gemma4_ple", tmp_path, ("f32", "q8_0"))
    names = {t.name for t in gguf.GGUFReader(str(paths["f32"])).tensors}
    assert {"per_layer_token_embd.weight", "per_layer_model_proj.weight",
            "per_layer_proj_norm.weight", "blk.3.inp_gate.weight", "blk.3.proj.weight",
            "blk.3.post_norm.weight", "blk.3.attn_k.weight"} <= names
    assert "blk.4.attn_k.weight" not in names  # layers 4-6 share earlier layers' K/V
    model = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    d = model.desc
    assert [L.kv_from for L in d.layers] == [0, 0, 0, 0, 3, 3, 4]  # 1 + the source layer
    own = [L for L in d.layers if not L.kv_from]
    assert d.kv_values_per_token() == sum(2 * L.n_head_kv * L.head_dim for L in own)
    ids = prompt(30, seed=1)
    ref = hf_logits(hf, ids)
    batch = batch_and_steps(model, hf, ids)
    start = prompt(12, seed=2)
    want = hf_greedy(hf, start, 16)
    seq = model.new_sequence()
    lg = model.eval([seq], tokens=start)
    got: list[int] = []
    for _ in range(16):
        got.append(int(np.argmax(lg[-1])))
        lg = model.eval([seq], tokens=[got[-1]])
    assert got == want
    q8 = Model(paths["q8_0"], threads=2, ctx=256, max_batch=64)
    assert rel_err(q8.logits(ids), ref) < 0.05
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.per_layer_projection.weight.zero_()
    assert rel_err(batch, hf_logits(hf, ids)) > 1e-3


def test_gemma4_text_part_of_multimodal_k_eq_v(tmp_path):
    """Gemma4ForConditionalGeneration: the converter keeps the text part only; global layers
    with attention_k_eq_v (no attn_v: V is the K projection) and their own KV head count
    (a per-layer head_count_kv array); dense layers (no MoE block)."""
    import gguf

    hf, paths = build("gemma4_mm", tmp_path, ("f32",))
    r = gguf.GGUFReader(str(paths["f32"]))
    names = {t.name for t in r.tensors}
    assert "blk.5.attn_v.weight" not in names and "blk.0.attn_v.weight" in names
    assert not any("vision" in n or "per_layer" in n for n in names)
    model = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    assert [L.n_head_kv for L in model.desc.layers] == [2] * 5 + [1]
    batch_and_steps(model, hf, prompt(30, seed=1))


def test_phi3_longrope_short_and_long_factors(tmp_path):
    """Phi-3.5's LongRoPE: the converter writes rope_factors_short/long and the attention factor
    as llama.cpp's does; colibri uses the short factors when its context fits the original one
    (32 here) and the long ones past it, as llama.cpp chooses. transformers switches by the
    sequence's length: a 30-token prompt is the short case, a 60-token one the long case."""
    import gguf

    hf, paths = build("phi3_longrope", tmp_path, ("f32",))
    r = gguf.GGUFReader(str(paths["f32"]))
    assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= {t.name for t in r.tensors}
    short = Model(paths["f32"], threads=2, ctx=32, max_batch=64)
    long = Model(paths["f32"], threads=2, ctx=256, max_batch=64)
    assert short.desc.layers[0].rope_freqs.max() < long.desc.layers[0].rope_freqs.max()
    assert long.desc.layers[0].rope_attn_factor == pytest.approx(
        np.sqrt(1 + np.log(512 / 32) / np.log(32)), rel=1e-6)
    for model, n in ((short, 30), (long, 60)):
        ids = prompt(n, seed=1)
        ref = hf_logits(hf, ids)
        assert rel_err(model.logits(ids), ref) < 1e-4, n
    # the other choice is measurably wrong: the test sees the factors
    ids = prompt(30, seed=1)
    assert rel_err(long.logits(ids), hf_logits(hf, ids)) > 1e-3
