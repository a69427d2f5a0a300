#!/usr/bin/env python3
"""colibri.Engine under concurrent load, with llama.cpp's batched decode as the peer:

    python tools/bench/engine.py [-m MODEL] [--moe [PATH]] [--streams 1,4,16] [--threads 2]
                                 [--prompt-tokens 64] [--gen-tokens 64] [--quick]
                                 [--no-llama-cpp] [--no-arrivals] [--no-prefix] [--json OUT]

Three measurements, on the default model (Gemma 3 270M) and, with --moe, on a MoE bench model
(PATH, or `python -m colibri.tools.make_bench_model OUT --layers 4` written to a temporary
directory):

- **Concurrency.** For each stream count N: N requests of distinct random prompts submitted at
  once, greedy, the end-of-generation tokens banned so every stream generates --gen-tokens.
  Aggregate decode tokens/s (tokens after each stream's first, over the time from the first
  stream's first token to the last token), the burst's p50/p99 time to first token (the N
  prompts arrive at once: how fast a burst is read) and p50/p99 inter-token latency (every
  gap between two tokens of a stream). llama.cpp (llama-cpp-python's
  low-level batch API: one context with n_seq_max = N, the same file and threads) runs the same
  work: every prompt prefilled in n_batch-token batches, then one batch per step holding each
  stream's next token. Without llama_cpp importable it says how to get it and runs colibri
  alone.
- **Arrivals.** 16 streams decode while new 256-token prompts arrive at one per second; p50 and
  p99 inter-token latency of the 16 streams before and during the arrivals, and the newcomers'
  time to first token.
- **Prefix reuse.** A 1,000-token shared system prompt: time to first token of a first request
  (cold) and of a second with another question after the same system prompt (its prefix copied
  from the cache), and the second once more with the prefix cache off.

--quick: 1/4/16 streams, 32 prompt and 32 generated tokens, 5 arrivals (the default run:
1/4/16/64 streams, 64/64, 10 arrivals). Timings on a shared machine move with its load: compare within one run.
Like every tool here it imports the installed colibri (from a checkout: PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from colibri.bench import LLAMA_CPP_MISSING, llama_cpp_missing

SYSTEM_TEXT = (
    "You are a careful assistant for questions about the history of the Roman Empire. Answer "
    "with dates where they are known, name your sources, say when historians disagree, and keep "
    "the answer short. The empire's roads, laws, aqueducts, legions and provinces, its emperors "
    "from Augustus to the last emperors of the west and of Constantinople, its trade across the "
    "Mediterranean and its long decline are all in scope. "
)
QUESTIONS = [" Question: what were the roads for?", " Question: who was the first emperor?",
             " Question: why did the western empire fall?"]


CHUNK: int | None = None  # --prefill-chunk (None: the engine's adaptive default)


def pct(x: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(x), q)) if x else float("nan")


def random_prompt(rng: np.random.Generator, n: int, n_vocab: int, bos: int | None) -> list[int]:
    ids = [int(t) for t in rng.integers(100, min(n_vocab, 30000), size=n)]
    if bos is not None:
        ids[0] = bos
    return ids


def token_times(st: dict[str, Any], t_submit: float) -> list[float]:
    """Absolute perf_counter times of a request's tokens (engine side)."""
    if st["ttft_s"] is None:
        return []
    return list(t_submit + st["ttft_s"] + np.concatenate([[0.0], np.cumsum(st["itl_s"])]))


# ---------------------------------------------------------------- colibri

def colibri_model(path: str, threads: int, ctx: int) -> Any:
    import colibri

    m = colibri.Model(path, threads=threads, ctx=ctx, verbose=False)
    m.prefault()
    return m


def no_eog(m: Any) -> dict[int, float]:
    from colibri.generate import stop_token_ids

    return {int(t): float("-inf") for t in stop_token_ids(m)}


def colibri_streams(m: Any, n: int, prompt_tokens: int, gen_tokens: int) -> dict[str, Any]:
    from colibri.engine import Engine

    rng = np.random.default_rng(n)
    bos = m.tokenizer.bos_id if m.tokenizer else None
    prompts = [random_prompt(rng, prompt_tokens, m.n_vocab, bos) for _ in range(n)]
    bias = no_eog(m)
    with Engine(m, max_seqs=max(n, 1), prefix_cache=False, prefill_chunk=CHUNK) as eng:
        # warm-up: touch the weights and the step path at this prompt length
        eng.submit(random_prompt(rng, prompt_tokens, m.n_vocab, bos), max_tokens=2,
                   temperature=0).text()
        t0 = time.perf_counter()
        reqs = [eng.submit(p, max_tokens=gen_tokens, temperature=0, logit_bias=bias)
                for p in prompts]
        for r in reqs:
            r.text()
        t_end = time.perf_counter()
        stats = [r.stats() for r in reqs]
        steps = eng.stats()
    ttft = [s["ttft_s"] for s in stats]
    itl = [x for s in stats for x in s["itl_s"]]
    first = min(r.t_submit + s["ttft_s"] for r, s in zip(reqs, stats, strict=True))
    decoded = sum(len(s["itl_s"]) for s in stats)
    return {"engine": "colibri", "streams": n, "decode_tps": decoded / (t_end - first),
            "total_tps": sum(s["generated_tokens"] for s in stats) / (t_end - t0),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3,
            "tokens_per_step": steps["tokens_per_step"],
            "generated": sum(s["generated_tokens"] for s in stats)}


