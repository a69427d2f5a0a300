"""The expert store: every mode, budget and policy, with prefetch on and off, gives
bit-identical logits to the mapped (full-RAM) store on the tiny oracle MoE models of every MoE
family (gemma4's fused gate_up experts in their own test; deepseek2's MLA too), a 25% budget included; statistics
add up; prefetched experts become hits; bad settings fail clearly. dots1, glm4moe and
ernie4_5_moe have a dense first layer (first_k_dense): nothing here assumes layer 0 has experts
or that every layer does."""

from __future__ import annotations

import os

import numpy as np
import pytest
from oracle_models import build, prompt

import colibri._core._forward as _fw
import colibri._core._quant as _quant
from colibri.errors import ColibriError
from colibri.model import Model, min_expert_slots, parse_budget

MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "hunyuan_v1_moe", "dots1", "glm4moe",
       "ernie4_5_moe", "granitemoe", "granitemoeshared", "phimoe", "deepseek_v3", "deepseek_v2",
       "gpt_oss", "llama4", "qwen3next"]

CONFIGS = [
    dict(expert_mode="cache", expert_budget=1, expert_policy="lru"),
    dict(expert_mode="cache", expert_budget=1, expert_policy="lfru"),
    dict(expert_mode="cache", expert_budget=0.4, expert_policy="lru"),
    # pins: (k, expert) pins that expert in the k-th MoE layer (k = -1: the last)
    dict(expert_mode="cache", expert_budget=0.4, expert_policy="lfru", pin=[(0, 1), (-1, 3)]),
    dict(expert_mode="cache", expert_budget=0.25),
    dict(expert_mode="cache", expert_budget=1.0),
    dict(expert_mode="mmap", expert_budget=1, expert_policy="lru"),
    dict(expert_mode="mmap", expert_budget=0.4, expert_policy="lfru"),
    dict(expert_mode="mmap", expert_budget=0.25),
]


def moe_layers(m) -> list[int]:
    return [i for i, L in enumerate(m.desc.layers) if L.n_expert > 0]


def per_expert_bytes(m, info) -> float:
    """One expert's bytes (every MoE layer of these models has the same experts)."""
    layers = moe_layers(m)
    return info["expert_bytes"] / (len(layers) * m.desc.layers[layers[0]].n_expert)


@pytest.fixture(scope="module", params=MOE)
def moe(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("experts")
    types = ("f32", "q8_0") if request.param == "mixtral" else ("f32",)
    _, paths = build(request.param, out, types)
    return request.param, paths


def _logits(path, **kw):
    """Prefill in batches of max_batch=2, then 6 single-token steps on a second sequence
    interleaved with the first: logits of all of it, and the store's statistics."""
    m = Model(path, threads=2, ctx=256, max_batch=2, tokenizer=False, **kw)
    a, b = m.new_sequence(), m.new_sequence()
    outs = [m.eval([a], tokens=prompt(11, seed=3)), m.eval([b], tokens=prompt(5, seed=4))]
    for t in prompt(6, seed=5):
        outs.append(m.eval([a, b], tokens=[t, (t * 7) % m.n_vocab]))
    return np.concatenate(outs), m.expert_stats(), m.expert_info(), m


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "noprefetch"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_logits_identical_to_the_mapped_store(moe, cfg, prefetch):
    name, paths = moe
    for path in paths.values():
        ref, ref_st, _, ref_m = _logits(path)
        layers = moe_layers(ref_m)
        if "pin" in cfg:
            cfg = dict(cfg, pin=[(layers[k], e) for k, e in cfg["pin"]])
        got, st, info, m = _logits(path, prefetch=prefetch, **cfg)
        assert np.array_equal(got, ref), (name, path.name, cfg, prefetch)
        # the same routing happened
        assert st["uses"] == ref_st["uses"] and st["acquired"] == ref_st["acquired"]
        m.experts.prefetch_sync()
        st = m.expert_stats()
        assert st["hits"] + st["misses"] == st["acquired"]
        assert info["mode"] == cfg["expert_mode"] and info["prefetch"] == prefetch
        # prefetch accounting: hits come from reads it issued, wasted ones were evicted unused
        assert st["prefetch_hits"] <= st["hits"]
        assert st["prefetch_hits"] + st["prefetch_wasted"] <= st["prefetch_issued"]
        if not prefetch:
            assert st["prefetch_issued"] == 0
        # nothing predicts the first MoE layer (nor a dense one)
        assert all(m.expert_stats(i)["prefetch_issued"] == 0
                   for i in range(len(m.desc.layers)) if i <= layers[0])
        assert st["prefetch_issued"] == sum(m.expert_stats(layer)["prefetch_issued"]
                                            for layer in layers)
        assert 0 < st["resident"] <= info["n_slots"]
        assert st["resident"] == sum(m.expert_stats(layer)["resident"] for layer in layers)
        slots = min_expert_slots(m.desc, 2)
        assert info["n_slots"] >= slots
        if cfg["expert_budget"] == 1 and isinstance(cfg["expert_budget"], int):  # one byte: the pool is the minimum rule
            assert info["n_slots"] == slots
            assert st["evictions"] > 0
        if cfg["expert_budget"] == 0.25:  # a quarter: fewer slots than experts, evictions
            n_all = len(layers) * m.desc.layers[layers[0]].n_expert
            assert info["n_slots"] < n_all and st["evictions"] > 0, (info["n_slots"], n_all)
        if isinstance(cfg["expert_budget"], float) and cfg["expert_budget"] == 1.0:  # everything fits: each expert is read at most once
            assert st["evictions"] == 0
            assert st["bytes_read"] <= info["expert_bytes"]
        per_expert = per_expert_bytes(m, info)
        assert st["resident_bytes"] == st["resident"] * per_expert
        assert info["n_pinned"] == len(cfg.get("pin", []))


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "noprefetch"])
def test_reads_match_misses(moe, prefetch):
    """Every miss and every prefetch reads exactly one expert (three ranges of a GGUF, so three
    preads) from the file."""
    _, paths = moe
    _, st, info, m = _logits(paths["f32"], expert_mode="cache", expert_budget=1,
                             prefetch=prefetch)
    m.experts.prefetch_sync()
    st = m.expert_stats()
    per_expert = per_expert_bytes(m, info)
    assert st["misses"] > 0 and info["one_read_layers"] == 0
    assert st["bytes_read"] == (st["misses"] + st["prefetch_issued"]) * per_expert
    assert st["reads"] == 3 * (st["misses"] + st["prefetch_issued"])
    m.reset_expert_stats()
    after = m.expert_stats()
    assert after["misses"] == 0 and after["resident"] == st["resident"]


