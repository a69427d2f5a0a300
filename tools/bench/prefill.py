#!/usr/bin/env python3
"""Prefill of colibri against llama.cpp (llama-cpp-python) on the same GGUF, repeated: issue #17's
MoE prefill target (>= 1.5x llama.cpp at 64, 256 and 1024 prompt tokens, 1 and 2 threads).

    python tools/bench/prefill.py -m MODEL [--threads 1,2] [--tokens 64,256,1024] [--repeats 5]
                                  [--rounds 2] [--ctx 2048] [--json OUT]

`colibri bench --vs-llama-cpp` times one prefill per engine; a 64-token MoE prefill lasts ~0.1 s,
and on a shared machine one such reading swings 1.2-2.5x between runs. Here each engine runs in a
fresh process (`colibri.bench.in_subprocess`, the file prefaulted as there), prefills the same
prompt `--repeats` times (colibri: a fresh sequence each time; llama.cpp: after a reset) and
reports the median; rounds alternate which engine goes first. Printed per thread count and prompt
length: both engines' median prefill tok/s over the rounds, their ratio, and each round's ratio.
Like every tool here it imports the installed colibri (from a checkout: PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

TARGET = 1.5


def measure(path: str, threads: int, tokens: int, repeats: int, rounds: int, ctx: int,
            llama: bool = True) -> dict[str, Any]:
    from colibri.bench import in_subprocess

    kw = dict(path=path, threads=threads, prompt_tokens=tokens, gen_tokens=0, ctx=ctx,
              prefill_repeats=repeats)
    runs: dict[str, list[float]] = {"colibri": [], "llama_cpp": []}
    engines = ["colibri", "llama_cpp"] if llama else ["colibri"]
    for r in range(rounds):
        for engine in engines if r % 2 == 0 else engines[::-1]:
            runs[engine].append(in_subprocess(engine, **kw)["prefill_tps"])
    out: dict[str, Any] = {"threads": threads, "tokens": tokens, "repeats": repeats,
                           "colibri_tps": runs["colibri"], "llama_cpp_tps": runs["llama_cpp"],
                           "colibri": statistics.median(runs["colibri"])}
    if llama:
        out["llama_cpp"] = statistics.median(runs["llama_cpp"])
        out["ratio"] = out["colibri"] / out["llama_cpp"]
        out["round_ratios"] = [a / b for a, b in zip(runs["colibri"], runs["llama_cpp"], strict=True)]
    return out


def line(m: dict[str, Any]) -> str:
    s = f"{m['threads']:>7d} {m['tokens']:>7d} {m['colibri']:>12.1f}"
    if "ratio" in m:
        rr = ", ".join(f"{x:.2f}" for x in m["round_ratios"])
        flag = "" if m["ratio"] >= TARGET else f"   (below the {TARGET}x target)"
        s += f" {m['llama_cpp']:>12.1f} {m['ratio']:>6.2f}x   rounds {rr}{flag}"
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="the GGUF (both engines read it)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--tokens", default="64,256,1024", help="comma-separated prompt lengths")
    ap.add_argument("--repeats", type=int, default=5, help="prefills timed per engine process")
    ap.add_argument("--rounds", type=int, default=2, help="fresh process pairs per point")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--no-llama-cpp", action="store_true", help="colibri alone")
    ap.add_argument("--json", default=None, help="write the measurements here")
    a = ap.parse_args(argv)
    threads = [int(x) for x in a.threads.split(",") if x]
    tokens = [int(x) for x in a.tokens.split(",") if x]
    if a.repeats < 1 or a.rounds < 1 or any(t < 1 for t in threads + tokens):
        ap.error("--repeats, --rounds, --threads and --tokens must be positive")
    if max(tokens) > a.ctx:
        ap.error(f"--ctx {a.ctx} is shorter than the longest prompt ({max(tokens)})")
    llama = not a.no_llama_cpp
    if llama:
        from colibri.bench import llama_cpp_missing

        if (missing := llama_cpp_missing()):
            print(missing, file=sys.stderr)
            return 2
    print(f"{a.model}: median prefill tok/s of {a.rounds} round(s), each the median of "
          f"{a.repeats} prefills in a fresh process")
    print(" threads  tokens      colibri" + ("    llama.cpp  ratio" if llama else ""), flush=True)
    results = []
    for th in threads:
        for n in tokens:
            m = measure(a.model, th, n, a.repeats, a.rounds, a.ctx, llama)
            results.append(m)
            print(line(m), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