def colibri_arrivals(m: Any, n_streams: int, arrivals: int, prompt_tokens: int,
                     arrival_tokens: int = 256) -> dict[str, Any]:
    from colibri.engine import Engine

    rng = np.random.default_rng(7)
    bos = m.tokenizer.bos_id if m.tokenizer else None
    bias = no_eog(m)
    with Engine(m, max_seqs=n_streams + arrivals, prefill_chunk=CHUNK) as eng:
        bg = [eng.submit(random_prompt(rng, prompt_tokens, m.n_vocab, bos), max_tokens=100000,
                         temperature=0, logit_bias=bias) for _ in range(n_streams)]
        for r in bg:
            next(iter(r))  # every stream is decoding
        t_quiet = time.perf_counter()
        time.sleep(max(3.0, arrivals / 2))  # a stretch without arrivals, for the baseline
        t_start = time.perf_counter()
        new = []
        for i in range(arrivals):  # pacing the load (one prompt a second), not synchronising
            nxt = t_start + i
            time.sleep(max(0.0, nxt - time.perf_counter()))
            new.append(eng.submit(random_prompt(rng, arrival_tokens, m.n_vocab, bos),
                                  max_tokens=8, temperature=0, logit_bias=bias))
        for r in new:
            r.text()
        t_stop = time.perf_counter()
        for r in bg:
            r.cancel()
        for r in bg:
            r.text()
        before: list[float] = []
        during: list[float] = []
        for r in bg:
            ts = token_times(r.stats(), r.t_submit)
            for a, b in zip(ts, ts[1:], strict=False):
                if t_quiet <= a and b <= t_start:
                    before.append(b - a)
                elif t_start <= a and b <= t_stop:
                    during.append(b - a)
        ttft = [r.stats()["ttft_s"] for r in new]
    return {"engine": "colibri", "streams": n_streams, "arrivals": arrivals,
            "itl_before_p50_ms": pct(before, 50) * 1e3, "itl_before_p99_ms": pct(before, 99) * 1e3,
            "itl_during_p50_ms": pct(during, 50) * 1e3, "itl_during_p99_ms": pct(during, 99) * 1e3,
            "itl_during_p99_over_p50": pct(during, 99) / pct(during, 50),
            # the stricter reading: the worst gaps during arrivals against the quiet decode
            "itl_during_p99_over_before_p50": pct(during, 99) / pct(before, 50),
            "arrival_ttft_p50_s": pct(ttft, 50), "arrival_ttft_p99_s": pct(ttft, 99)}


def colibri_prefix(m: Any, system_tokens: int = 1000) -> dict[str, Any]:
    from colibri.engine import Engine

    text = SYSTEM_TEXT
    while len(m.tokenize(text)) < system_tokens:
        text += SYSTEM_TEXT
    system = m.tokenize(text)[:system_tokens]
    qs = [m.tokenize(q, add_special=False) for q in QUESTIONS]

    def ttft(eng: Engine, ids: list[int]) -> float:
        r = eng.submit(ids, max_tokens=1, temperature=0)
        r.text()
        t = r.stats()["ttft_s"]
        assert t is not None
        return float(t)

    with Engine(m) as eng:
        ttft(eng, m.tokenize("warm up"))
        cold = ttft(eng, system + qs[0])
        warm = ttft(eng, system + qs[1])
        st = eng.stats()["prefix_cache"]
    with Engine(m, prefix_cache=False) as eng:
        off = ttft(eng, system + qs[2])
    return {"system_tokens": system_tokens, "ttft_first_s": cold, "ttft_second_s": warm,
            "speedup": cold / warm, "ttft_second_no_cache_s": off,
            "tokens_saved": st["tokens_saved"], "hits": st["hits"]}


# ---------------------------------------------------------------- llama.cpp