@pytest.mark.parametrize("mode", ["cache", "mmap"])
def test_prefetched_experts_are_hits(moe, mode):
    """Experts hinted and read before they are asked for are hits counted as prefetch hits;
    the logits stay those of the mapped store."""
    _, paths = moe
    path = paths["f32"]
    ref = Model(path, threads=1, ctx=32, max_batch=1, tokenizer=False)
    m = Model(path, threads=1, ctx=32, max_batch=1, tokenizer=False, expert_mode=mode,
              expert_budget=1.0, prefetch=True)
    n_expert = m.desc.layers[1].n_expert
    m.experts.prefetch(1, np.arange(n_expert))
    m.experts.prefetch_sync()
    st1 = m.expert_stats(1)
    assert st1["prefetch_issued"] == n_expert and st1["resident"] == n_expert
    s, r = m.new_sequence(), ref.new_sequence()
    for t in prompt(3, seed=7):
        assert np.array_equal(m.eval([s], tokens=[t]), ref.eval([r], tokens=[t]))
    st1 = m.expert_stats(1)
    assert st1["misses"] == 0 and st1["hits"] == st1["acquired"] > 0
    assert 0 < st1["prefetch_hits"] <= st1["acquired"]
    with pytest.raises(ValueError, match="no expert"):
        m.experts.prefetch(1, [n_expert])


def test_prediction_is_scored_at_the_next_acquire(moe):
    """A hint is scored against the layer's next acquire: precision = used / hinted, recall =
    used / acquired; an acquire without a pending hint is not scored."""
    _, paths = moe
    m = Model(paths["f32"], threads=1, ctx=32, max_batch=1, tokenizer=False,
              expert_mode="cache", expert_budget=1.0)  # no prefetch thread: scoring only
    n_expert = m.desc.layers[1].n_expert
    ids = [0, 1, n_expert - 1]
    m.experts.prefetch(1, [ids[0], ids[1], ids[1]])  # a repeated id counts once
    m.experts.acquire(1, [ids[1], ids[2]])
    m.experts.release(1, [ids[1], ids[2]])
    st = m.expert_stats(1)
    assert (st["predicted"], st["predicted_used"], st["predicted_acquired"]) == (2, 1, 2)
    m.experts.acquire(1, [ids[0]])  # no hint pending: not scored
    m.experts.release(1, [ids[0]])
    assert m.expert_stats(1)["predicted_acquired"] == 2
    assert m.expert_stats()["predicted_used"] == 1  # the sum over layers
    m.reset_expert_stats()
    assert m.expert_stats(1)["predicted"] == 0


