#!/usr/bin/env python3
"""`colibri serve` under N concurrent streaming clients, with llama.cpp's own server as the peer:

    python tools/bench/serve.py [-m MODEL] [--clients 1,4,16,64] [--threads 2]
                                [--max-tokens 64] [--requests 2] [--quick]
                                [--llama-server PATH | --build-llama-server | --no-llama]
                                [--soak MINUTES [--no-prefault]] [--json OUT]

For each client count N, each server is started fresh on the same GGUF with the same threads:
`colibri serve --max-seqs N` and `llama-server -np N` (N parallel slots, continuous batching;
its -c is N times the per-request context so each slot gets the same room). N clients then
each send --requests streaming /v1/completions requests one after another: distinct prompts,
greedy, the model's end-of-generation tokens banned through logit_bias so every request
generates --max-tokens tokens on both servers. Reported per server and N: aggregate generated
tokens/s (all tokens over the wall time of the run, after one unmeasured warm-up request), p50/p99 time to first token, p50/p99
inter-token latency (gaps between streamed chunks with text), the server's peak RSS (sampled
every 50 ms, psutil) and errors. For colibri also the structured-output mask cost: one
json_schema request's grammar-mask time per token, from /metrics.

llama-server: --llama-server PATH, else ~/.cache/colibri/llama.cpp/build/bin/llama-server
if built, else with --build-llama-server it is built there from the llama.cpp sources that
llama-cpp-python's sdist carries (colibri.tools.llama_build, shared with
tools/quantize_lowbit_refs.py: `pip download --no-binary llama-cpp-python`, `pip install cmake`,
a Release build with GGML_NATIVE=ON; minutes). Without one it says how and runs colibri alone.

--soak MINUTES: colibri only, 64 clients for MINUTES: streams of random length, a tenth of them
dropped mid-stream, a tenth malformed (bad JSON or values: they must get 400); reports the
server's RSS at the start (when the first request is sent, right after /health turned ready:
`colibri serve` touches its weights and KV arena before that) and at the end, and the
well-formed requests that failed (the target: RSS flat within 5%, none failed).
--no-prefault passes the same flag to colibri serve (memory then grows under the load).

--quick: 32 generated tokens, 1 request per client.
Like every tool here it runs the installed colibri (from a checkout: PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CTX_PER_REQUEST = 256

TOPICS = ["the Roman roads", "tides", "bread", "volcanoes", "the printing press", "glaciers",
          "bees", "copper", "the violin", "monsoons", "chess", "salt", "comets", "silk",
          "the compass", "coral reefs"]


def prompt(i: int) -> str:
    return (f"Request {i}. Write a short paragraph for a school encyclopedia about "
            f"{TOPICS[i % len(TOPICS)]}, in plain words:")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


# ---- llama-server ----

def find_llama_server(path: str | None, build: bool) -> tuple[str | None, str]:
    """(binary, why none)."""
    if path:
        return (path, "") if os.access(path, os.X_OK) else (None, f"{path} is not executable")
    from colibri.tools import llama_build

    cached = llama_build.binary("llama-server")
    if cached.is_file():
        return str(cached), ""
    if not build:
        return None, (f"no llama-server: pass --llama-server PATH, or --build-llama-server to "
                      f"build it in {llama_build.CACHE} (minutes), or --no-llama")
    return build_llama_server(), ""


def build_llama_server() -> str:
    from colibri.tools import llama_build

    return llama_build.build("llama-server")["llama-server"]


# ---- servers ----

class Proc:
    def __init__(self, kind: str, argv: list[str], url: str, log: str) -> None:
        import psutil

        self.kind, self.url = kind, url
        self.logf = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.p.pid)
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except Exception:  # the process is gone
                return
            time.sleep(0.05)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def wait_ready(self, timeout: float = 300) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.kind} exited {self.p.returncode}: see {self.logf.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} not ready in {timeout} s")

    def stop(self) -> None:
        self._stop.set()
        self.p.terminate()
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.logf.close()


def start_colibri(model: str, threads: int, n: int, logdir: str,
                  extra: tuple[str, ...] = ()) -> Proc:
    port = free_port()
    argv = [sys.executable, "-m", "colibri", "serve", "-m", model, "--port", str(port),
            "--threads", str(threads), "--ctx", str(CTX_PER_REQUEST * n), "--max-seqs", str(n),
            "--max-queue", str(4 * n + 64), "--model-name", "bench", *extra]
    pr = Proc("colibri", argv, f"http://127.0.0.1:{port}", os.path.join(logdir, f"colibri-{n}.log"))
    pr.wait_ready()
    return pr


def start_llama(binary: str, model: str, threads: int, n: int, logdir: str,
                extra: list[str]) -> Proc:
    port = free_port()
    argv = [binary, "-m", model, "--port", str(port), "--host", "127.0.0.1", "-t", str(threads),
            "-tb", str(threads), "-np", str(n), "-c", str(CTX_PER_REQUEST * n), "-cb",
            "-a", "bench", *extra]
    pr = Proc("llama-server", argv, f"http://127.0.0.1:{port}",
              os.path.join(logdir, f"llama-{n}.log"))
    pr.wait_ready()
    return pr


# ---- clients ----

async def stream_one(client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streaming completion: TTFT, the gaps between text chunks, tokens, error."""
    t0 = time.perf_counter()
    first = None
    last = None
    gaps: list[float] = []
    chunks = 0
    usage = None
    done = False
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    return {"error": str(obj["error"])[:200]}
                if obj.get("usage"):
                    usage = obj["usage"]
                for ch in obj.get("choices") or []:
                    if ch.get("text"):
                        now = time.perf_counter()
                        chunks += 1
                        if first is None:
                            first = now - t0
                        else:
                            gaps.append(now - last)  # type: ignore[operator]
                        last = now
    except Exception as e:  # noqa: BLE001 - counted as an error
        return {"error": f"{type(e).__name__}: {e}"}
    if not done:
        return {"error": "the stream ended without [DONE]"}
    tokens = usage["completion_tokens"] if usage else chunks
    return {"ttft": first, "gaps": gaps, "tokens": tokens}


