"""The CUDA check (colibri.tools.cuda_check; tools/bench/cuda_check.py is its command line)
without a GPU: its GPU path run on the emulated device (tests/fake_pycuda.py)."""

from __future__ import annotations

import sys

import numpy as np
from fake_pycuda import EMULATION_MARKS

from colibri.tools.cuda_check import driver
from colibri.tools.cuda_check.staged import staged_check
from colibri.tools.cuda_check.timing import SMALL_TIMING_TOKENS

pytestmark = EMULATION_MARKS


def test_cuda_check_staged_step(rt, tmp_path):
    """The CUDA check's staged-path step (colibri.tools.cuda_check.staged_check, run by
    tools/bench/cuda_check.py on a lent GPU) on the emulation."""
    reg = sys.modules["pycuda.driver"].registry
    st = staged_check(rt, np.random.default_rng(3), tmp_path, small=True)
    assert st["f16"]["misses"] > 0 and st["int4-g128"]["splits"] >= 1
    assert reg.pinned == {}


def test_cuda_check_gpu_main_small(rt, tmp_path, monkeypatch, capsys):
    """The whole GPU check (colibri.tools.cuda_check, what tools/bench/cuda_check.py runs on a
    lent device) end to end on the emulation with --small shapes and one timed run: routing
    and FFN checks with both GEMM pipelines, timing rows for every format / pipeline / token
    count with the pipelines compared bit for bit, the target report, the staged step, the
    JSON summary."""
    import json

    monkeypatch.setattr(driver, "measure_matmul_peer", lambda: (100.0, "stand-in peer"))
    monkeypatch.setenv("OUT", str(tmp_path))
    assert driver.main(["--small", "--runs", "1"], root=tmp_path) == 0
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert res["pipelines"] == ["cp", "regs"] and res["gemm_pipeline"] == "cp"
    assert {(r["fmt"], r["pipeline"]) for r in res["ffn"]} == {
        ("f16", "cp"), ("int4-g128", "cp"), ("f16", "regs")}
    rows = res["timings"]
    assert len(rows) == 3 * len(SMALL_TIMING_TOKENS)
    for r in rows:
        assert r["ms"] > 0 and 0 < r["frac_roofline"] and r["frac_matmul"] > 0
        if r["pipeline"] == "regs" and r["fmt"] == "f16":
            assert r["bit_identical_to_cp"] is True
    assert set(res["target"]) == set() and res["staged"]["f16"]["misses"] > 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "of roofline" in out