def _ll(name: str, *old: str) -> Any:
    """A llama_cpp low-level function by its current name or an older one."""
    import llama_cpp

    for n in (name, *old):
        if hasattr(llama_cpp, n):
            return getattr(llama_cpp, n)
    raise AttributeError(f"llama_cpp has none of {(name, *old)}")


def llama_streams(path: str, threads: int, n: int, prompt_tokens: int,
                  gen_tokens: int) -> dict[str, Any]:
    """The same work on llama.cpp's batched decode (one context, n_seq_max = n)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = _ll("llama_model_load_from_file", "llama_load_model_from_file")(path.encode(), mp)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    n_batch = 512
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n * (prompt_tokens + gen_tokens) + 64
    cp.n_batch = cp.n_ubatch = n_batch
    cp.n_seq_max = n
    cp.n_threads = cp.n_threads_batch = threads
    ctx = _ll("llama_init_from_model", "llama_new_context_with_model")(model, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    eog = np.array([bool(llama_cpp.llama_vocab_is_eog(vocab, t)) for t in range(n_vocab)])
    bos = int(llama_cpp.llama_vocab_bos(vocab))
    rng = np.random.default_rng(n)  # the prompts colibri got
    prompts = [random_prompt(rng, prompt_tokens, n_vocab, bos if bos >= 0 else None)
               for _ in range(n)]
    batch = llama_cpp.llama_batch_init(n_batch, 0, n)

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        """items: (token, pos, seq, want logits)."""
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = want
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(i: int) -> int:
        x = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
        return int(np.argmax(np.where(eog, -np.inf, x)))

    try:
        decode([(prompts[0][0], 0, 0, True)])  # warm-up
        _ll("llama_memory_seq_rm", "llama_kv_self_seq_rm", "llama_kv_cache_seq_rm")(
            *((llama_cpp.llama_get_memory(ctx),) if hasattr(llama_cpp, "llama_get_memory")
              else (ctx,)), 0, -1, -1)
        t0 = time.perf_counter()
        items = [(t, p, s, p == prompt_tokens - 1) for s in range(n)
                 for p, t in enumerate(prompts[s])]
        nxt = [0] * n
        ttft = [0.0] * n
        for a in range(0, len(items), n_batch):
            part = items[a:a + n_batch]
            decode(part)
            now = time.perf_counter()
            for i, (_, _p, s, want) in enumerate(part):
                if want:
                    nxt[s] = argmax(i)
                    ttft[s] = now - t0
        first = time.perf_counter()
        itl: list[float] = []
        t_last = first
        for k in range(1, gen_tokens):
            decode([(nxt[s], prompt_tokens + k - 1, s, True) for s in range(n)])
            nxt = [argmax(s) for s in range(n)]
            now = time.perf_counter()
            itl += [now - t_last] * n
            t_last = now
        t_end = time.perf_counter()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        _ll("llama_model_free", "llama_free_model")(model)
    return {"engine": "llama.cpp", "streams": n,
            "decode_tps": n * (gen_tokens - 1) / (t_end - first),
            "total_tps": n * gen_tokens / (t_end - t0),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3,
            "generated": n * gen_tokens}


# ---------------------------------------------------------------- driver

def row(r: dict[str, Any]) -> str:
    return (f"  {r['engine']:9s} {r['streams']:3d} streams: decode {r['decode_tps']:7.1f} tok/s "
            f"(all {r['total_tps']:6.1f}), burst TTFT p50 {r['ttft_p50_s']:6.2f} s p99 "
            f"{r['ttft_p99_s']:6.2f} s, ITL p50 {r['itl_p50_ms']:6.1f} ms p99 "
            f"{r['itl_p99_ms']:6.1f} ms")


def show_bound(out: dict[str, Any], path: str, args: argparse.Namespace) -> None:
    """The bound of a 16-sequence step, measured now (colibri.tools.roofline.batch_bound), and
    each engine's 16-stream decode rate as a share of it."""
    from colibri.tools.roofline import batch_bound

    try:
        b = batch_bound(path, 16, args.threads, args.prompt_tokens + args.gen_tokens / 2)
    except (RuntimeError, OSError) as e:  # no C compiler / not a checkout: say so, go on
        print(f"  bound at 16 streams: not measured ({e})", flush=True)
        return
    out["bound16"] = b
    share = (f"; routed experts: {b['expert_share']:.1%} of each expert tensor (expected under "
             f"uniform routing)" if b["expert_share"] else "")
    shares = ", ".join(f"{r['engine']} {r['decode_tps'] / b['bound_tps']:.0%}"
                       for r in out["streams"] if r["streams"] == 16)
    print(f"  bound at 16 streams ({b['bound']}): weight reads {b['bytes_per_step'] / 1e6:.0f} MB "
          f"a step at {b['bandwidth_gbs']:.1f} GB/s = {b['read_bound_tps']:.0f} tok/s; compute "
          f"{b['flops_per_step'] / 1e9:.1f} GFLOP at {b['matmul_gflops']:.0f} GFLOP/s (colibri's "
          f"matmul on the head) = {b['compute_bound_tps']:.0f} tok/s{share}. Share of the bound: "
          f"{shares}", flush=True)


