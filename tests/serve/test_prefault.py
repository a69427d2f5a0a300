"""A server's memory at its start (colibri.serve.prefault): the KV arena's free blocks touched
and live ones kept, the weights (dense only with streamed experts), the expert pool, the
forward's scratch; `colibri serve` does it before /health is ready, `--no-prefault` skips it."""

from __future__ import annotations

import re

import fastapi  # noqa: F401  the serve extra (test extras)
import numpy as np
import psutil
import pytest
from serve_util import metric, start  # noqa: E402

import colibri
from colibri.kv import KVArena
from colibri.serve.prefault import (
    prefault,
    prefault_arena,
    prefault_forward,
    prefault_pool,
    prefault_weights,
    tune_malloc,
)


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("prefault") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))


def test_arena_free_blocks_touched_live_ones_kept():
    with KVArena(64 << 20, hugepages="off") as a:
        live = a.alloc(3 << 20)
        pattern = np.arange(3 << 20, dtype=np.uint64).astype(np.uint8)
        np.frombuffer(a.view(live, 3 << 20), dtype=np.uint8)[:] = pattern
        before_stats, before = a.stats(), _rss()
        touched = prefault_arena(a)
        assert touched == before_stats["free"]
        assert _rss() - before > 0.9 * touched  # the pages are resident now
        after = a.stats()
        assert {k: after[k] for k in ("used", "n_blocks", "free", "largest_free")} == \
            {k: before_stats[k] for k in ("used", "n_blocks", "free", "largest_free")}
        assert np.array_equal(np.frombuffer(a.view(live, 3 << 20), dtype=np.uint8), pattern)
        a.check()


def test_dense_model_weights_arena_and_forward():
    with colibri.Model(ctx=2048, threads=2, verbose=False) as m:
        rss0 = _rss()
        out = prefault(m, rows=16)
        assert out["weights"] == m.prefault() > 0 and out["expert_pool"] == 0
        assert out["kv_arena"] == m.arena.stats()["capacity"]  # nothing live: all of it
        assert out["forward_tokens"] == min(m.max_batch, m.ctx)
        assert _rss() - rss0 > 0.9 * out["kv_arena"]
        assert m.arena.stats()["used"] == 0 and m.kv.sequences() == []  # scratch gone
        # the model still answers as before
        seq = m.new_sequence()
        m.eval([seq], tokens=[2, 3, 4])
        assert m.sequence_length(seq) == 3
        m.free_sequence(seq)


def test_streamed_experts_prefault_dense_weights_and_the_pool(tiny_path, tmp_path,
                                                              monkeypatch):
    from colibri.usage import load_usage

    monkeypatch.setenv("COLIBRI_USAGE_DIR", str(tmp_path / "usage"))
    with colibri.Model(tiny_path, ctx=512, threads=2, verbose=False, expert_mode="cache",
                       expert_budget=0.5, expert_usage=True) as m:
        dense = prefault_weights(m)
        assert 0 < dense < m.prefault()  # the routed experts are left to the store
        assert abs(dense - m.desc.dense_bytes()) < 0.02 * dense
        pool = prefault_pool(m)
        assert pool in (0, m.experts.pool()["bytes"])  # 0: a kernel without POPULATE_WRITE
        n = prefault_forward(m, rows=4)
        assert n == min(m.max_batch, m.ctx) and m.expert_stats()["acquired"] > 0
        shape = m._usage_shape()
        m.save_expert_usage()  # the warm-up's routes are not the model's use
        assert load_usage(tiny_path, shape) is None
        seq = m.new_sequence()
        m.eval([seq], tokens=[5, 6, 7])
        m.save_expert_usage()  # real use is recorded, without the warm-up's
        rec = load_usage(tiny_path, shape)
        k = m.desc.layers[-1].n_expert_used
        assert rec is not None and int(rec.sum()) == 3 * k * sum(
            1 for L in m.desc.layers if L.n_expert)
    with colibri.Model(tiny_path, ctx=512, threads=2, verbose=False) as m:  # mapped experts
        assert prefault_weights(m) == m.prefault() and prefault_pool(m) == 0


def test_tune_malloc():
    assert tune_malloc()  # glibc here


@pytest.mark.slow
def test_serve_prefaults_before_ready_unless_told_not_to(tiny_path, tmp_path):
    rss = {}
    for flag in ([], ["--no-prefault"]):
        srv = start(["-m", tiny_path, "--threads", "2", "--ctx", "32768", "--max-seqs", "4",
                     *flag], str(tmp_path / "log"))
        try:
            cap = metric(srv.url, "colibri_kv_capacity_bytes")
            assert cap is not None and cap > 64 << 20
            rss[bool(flag)] = psutil.Process(srv.proc.pid).memory_info().rss
            log = srv.log()
        finally:
            assert srv.stop() == 0
        said = re.search(r"memory touched at start: .*kv arena (\d+) MiB", log)
        if flag:
            assert said is None, log
        else:
            assert said and int(said.group(1)) == round(cap / 2**20), log
    assert rss[False] - rss[True] > 0.9 * cap
