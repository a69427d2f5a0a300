#!/usr/bin/env python3
"""Where a batched decode step's time goes, with SIMD-level A/B in one process:

    PYTHONPATH=. python tools/bench/batched_step.py [-m MODEL] [--tokens 16] [--threads 1]
                                                   [--rounds 5] [--levels avx512,avx512vnni]
                                                   [--prefill 64,256]

N sequences (--tokens) each hold a 44-token prompt; one step = one Model.eval of one token per
sequence (logits for all, as colibri.Engine asks). For each round and each SIMD level
(alternating, so the machine's load hits both alike) it times, as medians of 7 calls:
the whole step, the output head's matmul alone (the same N tokens, the model's own weight
through colibri.quant.matmul on a pool of --threads), and from those the rest (layers,
attention, Python); then the Sampler over the N logits rows (greedy and the default
temperature/top-k/top-p/min-p). With --prefill, each round also times the prefill of an N-token
prompt in a fresh sequence (one Model.eval, the last token's logits; the MoE layers' experts
then see many tokens each). CPU time (all threads of the process) is printed beside wall
time: on a shared machine CPU time moves less. Prints per-level medians over the rounds.
Like every tool here it imports the installed colibri (from a checkout: PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def timed(fn: Callable[[], Any], reps: int = 7) -> tuple[float, float]:
    """Median (wall, cpu) seconds of reps calls."""
    w, c = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        w.append(time.perf_counter() - t0)
        c.append(time.process_time() - c0)
    return statistics.median(w), statistics.median(c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--levels", default=None, help="comma-separated SIMD caps (default: detected)")
    ap.add_argument("--prefill", default="", help="comma-separated prompt lengths to time too")
    a = ap.parse_args()

    import colibri
    from colibri import quant, simd
    from colibri.sampling import Sampler, SamplingParams

    path = a.model or colibri.default_model_path()
    levels = a.levels.split(",") if a.levels else [simd.detected()]
    prefill = [int(n) for n in a.prefill.split(",") if n]
    n_steps = 2 + a.rounds * len(levels) * 8  # every sequence grows by one token per step
    m = colibri.Model(path, threads=a.threads,
                      ctx=a.tokens * (44 + n_steps + 16) + max(prefill, default=0),
                      max_batch=max([64, a.tokens] + prefill), tokenizer=False)
    m.prefault()
    seqs = [m.new_sequence() for _ in range(a.tokens)]
    for i, s in enumerate(seqs):
        m.eval([s], tokens=[2, 100 + i, 200 + i, 300 + i] + list(range(400, 440)))
    step_tok = [500 + i for i in range(a.tokens)]

    def step() -> np.ndarray:
        return m.eval(seqs, tokens=step_tok)

    head = _head_matrix(m)
    pool = quant.ThreadPool(a.threads)
    x = np.random.default_rng(0).standard_normal((a.tokens, head[3])).astype(np.float32)
    y = np.empty((a.tokens, head[2]), np.float32)

    def prefill_eval(n: int) -> None:
        s = m.new_sequence()
        try:
            m.eval([s] * n, tokens=[(1000 + 7 * i) % 30000 for i in range(n)],
                   logits=[False] * (n - 1) + [True])
        finally:
            m.free_sequence(s)

    def head_mm() -> None:
        quant.matmul(head[0], head[1], head[2], head[3], x, pool=pool, out=y)

    res: dict[str, dict[str, list[float]]] = {lv: {} for lv in levels}
    logits = step()
    for _ in range(a.rounds):
        for lv in levels:
            with simd.max_simd(lv):
                step()
                sw, sc = timed(step)
                hw, hc = timed(head_mm)
            r = res[lv]
            for k, v in (("step_wall", sw), ("step_cpu", sc), ("head_wall", hw),
                         ("head_cpu", hc), ("rest_cpu", sc - hc)):
                r.setdefault(k, []).append(v * 1e3)
            for n in prefill:
                with simd.max_simd(lv):
                    pw, pc = timed(lambda n=n: prefill_eval(n), reps=3)
                r.setdefault(f"prefill{n}_wall", []).append(pw * 1e3)
                r.setdefault(f"prefill{n}_cpu", []).append(pc * 1e3)
    greedy = Sampler(SamplingParams(temperature=0))
    dflt = Sampler(SamplingParams(seed=1))
    hist = list(range(64))
    gw, _ = timed(lambda: [greedy.sample(logits[i], hist) for i in range(a.tokens)])
    dw, _ = timed(lambda: [dflt.sample(logits[i], hist) for i in range(a.tokens)])
    print(f"{path}: {a.tokens} tokens/step, {a.threads} thread(s), output head {head[0]} "
          f"{head[2]}x{head[3]} ({head[1].nbytes / 1e6:.0f} MB), {a.rounds} rounds")
    for lv in levels:
        r = res[lv]
        print(f"  {lv:>10}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms"
                                          for k, v in r.items()))
    print(f"  sampling {a.tokens} rows: greedy {gw * 1e3:.2f} ms, default params {dw * 1e3:.2f} ms")


def _head_matrix(m: Any) -> tuple[str, np.ndarray, int, int]:
    """(type name, raw bytes, rows, cols) of the model's output head."""
    import gguf

    r = gguf.GGUFReader(m.path)
    t = {t.name: t for t in r.tensors}
    w = t.get("output.weight") or t["token_embd.weight"]
    cols, rows = int(w.shape[0]), int(w.shape[1])
    return w.tensor_type.name, np.asarray(w.data).view(np.uint8).reshape(-1), rows, cols


if __name__ == "__main__":
    main()
