"""The architecture-true bench shapes of make_bench_model (colibri/tools/bench_shapes.py):
ERNIE-4.5-21B-A3B (ernie4_5-moe), GLM-4.5-Air (glm4moe), DeepSeek-V3 (deepseek2) and gpt-oss-20b. The tiny
versions of the first two load in colibri with the architecture's metadata (dense first layer,
shared experts, selection bias, gating, partial rotary, the NextN layer skipped) and run, their
calibrated routers using most experts; the deepseek2 file has every key and tensor llama.cpp's
loader (src/models/deepseek2.cpp, llama-cpp-python 0.3.36) requires, named as gguf-py's
DEEPSEEK2 tensor list names them. The full shapes' plans are checked without writing them."""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import colibri
from colibri.arch import GATING_SIGMOID, GATING_SOFTMAX
from colibri.tools.bench_shapes import SHAPES, block_count, n_dense
from colibri.tools.make_bench_model import file_size, plan

LAYERS = 3  # 1 dense + 2 MoE


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from colibri.tools.make_bench_model import write

    out = tmp_path_factory.mktemp("shapes")
    yield {s: str(write(str(out / f"{s}.gguf"), LAYERS, "q4_k_m", shape=s))
           for s in ("tiny-ernie4_5-moe", "tiny-glm4moe", "tiny-deepseek2", "tiny-gpt-oss")}


def test_dense_lead_scales_with_the_depth():
    ds, ernie, glm = SHAPES["deepseek-v3"], SHAPES["ernie-4.5-21b-a3b"], SHAPES["glm-4.5-air"]
    assert [n_dense(ds, n) for n in (1, 2, 4, 30, 31, 61)] == [0, 1, 1, 1, 2, 3]
    assert [n_dense(ernie, n) for n in (1, 2, 12, 28)] == [0, 1, 1, 1]
    assert [n_dense(glm, n) for n in (1, 4, 46)] == [0, 1, 1]
    assert n_dense(SHAPES["qwen3-30b-a3b"], 12) == 0
    assert block_count(glm, 4) == 5 and block_count(ernie, 12) == 12  # GLM's NextN layer


def test_full_shapes_plans_and_type_fallbacks():
    """The real models' tensor shapes (GGUF order reversed) and llama.cpp's fallbacks where a
    row does not fit a 256-block: GLM's 1408 / 10944 wide FFNs, DeepSeek's 128-wide attn_k_b."""
    p = {n: (s, t) for n, s, t in plan(4, "q4_k_m", "glm-4.5-air")}
    assert p["blk.1.ffn_gate_exps.weight"] == ((128, 1408, 4096), QT.Q4_K)
    assert p["blk.1.ffn_down_exps.weight"] == ((128, 4096, 1408), QT.Q8_0)  # Q6_K's fallback
    assert p["blk.0.ffn_up.weight"] == ((10944, 4096), QT.Q4_K)
    assert p["blk.0.ffn_down.weight"] == ((4096, 10944), QT.Q8_0)
    assert p["blk.1.ffn_gate_shexp.weight"] == ((1408, 4096), QT.Q4_K)
    assert p["blk.2.attn_q.weight"] == ((12288, 4096), QT.Q4_K)
    assert p["blk.2.attn_k.bias"] == ((1024,), None) and "blk.4.attn_norm.weight" not in p
    p = {n: (s, t) for n, s, t in plan(4, "q4_k_m", "deepseek-v3")}
    assert p["blk.0.ffn_gate.weight"] == ((18432, 7168), QT.Q4_K)
    assert p["blk.1.attn_k_b.weight"] == ((128, 512, 128), QT.Q5_0)  # Q4_K's fallback
    assert p["blk.1.attn_v_b.weight"] == ((128, 128, 512), QT.Q4_K)
    assert p["blk.1.attn_q_b.weight"] == ((128 * 192, 1536), QT.Q4_K)
    assert p["blk.1.attn_kv_a_mqa.weight"] == ((576, 7168), QT.Q4_K)
    assert p["blk.3.ffn_down_exps.weight"] == ((256, 7168, 2048), QT.Q6_K)
    p = {n: (s, t) for n, s, t in plan(2, "q4_k_m", "ernie-4.5-21b-a3b")}
    assert "output.weight" not in p and p["token_embd.weight"] == ((103424, 2560), QT.Q6_K)
    assert p["blk.1.ffn_up_shexp.weight"] == ((3072, 2560), QT.Q4_K)
    assert p["blk.1.ffn_gate_exps.weight"] == ((64, 1536, 2560), QT.Q4_K)
    p = {n: (s, t) for n, s, t in plan(2, "q4_k_m", "gpt-oss-20b")}
    assert p["blk.0.attn_q.weight"] == ((64 * 64, 2880), QT.Q5_0)  # 2880 = 11.25 Q4_K blocks
    assert p["blk.1.ffn_down_exps.weight"] == ((32, 2880, 2880), QT.MXFP4)
    assert p["blk.1.ffn_down_exps.bias"] == ((32, 2880), None)
    assert p["blk.1.attn_sinks.weight"] == ((64,), None)
    # sizes: the ones docs/benchmarks.md quotes
    assert 5.4 < file_size(12, "q4_k_m", "ernie-4.5-21b-a3b") / 2**30 < 5.7
    assert 5.5 < file_size(4, "q4_k_m", "glm-4.5-air") / 2**30 < 5.8
    assert 6.1 < file_size(12, "q8_0", "gpt-oss-20b") / 2**30 < 6.3