def eog_bias(model_path: str) -> dict[str, float]:
    import colibri
    from colibri.generate import stop_token_ids

    with colibri.Model(model_path, ctx=64, verbose=False) as m:
        return {str(t): -100.0 for t in sorted(stop_token_ids(m))}


async def load_run(url: str, n: int, requests: int, max_tokens: int,
                   bias: dict[str, float]) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker(c: int) -> list[dict[str, Any]]:
            out = []
            for k in range(requests):
                body = {"model": "bench", "prompt": prompt(c * requests + k),
                        "max_tokens": max_tokens, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True}, "logit_bias": bias}
                out.append(await stream_one(client, url, body))
            return out

        # warm-up (first-touch page faults, lazy initialisation), not measured
        await stream_one(client, url, {"model": "bench", "prompt": prompt(999), "max_tokens": 4,
                                       "temperature": 0, "stream": True, "logit_bias": bias})
        t0 = time.perf_counter()
        res = [r for rs in await asyncio.gather(*(worker(c) for c in range(n))) for r in rs]
        wall = time.perf_counter() - t0
    ok = [r for r in res if "error" not in r]
    errors = [r["error"] for r in res if "error" in r]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    return {"clients": n, "requests": len(res), "errors": len(errors),
            "first_error": errors[0] if errors else None, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": pct(ttft, 50) * 1e3,
            "ttft_p99_ms": pct(ttft, 99) * 1e3, "itl_p50_ms": pct(gaps, 50) * 1e3,
            "itl_p99_ms": pct(gaps, 99) * 1e3}


def mask_cost(url: str) -> dict[str, Any]:
    """One json_schema request on colibri: grammar mask time per generated token."""
    import httpx

    def metrics() -> dict[str, float]:
        out = {}
        for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("colibri_grammar_mask"):
                k, v = line.split()
                out[k] = float(v)
        return out

    before = metrics()
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                               "year": {"type": "integer"},
                                               "tags": {"type": "array", "items": {
                                                   "type": "string", "maxLength": 12},
                                                        "maxItems": 4}},
              "required": ["title", "year", "tags"], "additionalProperties": False}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", timeout=300, json={
        "model": "bench", "messages": [{"role": "user", "content": "Describe a book as JSON."}],
        "max_tokens": 64, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "book",
                                                                   "schema": schema}}}).json()
    wall = time.perf_counter() - t0
    after = metrics()
    n = after.get("colibri_grammar_masks_total", 0) - before.get("colibri_grammar_masks_total", 0)
    s = after.get("colibri_grammar_mask_seconds_total", 0) - before.get(
        "colibri_grammar_mask_seconds_total", 0)
    return {"masked_tokens": int(n), "mask_ms_per_token": s / n * 1e3 if n else float("nan"),
            "request_ms_per_token": wall / n * 1e3 if n else float("nan"),
            "finish_reason": r["choices"][0]["finish_reason"]}


