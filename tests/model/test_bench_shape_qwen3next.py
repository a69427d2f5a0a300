"""The Qwen3-Next-80B-A3B bench shape of make_bench_model (colibri/tools/bench_shapes.py,
qwen3next): the full shape's plan checked without writing it; the tiny version has every key
and tensor llama.cpp's loader requires (src/models/qwen3next.cpp load_arch_hparams /
load_arch_tensors, llama-cpp-python 0.3.36, transcribed below), named as gguf-py's QWEN3NEXT
tensor list names them, and loads and runs in colibri with its calibrated routers."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import colibri
from colibri.tools.bench_shapes import SHAPES
from colibri.tools.make_bench_model import file_size, plan

LAYERS = 4  # 3 linear attention layers, then a full attention one


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("q3n") / "t.gguf"), LAYERS, "q4_k_m",
                     shape="tiny-qwen3next"))


def _required(s: dict, n_layers: int) -> dict[str, tuple[int, ...]]:
    """GGUF shapes of every tensor llama.cpp's qwen3next loader requires for this file."""
    E, H, KV, D, X, F, V = (s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"],
                            s["n_expert"], s["n_ff_exp"], s["n_vocab"])
    dk, nk, nv = s["ssm_head"], s["ssm_k_heads"], s["ssm_v_heads"]
    key, value = dk * nk, dk * nv  # head_v_dim = ssm_d_state in llama.cpp's loader
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, V), "output_norm.weight": (E,),
                                     "output.weight": (E, V)}
    for i in range(n_layers):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": (E,), b + "post_attention_norm.weight": (E,),
                  b + "ffn_gate_inp.weight": (E, X), b + "ffn_down_exps.weight": (F, E, X),
                  b + "ffn_gate_exps.weight": (E, F, X), b + "ffn_up_exps.weight": (E, F, X),
                  b + "ffn_gate_inp_shexp.weight": (E,), b + "ffn_gate_shexp.weight": (E, F),
                  b + "ffn_up_shexp.weight": (E, F), b + "ffn_down_shexp.weight": (F, E)})
        if (i + 1) % 4:
            t.update({b + "attn_qkv.weight": (E, 2 * key + value),
                      b + "attn_gate.weight": (E, value),
                      b + "ssm_conv1d.weight": (s["ssm_conv"], 2 * key + value),
                      b + "ssm_dt.bias": (nv,), b + "ssm_a": (nv,),
                      b + "ssm_ba.weight": (E, 2 * nv), b + "ssm_norm.weight": (dk,),
                      b + "ssm_out.weight": (value, E)})
        else:
            t.update({b + "attn_q.weight": (E, D * H * 2), b + "attn_k.weight": (E, D * KV),
                      b + "attn_v.weight": (E, D * KV), b + "attn_output.weight": (D * H, E),
                      b + "attn_q_norm.weight": (D,), b + "attn_k_norm.weight": (D,)})
    return t


def test_full_shape_plan():
    """The real model's tensors (numpy order) and its 8-layer file's size."""
    p = {n: (s, t) for n, s, t in plan(8, "q4_k_m", "qwen3-next-80b-a3b")}
    assert p["blk.0.attn_qkv.weight"] == ((8192, 2048), QT.Q4_K)
    assert p["blk.0.attn_gate.weight"] == ((4096, 2048), QT.Q4_K)
    assert p["blk.0.ssm_ba.weight"] == ((64, 2048), QT.Q4_K)
    assert p["blk.0.ssm_conv1d.weight"] == ((8192, 4), None)
    assert p["blk.0.ssm_out.weight"] == ((2048, 4096), QT.Q4_K)
    assert p["blk.3.attn_q.weight"] == ((8192, 2048), QT.Q4_K)
    assert p["blk.3.attn_v.weight"] == ((512, 2048), QT.Q6_K)
    assert p["blk.3.ffn_gate_exps.weight"] == ((512, 512, 2048), QT.Q4_K)
    assert p["blk.3.ffn_down_exps.weight"] == ((512, 2048, 512), QT.Q6_K)
    assert p["blk.7.ffn_gate_inp_shexp.weight"] == ((1, 2048), None)
    assert "blk.3.ssm_a" not in p and "blk.2.attn_q.weight" not in p
    assert 8.2 < file_size(8, "q4_k_m", "qwen3-next-80b-a3b") / 2**30 < 8.5


def test_file_has_what_llama_cpp_requires(tiny):
    s = SHAPES["tiny-qwen3next"]
    r = gguf.GGUFReader(tiny)
    kv = {k: f.contents() for k, f in r.fields.items()}
    a = "qwen3next"
    want = {"general.architecture": a, f"{a}.block_count": LAYERS,
            f"{a}.embedding_length": s["n_embd"], f"{a}.attention.head_count": s["n_head"],
            f"{a}.attention.head_count_kv": s["n_head_kv"],
            f"{a}.attention.key_length": s["head_dim"],
            f"{a}.rope.dimension_count": s["n_rot"], f"{a}.expert_count": s["n_expert"],
            f"{a}.expert_used_count": s["n_used"],
            f"{a}.expert_feed_forward_length": s["n_ff_exp"],
            f"{a}.expert_shared_feed_forward_length": s["n_ff_shexp"],
            f"{a}.ssm.conv_kernel": s["ssm_conv"], f"{a}.ssm.state_size": s["ssm_head"],
            f"{a}.ssm.group_count": s["ssm_k_heads"],
            f"{a}.ssm.time_step_rank": s["ssm_v_heads"],
            f"{a}.ssm.inner_size": s["ssm_v_heads"] * s["ssm_head"]}
    assert f"{a}.attention.layer_norm_rms_epsilon" in kv
    for k, v in want.items():
        assert kv.get(k) == v, (k, kv.get(k), v)
    assert list(kv[f"{a}.attention.recurrent_layers"]) == [True, True, True, False]
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    required = _required(s, LAYERS)
    # (the shared expert's gate: [E, 1] here as the converter writes it, {E} in the loader,
    # which takes the trailing 1)
    got = {n: v[:1] if n.endswith("ffn_gate_inp_shexp.weight") else v for n, v in got.items()}
    assert {n: got.get(n) for n in required} == required
    names = {gguf.TENSOR_NAMES[t].format(bid=i) + suffix
             for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3NEXT] for i in range(LAYERS)
             for suffix in (".weight", ".bias", "")}
    assert set(got) <= names, set(got) - names


def test_file_runs_in_colibri(tiny):
    s = SHAPES["tiny-qwen3next"]
    with colibri.Model(tiny, threads=2, ctx=256, max_batch=64, verbose=False) as m:
        d = m.desc
        assert [L.gdn_v_heads for L in d.layers] == [s["ssm_v_heads"]] * 3 + [0]
        assert d.layers[3].attn_q_gate and d.rope_n_dims == s["n_rot"]
        assert all(L.sh_gate_inp.data is not None for L in d.layers)
        seq = m.new_sequence()
        tokens = [int(t) for t in np.random.default_rng(2).integers(0, m.n_vocab, 64)]
        assert np.isfinite(m.eval([seq], tokens=tokens, logits=[True] * 64)).all()
        for i in range(LAYERS):  # the calibrated routers reach most experts
            assert (m.route_counts(i) > 0).sum() >= 0.75 * s["n_expert"]
