"""colibri.tools.roofline: the bytes one decode step reads, counted from the GGUF, checked against
sums computed here independently (gguf's GGUFReader and GGML_QUANT_SIZES, the models' own
configs for the KV term) on tiny dense and MoE models; and tools/bench/roofline.py run end to
end (colibri alone, 2 tokens) with its JSON read back; likewise tools/bench/prefill.py and the
repeated prefill of colibri.bench under it. No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from colibri.tools.roofline import CLASSES, add_shares, bytes_per_token, report, tensor_class

ROOT = Path(__file__).resolve().parents[2]


def _oracle(family: str, out: Path, tie: bool) -> tuple[str, object]:
    """The tests' tiny model of a family (oracle_models' config), Q8_0, optionally with the
    output head tied to the token embedding."""
    import oracle_models as om
    import torch

    from colibri.tools import convert_hf

    configs, common = om.family_configs()
    cls, model_cls, extra = configs[family]
    cfg = cls(**{**common, **extra, "tie_word_embeddings": tie})
    torch.manual_seed(0)
    model_cls(cfg).save_pretrained(out / f"{family}-hf")
    return str(convert_hf.convert(out / f"{family}-hf", out / f"{family}.gguf", "q8_0")), cfg


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from colibri.tools.make_bench_model import write

    d = tmp_path_factory.mktemp("roofline")
    gemma, gemma_cfg = _oracle("gemma3", d, tie=True)
    qmoe, qmoe_cfg = _oracle("qwen2_moe", d, tie=False)
    bench = write(str(d / "bench.gguf"), n_layers=2, kind="q4_k_m", routing="raw", shape="tiny")
    return {"gemma3": (gemma, gemma_cfg), "qwen2_moe": (qmoe, qmoe_cfg), "bench": bench}


def _tensors(path: str) -> dict[str, tuple[int, int]]:
    """name -> (bytes, bytes of one row), from gguf's reader and block sizes."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        shape = [int(x) for x in t.shape]
        out[t.name] = (math.prod(shape) // block * size, shape[0] // block * size)
    return out


ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
EXPS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
FFN = ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
ROUTER = ("ffn_gate_inp", "ffn_gate_inp_shexp")


def expected(path: str, top_k: int, n_expert: int, kv: float) -> dict[str, float]:
    want = dict.fromkeys(CLASSES, 0.0)
    ts = _tensors(path)
    for name, (nbytes, row) in ts.items():
        if name == "token_embd.weight":
            want["other"] += row
            if "output.weight" not in ts:
                want["head"] += nbytes
            continue
        parts = name.split(".")
        base = parts[2] if parts[0] == "blk" else parts[0]
        if base in EXPS:
            want["experts"] += nbytes * top_k / n_expert
        elif base in ATTN:
            want["attention"] += nbytes
        elif base in ROUTER:
            want["router"] += nbytes
        elif base in FFN:
            want["ffn"] += nbytes
        elif base == "output":
            want["head"] += nbytes
        else:
            assert "norm" in base, name  # the only other tensors of these models
            want["other"] += nbytes
    want["kv"] = kv
    return want


def check(got: dict, want: dict[str, float]) -> None:
    assert set(got["classes"]) == set(CLASSES)
    for k in CLASSES:
        assert got["classes"][k] == pytest.approx(want[k], abs=1), k
    assert got["total"] == pytest.approx(sum(want.values()), abs=len(CLASSES))


def test_dense_tied_head_and_sliding_window(models):
    path, cfg = models["gemma3"]
    ts = _tensors(path)
    assert "output.weight" not in ts  # tied: the head is the token embedding, read in full
    hd, n_kv = cfg.head_dim, cfg.num_key_value_heads
    win = cfg.sliding_window
    for pos, dtype in ((20, "f32"), (3, "f32"), (20, "f16")):
        esize = 4 if dtype == "f32" else 2
        # sliding layers read at most `win` positions, the global ones all pos + 1
        kv = sum(2 * n_kv * hd * esize * (min(pos + 1, win) if t == "sliding_attention" else pos + 1)
                 for t in cfg.layer_types)
        got = bytes_per_token(path, pos, dtype)
        check(got, expected(path, 0, 1, kv))
        assert got["tied_head"] and got["classes"]["head"] == ts["token_embd.weight"][0]
        assert got["classes"]["experts"] == got["classes"]["router"] == 0
    assert cfg.layer_types.count("sliding_attention") >= 1 and 20 + 1 > win


def test_moe_expert_share_shared_expert_and_kv(models):
    path, cfg = models["qwen2_moe"]
    k, n = cfg.num_experts_per_tok, cfg.num_experts
    assert 0 < k < n
    hd = cfg.hidden_size // cfg.num_attention_heads
    pos = 11.5  # the mean position of the timed steps need not be whole
    kv = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * hd * 4 * (pos + 1)
    got = bytes_per_token(path, pos)
    want = expected(path, k, n, kv)
    check(got, want)
    assert not got["tied_head"] and want["ffn"] > 0 and want["router"] > 0  # shared expert
    assert set(got["expert_shares"].values()) == {k / n}
    full = sum(b for name, (b, _) in _tensors(path).items() if "_exps" in name)
    assert got["classes"]["experts"] == pytest.approx(full * k / n, abs=1)


def test_batched_step_bytes_and_params(models):
    """A step of B sequences: dense tensors once, each routed expert tensor at the expected
    share of distinct experts B tokens touch, 1 - (1 - k/n)^B, the KV and embedding rows B times;
    matmul_params: the 2-D weights one token multiplies, experts at k/n (computed here from the
    shapes)."""
    path, cfg = models["qwen2_moe"]
    k, n = cfg.num_experts_per_tok, cfg.num_experts
    hd = cfg.hidden_size // cfg.num_attention_heads
    B, pos = 16, 11.0
    kv = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * hd * 4 * (pos + 1) * B
    want = expected(path, k, n, kv)
    ts = _tensors(path)
    share = 1 - (1 - k / n) ** B
    want["experts"] = sum(b for name, (b, _) in ts.items() if "_exps" in name) * share
    want["other"] += ts["token_embd.weight"][1] * (B - 1)
    got = bytes_per_token(path, pos, batch_tokens=B)
    check(got, want)
    assert all(v == pytest.approx(share) for v in got["expert_shares"].values())
    params = 0.0
    for t in gguf.GGUFReader(path).tensors:
        shape = [int(x) for x in t.shape]
        if len(shape) < 2 or t.name == "token_embd.weight":  # untied here: a row a token
            continue
        params += math.prod(shape) * (k / n if "_exps" in t.name else 1.0)
    assert got["matmul_params"] == pytest.approx(params, abs=1)
    one = bytes_per_token(path, pos)
    assert set(one["expert_shares"].values()) == {k / n}  # B = 1: the decode share
    with pytest.raises(ValueError):
        bytes_per_token(path, pos, batch_tokens=0)


def test_bench_model_k_quants(models):
    """make_bench_model's tiny Q4_K_M model: Q4_K and Q6_K experts, 4 of 32 routed."""
    from colibri.tools.make_bench_model import SHAPES

    path = models["bench"]
    s = SHAPES["tiny"]
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert {types["blk.0.ffn_gate_exps.weight"], types["blk.0.ffn_down_exps.weight"]} == {"Q4_K", "Q6_K"}
    kv = 2 * 2 * s["n_head_kv"] * s["head_dim"] * 4 * (16 + 1)
    check(bytes_per_token(path, 16), expected(path, s["n_used"], s["n_expert"], kv))


def test_tensor_classes():
    assert tensor_class("blk.3.ffn_gate_up_exps.weight") == "experts"
    assert tensor_class("blk.3.ffn_down_exps.scale") == "experts"
    assert tensor_class("blk.0.ffn_gate_inp.weight") == "router"
    assert tensor_class("blk.0.exp_probs_b.bias") == "router"
    assert tensor_class("blk.0.attn_q.bias") == "attention"
    assert tensor_class("blk.0.attn_q_norm.weight") == "other"
    assert tensor_class("blk.0.ffn_down_shexp.weight") == "ffn"
    assert tensor_class("output.weight") == "head"
    assert tensor_class("output_norm.weight") == "other"


def test_shares():
    r = add_shares({"bandwidth_gbs": 10.0, "colibri_tps": 40.0, "llama_cpp_tps": 20.0}, 200e6)
    assert r["roofline_tps"] == pytest.approx(50.0)
    assert r["colibri_share"] == pytest.approx(0.8) and r["llama_cpp_share"] == pytest.approx(0.4)
    assert r["ratio"] == pytest.approx(2.0)
    assert r["colibri_best_share"] is None  # no best given
    r = add_shares({"bandwidth_gbs": 10.0, "colibri_tps": 40.0, "llama_cpp_tps": None,
                    "colibri_best_tps": 45.0, "llama_cpp_best_tps": None}, 200e6)
    assert r["llama_cpp_share"] is None and r["ratio"] is None
    assert r["colibri_best_share"] == pytest.approx(0.9) and r["llama_cpp_best_share"] is None
    assert r["colibri_paired_share"] is None  # no rounds given


def _report_of(r: dict[str, Any], threads: int) -> str:
    """report() of one run r (a 200 MB a token model) at `threads`."""
    return report("m", {"total": 200e6, "ctx_pos": 20, "kv_dtype": "f32", "tied_head": False,
                        "expert_shares": {}, "classes": dict.fromkeys(CLASSES, 0.0)},
                  [{**r, "threads": threads, "roofline_tps": 100.0, "colibri_best_tps": 72.0,
                    "llama_cpp_best_tps": 40.0, "colibri_best_share": 0.72,
                    "llama_cpp_best_share": 0.4}])


# three rounds: each round's probe and rates (colibri's probe is the round's first)
ROUNDS = {"bandwidth_gbs": [10.0, 20.0, 16.0], "colibri_tps": [40.0, 60.0, 72.0],
          "llama_cpp_bandwidth_gbs": [8.0, 20.0, 10.0], "llama_cpp_tps": [20.0, 30.0, 40.0]}


def _shares_of(samples: dict[str, list[float]]) -> dict[str, Any]:
    """add_shares() of a 200 MB a token run over these rounds: median rates 60 and 30 tok/s,
    the best probe 20 GB/s."""
    return add_shares({"bandwidth_gbs": 20.0, "colibri_tps": 60.0, "llama_cpp_tps": 30.0,
                       "samples": samples}, 200e6)


def test_paired_shares():
    """Each round's rate over the probe run just before it (colibri: the round's first probe,
    llama.cpp: its own), the median of the rounds; the headline share stays the conservative
    median rate over the best probe of all."""
    r = _shares_of(ROUNDS)
    assert r["colibri_paired_shares"] == pytest.approx([0.8, 0.6, 0.9])
    assert r["colibri_paired_share"] == pytest.approx(0.8)
    assert r["llama_cpp_paired_shares"] == pytest.approx([0.5, 0.3, 0.8])
    assert r["llama_cpp_paired_share"] == pytest.approx(0.5)
    assert r["colibri_share"] == pytest.approx(0.6)  # 60 tok/s x 200 MB / 20 GB/s
    line = _report_of(r, 1)
    assert "paired" in line and "colibri 80% (60-90%)" in line and "llama.cpp 50% (30-80%)" in line
    assert "bracketed" not in line  # no bracket probes in these samples
    assert "target not met on the headline share" in line  # 60%, no interleaved share
    assert r["probe_headline_share"] is None and "own headline share" not in line


def test_bracketed_and_interleaved_shares():
    """Each round's rate over the best of the probes run among its own timed steps (as
    measure() records them: the max of their best passes), and over those probes' sustained
    rate, the medians of the rounds; the paired and the conservative shares are left as they
    were."""
    samples = {**ROUNDS, "colibri_bracket_gbs": [8.0, 12.5, 16.0],
               "colibri_sustained_gbs": [8.0, 16.0, 12.0],
               "llama_cpp_bracket_gbs": [10.0, 10.0, 10.0],
               "llama_cpp_sustained_gbs": [5.0, 10.0, 10.0]}
    r = _shares_of(samples)
    assert r["colibri_bracketed_shares"] == pytest.approx([1.0, 0.96, 0.9])
    assert r["colibri_bracketed_share"] == pytest.approx(0.96)
    assert r["llama_cpp_bracketed_shares"] == pytest.approx([0.4, 0.6, 0.8])
    assert r["llama_cpp_bracketed_share"] == pytest.approx(0.6)
    assert r["colibri_paired_share"] == pytest.approx(0.8) and r["colibri_share"] == pytest.approx(0.6)
    assert r["colibri_interleaved_shares"] == pytest.approx([1.0, 0.75, 1.2])
    assert r["colibri_interleaved_share"] == pytest.approx(1.0)
    assert r["llama_cpp_interleaved_shares"] == pytest.approx([0.8, 0.6, 0.8])
    line = _report_of(r, 2)
    bracketed, interleaved = (next(x for x in line.splitlines() if x.strip().startswith(k))
                              for k in ("bracketed", "interleaved"))
    assert "colibri 96% (90-100%)" in bracketed and "llama.cpp 60% (40-80%)" in bracketed
    assert "colibri 100% (75-120%)" in interleaved and "llama.cpp 80% (60-80%)" in interleaved
    # judged on the interleaved share (100%, and 2x llama.cpp), though the headline is 60%
    assert "target met on the interleaved share" in line
    # the probe's own headline share: the median sustained rate 12 over the best pass 20
    assert r["probe_headline_share"] == pytest.approx(0.6)
    assert "own headline share" in line and "2 thread(s) 60%" in line
    behind = add_shares({"bandwidth_gbs": 20.0, "colibri_tps": 60.0, "llama_cpp_tps": 61.0,
                         "samples": samples}, 200e6)
    assert "target not met on the interleaved share" in _report_of(behind, 2)  # behind llama.cpp


def test_rejects_bad_arguments(models):
    with pytest.raises(ValueError, match="kv_dtype"):
        bytes_per_token(models["bench"], 4, "q8_0")
    with pytest.raises(ValueError, match="ctx_pos"):
        bytes_per_token(models["bench"], -1)


def _tool(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """python tools/bench/SCRIPT ARGS with this checkout first on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    return subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / script), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_script_end_to_end(models, tmp_path):
    out = tmp_path / "roof.json"
    p = _tool("roofline.py", "-m", models["bench"], "--no-llama-cpp", "--tokens", "2",
              "--threads", "1", "--rounds", "1", "--membw-mib", "64", "--probe-blocks", "2",
              "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "MB read per token" in p.stdout
    r = json.loads(out.read_text())
    assert r["llama_cpp"] is False and r["threads"] == [1] and r["tokens"] == 2
    assert r["probe_blocks"] == 2
    (m,) = r["models"]
    assert m["path"] == models["bench"]
    counted = m["bytes_per_token"]
    assert counted["total"] > 0 and counted["classes"]["experts"] > 0 and counted["classes"]["kv"] > 0
    # the KV term at the timed steps' mean position: prompt 16 + 4 warm-up + (2 - 1) / 2
    assert counted["ctx_pos"] == pytest.approx(20.5)
    (run,) = m["runs"]
    assert run["threads"] == 1
    for key in ("bandwidth_gbs", "colibri_tps", "roofline_tps", "colibri_share",
                "colibri_best_tps", "colibri_best_share"):
        assert np.isfinite(run[key]) and run[key] > 0, key
    assert run["colibri_share"] == pytest.approx(
        run["colibri_tps"] * counted["total"] / (run["bandwidth_gbs"] * 1e9))
    assert run["colibri_best_tps"] == max(run["samples"]["colibri_tps"])
    assert run["colibri_paired_share"] == pytest.approx(
        run["colibri_tps"] * counted["total"] / (run["samples"]["bandwidth_gbs"][0] * 1e9))
    assert "paired" in p.stdout
    # the bracket: probes in the engine's process before, between and after its timed steps
    (bracket,) = run["samples"]["colibri_bracket_gbs"]
    (sustained,) = run["samples"]["colibri_sustained_gbs"]
    assert np.isfinite(bracket) and bracket > 0 and 0 < sustained <= bracket * 1.001
    assert run["colibri_bracketed_share"] == pytest.approx(
        run["colibri_tps"] * counted["total"] / (bracket * 1e9))
    assert run["colibri_interleaved_share"] == pytest.approx(
        run["colibri_tps"] * counted["total"] / (sustained * 1e9))
    assert "bracketed" in p.stdout and "interleaved" in p.stdout
    assert run["llama_cpp_tps"] is None and run["ratio"] is None


def test_probe_brackets_the_timed_steps(models, monkeypatch):
    """_timed_steps: the warm-up steps, a probe, the timed steps in `blocks` runs as equal as
    can be with a probe after each (with the probe's arguments), each next token picked from
    the step before; without a probe none runs, and no more blocks than steps. run_colibri
    passes its probe through and reports every reading, best and sustained."""
    from colibri import bench

    events: list[Any] = []

    def fake_probe(probe):
        events.append(("probe", list(probe)))
        return 10.0 + len(events), 1.0 + len(events)

    def step(tok):
        events.append(tok)
        return tok + 1

    monkeypatch.setattr(bench, "_probe", fake_probe)
    lat, bw = bench._timed_steps(step, lambda out: out * 10, 1, 2, 3, [2, 64, 3])
    assert events == [1, 20, ("probe", [2, 64, 3]), 210, 2110, 21110, ("probe", [2, 64, 3])]
    assert len(lat) == 3 and all(t >= 0 for t in lat) and bw == [(13.0, 4.0), (17.0, 8.0)]
    events.clear()
    p = ("probe", [1, 64, 2, 2])
    lat, bw = bench._timed_steps(step, lambda out: out, 5, 0, 5, [1, 64, 2, 2])
    # 2 timed, a probe, an untimed step (7), 3 timed, a probe
    assert events == [p, 5, 6, p, 7, 8, 9, 10, p] and len(lat) == 5 and len(bw) == 3
    events.clear()
    lat, bw = bench._timed_steps(step, lambda out: out, 5, 0, 2, [1, 64, 2, 6])
    assert [e for e in events if e != ("probe", [1, 64, 2, 6])] == [5, 6, 7] and len(bw) == 3
    assert events[0] == events[2] == events[5] == ("probe", [1, 64, 2, 6]) and len(lat) == 2
    events.clear()
    lat, bw = bench._timed_steps(step, lambda out: out, 5, 1, 2, None)
    assert events == [5, 6, 7] and len(lat) == 2 and bw == []
    events.clear()
    r = bench.run_colibri(models["bench"], threads=1, prompt_tokens=4, gen_tokens=3, ctx=64,
                          warmup=2, probe=[1, 64, 2, 3])
    assert r["probe_gbs"] == [11.0, 12.0, 13.0, 14.0]
    assert r["probe_sustained_gbs"] == [2.0, 3.0, 4.0, 5.0]
    assert bench.run_colibri(models["bench"], threads=1, prompt_tokens=4, gen_tokens=1,
                             ctx=64)["probe_gbs"] == []


def test_measure_passes_the_blocks_and_takes_the_harmonic_mean(monkeypatch):
    """measure() asks each engine's process for its probe in `blocks` blocks of PROBE_PASSES
    passes, and records per round the best pass of its probes and their sustained rates'
    harmonic mean (every probe reads the same bytes: their bytes over their time)."""
    import colibri.bench
    import colibri.tools.membw
    from colibri.tools import roofline

    seen: list[dict[str, Any]] = []

    def fake_in_subprocess(engine, **kw):
        seen.append({"engine": engine, **kw})
        return {"decode_tps": 50.0 + len(seen), "probe_gbs": [30.0, 36.0, 33.0],
                "probe_sustained_gbs": [20.0, 30.0, 60.0]}

    monkeypatch.setattr(colibri.bench, "in_subprocess", fake_in_subprocess)
    monkeypatch.setattr(colibri.tools.membw, "membw", lambda t, mib, passes: 40.0)
    (run,) = roofline.measure("m.gguf", [2], tokens=8, ctx_pos=16, rounds=2, llama=True,
                              membw_mib=64, log=lambda *a: None, blocks=3)
    assert [s["engine"] for s in seen] == ["colibri", "llama_cpp"] * 2
    assert all(s["probe"] == [2, 64, roofline.PROBE_PASSES, 3] for s in seen)
    assert all(s["warmup"] == roofline.WARMUP and s["gen_tokens"] == 8 for s in seen)
    got = run["samples"]
    assert got["colibri_tps"] == [51.0, 53.0] and got["llama_cpp_tps"] == [52.0, 54.0]
    assert got["colibri_bracket_gbs"] == [36.0, 36.0]
    # 3 / (1/20 + 1/30 + 1/60) = 30
    assert got["colibri_sustained_gbs"] == pytest.approx([30.0, 30.0])
    assert got["llama_cpp_sustained_gbs"] == pytest.approx([30.0, 30.0])
    assert run["bandwidth_gbs"] == 40.0


def test_membw_rates():
    """The probe's two readings as parsed (the first and the third field membw.c prints): one
    pass is both the best and the sustained rate; over more passes the best is at least their
    sustained rate (the mean of passes 2..)."""
    from colibri.tools.membw import membw, membw_rates

    best, sustained = membw_rates(1, 64, 1)
    assert best > 0 and sustained == pytest.approx(best, rel=2e-3)
    best, sustained = membw_rates(2, 64, 4)
    assert 0 < sustained <= best * 1.001
    assert membw(1, 64, 2) > 0
    with pytest.raises(ValueError, match="positive"):
        membw_rates(1, 64, 0)


def test_repeated_prefill_times_each_and_keeps_the_first_token(models):
    """colibri.bench.run_colibri(prefill_repeats=3): three prefills of the prompt, each into a
    fresh sequence (the one before freed), the figure their median; the greedy first token and
    the decode after it as with one prefill (a sequence left over would change neither the
    token nor the timing list's length, so both are checked)."""
    from colibri.bench import run_colibri

    one = run_colibri(models["bench"], threads=1, prompt_tokens=6, gen_tokens=2, ctx=64)
    three = run_colibri(models["bench"], threads=1, prompt_tokens=6, gen_tokens=2, ctx=64,
                        prefill_repeats=3)
    assert len(one["prefill_s_all"]) == 1 and len(three["prefill_s_all"]) == 3
    assert three["ttft_s"] == pytest.approx(float(np.median(three["prefill_s_all"])))
    assert three["prefill_tps"] == pytest.approx(6 / three["ttft_s"])
    assert three["first_token"] == one["first_token"]
    assert all(t > 0 for t in three["prefill_s_all"])


def test_prefill_script_end_to_end(models, tmp_path):
    out = tmp_path / "prefill.json"
    p = _tool("prefill.py", "-m", models["bench"], "--no-llama-cpp", "--tokens", "4,8",
              "--threads", "1", "--rounds", "2", "--repeats", "2", "--ctx", "64", "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["threads"], r["tokens"]) for r in rows] == [(1, 4), (1, 8)]
    for r in rows:
        assert len(r["colibri_tps"]) == 2 and all(np.isfinite(x) and x > 0 for x in r["colibri_tps"])
        assert r["colibri"] == pytest.approx(float(np.median(r["colibri_tps"])))
        assert "ratio" not in r and r["llama_cpp_tps"] == []
    bad = _tool("prefill.py", "-m", models["bench"], "--no-llama-cpp", "--tokens", "128",
                "--ctx", "64", timeout=120)
    assert bad.returncode == 2 and "shorter than the longest prompt" in bad.stderr


def test_bench_under_an_expert_budget(models):
    """run_colibri(expert_budget=0.25) (generate.py --expert-budget): the experts from a cache
    store of a quarter of their bytes, the row named by its budget, the same greedy first token
    as the full-RAM run; report() gives each colibri row its ratio to llama.cpp's."""
    from colibri import bench

    full = bench.run_colibri(models["bench"], threads=1, prompt_tokens=6, gen_tokens=4, ctx=64)
    part = bench.run_colibri(models["bench"], threads=1, prompt_tokens=6, gen_tokens=4, ctx=64,
                             expert_budget=0.25)
    assert full["engine"] == "colibri" and part["engine"] == "colibri@0.25"
    assert part["first_token"] == full["first_token"]
    assert full["expert"]["misses"] == 0 and part["expert"]["misses"] > 0
    peer = dict(full, engine="llama.cpp", decode_tps=full["decode_tps"] * 2, expert={})
    text = bench.report([full, part, peer])
    assert "ratio colibri/llama.cpp" in text and "ratio colibri@0.25/llama.cpp" in text
    assert "colibri@0.25 experts: hit rate" in text
