"""Generation benchmark: colibri, and llama.cpp (llama-cpp-python) on the same file, thread
count and prompt, measured in the same run; used by `colibri bench` and tools/bench/generate.py.

Figures: prefill tokens/s (the prompt in one evaluation), decode tokens/s, time to first
token, p50/p99 per-token decode latency, peak RSS (each engine in its own subprocess, so RSS is
its own), load time. Before timing, both engines' greedy next token after the prompt is
compared (a warning is printed when they differ: the timings would not be of the same work).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from colibri._dist import install_hint

PROMPT_TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city to the "
    "fall of Constantinople. Its roads, laws and language shaped Europe for a thousand years. "
)


def _prompt_ids(n: int, vocab_size: int, bos: int | None) -> list[int]:
    rng = np.random.default_rng(0)
    ids = [int(x) for x in rng.integers(100, min(vocab_size, 30000), size=n)]
    if bos is not None and n > 0:
        ids[0] = bos
    return ids


def _rss() -> int:
    from colibri.generate import peak_rss_bytes

    return peak_rss_bytes()


def run_colibri(path: str, threads: int, prompt_tokens: int, gen_tokens: int, ctx: int,
                warmup: int = 0, kv_dtype: str = "f32", prefill_repeats: int = 1,
                probe: Sequence[int] | None = None,
                expert_budget: str | float | None = None) -> dict[str, Any]:
    """colibri's figures in this process; `warmup` greedy decode steps run untimed after the
    prompt, before the gen_tokens timed ones (their tokens are not counted). The prompt is
    prefilled `prefill_repeats` times, each into a fresh sequence: the median is the figure.
    `probe` [threads, MiB, passes(, blocks)]: the bandwidth probe brackets the timed steps
    (probe_gbs, probe_sustained_gbs; see _timed_steps). `expert_budget` (Model's: a fraction
    such as 0.25, or bytes) runs an MoE model's experts from a budgeted store (engine
    "colibri@BUDGET"; no usage record, so no pins: the same run every time)."""
    from colibri.model import Model

    t0 = time.perf_counter()
    budget: dict[str, Any] = ({} if expert_budget is None else
                              {"expert_budget": expert_budget, "expert_usage": False})
    m = Model(path, threads=threads, ctx=ctx, max_batch=max(prompt_tokens, 1), verbose=False,
              kv_dtype=kv_dtype, **budget)
    m.prefault()  # like llama.cpp's MAP_POPULATE at load: counted in the load time
    load = time.perf_counter() - t0
    ids = _prompt_ids(prompt_tokens, m.n_vocab, m.tokenizer.bos_id if m.tokenizer else None)
    m.logits(ids[: min(8, len(ids))])
    pre: list[float] = []
    seq = m.new_sequence()
    for i in range(max(prefill_repeats, 1)):
        if i:
            m.free_sequence(seq)
            seq = m.new_sequence()
        t = time.perf_counter()
        logits = m.eval([seq], tokens=ids, logits=[False] * (len(ids) - 1) + [True])[-1]
        pre.append(time.perf_counter() - t)
    first = int(np.argmax(logits))
    lat, bw = _timed_steps(lambda t: m.eval([seq], tokens=[t])[-1],
                           lambda out: int(np.argmax(out)), first, warmup, gen_tokens, probe)
    name = "colibri" if expert_budget is None else f"colibri@{expert_budget}"
    return _figures(name, load, prompt_tokens, pre, lat, first, _rss(), m.expert_stats(), bw)


def run_llama_cpp(path: str, threads: int, prompt_tokens: int, gen_tokens: int, ctx: int,
                  warmup: int = 0, prefill_repeats: int = 1,
                  probe: Sequence[int] | None = None) -> dict[str, Any]:
    """llama.cpp's figures in this process, the same work as run_colibri's (each repeated
    prefill after a reset, which drops the cached tokens)."""
    from llama_cpp import Llama

    t0 = time.perf_counter()
    ll = Llama(path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
               n_batch=max(prompt_tokens, 1), n_ubatch=max(prompt_tokens, 1), verbose=False)
    load = time.perf_counter() - t0
    ids = _prompt_ids(prompt_tokens, ll.n_vocab(), ll.token_bos())
    def last_logits() -> np.ndarray:
        # without logits_all, llama-cpp-python keeps no scores: read the context's last row
        return np.ctypeslib.as_array(ll._ctx.get_logits_ith(-1), shape=(ll.n_vocab(),))

    ll.eval(ids[: min(8, len(ids))])
    pre: list[float] = []
    for _ in range(max(prefill_repeats, 1)):
        ll.reset()
        t = time.perf_counter()
        ll.eval(ids)
        pre.append(time.perf_counter() - t)
    first = int(np.argmax(last_logits()))
    lat, bw = _timed_steps(lambda t: ll.eval([t]), lambda _: int(np.argmax(last_logits())),
                           first, warmup, gen_tokens, probe)
    return _figures("llama.cpp", load, prompt_tokens, pre, lat, first, _rss(), {}, bw)


def _timed_steps(step: Callable[[int], Any], pick: Callable[[Any], int], first: int, warmup: int,
                 n: int, probe: Sequence[int] | None) -> tuple[list[float], list[tuple[float, float]]]:
    """`warmup` untimed, then `n` timed greedy decode steps from token `first`: step(token)
    evaluates one token, pick(step's result) gives the next. Returns each timed step's seconds
    (step only, not pick) and, with a probe [threads, MiB, passes] or [threads, MiB, passes,
    blocks], the bandwidth probe's (best, sustained) GB/s (colibri.tools.membw; the engine's
    threads idle meanwhile) run just before the first timed step, between `blocks` (1 unless
    given; at most n) equal runs of the steps, and just after the last: the machine's streaming
    rate at the time of the steps, alternating with them. After a probe between two blocks one
    untimed step runs first (its threads wake and its caches refill: the probe's cost, not the
    engine's)."""
    nxt = first
    for _ in range(warmup):
        nxt = pick(step(nxt))
    blocks = max(1, min(int(probe[3]), n)) if probe and len(probe) > 3 else 1
    bw = [_probe(probe)] if probe else []
    lat: list[float] = []
    for b in range(blocks):
        if b:  # one untimed step after a probe: the threads wake, the caches refill
            nxt = pick(step(nxt))
        for _ in range(n * (b + 1) // blocks - n * b // blocks):
            t = time.perf_counter()
            out = step(nxt)
            lat.append(time.perf_counter() - t)
            nxt = pick(out)
        if probe:
            bw.append(_probe(probe))
    return lat, bw


def _probe(probe: Sequence[int]) -> tuple[float, float]:
    from colibri.tools.membw import membw_rates

    threads, mib, passes = probe[:3]
    return membw_rates(threads, mib, passes)


def _figures(engine: str, load: float, n_prompt: int, pre: list[float], lat: list[float],
             first: int, rss: int, expert: dict[str, Any],
             bw: list[tuple[float, float]]) -> dict[str, Any]:
    lat_a = np.array(lat) if lat else np.array([np.nan])
    prefill = float(np.median(pre))
    return {
        "engine": engine,
        "load_s": load,
        "prompt_tokens": n_prompt,
        "prefill_tps": n_prompt / prefill if prefill > 0 else 0.0,
        "ttft_s": prefill,
        "prefill_s_all": pre,
        "decode_tps": len(lat) / float(np.sum(lat_a)) if lat else 0.0,
        "p50_ms": float(np.percentile(lat_a, 50) * 1e3),
        "p99_ms": float(np.percentile(lat_a, 99) * 1e3),
        "peak_rss_mib": rss / 2**20,
        "first_token": first,
        "expert": expert,
        # the bandwidth probes just before, between and just after the blocks of timed steps:
        # each one's best pass, and its sustained rate
        "probe_gbs": [b for b, _ in bw],
        "probe_sustained_gbs": [s for _, s in bw],
    }


_CHILD = """
import json, sys
from colibri import bench
try:
    r = getattr(bench, "run_" + sys.argv[1])(**json.loads(sys.argv[2]))
except BaseException as e:  # the parent names it in one line
    print("ERROR" + json.dumps(f"{type(e).__name__}: {e}"), flush=True)
    raise
print("RESULT" + json.dumps(r))
"""


def in_subprocess(engine: str, **kw: Any) -> dict[str, Any]:
    """run_colibri (engine "colibri") or run_llama_cpp ("llama_cpp") with these arguments in a
    fresh interpreter (its own RSS, no other engine's threads), its figures returned. A failed
    run is a ColibriError of one line with its reason (the child's exception, or the signal that
    killed it); the child's stderr goes to the "colibri" log (INFO: `colibri -v` shows it)."""
    import logging
    import signal

    p = subprocess.run([sys.executable, "-c", _CHILD, engine, json.dumps(kw)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    reason = None
    for line in p.stdout.splitlines():
        if line.startswith("RESULT") and p.returncode == 0:
            return dict(json.loads(line[6:]))
        if line.startswith("ERROR"):
            reason = str(json.loads(line[5:]))
    if p.stderr.strip():
        logging.getLogger("colibri").info("the %s benchmark's stderr:\n%s", engine,
                                          p.stderr[-3000:])
    if p.returncode < 0:
        try:
            name = signal.Signals(-p.returncode).name
        except ValueError:
            name = f"signal {-p.returncode}"
        reason = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    elif reason is None:
        last = [ln for ln in p.stderr.splitlines() if ln.strip()]
        reason = last[-1].strip() if last else f"exit status {p.returncode}, no output"
    from colibri.errors import ColibriError

    raise ColibriError(f"the {engine.replace('_', '.')} benchmark failed: {reason}")


def check_args(threads: int, prompt_tokens: int, gen_tokens: int, ctx: int) -> None:
    """ValueError naming the option (`colibri bench`'s) unless every count is an integer >= 1
    and the prompt and the generated tokens fit the KV cache."""
    for name, v in (("--threads", threads), ("--prompt-tokens", prompt_tokens),
                    ("--gen-tokens", gen_tokens), ("--ctx", ctx)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer of at least 1, got {v!r}")
    if prompt_tokens + gen_tokens > ctx:
        raise ValueError(f"--prompt-tokens {prompt_tokens} + --gen-tokens {gen_tokens} do not fit "
                         f"the KV cache of --ctx {ctx} tokens: raise --ctx to at least "
                         f"{prompt_tokens + gen_tokens}, or ask for fewer tokens")


def check_model(path: str) -> None:
    """The model file's header read and described (no weights loaded), so that a missing file,
    a FIFO, a file that is not a model or an architecture colibri does not run is one line
    (FileNotFoundError, ValueError) before any benchmark process starts."""
    from colibri.arch import describe
    from colibri.container import open_model_file

    f = open_model_file(path, verify=False)  # regular files only; a FIFO is not opened
    try:
        describe(f)
    finally:
        f.close()


LLAMA_CPP_MISSING = (
    "--vs-llama-cpp needs llama.cpp's Python binding, which is not installed: "
    f"{install_hint('bench')} (or pip install llama-cpp-python; it builds llama.cpp from "
    "source: needs a C++ compiler and cmake; CMAKE_ARGS=\"-DGGML_NATIVE=ON\" builds it for "
    "this CPU)"
)


def llama_cpp_missing() -> str | None:
    """None when llama-cpp-python is importable, else how to get it."""
    import importlib.util

    return None if importlib.util.find_spec("llama_cpp") is not None else LLAMA_CPP_MISSING


def bench(path: str, threads: int = 2, prompt_tokens: int = 128, gen_tokens: int = 32,
          vs_llama_cpp: bool = False, ctx: int = 2048,
          expert_budget: str | float | None = None) -> list[dict[str, Any]]:
    """colibri's figures (then, with expert_budget, colibri's under that expert budget, and
    with vs_llama_cpp llama.cpp's), each run in its own process. The counts and the model file
    are checked first (check_args, check_model)."""
    check_args(threads, prompt_tokens, gen_tokens, ctx)
    if vs_llama_cpp and (missing := llama_cpp_missing()):
        from colibri.errors import ColibriError

        raise ColibriError(missing)
    check_model(path)
    kw = dict(path=path, threads=threads, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, ctx=ctx)
    results = [in_subprocess("colibri", **kw)]
    if expert_budget is not None:
        results.append(in_subprocess("colibri", **kw, expert_budget=expert_budget))
    if vs_llama_cpp:
        results.append(in_subprocess("llama_cpp", **kw))
    return results


def report(results: list[dict[str, Any]]) -> str:
    cols = [("prefill tok/s", "prefill_tps", "{:.1f}"), ("decode tok/s", "decode_tps", "{:.2f}"),
            ("ttft ms", "ttft_s", "{:.0f}"), ("p50 ms", "p50_ms", "{:.1f}"),
            ("p99 ms", "p99_ms", "{:.1f}"), ("peak RSS MiB", "peak_rss_mib", "{:.0f}"),
            ("load s", "load_s", "{:.2f}")]
    lines = ["engine     " + "".join(f"{c[0]:>15s}" for c in cols)]
    for r in results:
        vals = []
        for _, k, f in cols:
            v = r[k] * 1000 if k == "ttft_s" else r[k]
            vals.append(f"{f.format(v):>15s}")
        lines.append(f"{r['engine']:<11s}" + "".join(vals))
    peer = next((r for r in results if r["engine"] == "llama.cpp"), None)
    for a in results:
        if peer is None or a is peer:
            continue
        lines.append(
            f"ratio {a['engine']}/llama.cpp: prefill {a['prefill_tps'] / peer['prefill_tps']:.2f}x, "
            f"decode {a['decode_tps'] / peer['decode_tps']:.2f}x"
        )
        if a["first_token"] != peer["first_token"]:
            lines.append(f"warning: greedy first token differs ({a['engine']} "
                         f"{a['first_token']} vs {peer['first_token']})")
    for a in results:
        ex = a.get("expert") or {}
        if ex:
            acq = ex.get("acquired", 0) or 1
            lines.append(f"{a['engine']} experts: hit rate {ex.get('hits', 0) / acq * 100:.1f}%, "
                         f"bytes read {ex.get('bytes_read', 0) / 2**20:.1f} MiB")
    return "\n".join(lines)