def test_forward_predictions_are_scored(moe):
    """With prefetch on, the forward hints each next MoE layer: every hinted layer's acquires
    are scored, and used <= min(hinted, acquired)."""
    _, paths = moe
    m = Model(paths["f32"], threads=1, ctx=32, max_batch=1, tokenizer=False,
              expert_mode="cache", expert_budget=1.0, prefetch=True)
    s = m.new_sequence()
    for t in prompt(4, seed=9):
        m.eval([s], tokens=[t])
    moe_layers = [i for i, L in enumerate(m.desc.layers) if L.n_expert]
    for i in moe_layers[1:]:  # the first MoE layer is never predicted
        st = m.expert_stats(i)
        assert st["predicted"] > 0 and st["predicted_acquired"] == st["acquired"]
        assert st["predicted_used"] <= min(st["predicted"], st["predicted_acquired"])
    assert m.expert_stats(moe_layers[0])["predicted"] == 0


def test_prefetch_option_and_environment(moe, monkeypatch):
    _, paths = moe
    path = paths["f32"]

    def info(**kw):
        return Model(path, threads=1, ctx=16, max_batch=1, tokenizer=False, **kw).expert_info()

    monkeypatch.delenv("COLIBRI_EXPERT_PREFETCH", raising=False)
    assert info(expert_mode="cache")["prefetch"] is False  # default: off
    assert info(expert_mode="cache", prefetch=True)["prefetch"] is True
    assert info(expert_mode="mmap", prefetch=True)["prefetch"] is True
    assert info(expert_mode="mapped", prefetch=True)["prefetch"] is False  # nothing to prefetch
    monkeypatch.setenv("COLIBRI_EXPERT_PREFETCH", "1")
    assert info(expert_mode="cache")["prefetch"] is True
    assert info(expert_mode="mmap")["prefetch"] is True
    assert info()["prefetch"] is False
    assert info(expert_mode="cache", prefetch=False)["prefetch"] is False
    monkeypatch.setenv("COLIBRI_EXPERT_PREFETCH", "maybe")
    with pytest.raises(ValueError, match="COLIBRI_EXPERT_PREFETCH"):
        info(expert_mode="cache")


def _vm_flags(mm):
    """The kernel's VmFlags of the mapping that starts at mm's first byte (/proc/self/smaps)."""
    start = f"{np.frombuffer(mm, np.uint8, count=1).ctypes.data:x}-"
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip("0").startswith(start))
    flags = next(line for line in lines[at + 1:] if line.startswith("VmFlags:"))
    return flags.split()[1:]


def test_file_mapping_page_advice(moe):
    """The file mapping is advised MADV_HUGEPAGE ("hg": experts read in place through 2 MiB
    folios where the kernel keeps them), except under the mmap store (MADV_NOHUGEPAGE, "nh":
    it faults single experts in and evicts them). A kernel without transparent huge pages
    refuses both: then the mapping carries neither flag and the advice reports False."""
    path = moe[1]["f32"]
    thp = os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
    for mode, flag in (("mapped", "hg"), ("cache", "hg"), ("mmap", "nh")):
        kw = {} if mode == "mapped" else {"expert_budget": 1}
        m = Model(path, threads=1, ctx=16, max_batch=1, tokenizer=False, expert_mode=mode, **kw)
        flags = _vm_flags(m.gguf._mm)
        if thp:
            assert flag in flags, mode
        else:
            assert "hg" not in flags and "nh" not in flags, mode
            assert m.gguf.advise(huge=True) is False
        m.close()


def _takes_o_direct(path):
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:  # tmpfs and some others refuse O_DIRECT
        return False


def test_direct_io_setting_and_same_logits(moe, monkeypatch):
    """COLIBRI_EXPERT_DIRECT_IO: auto leaves these small experts (KiBs: the alignment would cost
    more than it gains) buffered, on reads them with O_DIRECT where the file system takes it,
    off never; every setting gives the mapped store's logits bit for bit."""
    name, paths = moe
    path = paths["f32"]
    ref, _, _, m = _logits(path)
    m.close()
    for setting, direct in [("auto", False), ("on", _takes_o_direct(path)), ("off", False)]:
        monkeypatch.setenv("COLIBRI_EXPERT_DIRECT_IO", setting)
        got, _, info, m = _logits(path, expert_mode="cache", expert_budget=0.4)
        m.close()
        assert info["direct_io"] is direct, setting
        np.testing.assert_array_equal(got, ref)
    monkeypatch.setenv("COLIBRI_EXPERT_DIRECT_IO", "sometimes")
    with pytest.raises(ValueError, match="COLIBRI_EXPERT_DIRECT_IO"):
        _logits(path, expert_mode="cache")
    with pytest.raises(ValueError, match="direct_io"):
        _fw.ExpertStore(None, direct_io=3)


