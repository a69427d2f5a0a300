"""Memory: with an expert budget the process's peak RSS stays under dense size + budget +
MARGIN, measured in a fresh subprocess (VmHWM: ru_maxrss would carry pytest's own peak
across the exec) on a 2-layer Qwen3-30B-A3B-shaped Q4_0
model (~1 GB: 356 MiB dense, 648 MiB experts) written by colibri/tools/make_bench_model.py. The mapped
store (whole-file mapping) is run too: its peak must be higher, or the test proves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARGIN = 150 * 2**20  # interpreter + numpy + colibri, KV (ctx 128), scratch, logits

CHILD = r"""
import json, sys
import numpy as np
from colibri.generate import peak_rss_bytes
from colibri.model import Model
path, mode, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
kw = {} if mode == "mapped" else dict(expert_mode=mode, expert_budget=budget)
m = Model(path, threads=2, ctx=128, max_batch=1, tokenizer=False, **kw)
rng = np.random.default_rng(0)
s = m.new_sequence()
for t in rng.integers(0, m.n_vocab, 32).tolist():
    m.eval([s], tokens=[t])
print(json.dumps(dict(peak=peak_rss_bytes(),
                      dense=m.desc.dense_bytes(), experts=m.desc.expert_bytes(),
                      stats=m.expert_stats(), info=m.expert_info())))
"""


def _child(path: Path, mode: str, budget: float) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode, str(budget)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_rss_stays_under_dense_plus_budget(tmp_path):
    path = tmp_path / "bench2.gguf"
    subprocess.run([sys.executable, "-m", "colibri.tools.make_bench_model", str(path),
                    "--layers", "2", "--type", "q4_0", "--routing", "raw"], check=True, capture_output=True,
                   timeout=300)
    mapped = _child(path, "mapped", 1.0)
    for mode in ("cache", "mmap"):
        r = _child(path, mode, 0.05)
        budget = int(0.05 * r["experts"])
        held = max(budget, r["info"]["n_slots"] * r["info"]["slot_bytes"])
        assert r["stats"]["evictions"] > 0, mode  # the budget was binding
        assert r["stats"]["resident_bytes"] <= held
        assert r["peak"] < r["dense"] + held + MARGIN, (mode, r["peak"] >> 20, r["dense"] >> 20,
                                                        held >> 20)
        if mode == "cache":
            assert mapped["peak"] > r["peak"] + 20 * 2**20, (mapped["peak"] >> 20,
                                                             r["peak"] >> 20)
