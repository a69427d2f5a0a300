#!/usr/bin/env python3
"""Generation speed of colibri against llama.cpp (llama-cpp-python) on the same GGUF, thread
count and prompt, measured in the same run (each engine in its own subprocess):

    python tools/bench/generate.py [-m MODEL] [--threads 2] [--prompt-tokens 128]
                                   [--gen-tokens 32] [--expert-budget B] [--no-llama-cpp]
                                   [--json OUT]

Reports prefill tokens/s, decode tokens/s, time to first token, p50/p99 per-token latency, peak
RSS and load time, and the colibri/llama.cpp ratios; the greedy first token of both engines is
compared so that both timed the same work. The same as `colibri bench --vs-llama-cpp`.
--expert-budget B (an MoE model; a fraction of the experts' bytes such as 0.25, or a size such
as 2GiB): colibri also runs a second time, its experts in a store of that budget (row
"colibri@B"), beside the full-RAM run.
"""

from __future__ import annotations

import argparse
import json
import sys

from colibri import bench
from colibri.model import default_model_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--expert-budget", default=None,
                    help="also run colibri with this expert budget (0.25, 2GiB...)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    path = args.model or default_model_path()
    budget = args.expert_budget
    if budget is not None:
        try:
            budget = float(budget)
        except ValueError:
            pass  # a size: "2GiB"
    res = bench.bench(path, args.threads, args.prompt_tokens, args.gen_tokens,
                      not args.no_llama_cpp, args.ctx, expert_budget=budget)
    print(f"model {path}, {args.threads} threads, prompt {args.prompt_tokens}, "
          f"generate {args.gen_tokens}"
          + (f", expert budget {budget}" if budget is not None else ""))
    print(bench.report(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
