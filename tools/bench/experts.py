#!/usr/bin/env python3
"""The expert store under a memory budget: decode speed and hit rate, colibri vs llama.cpp.

    python tools/bench/experts.py [--model M.gguf] [--layers 4] [--gen 24] [--warmup 0]
                                  [--budgets 1,0.75,0.5,0.25]
                                  [--modes cache,mmap] [--policies lru,lfru] [--prefetch on,off]
                                  [--llama-extra-bufts] [--container] [--no-llama] [--json OUT]
                                  [--margin MiB] [--timeout S] [--disk-seconds S]

colibri runs with max_batch=1 (the prompt token by token), so a budget's pool floor is one
token's experts per layer (min_expert_slots). Without --model it writes the benchmark MoE model
(colibri/tools/make_bench_model.py: Qwen3-30B-A3B shape, random --type weights (default Q4_K_M),
spread routing, --layers layers) to a temporary directory. For each budget B (a fraction of
the experts' size) every run happens in a fresh process, inside a cgroup-v1 memory
limit of dense + B * experts + a margin when /sys/fs/cgroup/memory is writable (the page cache
counts against that limit, so mmap thrashing shows); otherwise without a limit, and the report
says so. Runs: colibri's mapped store (full RAM, the reference), colibri cache/mmap x policy at
each budget with the prefetch thread on and off, and llama.cpp (llama-cpp-python, mmap) on the
same GGUF under the same limit. llama.cpp runs with use_extra_bufts=False by default: with extra
buffer types its CPU backend repacks Q4_0 weights into anonymous memory (a second copy of the
model outside the page cache), which a memory limit below the model's size kills; without them
the weights stay in the file mapping and a limit makes the page cache thrash, the experience of
llama.cpp users on models larger than RAM (--llama-extra-bufts restores llama.cpp's default).
--container also converts the GGUF with tools/convert_gguf.py (--quant keep) when it exists and
runs the cache mode on the container (one pread per expert) at each budget.

Validation: every colibri configuration must produce the mapped store's logits bit for bit
(a SHA-1 of all logits); llama.cpp's top-1 per step is compared with colibri's and the
agreement reported (random weights: near-ties may differ). The page cache of the model file is
dropped before each run (read in full before the full-RAM reference).
Figures: decode tok/s (1 / the median step time: the machine is shared; one token per step after an 8-token prompt, teacher-forced on a fixed
random token stream), expert hit rate, prefetch hits / experts the prefetch thread read
("pf h/read") and, with prefetch, the next-layer prediction's precision and recall per layer
(hinted experts that the layer then used / hinted; used / what the layer acquired), pread calls, bytes read, peak RSS; ratios to llama.cpp at the same
budget and to the mapped store. The generated model routes evenly over its experts, as a
trained MoE does (make_bench_model's default `spread` routing; `--routing raw` models
concentrate on a few experts); the number of distinct experts used is printed so the budgets
can be read against it. A run that does not finish in --timeout seconds is reported as an upper
bound on its speed (and the ratios against it as lower bounds); rows print as they finish.
The disk bound of a budgeted run ("bound", and the run's share of it, "%bnd") is min(the mapped
store's speed, the disk's bandwidth / the bytes the run read per timed token), the bandwidth
measured first on the model file by tools/bench/disk.py (the best of buffered, O_DIRECT and
io_uring reads at queue depths 1-8, in expert-part-sized blocks; --disk-seconds 0 skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CG = Path("/sys/fs/cgroup/memory")
MARGIN = 400 * 2**20
TIMEOUT = 900  # seconds per run (--timeout)
PROMPT = [11, 9301, 345, 77, 2048, 15, 5000, 123]


def _stream(n: int, n_vocab: int) -> list[int]:
    """The decode tokens: a fixed pseudo-random stream (teacher forcing). Greedy decoding of a
    random-weight model repeats one token, which would route every step to the same experts."""
    import numpy as np

    return [int(t) for t in np.random.default_rng(7).integers(0, n_vocab, n)]


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from colibri.generate import peak_rss_bytes

    gen = cfg["gen"]
    warmup = cfg.get("warmup", 0)  # decode steps before timing (and before the expert stats)
    t0 = time.perf_counter()
    if cfg["engine"] == "llama.cpp":
        import llama_cpp.llama_cpp as lc
        from llama_cpp import Llama

        if not cfg.get("extra_bufts", False):
            default_params = lc.llama_model_default_params

            def no_extra_bufts() -> Any:
                p = default_params()
                p.use_extra_bufts = False
                return p

            lc.llama_model_default_params = no_extra_bufts
        ll = Llama(cfg["path"], n_ctx=max(128, gen + 16), n_threads=cfg["threads"], n_threads_batch=cfg["threads"],
                   n_batch=128, verbose=False)
        load = time.perf_counter() - t0

        def last() -> int:
            # without logits_all, llama-cpp-python keeps no scores: the context's last row
            return int(np.argmax(np.ctypeslib.as_array(ll._ctx.get_logits_ith(-1),
                                                       shape=(ll.n_vocab(),))))

        ll.eval(PROMPT)
        toks, lat = [last()], []
        for i, tok in enumerate(_stream(gen, ll.n_vocab())):
            if i == warmup:
                lat.clear()
            t = time.perf_counter()
            ll.eval([tok])
            lat.append(time.perf_counter() - t)
            toks.append(last())
        stats: dict[str, Any] = {}
        digest = ""
        direct = None
    else:
        from colibri.model import Model

        os.environ["COLIBRI_EXPERT_DIRECT_IO"] = cfg.get("direct_io", "auto")
        # the usage record pins the hottest experts of earlier runs: off unless --usage, and
        # then in this benchmark's own folder (not the user's record)
        os.environ["COLIBRI_EXPERT_USAGE"] = "1" if cfg.get("usage_dir") else "0"
        if cfg.get("usage_dir"):
            os.environ["COLIBRI_USAGE_DIR"] = cfg["usage_dir"]
        kw: dict[str, Any] = {}
        if cfg["mode"] != "mapped":
            kw = dict(expert_mode=cfg["mode"], expert_budget=cfg["budget"],
                      expert_policy=cfg["policy"], prefetch=cfg.get("prefetch", False))
        if cfg["path"].endswith(".colibri"):
            kw["verify"] = False  # the checksum pass reads the whole file: not a decode cost
        m = Model(cfg["path"], threads=cfg["threads"], ctx=max(128, gen + 16), max_batch=1, tokenizer=False, **kw)
        load = time.perf_counter() - t0
        import hashlib

        h = hashlib.sha1()
        s = m.new_sequence()
        out = m.eval([s], tokens=PROMPT)[-1]
        h.update(out.tobytes())
        m.reset_expert_stats()
        toks, lat = [int(np.argmax(out))], []
        for i, tok in enumerate(_stream(gen, m.n_vocab)):
            if i == warmup:
                lat.clear()
                m.reset_expert_stats()
            t = time.perf_counter()
            out = m.eval([s], tokens=[tok])[-1]
            lat.append(time.perf_counter() - t)
            h.update(out.tobytes())
            toks.append(int(np.argmax(out)))
        if m.experts is not None:
            m.experts.prefetch_sync()
        stats = m.expert_stats()
        stats["one_read_layers"] = m.expert_info().get("one_read_layers", 0)
        direct = m.expert_info().get("direct_io")
        stats["distinct"] = int(sum((m.route_counts(layer) > 0).sum() for layer in range(
            m.desc.n_layer)))
        # the next-layer prediction (prefetch hints), per layer: precision, recall
        stats["prediction"] = [
            (layer, x["predicted_used"] / x["predicted"],
             x["predicted_used"] / x["predicted_acquired"])
            for layer in range(m.desc.n_layer)
            for x in [m.expert_stats(layer)] if x.get("predicted") and x["predicted_acquired"]]
        digest = h.hexdigest()
    return {"tokens": toks, "digest": digest, "decode_tps": 1.0 / float(np.median(lat)),
            "direct_io": direct,
            "mean_tps": len(lat) / sum(lat), "load_s": load,
            "peak_rss": peak_rss_bytes(), "stats": stats}


def _cgroup(limit: int | None) -> Path | None:
    if limit is None or not (CG / "cgroup.procs").exists():
        return None
    d = CG / f"colibri_bench_{os.getpid()}"
    try:
        d.mkdir(exist_ok=True)
        (d / "memory.limit_in_bytes").write_text(str(limit))
        return d
    except OSError:
        return None


def _drop_cache(path: str) -> None:
    """Evict the model file from the page cache, so that the run's reads are charged to its
    cgroup (cgroup v1 charges a cached page to whoever read it first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm_cache(path: str) -> None:
    """Read the whole model file into the page cache: the full-RAM reference starts with every
    page resident (with spread routing a cold start would fault experts in for hundreds of
    steps and time the disk, not the full-RAM path)."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def run(cfg: dict[str, Any], limit: int | None) -> dict[str, Any]:
    if cfg.get("mode") == "mapped":
        _warm_cache(cfg["path"])
    else:
        _drop_cache(cfg["path"])
    cg = _cgroup(limit)

    def enter() -> None:
        if cg is not None:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)],
                           capture_output=True, text=True, preexec_fn=enter, cwd=ROOT,
                           timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        # slower than gen / TIMEOUT tokens/s (loading included): reported as an upper bound
        return {"error": f"did not finish {cfg['gen']} steps in {TIMEOUT} s",
                "limited": cg is not None, "timeout": True,
                "decode_tps_max": cfg["gen"] / TIMEOUT}
    finally:
        if cg is not None:
            try:
                cg.rmdir()
            except OSError:
                pass
    for line in p.stdout.splitlines():
        if line.startswith("RESULT"):
            r = dict(json.loads(line[6:]))
            r["limited"] = cg is not None
            return r
    return {"error": f"exit {p.returncode}: {p.stderr.strip()[-400:]}", "limited": cg is not None}


def main() -> int:
    global TIMEOUT, MARGIN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", default="q4_k_m", choices=("q4_k_m", "q4_0", "q8_0"),
                    help="weights of the generated model (q4_0's random nibbles are not "
                         "zero-mean: hidden states share one direction and routing collapses "
                         "onto a few experts)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=0,
                    help="of the --gen decode steps, how many run before timing and before the "
                         "expert statistics start (both engines): the steady state")
    ap.add_argument("--budgets", default="1,0.75,0.5,0.25,0.1,0.05")
    ap.add_argument("--modes", default="cache,mmap")
    ap.add_argument("--policies", default="lru,lfru")
    ap.add_argument("--prefetch", default="on,off", help="prefetch settings to run: on,off")
    ap.add_argument("--llama-extra-bufts", action="store_true",
                    help="llama.cpp with its default extra buffer types (repacked weights)")
    ap.add_argument("--container", action="store_true",
                    help="also run cache mode on a converted container (tools/convert_gguf.py)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--margin", type=int, default=MARGIN >> 20,
                    help="MiB above dense + budget in the memory limit of every run (default "
                         "400: generous to llama.cpp's own buffers; colibri's tests hold it to "
                         "150)")
    ap.add_argument("--timeout", type=int, default=TIMEOUT,
                    help="seconds one run may take; a slower run is reported as an upper bound "
                         "on its speed")
    ap.add_argument("--direct-io", default="auto",
                    help="COLIBRI_EXPERT_DIRECT_IO settings to run the cache store with: "
                         "auto,on,off (default auto)")
    ap.add_argument("--usage", action="store_true",
                    help="let colibri's expert usage record pin the hottest experts (kept in a "
                         "folder of this benchmark's, filled by its earlier runs); default: off, "
                         "every run starts from an empty cache")
    ap.add_argument("--disk-seconds", type=float, default=1.0,
                    help="seconds per (mode, queue depth) cell of the disk measurement "
                         "(tools/bench/disk.py) behind the disk bound; 0 skips it")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        print("RESULT" + json.dumps(child(json.loads(a.child))))
        return 0
    TIMEOUT = a.timeout
    MARGIN = a.margin << 20
    tmp = None
    path = a.model
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = os.path.join(tmp.name, "bench.gguf")
        subprocess.run([sys.executable, "-m", "colibri.tools.make_bench_model", path,
                        "--layers", str(a.layers), "--type", a.type], check=True,
                       capture_output=True)
    from colibri.arch import open_model

    gf, d = open_model(path)
    dense, experts = d.dense_bytes(), d.expert_bytes()
    gf.close()
    if not 0 <= a.warmup < a.gen:
        ap.error("--warmup must be in [0, --gen)")
    base = dict(path=path, threads=a.threads, gen=a.gen, warmup=a.warmup)
    usage_tmp = tempfile.TemporaryDirectory() if a.usage else None
    if usage_tmp is not None:
        base["usage_dir"] = usage_tmp.name
    container = None
    if a.container and (ROOT / "tools" / "convert_gguf.py").exists():
        container = os.path.splitext(path)[0] + ".colibri"
        cp = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_gguf.py"), path,
                             container, "--quant", "keep"], capture_output=True, text=True)
        if cp.returncode != 0:
            print("container conversion failed:", cp.stderr.strip()[-300:])
            container = None
    disk_bw = 0.0  # bytes/s: the best (mode, queue depth) of tools/bench/disk.py on this file
    if a.disk_seconds > 0:
        from disk import best, measure  # tools/bench/disk.py, beside this script

        part = max(4096, experts // (3 * sum(L.n_expert for L in d.layers if L.n_expert)))
        m_, q_, mbs = best(measure(path, part, a.disk_seconds, qds=(1, 2, 4, 8)))
        disk_bw = mbs * 1e6
        print(f"disk: {mbs:.0f} MB/s reading {part >> 10} KiB parts at random (best: {m_} at "
              f"queue depth {q_}; tools/bench/disk.py)")
    timed = a.gen - a.warmup
    print(f"model {os.path.basename(path)}: dense {dense / 2**20:.0f} MiB, experts "
          f"{experts / 2**20:.0f} MiB; {a.threads} threads, 8-token prompt, {a.gen} decode steps "
          f"(the first {a.warmup} untimed)")
    ref = run({**base, "engine": "colibri", "mode": "mapped", "policy": "lru", "budget": 1.0}, None)
    if "error" in ref:
        print("mapped reference failed:", ref["error"])
        return 1
    rows: list[dict[str, Any]] = [{"engine": "colibri", "mode": "mapped", "policy": "-",
                                   "budget": 1.0, **ref}]
    cg_ok = _cgroup(1 << 40)
    if cg_ok is not None:
        cg_ok.rmdir()
    print("memory limit: " + ("cgroup v1 memory.limit_in_bytes = dense + budget + "
                              f"{MARGIN >> 20} MiB, page cache included" if cg_ok else
                              "NOT enforced (no writable cgroup): runs share the machine's RAM"))
    bad = 0
    header = (f"{'engine':10} {'mode':7} {'policy':6} {'pf':3} {'budget':>6} {'tok/s':>7} "
              f"{'vs full':>7} {'vs llama':>8} {'hit %':>6} {'pf h/read':>9} {'reads':>6} "
              f"{'read MiB':>9} {'rss MiB':>8} {'bound':>6} {'%bnd':>5}  note")
    llama: dict[float, dict[str, Any]] = {}

    def line(r: dict[str, Any]) -> str:
        pf = r.get("prefetch", "-")
        if "error" in r:
            return (f"{r['engine']:10} {r['mode']:7} {r['policy']:6} {pf:3} {r['budget']:6.2f}  "
                    f"ERROR {r['error']}")
        st = r["stats"]
        hit = 100 * st["hits"] / st["acquired"] if st.get("acquired") else float("nan")
        peer = llama.get(r["budget"])
        vs = f"{'-':>8}"
        if peer is not None and r["engine"] != "llama.cpp":
            if "error" not in peer:
                vs = f"{r['decode_tps'] / peer['decode_tps']:8.2f}"
            elif peer.get("timeout"):  # llama.cpp slower than gen / timeout: a lower bound
                vs = f"{'>' + format(r['decode_tps'] / peer['decode_tps_max'], '.1f'):>8}"
        note = ""
        if r["engine"] == "colibri" and r.get("direct_io") is not None:
            note = "O_DIRECT" if r["direct_io"] else "buffered"
        if r["engine"] == "llama.cpp":
            same = sum(x == y for x, y in zip(r["tokens"], ref["tokens"], strict=True))
            note = f"top-1 equal to colibri's: {same}/{len(ref['tokens'])}"
        pfh = (f"{st['prefetch_hits']:4d}/{st['prefetch_issued']:<4d}"
               if st.get("prefetch_issued") else f"{'-':>9}")
        # the disk bound: min(full-RAM speed, disk bandwidth / bytes missed per token)
        bnd, pct = f"{'-':>6}", f"{'-':>5}"
        if disk_bw and r["engine"] == "colibri" and r["mode"] != "mapped" and timed:
            per_tok = st.get("bytes_read", 0) / timed
            bound = min(ref["decode_tps"], disk_bw / per_tok if per_tok else float("inf"))
            r["disk_bound_tps"] = bound
            bnd, pct = f"{bound:6.1f}", f"{100 * r['decode_tps'] / bound:5.0f}"
        return (f"{r['engine']:10} {r['mode']:7} {r['policy']:6} {pf:3} {r['budget']:6.2f} "
                f"{r['decode_tps']:7.2f} {r['decode_tps'] / ref['decode_tps']:7.2f} {vs} "
                f"{hit:6.1f} {pfh} {st.get('reads', 0):6d} "
                f"{st.get('bytes_read', 0) / 2**20:9.0f} {r['peak_rss'] / 2**20:8.0f} "
                f"{bnd} {pct}  {note}")

    def add(row: dict[str, Any]) -> None:
        rows.append(row)
        print("  " + line(row), flush=True)  # as it finishes: a long run keeps what it has
        pred = row.get("stats", {}).get("prediction")
        if pred:
            print("    next-layer prediction, precision/recall per layer: " + ", ".join(
                f"{layer}: {p * 100:.0f}/{r * 100:.0f}%" for layer, p, r in pred), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))

    print(header, flush=True)
    print("  " + line(rows[0]), flush=True)
    for b in [float(x) for x in a.budgets.split(",")]:
        limit = dense + int(b * experts) + MARGIN
        if not a.no_llama:  # first, so the colibri rows of this budget print their ratio
            r = run({**base, "engine": "llama.cpp", "extra_bufts": a.llama_extra_bufts}, limit)
            llama[b] = {"engine": "llama.cpp", "mode": "mmap", "policy": "-", "budget": b, **r}
            add(llama[b])
        for mode in a.modes.split(","):
            for pol in a.policies.split(","):
                for pf in a.prefetch.split(","):
                    for dio in (a.direct_io.split(",") if mode == "cache" else ["auto"]):
                        r = run({**base, "engine": "colibri", "mode": mode, "policy": pol,
                                 "budget": b, "prefetch": pf == "on", "direct_io": dio}, limit)
                        if "error" not in r and r["digest"] != ref["digest"]:
                            r["error"] = "logits differ from the mapped store"
                            bad += 1
                        add({"engine": "colibri", "mode": mode, "policy": pol, "budget": b,
                             "prefetch": pf, **r})
        if container is not None:
            for pf in a.prefetch.split(","):
                r = run({**base, "path": container, "engine": "colibri", "mode": "cache",
                         "policy": "lru", "budget": b, "prefetch": pf == "on"}, limit)
                if "error" not in r and r["digest"] != ref["digest"]:
                    r["error"] = "logits differ from the mapped store (GGUF)"
                    bad += 1
                add({"engine": "colibri", "mode": "cont", "policy": "lru", "budget": b,
                     "prefetch": pf, **r})
    print()
    print("llama.cpp: " + ("default extra buffer types (repacked weights in anonymous memory)"
                           if a.llama_extra_bufts else
                           "use_extra_bufts=False (weights stay in the file mapping)"))
    print(f"(routing of this model: {ref['stats']['distinct']} distinct (layer, expert) pairs of "
          f"{sum(L.n_expert for L in d.layers)} used in the decode steps)")
    print(header)
    for r in rows:
        print(line(r))
    if tmp is not None:
        tmp.cleanup()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
