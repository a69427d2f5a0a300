"""The expert usage record (colibri.usage): concurrent updates lose nothing, a bad record is
ignored and replaced, the hottest experts and their hit share follow the counts, and a model
adds its route counts at close, pins the hottest experts of a budgeted store at the next load
(logits unchanged) and `colibri plan` reports the record's hit share for a budget."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.usage import PIN_SHARE, add_usage, hit_share, hottest, load_usage, record_key

SHAPE = (3, 8)


def _adder(args: tuple[str, str, int]) -> None:
    model, folder, seed = args
    rng = np.random.default_rng(seed)
    for _ in range(20):
        add_usage(model, rng.integers(0, 1000, SHAPE).astype(np.uint64), Path(folder))


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    want = np.zeros(SHAPE, dtype=np.uint64)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            want += rng.integers(0, 1000, SHAPE).astype(np.uint64)
    with mp.get_context("fork").Pool(4) as pool:
        pool.map(_adder, [(str(model), str(tmp_path / "rec"), s) for s in range(4)])
    got = load_usage(model, SHAPE, tmp_path / "rec")
    assert got is not None and np.array_equal(got, want)
    # nothing left behind but the record and its lock
    assert sorted(p.suffix for p in (tmp_path / "rec").iterdir()) == [".lock", ".npy"]


def test_bad_records_are_ignored_and_replaced(tmp_path: Path, caplog) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" * 100)
    rec = tmp_path / f"{record_key(model)}.npy"
    rec.write_bytes(b"\x93NUMPY garbage")
    with caplog.at_level("WARNING", logger="colibri"):
        assert load_usage(model, SHAPE, tmp_path) is None
    assert "ignoring the expert usage record" in caplog.text
    np.save(rec, np.ones((2, 2), dtype=np.uint64))  # another shape
    assert load_usage(model, SHAPE, tmp_path) is None
    add_usage(model, np.full(SHAPE, 3, dtype=np.uint64), tmp_path)
    assert np.array_equal(load_usage(model, SHAPE, tmp_path), np.full(SHAPE, 3))
    # the key follows the content, not the name
    other = tmp_path / "copy.gguf"
    other.write_bytes(model.read_bytes())
    assert record_key(other) == record_key(model)
    other.write_bytes(model.read_bytes() + b"x")
    assert record_key(other) != record_key(model)


def test_hottest_and_hit_share_by_construction() -> None:
    c = np.array([[90, 5, 5, 0],     # layer 0: one expert takes 90% of its routings
                  [0, 0, 50, 50],    # layer 1: two take half each
                  [0, 0, 0, 0]])     # a dense layer
    assert hottest(c, 1) == [(0, 0)]
    assert hottest(c, 3) == [(0, 0), (1, 2), (1, 3)]  # shares .9, .5, .5 (ties by position)
    assert hottest(c, 100) == [(0, 0), (1, 2), (1, 3), (0, 1), (0, 2)]  # never-used left out
    assert hit_share(c, 3) == pytest.approx(190 / 200)
    assert hit_share(c, 0) == 0 and hit_share(np.zeros((2, 2)), 4) == 0


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("usage") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))


def _run(m: colibri.Model) -> np.ndarray:
    seq = m.new_sequence()
    return m.eval([seq] * 24, tokens=[(7 * i + 3) % m.n_vocab for i in range(24)])


def test_model_records_pins_and_plans(moe_path: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLIBRI_USAGE_DIR", str(tmp_path))
    kw = dict(threads=2, ctx=256, max_batch=2, tokenizer=False, verbose=False)
    with colibri.Model(moe_path, expert_usage=False, **kw) as m:
        ref = _run(m)
        moe_layers = [i for i, L in enumerate(m.desc.layers) if L.n_expert]
        shape = (m.desc.n_layer, max(L.n_expert for L in m.desc.layers))
    assert load_usage(moe_path, shape) is None  # off: nothing written

    with colibri.Model(moe_path, expert_usage=True, **kw) as m:  # mapped: records, no pins
        assert np.array_equal(_run(m), ref)
        counts = {i: m.route_counts(i).copy() for i in moe_layers}
        assert m.usage_pins == []
    rec = load_usage(moe_path, shape)
    assert rec is not None
    for i in moe_layers:
        assert np.array_equal(rec[i, : len(counts[i])], counts[i])
    assert rec.sum() == sum(int(c.sum()) for c in counts.values()) > 0

    # a budgeted store pins the record's hottest experts; logits do not change
    with colibri.Model(moe_path, expert_usage=True, expert_mode="cache", expert_budget=0.5,
                       **kw) as m:
        info = m.expert_info()
        free = info["n_slots"] - colibri.model.min_expert_slots(m.desc, m.max_batch)
        assert m.usage_pins == hottest(rec, int(free * PIN_SHARE)) != []
        assert info["n_pinned"] == len(m.usage_pins)
        assert np.array_equal(_run(m), ref)
    rec2 = load_usage(moe_path, shape)
    assert rec2 is not None and np.array_equal(rec2, 2 * rec)  # the second run added its own

    # explicit pins win: none from the record
    with colibri.Model(moe_path, expert_usage=True, expert_mode="cache", expert_budget=0.5,
                       pin=[(moe_layers[0], 0)], **kw) as m:
        assert m.usage_pins == [] and m.expert_info()["n_pinned"] == 1

    out = subprocess.run([sys.executable, "-m", "colibri", "plan", "-m", moe_path,
                          "--expert-budget", "0.25"], capture_output=True, text=True,
                         check=True).stdout
    total = int(load_usage(moe_path, shape).sum())
    assert f"usage record    {total} routings" in out, out


def test_plan_without_a_record_says_so(moe_path: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "colibri", "plan", "-m", moe_path],
                         capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "COLIBRI_USAGE_DIR": str(tmp_path)}
                         ).stdout
    assert "usage record    none yet" in out


def test_learned_moe_bench_slice(tmp_path: Path) -> None:
    # a short slice of tools/bench/learned_moe.py (train a few steps, export, measure): every
    # MoE layer gets a row, the layers after the first a scored prediction
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-W", "ignore", str(root / "tools" / "bench" /
                          "learned_moe.py"), "--steps", "2", "--layers", "2", "--eval-tokens",
                          "16", "--corpus-bytes", "200000", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()
            if line.strip()[:1].isdigit() and "%" in line]
    assert [r[0] for r in rows] == ["0", "1"], out.stdout
    assert rows[0][1] == "-" and rows[1][1].endswith("%"), out.stdout
    assert "cache hit rate" in out.stdout


def test_a_budget_holding_every_expert_maps_them(moe_path: str, caplog) -> None:
    kw = dict(threads=1, ctx=64, max_batch=1, tokenizer=False, verbose=False)
    with caplog.at_level("INFO", logger="colibri"):
        with colibri.Model(moe_path, expert_budget=1.0, **kw) as m:
            assert m.expert_info()["mode"] == "mapped"
    assert "holds every expert" in caplog.text
    with colibri.Model(moe_path, expert_budget=0.5, **kw) as m:
        assert m.expert_info()["mode"] == "cache"
    with colibri.Model(moe_path, expert_budget=1.0, expert_mode="cache", **kw) as m:
        assert m.expert_info()["mode"] == "cache"  # asked for: kept