@pytest.mark.parametrize("shape", ["tiny-ernie4_5-moe", "tiny-glm4moe"])
def test_loads_with_the_architecture_and_runs(files, shape):
    s = SHAPES[shape]
    with colibri.Model(files[shape], threads=2, ctx=256, max_batch=64, verbose=False) as m:
        d = m.desc
        assert d.arch == s["arch"] and d.n_layer == LAYERS and d.n_embd == s["n_embd"]
        assert (d.n_head, d.n_head_kv, d.head_dim) == (s["n_head"], s["n_head_kv"], s["head_dim"])
        assert d.rope_n_dims == s.get("n_rot", s["head_dim"])
        dense, moe = d.layers[0], d.layers[1:]
        assert dense.n_expert == 0 and dense.ffn_gate.rows == s["n_ff"]
        for L in moe:
            assert (L.n_expert, L.n_expert_used, L.n_ff_exp) == (s["n_expert"], s["n_used"],
                                                                s["n_ff_exp"])
            assert L.router_bias is not None and np.abs(L.router_bias).max() > 0
            assert L.sh_gate.rows == s.get("n_ff_shexp", s["n_ff_exp"] * s["n_shared"])
        if s["arch"] == "glm4moe":
            assert d.gating == GATING_SIGMOID and d.expert_scale == s["expert_scale"]
            assert moe[0].bq is not None and moe[0].q_norm is None
        else:
            assert d.gating == GATING_SOFTMAX and d.output.data is d.tok_embd.data  # tied
        assert d.expert_renorm
        seq = m.new_sequence()
        rng = np.random.default_rng(1)
        logits = m.eval([seq], tokens=[int(t) for t in rng.integers(0, m.n_vocab, 64)],
                        logits=[True] * 64)
        assert np.isfinite(logits).all() and logits.shape == (64, s["n_vocab"])
        # the calibrated (spread) routers: 64 random tokens x top-k reach most experts
        for i in range(1, LAYERS):
            used = (m.route_counts(i) > 0).sum()
            assert used >= 0.75 * s["n_expert"], (i, used)