def test_unknown_names():
    with pytest.raises(ValueError, match="policy"):
        _fw.ExpertStore(None, policy="mru")
    with pytest.raises(ValueError, match="mode"):
        _fw.ExpertStore(None, mode="ram")


def test_parse_budget():
    assert parse_budget(None, 100) is None
    assert parse_budget("4GB", 1) == 4 * 10**9
    assert parse_budget("512MiB", 1) == 512 * 2**20
    assert parse_budget("2 GiB", 1) == 2 * 2**30
    assert parse_budget(0.25, 1000) == 250
    assert parse_budget("0.5", 1000) == 500
    assert parse_budget(12345, 1) == 12345
    for bad in ("lots", "-1GB", "4XB", 0, -5, 1.5, 0.0, True, "nan"):
        with pytest.raises(ValueError, match="budget"):
            parse_budget(bad, 1000)


def test_bad_settings_fail_clearly(moe):
    _, paths = moe
    path = paths["f32"]
    with Model(path, tokenizer=False, max_batch=1) as ref:
        layers = moe_layers(ref)
        dense = [i for i in range(len(ref.desc.layers)) if i not in layers]
    first = layers[0]
    with pytest.raises(ValueError, match="expert_mode"):
        Model(path, tokenizer=False, expert_mode="ram", expert_budget=1)
    with pytest.raises(ValueError, match="policy"):
        Model(path, tokenizer=False, expert_mode="cache", expert_policy="fifo")
    with pytest.raises(ValueError, match="no expert"):
        Model(path, tokenizer=False, expert_mode="cache", pin=[(first, 99)])
    for i in dense:  # first_k_dense: a dense layer has nothing to pin
        with pytest.raises(ValueError, match=f"layer {i} has no experts"):
            Model(path, tokenizer=False, expert_mode="cache", pin=[(i, 0)])
    with pytest.raises(ValueError, match="pin"):
        Model(path, tokenizer=False, expert_mode="cache", pin=[(7, 0)])
    with pytest.raises(ValueError, match="mapped store cannot pin"):
        Model(path, tokenizer=False, expert_mode="mapped", pin=[(first, 0)])
    # pinning so many that fewer than one layer's worth stays free
    m = Model(path, tokenizer=False, max_batch=1, expert_mode="cache", expert_budget=1)
    slots = m.expert_info()["n_slots"]
    with pytest.raises(ValueError, match="unpinned slots"):
        m.experts.pin(first, 0)
    assert slots == min_expert_slots(m.desc, 1)


def test_a_pool_smaller_than_one_batch_fails_with_the_numbers(moe):
    """A store built below the minimum rule (min_slots=1) refuses a batch needing more
    experts than it has slots, naming the numbers, instead of evicting experts in use."""
    _, paths = moe
    m = Model(paths["f32"], threads=1, ctx=64, max_batch=16, tokenizer=False)
    store = _fw.ExpertStore(m.desc, mode="cache", path=str(paths["f32"]), budget_bytes=1,
                            min_slots=1)
    assert store.info()["n_slots"] == 1
    kv = m.kv
    fw = _fw.Forward(m.desc, kv, store, _quant.ThreadPool(1), 16)
    seq = kv.new_sequence()
    with pytest.raises(MemoryError, match=r"needs \d+ experts at once but the store has 1 slots"):
        fw.run(np.full(16, seq), np.arange(16), tokens=prompt(16, seed=9))
    with pytest.raises((FileNotFoundError, OSError, ColibriError)):
        _fw.ExpertStore(m.desc, mode="cache", path="/nonexistent/model.gguf", budget_bytes=1)