def bench_model(label: str, path: str, args: argparse.Namespace, llama: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"model": label, "path": path, "streams": [], "arrivals": None,
                           "prefix": None}
    print(f"== {label}: {path}, {args.threads} threads, prompt {args.prompt_tokens}, "
          f"generate {args.gen_tokens}", flush=True)
    m = colibri_model(path, args.threads, args.ctx)
    try:
        for n in args.streams:
            r = colibri_streams(m, n, args.prompt_tokens, args.gen_tokens)
            out["streams"].append(r)
            print(row(r), flush=True)
            if llama:
                try:
                    r = llama_streams(path, args.threads, n, args.prompt_tokens, args.gen_tokens)
                    out["streams"].append(r)
                    print(row(r), flush=True)
                except Exception as e:  # a binding of another vintage: report, keep going
                    print(f"  llama.cpp {n} streams failed: {type(e).__name__}: {e}", flush=True)
        if 16 in args.streams:
            show_bound(out, path, args)
        if not args.no_arrivals:
            r = colibri_arrivals(m, 16, args.arrivals, args.prompt_tokens)
            out["arrivals"] = r
            print(f"  arrivals: 16 streams decoding, {r['arrivals']} prompts of 256 tokens at "
                  f"1/s: ITL p50 {r['itl_during_p50_ms']:.1f} ms p99 "
                  f"{r['itl_during_p99_ms']:.1f} ms (p99/p50 {r['itl_during_p99_over_p50']:.2f});"
                  f" before: p50 {r['itl_before_p50_ms']:.1f} ms p99 "
                  f"{r['itl_before_p99_ms']:.1f} ms (p99 during / p50 before "
                  f"{r['itl_during_p99_over_before_p50']:.2f}); newcomers' TTFT p50 "
                  f"{r['arrival_ttft_p50_s']:.2f} s p99 {r['arrival_ttft_p99_s']:.2f} s",
                  flush=True)
        if not args.no_prefix:
            r = colibri_prefix(m)
            out["prefix"] = r
            print(f"  prefix: {r['system_tokens']}-token system prompt: TTFT first "
                  f"{r['ttft_first_s'] * 1e3:.0f} ms, second {r['ttft_second_s'] * 1e3:.1f} ms "
                  f"({r['speedup']:.1f}x, {r['tokens_saved']} tokens copied); second without "
                  f"the cache {r['ttft_second_no_cache_s'] * 1e3:.0f} ms", flush=True)
    finally:
        m.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: the default model)")
    ap.add_argument("--moe", nargs="?", const="", default=None,
                    help="also a MoE bench model (PATH, or one written with --layers 4)")
    ap.add_argument("--streams", default=None, help="comma-separated (default 1,4,16,64; --quick: 1,4,16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=None)
    ap.add_argument("--gen-tokens", type=int, default=None)
    ap.add_argument("--arrivals", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-arrivals", action="store_true")
    ap.add_argument("--no-prefix", action="store_true")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="a fixed prefill chunk (default: the engine's adaptive one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    global CHUNK
    CHUNK = args.prefill_chunk
    args.streams = [int(x) for x in (args.streams or ("1,4,16" if args.quick else "1,4,16,64")).split(",")]
    args.prompt_tokens = args.prompt_tokens or (32 if args.quick else 64)
    args.gen_tokens = args.gen_tokens or (32 if args.quick else 64)
    args.arrivals = args.arrivals or (5 if args.quick else 10)
    llama = not args.no_llama_cpp
    if llama and llama_cpp_missing():
        print(LLAMA_CPP_MISSING.replace("--vs-llama-cpp", "the llama.cpp peer")
              + "; running colibri alone", flush=True)
        llama = False
    from colibri.model import default_model_path

    path = args.model or default_model_path()
    results = [bench_model("default" if args.model is None else Path(path).name, path, args,
                           llama)]
    if args.moe is not None:
        path = args.moe
        if not path:
            from colibri.tools.make_bench_model import write

            tmp = tempfile.mkdtemp(prefix="colibri-bench-")
            print(f"writing a 4-layer MoE bench model to {tmp} ...", flush=True)
            path = str(write(str(Path(tmp) / "moe4.gguf"), n_layers=4))
        results.append(bench_model("moe-bench-4-layers", path, args, llama))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