def _deepseek2_required(s: dict, n_layers: int) -> dict[str, tuple[int, ...]]:
    """Every tensor llama.cpp's deepseek2 loader requires for this file (its flags 0, MLA
    split, a q_lora_rank > 0), GGUF shapes: transcribed from src/models/deepseek2.cpp."""
    E, H, QL, KL, R = s["n_embd"], s["n_head"], s["q_lora"], s["kv_lora"], s["qk_rope"]
    NP, VH, X, F, V = s["qk_nope"], s["v_head"], s["n_expert"], s["n_ff_exp"], s["n_vocab"]
    t: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, V), "output_norm.weight": (E,)}
    for i in range(n_layers):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": (E,), b + "attn_q_a_norm.weight": (QL,),
                  b + "attn_kv_a_norm.weight": (KL,), b + "attn_q_a.weight": (E, QL),
                  b + "attn_q_b.weight": (QL, H * (NP + R)),
                  b + "attn_kv_a_mqa.weight": (E, KL + R), b + "attn_k_b.weight": (NP, KL, H),
                  b + "attn_v_b.weight": (KL, VH, H), b + "attn_output.weight": (H * VH, E),
                  b + "ffn_norm.weight": (E,)})
        if i < n_dense(s, n_layers):
            t.update({b + "ffn_gate.weight": (E, s["n_ff"]), b + "ffn_up.weight": (E, s["n_ff"]),
                      b + "ffn_down.weight": (s["n_ff"], E)})
        else:
            sh = F * s["n_shared"]
            t.update({b + "ffn_gate_inp.weight": (E, X), b + "ffn_gate_exps.weight": (E, F, X),
                      b + "ffn_up_exps.weight": (E, F, X), b + "ffn_down_exps.weight": (F, E, X),
                      b + "ffn_gate_shexp.weight": (E, sh), b + "ffn_up_shexp.weight": (E, sh),
                      b + "ffn_down_shexp.weight": (sh, E)})
    return t


def test_deepseek2_file_has_what_llama_cpp_requires(files):
    s = SHAPES["tiny-deepseek2"]
    r = gguf.GGUFReader(files["tiny-deepseek2"])
    kv = {k: f.contents() for k, f in r.fields.items()}
    a = "deepseek2"
    K = gguf.Keys
    want = {K.General.ARCHITECTURE: a, K.LLM.BLOCK_COUNT.format(arch=a): LAYERS,
            K.LLM.EMBEDDING_LENGTH.format(arch=a): s["n_embd"],
            K.LLM.FEED_FORWARD_LENGTH.format(arch=a): s["n_ff"],
            K.LLM.CONTEXT_LENGTH.format(arch=a): s["n_ctx"],
            K.LLM.VOCAB_SIZE.format(arch=a): s["n_vocab"],
            K.Attention.HEAD_COUNT.format(arch=a): s["n_head"],
            K.Attention.HEAD_COUNT_KV.format(arch=a): 1,
            K.Attention.Q_LORA_RANK.format(arch=a): s["q_lora"],
            K.Attention.KV_LORA_RANK.format(arch=a): s["kv_lora"],
            K.Attention.KEY_LENGTH.format(arch=a): s["kv_lora"] + s["qk_rope"],
            K.Attention.VALUE_LENGTH.format(arch=a): s["kv_lora"],
            K.Attention.KEY_LENGTH_MLA.format(arch=a): s["qk_nope"] + s["qk_rope"],
            K.Attention.VALUE_LENGTH_MLA.format(arch=a): s["v_head"],
            K.Rope.DIMENSION_COUNT.format(arch=a): s["qk_rope"],
            K.Rope.SCALING_TYPE.format(arch=a): "yarn",
            K.Rope.SCALING_FACTOR.format(arch=a): s["yarn_factor"],
            K.Rope.SCALING_ORIG_CTX_LEN.format(arch=a): s["yarn_orig_ctx"],
            K.Rope.SCALING_YARN_LOG_MUL.format(arch=a): pytest.approx(0.1),
            K.LLM.EXPERT_COUNT.format(arch=a): s["n_expert"],
            K.LLM.EXPERT_USED_COUNT.format(arch=a): s["n_used"],
            K.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=a): s["n_ff_exp"],
            K.LLM.EXPERT_SHARED_COUNT.format(arch=a): 1,
            K.LLM.EXPERT_GROUP_COUNT.format(arch=a): s["n_group"],
            K.LLM.EXPERT_GROUP_USED_COUNT.format(arch=a): s["group_used"],
            K.LLM.EXPERT_GATING_FUNC.format(arch=a): int(gguf.ExpertGatingFuncType.SIGMOID),
            K.LLM.EXPERT_WEIGHTS_SCALE.format(arch=a): s["expert_scale"],
            K.LLM.EXPERT_WEIGHTS_NORM.format(arch=a): True,
            K.LLM.LEADING_DENSE_BLOCK_COUNT.format(arch=a): 1}
    assert K.Attention.LAYERNORM_RMS_EPS.format(arch=a) in kv
    for k, v in want.items():
        assert kv.get(k) == v, (k, kv.get(k), v)
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    required = _deepseek2_required(s, LAYERS)
    assert {n: got.get(n) for n in required} == required
    # every tensor is one gguf-py names for DEEPSEEK2 (no other architecture's)
    names = {gguf.TENSOR_NAMES[t].format(bid=i) + suffix
             for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.DEEPSEEK2] for i in range(LAYERS)
             for suffix in (".weight", ".bias")}
    assert set(got) <= names, set(got) - names
    assert "blk.1.exp_probs_b.bias" in got and "blk.1.attn_kv_b.weight" not in got


