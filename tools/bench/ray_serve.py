#!/usr/bin/env python3
"""`colibri serve --ray` against `colibri serve` alone, on one machine:

    python tools/bench/ray_serve.py [-m MODEL] [--clients 1,16] [--rounds 2]
                                    [--max-tokens 32] [--requests 1] [--json OUT]

Servers, each started fresh on the same GGUF, in the same round, the rounds interleaved (the
machine is shared and noisy: medians over rounds are reported):
  serve-1t      colibri serve --threads 1             (one engine, one thread)
  ray-1x1t      colibri serve --ray --replicas 1 --threads 1   (the same, behind Ray)
  ray-2x1t      colibri serve --ray --replicas 2 --threads 1   (two replicas, one thread each)
  serve-2t      colibri serve --threads 2             (one engine on both cores: the peer of
                                                       two one-thread replicas on 2 cores)
For each, N concurrent streaming clients (tools/bench/serve.py's load: distinct prompts,
greedy, end-of-generation banned so every request makes --max-tokens tokens): aggregate
generated tokens/s, p50/p99 time to first token, p50 inter-token latency, errors. The cost of
the Ray hop is ray-1x1t's TTFT over serve-1t's at the same N; scale-out is ray-2x1t's tokens/s
over ray-1x1t's. Each Ray server runs a Ray cluster of its own (RAY_TMPDIR: a fresh
directory); its processes are killed when it stops. Runs the installed colibri (from a
checkout: PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as sb  # noqa: E402  tools/bench/serve.py: Proc, load_run, eog_bias

CONFIGS = {
    "serve-1t": ["--threads", "1"],
    "ray-1x1t": ["--ray", "--replicas", "1", "--threads", "1"],
    "ray-2x1t": ["--ray", "--replicas", "2", "--threads", "1"],
    "serve-2t": ["--threads", "2"],
}


def start(name: str, model: str, clients: int, logdir: str) -> tuple[sb.Proc, str | None]:
    port = sb.free_port()
    ray_tmp = None
    if "--ray" in CONFIGS[name]:
        ray_tmp = tempfile.mkdtemp(prefix="crb", dir="/tmp")
        os.environ["RAY_TMPDIR"] = ray_tmp
    argv = [sys.executable, "-m", "colibri", "serve", "-m", model, "--port", str(port),
            "--ctx", str(sb.CTX_PER_REQUEST * clients), "--max-seqs", str(clients),
            "--model-name", "bench", *CONFIGS[name]]
    try:
        pr = sb.Proc(name, argv, f"http://127.0.0.1:{port}",
                     os.path.join(logdir, f"{name}-{clients}.log"))
    finally:
        os.environ.pop("RAY_TMPDIR", None)
    pr.wait_ready()
    if ray_tmp is not None:  # /health is ok with one replica; wait for the command's "ready"
        import time

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with open(pr.logf.name) as f:
                if " ready on " in f.read():
                    break
            time.sleep(0.2)
    return pr, ray_tmp


def stop(pr: sb.Proc, ray_tmp: str | None) -> None:
    pr.stop()
    if ray_tmp is not None:
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if ray_tmp.encode() in f.read():
                        os.kill(int(pid), 9)
            except (OSError, ValueError):
                pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: Gemma 3 270M)")
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1, help="requests per client, in sequence")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import colibri
    from colibri.simd import level as kernel_level

    model = a.model or colibri.default_model_path(progress=True)
    bias = sb.eog_bias(model)
    logdir = tempfile.mkdtemp(prefix="colibri-ray-bench-")
    names = [c for c in a.configs.split(",") if c]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rnd in range(a.rounds):
        for n in (int(x) for x in a.clients.split(",")):
            for name in names if rnd % 2 == 0 else names[::-1]:
                pr, tmp = start(name, model, n, logdir)
                try:
                    r = asyncio.run(sb.load_run(pr.url, n, a.requests if n > 1 else 8,
                                                a.max_tokens, bias))
                finally:
                    stop(pr, tmp)
                runs.setdefault((name, n), []).append(r)
                print(f"round {rnd} {name:9s} clients={n:3d} {r['tokens_per_s']:7.1f} tok/s  "
                      f"TTFT p50 {r['ttft_p50_ms']:7.1f} ms p99 {r['ttft_p99_ms']:7.1f} ms  "
                      f"ITL p50 {r['itl_p50_ms']:6.1f} ms  errors {r['errors']}", flush=True)
    med = {f"{k[0]}@{k[1]}": {m: statistics.median(r[m] for r in v)
                              for m in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms",
                                        "itl_p50_ms", "errors")}
           for k, v in runs.items()}
    print(f"\nmedians over {a.rounds} rounds ({os.path.basename(model)}, kernels: "
          f"{kernel_level()}, {os.cpu_count()} CPUs):")
    for k, v in med.items():
        print(f"  {k:14s} {v['tokens_per_s']:7.1f} tok/s  TTFT p50 {v['ttft_p50_ms']:7.1f} ms  "
              f"p99 {v['ttft_p99_ms']:7.1f} ms  ITL p50 {v['itl_p50_ms']:6.1f} ms  "
              f"errors {v['errors']:g}")
    for n in (int(x) for x in a.clients.split(",")):
        one, hop, two = (med.get(f"{c}@{n}") for c in ("serve-1t", "ray-1x1t", "ray-2x1t"))
        if one and hop:
            print(f"  {n} client(s): the Ray hop adds {hop['ttft_p50_ms'] - one['ttft_p50_ms']:+.1f}"
                  f" ms to the p50 TTFT ({hop['ttft_p50_ms'] / one['ttft_p50_ms']:.2f}x)")
        if hop and two:
            print(f"  {n} client(s): 2 replicas / 1 replica: "
                  f"{two['tokens_per_s'] / hop['tokens_per_s']:.2f}x tokens/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(model), "kernels": kernel_level(),
                       "medians": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