# ---- soak ----

async def soak(url: str, minutes: float, bias: dict[str, float], proc: Proc) -> dict[str, Any]:
    """The mixed load for `minutes`, counted; the server's RSS when the first request is sent
    and at the end."""
    import httpx

    rng = random.Random(0)
    stats = {"ok": 0, "failed": 0, "dropped": 0, "malformed_ok": 0, "malformed_wrong": 0}
    failures: list[str] = []
    limits = httpx.Limits(max_connections=80, max_keepalive_connections=80)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker(c: int, until: float) -> None:
            k = 0
            while time.monotonic() < until:
                k += 1
                roll = rng.random()
                body = {"model": "bench", "prompt": prompt(c * 100000 + k),
                        "max_tokens": rng.randint(4, 64), "temperature": rng.choice([0, 0.8]),
                        "stream": True, "logit_bias": bias}
                if roll < 0.1:  # malformed
                    bad = rng.choice([b"{oops", json.dumps({**body, "temperature": "x"}).encode(),
                                      json.dumps({**body, "max_tokens": -3}).encode(),
                                      json.dumps({"prompt": 5}).encode()])
                    r = await client.post(url + "/v1/completions", content=bad)
                    stats["malformed_ok" if r.status_code == 400 else "malformed_wrong"] += 1
                elif roll < 0.2:  # dropped mid-stream
                    try:
                        async with client.stream("POST", url + "/v1/completions", json=body) as r:
                            seen = 0
                            async for line in r.aiter_lines():
                                if line.startswith("data: {"):
                                    seen += 1
                                    if seen >= 2:
                                        break
                    except Exception:  # noqa: BLE001 - dropping is the point
                        pass
                    stats["dropped"] += 1
                else:
                    res = await stream_one(client, url, body)
                    if "error" in res:
                        stats["failed"] += 1
                        failures.append(res["error"])
                    else:
                        stats["ok"] += 1

        samples: list[tuple[float, float, float]] = []  # (s, RSS MiB, KV used MiB)
        t_start = time.monotonic()

        async def sampler() -> None:
            while True:
                kv = 0.0
                try:
                    for line in (await client.get(url + "/metrics")).text.splitlines():
                        if line.startswith("colibri_kv_used_bytes "):
                            kv = float(line.split()[1]) / 2**20
                except Exception:  # noqa: BLE001 - a sample missed
                    pass
                samples.append((time.monotonic() - t_start, proc.rss() / 2**20, kv))
                await asyncio.sleep(15)

        rss_start = proc.rss()
        sampling = asyncio.create_task(sampler())
        until = time.monotonic() + minutes * 60
        await asyncio.gather(*(worker(c, until) for c in range(64)))
        sampling.cancel()
    await asyncio.sleep(1.0)
    rss_end = proc.rss()
    return {**stats, "minutes": minutes,
            "rss_start_mib": rss_start / 2**20, "rss_end_mib": rss_end / 2**20,
            "rss_change_pct": (rss_end / rss_start - 1) * 100, "first_failures": failures[:3],
            "samples_s_rss_kv_mib": samples}