def test_deepseek2_is_written_with_raw_routing(tmp_path):
    from colibri.tools.make_bench_model import default_routing, write

    assert default_routing("deepseek-v3") == "raw" and default_routing("glm-4.5-air") == "spread"
    with pytest.raises(ValueError, match="routing raw"):
        write(str(tmp_path / "d.gguf"), 2, "q8_0", shape="tiny-deepseek2", routing="spread")


def test_deepseek2_file_runs_in_colibri(files):
    """The deepseek2 bench file (MLA, YaRN, groups) in colibri: its MLA layers and latent cache
    as the shape says, and a forward with finite logits."""
    s = SHAPES["tiny-deepseek2"]
    with colibri.Model(files["tiny-deepseek2"], threads=2, ctx=256, max_batch=64,
                       verbose=False) as m:
        d = m.desc
        assert d.arch == "deepseek2" and d.expert_groups == s["n_group"]
        assert all(L.mla_kv_lora == s["kv_lora"] for L in d.layers)
        assert d.kv_values_per_token() == LAYERS * (s["kv_lora"] + s["qk_rope"])
        seq = m.new_sequence()
        tokens = [int(t) for t in np.random.default_rng(2).integers(0, m.n_vocab, 32)]
        assert np.isfinite(m.eval([seq], tokens=tokens, logits=[True] * 32)).all()


def test_gpt_oss_file_has_its_mechanisms_and_runs(files):
    """The gpt-oss bench file: every tensor one gguf-py names for GPT_OSS, MXFP4 experts with
    biases, sinks, alternating sliding-window layers and YaRN as colibri reads them."""
    s = SHAPES["tiny-gpt-oss"]
    r = gguf.GGUFReader(files["tiny-gpt-oss"])
    got = {t.name: t.tensor_type for t in r.tensors}
    names = {gguf.TENSOR_NAMES[t].format(bid=i) + suffix
             for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT_OSS] for i in range(LAYERS)
             for suffix in (".weight", ".bias")}
    assert set(got) <= names, set(got) - names
    assert {got[f"blk.1.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")} == {QT.MXFP4}
    assert got["blk.0.attn_q.weight"] == QT.Q4_K and got["blk.0.attn_output.weight"] == QT.Q4_K
    assert r.fields["gpt-oss.attention.sliding_window"].contents() == s["swa"]
    with colibri.Model(files["tiny-gpt-oss"], threads=2, ctx=256, max_batch=64,
                       verbose=False) as m:
        d = m.desc
        assert d.arch == "gpt-oss" and [L.sliding_window for L in d.layers] == [s["swa"], 0, s["swa"]]
        for L in d.layers:
            assert L.attn_sinks is not None and L.exp_down_b is not None and L.bq is not None
            assert (L.n_expert, L.n_expert_used, L.n_ff_exp) == (s["n_expert"], s["n_used"],
                                                                s["n_ff_exp"])
            assert L.rope_ext_factor > 0  # YaRN on every layer
        seq = m.new_sequence()
        tokens = [int(t) for t in np.random.default_rng(2).integers(0, m.n_vocab, 32)]
        assert np.isfinite(m.eval([seq], tokens=tokens, logits=[True] * 32)).all()