def test_plan_sizes_and_budget(moe):
    """The plan's sizes are the file's tensor sizes (phimoe's head and output-norm biases
    included: dense_bytes counts every model-wide tensor); a machine too small for the experts
    gets a cache budget, never below one batch's experts."""
    from colibri.gguf import GGUFFile
    from colibri.plan import make_plan

    name, paths = moe
    path = str(paths["f32"])
    with GGUFFile(path) as gf:
        # (gpt-oss's expert biases are small and always resident: dense)
        exps = sum(t.nbytes for n, t in gf.tensors.items()
                   if "_exps." in n and not n.endswith(".bias"))
        total = sum(t.nbytes for t in gf.tensors.values())
    big = make_plan(path, ctx=64, max_batch=2, available=2**34)
    assert big.expert_bytes == exps and big.dense_bytes == total - exps
    assert big.mode == "mapped" and big.budget_bytes == exps
    need = big.dense_bytes + big.kv_bytes + big.state_bytes + big.scratch_bytes
    tight = make_plan(path, ctx=64, max_batch=2, available=int((need + exps // 2) / 0.85))
    assert tight.mode == "cache" and tight.min_budget_bytes <= tight.budget_bytes < exps
    tiny = make_plan(path, ctx=64, max_batch=2, available=need)
    assert tiny.budget_bytes == tiny.min_budget_bytes > 0
    assert tiny.peak_bytes == need + tiny.budget_bytes
    assert any("projected peak" in line for line in tiny.lines())


def test_cli_plan_and_run_with_a_budget(moe, capsys):
    from colibri.cli import main

    _, paths = moe
    path = str(paths["f32"])
    assert main(["plan", "-m", path, "--ctx", "64"]) == 0
    out = capsys.readouterr().out
    assert "routed experts" in out and "expert budget" in out and "projected peak" in out
    assert main(["run", "-m", path, "-p", "hello", "-n", "3", "--temp", "0", "--ctx", "64",
                 "--expert-mode", "cache", "--expert-budget", "0.3",
                 "--expert-policy", "lfru"]) == 0
    captured = capsys.readouterr()
    assert "expert hit rate" in captured.out + captured.err
    assert "experts resident" in captured.out + captured.err
    for flag in ("--prefetch", "--no-prefetch"):
        assert main(["run", "-m", path, "-p", "hello", "-n", "2", "--temp", "0", "--ctx", "64",
                     "--expert-mode", "cache", "--expert-budget", "0.3", flag]) == 0
        assert "expert hit rate" in capsys.readouterr().err
    assert main(["run", "-m", path, "-p", "hi", "-n", "1", "--expert-budget", "lots"]) == 1
    assert "budget" in capsys.readouterr().err


@pytest.fixture(scope="module")
def gemma4_paths(tmp_path_factory):
    _, paths = build("gemma4", tmp_path_factory.mktemp("experts-gemma4"), ("f32", "q8_0"))
    return paths


@pytest.mark.parametrize("cfg", [CONFIGS[i] for i in (0, 3, 4, 6, 8)],
                         ids=lambda c: "-".join(str(v) for v in c.values()))
def test_gemma4_fused_gate_up_experts_identical_in_every_mode(gemma4_paths, cfg):
    """gemma4's experts are one fused gate_up tensor (gate and up rows of an expert side by
    side) plus down: cache and mmap stores with small budgets (25% included) give the mapped
    store's logits."""
    for path in gemma4_paths.values():
        ref, ref_st, _, ref_m = _logits(path)
        if "pin" in cfg:
            layers = moe_layers(ref_m)
            cfg = dict(cfg, pin=[(layers[k], e) for k, e in cfg["pin"]])
        got, st, info, _ = _logits(path, **cfg)
        assert np.array_equal(got, ref), (path.name, cfg)
        if cfg["expert_budget"] == 0.25:
            assert st["evictions"] > 0
        assert st["uses"] == ref_st["uses"] and st["hits"] + st["misses"] == st["acquired"]
        assert info["mode"] == cfg["expert_mode"]


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "noprefetch"])
def test_container_reads_each_expert_once(moe, tmp_path, prefetch):
    """On the colibri container (gate|up|down adjacent per expert) the cache store reads each
    expert with ONE pread, and the logits stay those of the mapped GGUF."""
    from colibri.container import convert

    _, paths = moe
    ref, _, _, _ = _logits(paths["f32"])
    cpath = convert(paths["f32"], tmp_path / "m.colibri", "keep", progress=False)["path"]
    got, _, info, m = _logits(cpath, expert_mode="cache", expert_budget=1, prefetch=prefetch)
    assert np.array_equal(got, ref)
    m.experts.prefetch_sync()
    st = m.expert_stats()
    n_moe = sum(1 for L in m.desc.layers if L.n_expert > 0)
    assert info["one_read_layers"] == n_moe > 0
    assert st["misses"] > 0 and st["reads"] == st["misses"] + st["prefetch_issued"]