# ---- main ----

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: Gemma 3 270M)")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2, help="requests per client, in sequence")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--llama-server", default=None, help="path of a llama-server binary")
    ap.add_argument("--build-llama-server", action="store_true")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--llama-args", default="", help="more llama-server arguments, one "
                    "string (e.g. '--poll 0': no busy-waiting threads on a shared machine)")
    ap.add_argument("--soak", type=float, default=None, metavar="MINUTES")
    ap.add_argument("--no-prefault", action="store_true",
                    help="--soak: start colibri serve with --no-prefault")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.max_tokens, a.requests = 32, 1
    import colibri

    model = a.model or colibri.default_model_path(progress=True)
    bias = eog_bias(model)
    logdir = tempfile.mkdtemp(prefix="colibri-serve-bench-")
    report: dict[str, Any] = {"model": os.path.basename(model), "threads": a.threads,
                              "llama_args": a.llama_args,
                              "max_tokens": a.max_tokens, "requests_per_client": a.requests,
                              "runs": []}
    if a.soak is not None:
        pr = start_colibri(model, a.threads, 64, logdir,
                           ("--no-prefault",) if a.no_prefault else ())
        try:
            res = asyncio.run(soak(pr.url, a.soak, bias, pr))
        finally:
            pr.stop()
        report["soak"] = res
        res["prefault"] = not a.no_prefault
        print(f"soak {a.soak:g} min, 64 clients{' (--no-prefault)' if a.no_prefault else ''}: "
              f"{res['ok']} streams ok, {res['failed']} failed, "
              f"{res['dropped']} dropped mid-stream, {res['malformed_ok']} malformed -> 400 "
              f"({res['malformed_wrong']} otherwise); RSS at the first request {res['rss_start_mib']:.0f} -> "
              f"{res['rss_end_mib']:.0f} MiB ({res['rss_change_pct']:+.1f}%)")
        print("  (s, RSS MiB, KV arena used MiB) every 15 s: " + ", ".join(
            f"({t:.0f}, {r:.0f}, {k:.0f})" for t, r, k in res["samples_s_rss_kv_mib"]))
        if res["first_failures"]:
            print("  failures:", res["first_failures"])
    else:
        binary = None
        if not a.no_llama:
            binary, why = find_llama_server(a.llama_server, a.build_llama_server)
            if binary is None:
                print(f"llama-server: {why}", file=sys.stderr)
        kinds = ["colibri"] + (["llama-server"] if binary else [])
        print(f"model {report['model']}, {a.threads} threads, {a.max_tokens} tokens per request "
              f"(end-of-generation banned), {a.requests} request(s) per client")
        print(f"{'server':<13}{'clients':>8}{'tok/s':>9}{'TTFT p50':>10}{'p99':>8}"
              f"{'ITL p50':>9}{'p99':>8}{'peak RSS':>10}{'errors':>8}")
        for n in [int(x) for x in a.clients.split(",")]:
            for kind in kinds:
                pr = (start_colibri(model, a.threads, n, logdir) if kind == "colibri" else
                      start_llama(binary, model, a.threads, n, logdir,  # type: ignore[arg-type]
                                  a.llama_args.split()))
                try:
                    res = asyncio.run(load_run(pr.url, n, a.requests, a.max_tokens, bias))
                    if kind == "colibri" and n == 1:
                        report["mask"] = mask_cost(pr.url)
                finally:
                    pr.stop()
                res.update(server=kind, peak_rss_mib=pr.peak / 2**20)
                report["runs"].append(res)
                print(f"{kind:<13}{n:>8}{res['tokens_per_s']:>9.1f}{res['ttft_p50_ms']:>8.0f}ms"
                      f"{res['ttft_p99_ms']:>6.0f}ms{res['itl_p50_ms']:>7.0f}ms"
                      f"{res['itl_p99_ms']:>6.0f}ms{res['peak_rss_mib']:>7.0f}MiB"
                      f"{res['errors']:>8}", flush=True)
                if res["first_error"]:
                    print(f"  first error: {res['first_error']}")
        by = {(r["server"], r["clients"]): r for r in report["runs"]}
        for n in [int(x) for x in a.clients.split(",")]:
            c, ll = by.get(("colibri", n)), by.get(("llama-server", n))
            if c and ll and ll["tokens_per_s"] > 0:
                print(f"{n:>3} clients: colibri/llama-server aggregate {c['tokens_per_s'] / ll['tokens_per_s']:.2f}x, "
                      f"p99 TTFT {c['ttft_p99_ms']:.0f} vs {ll['ttft_p99_ms']:.0f} ms")
        if "mask" in report:
            mk = report["mask"]
            print(f"structured output (json_schema, 1 client): grammar mask "
                  f"{mk['mask_ms_per_token']:.3f} ms per token over {mk['masked_tokens']} tokens "
                  f"(the request: {mk['request_ms_per_token']:.1f} ms per token)")
    load = os.getloadavg()
    report["loadavg_end"] = load
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          f"({os.cpu_count()} CPUs)")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
