"""Benchmark of the quantized CPU kernels (colibri.quant) against their peers, in one run.

- Read bandwidth: tools/bench/membw.c (a plain streaming read), compiled here, 1 and 2 threads.
- matvec (decode, 1 token) per block type on a weight several times the L3 cache, 1 and 2
  threads: GB/s of weight bytes streamed and % of the measured read bandwidth.
- matmul with 32 and 128 tokens on a 4096x4096 weight: GFLOP/s (2*rows*cols*tokens) next to
  numpy's float32 matmul of the dequantized weight with the same thread count (OpenBLAS threads
  set through OPENBLAS_NUM_THREADS in a subprocess).
- packed (with --parts packed): the packed-row path forced on against forced off on expert-sized
  weights (768x2048 and 2048x768, distinct weights from memory as experts are) at 1-32 tokens, the
  batch sizes of MoE prefill per expert:
  the ratio of times and the smallest count from which packing wins, next to the threshold
  matmul uses (rp_min_tokens in colibri/_core/quant.c).
Every kernel's output is first checked against gguf's dequantizer + a float64 product (within
the activation-quantization bound) before it is timed. Times are the best of repeated runs
(other processes share the machine; best-of is the least noisy estimate for both sides).

Usage: python tools/bench/quant_kernels.py [--types Q4_0,Q4_K] [--threads 1,2] [--tokens 32,128]
       [--parts matvec,matmul,packed] [--seconds 0.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import gguf
import gguf.quants
import numpy as np

import colibri.quant as cq
from colibri.tools.membw import l3_bytes, membw

ALL = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K", "I4_G128", "F16",
       "BF16", "F32",
       # the low-bit types (Q8_K left out: gguf has no reference dequantizer for it)
       "Q2_K", "Q3_K", "TQ1_0", "TQ2_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
       "IQ3_S", "IQ4_NL", "IQ4_XS"]
TARGET_MATVEC = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")

NUMPY_PEER = r"""
import sys, time, numpy as np
w = np.load(sys.argv[1]); res = {}
for n in map(int, sys.argv[2].split(",")):
    x = np.random.default_rng(n).standard_normal((n, w.shape[1])).astype(np.float32)
    x @ w.T
    best, t_end = 1e9, time.perf_counter() + float(sys.argv[3])
    while True:
        t0 = time.perf_counter(); x @ w.T; best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > t_end: break
    res[n] = best
print(repr(res))
"""


def blas_thread_setter():
    """A function that sets numpy's OpenBLAS thread count in this process (ctypes), or None."""
    import ctypes
    import glob

    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for lib in glob.glob(os.path.join(libdir, "*openblas*.so*")):
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            fn = getattr(dll, sym, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                return fn
    return None


def best_time(fn, seconds: float, min_reps: int = 3) -> float:
    fn()
    best, reps, end = 1e9, 0, time.perf_counter() + seconds
    while reps < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return best


def reference_rows(t: str, raw: np.ndarray, cols: int, row_ids: np.ndarray) -> np.ndarray:
    rb = cq.row_bytes(t, cols)
    sub = raw.reshape(-1, rb)[row_ids]
    if t == "I4_G128":  # colibri's own type (quant.h): {f16 d; u8 qs[64]}, v = d*(q-8)
        blk = sub.reshape(len(row_ids), cols // 128, 66)
        d = blk[:, :, :2].copy().view(np.float16).astype(np.float32)
        q = np.empty((len(row_ids), cols // 128, 128), np.float32)
        q[:, :, 0::2] = blk[:, :, 2:] & 15
        q[:, :, 1::2] = blk[:, :, 2:] >> 4
        return ((q - 8) * d).reshape(len(row_ids), cols)
    if t in ("F32", "F16"):
        return np.asarray(gguf.quants.dequantize(
            sub.view(np.float32 if t == "F32" else np.float16), gguf.GGMLQuantizationType[t]),
            dtype=np.float32).reshape(len(row_ids), cols)
    return np.asarray(gguf.quants.dequantize(sub, gguf.GGMLQuantizationType[t]),
                      dtype=np.float32).reshape(len(row_ids), cols)


def validate(t: str, raw: np.ndarray, rows: int, cols: int, x: np.ndarray, y: np.ndarray) -> None:
    ids = np.unique(np.concatenate([np.arange(min(32, rows)), np.arange(max(0, rows - 32), rows)]))
    w = reference_rows(t, raw, cols, ids)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = cq.error_bound(t, w, x)
    err = np.abs(y[:, ids] - ref)
    if not np.all(err <= bound):
        raise SystemExit(f"{t}: kernel output differs from the gguf reference "
                         f"(max error/bound {float((err / bound).max()):.3g})")


PACKED_TOKENS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
# rp_min_tokens() in colibri/_core/quant.c, for the report (the test of this table is the
# benchmark itself: a threshold far from the measured crossover shows there)
PACKED_MIN_AVX2 = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 4, "Q5_1": 4, "MXFP4": 4, "I4_G128": 4,
                   "Q8_0": 5, "Q5_K": 8, "Q6_K": 8, "Q4_K": 16}
PACKED_MIN_AVX512 = {**{t: 4 for t in PACKED_MIN_AVX2}, "Q8_0": 5, "Q5_K": 5, "Q6_K": 5, "Q4_K": 5}
PACKED_MIN_AVX512_VNNI = {**{t: 2 for t in PACKED_MIN_AVX2}, "Q5_K": 5, "Q6_K": 5, "Q4_K": 5}


def packed_min() -> dict[str, int]:
    """The thresholds matmul uses at the current SIMD level."""
    from colibri import simd
    return {"avx512": PACKED_MIN_AVX512, "avx512vnni": PACKED_MIN_AVX512_VNNI}.get(
        simd.level(), PACKED_MIN_AVX2)


def packed_crossover(types: list[str], pool, th: int, seconds: float, rng, result: dict) -> None:
    """Packed-row path forced on vs off on expert-sized weights, per token count."""
    print(f"\npacked-row path on / off, {th} thread(s), time ratio (< 1: packing wins):")
    print(f"{'type':8s} {'weight':>9s} " + " ".join(f"{n:>5d}" for n in PACKED_TOKENS) +
          "  wins from  threshold")
    for t in types:
        if t not in PACKED_MIN_AVX2:
            continue
        for rows, cols in ((768, 2048), (2048, 768)):
            # experts come from memory: enough distinct weights to pass 4x the last-level cache,
            # each call on the next (one weight reused from cache favours packing)
            one = cq.random_weight(t, rows, cols, rng)
            raws = [one] + [cq.random_weight(t, rows, cols, rng)
                            for _ in range(max(1, 4 * l3_bytes() // one.nbytes) - 1)]
            ratios = []
            for n in PACKED_TOKENS:
                x = rng.standard_normal((n, cols)).astype(np.float32)
                for packed in (True, False):
                    validate(t, one, rows, cols, x,
                             cq.matmul(t, one, rows, cols, x, pool=pool, packed=packed))

                def sweep(p: bool, x: np.ndarray = x, t: str = t, rows: int = rows,
                          cols: int = cols, raws: list = raws) -> None:
                    for raw in raws:
                        cq.matmul(t, raw, rows, cols, x, pool=pool, packed=p)

                on, off = (best_time(lambda p=p: sweep(p), seconds) for p in (True, False))
                ratios.append(on / off)
            wins = next((n for i, n in enumerate(PACKED_TOKENS)
                         if all(r < 1 for r in ratios[i:])), None)
            result.setdefault("packed", {}).setdefault(t, {})[f"{rows}x{cols}"] = {
                "tokens": list(PACKED_TOKENS), "on_over_off": ratios, "wins_from": wins,
                "threshold": packed_min()[t]}
            print(f"{t:8s} {f'{rows}x{cols}':>9s} " + " ".join(f"{r:5.2f}" for r in ratios) +
                  f"  {str(wins):>9s}  {packed_min()[t]:>9d}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(ALL))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", default="32,128")
    ap.add_argument("--seconds", type=float, default=0.5, help="time budget per measurement")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--parts", default="matvec,matmul", help="which parts to run")
    args = ap.parse_args()
    types = [cq.type_name(t) for t in args.types.split(",")]
    threads = [int(n) for n in args.threads.split(",")]
    tokens = [int(n) for n in args.tokens.split(",")]
    parts = set(args.parts.split(","))
    rng = np.random.default_rng(0)
    l3 = l3_bytes()
    result: dict = {"l3_bytes": l3, "bandwidth_gbs": {}, "matvec": {}, "matmul": {}, "numpy": {}}

    print(f"L3 {l3 >> 20} MiB; SIMD {__import__('colibri.simd').simd.level()}; "
          f"cpus {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}")
    mib = max(512, 8 * l3 >> 20)
    for th in threads:
        result["bandwidth_gbs"][th] = membw(th, mib)
        print(f"streaming read, {th} thread(s): {result['bandwidth_gbs'][th]:.2f} GB/s ({mib} MiB)")

    pools = {th: cq.ThreadPool(th) for th in threads}
    cols = 4096
    print("\nmatvec (1 token), weight >= 4x L3:")
    print(f"{'type':6s} {'rows x cols':>13s} {'MiB':>6s} " +
          " ".join(f"{f'{th}T GB/s':>9s} {'%bw':>5s}" for th in threads))
    for t in types if "matvec" in parts else []:
        rb = cq.row_bytes(t, cols)
        rows = max(14336, -(-4 * l3 // rb))
        rows = -(-rows // 256) * 256
        raw = cq.random_weight(t, rows, cols, rng)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        y = cq.matmul(t, raw, rows, cols, x, pool=pools[threads[-1]])
        validate(t, raw, rows, cols, x, y)
        line = f"{t:6s} {rows:>6d} x {cols:<5d} {raw.nbytes / 2**20:6.0f} "
        for th in threads:
            dt = best_time(lambda t=t, raw=raw, rows=rows, x=x, th=th: cq.matmul(
                t, raw, rows, cols, x, pool=pools[th]), args.seconds)
            # the peer, measured again right after: the machine may be shared and busy
            bw = max(membw(th, max(256, 4 * l3 >> 20), 3), 1e-9)
            gbs = raw.nbytes / dt / 1e9
            pct = 100 * gbs / bw
            result["matvec"].setdefault(t, {})[th] = {"gbs": gbs, "pct_bw": pct, "rows": rows,
                                                      "bandwidth_gbs": bw}
            line += f"{gbs:9.2f} {pct:4.0f}% "
        print(line, flush=True)
        del raw

    set_blas = blas_thread_setter()
    rows = 4096
    print(f"\nmatmul {rows}x{cols} weight, GFLOP/s (numpy: float32 matmul of the dequantized weight):")
    with tempfile.TemporaryDirectory() as tmp:
        wf = rng.standard_normal((rows, cols)).astype(np.float32)
        path = os.path.join(tmp, "w.npy")
        np.save(path, wf)
        del wf
        for th in threads:
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(th), OMP_NUM_THREADS=str(th),
                       MKL_NUM_THREADS=str(th))
            out = subprocess.run([sys.executable, "-c", NUMPY_PEER, path, ",".join(map(str, tokens)),
                                  str(args.seconds * 2)], env=env, check=True, capture_output=True,
                                 text=True).stdout
            times = eval(out)  # noqa: S307 - our own subprocess's repr of a dict of floats
            result["numpy"][th] = {n: 2 * rows * cols * n / times[n] / 1e9 for n in tokens}
    hdr = " ".join(f"{f'{th}T n={n}':>10s} {'x np':>5s}" for th in threads for n in tokens)
    print(f"{'type':6s} {hdr}")
    print(f"{'numpy':6s} " + " ".join(f"{result['numpy'][th][n]:10.1f} {'':5s}" for th in threads
                                       for n in tokens) + "  (subprocess, once)")
    if set_blas is not None:
        print("       ratios below are against numpy timed right after each kernel on that "
              "type's dequantized weight (its GFLOP/s in parentheses)")
    for t in types if "matmul" in parts else []:
        raw = cq.random_weight(t, rows, cols, rng)
        line = f"{t:6s} "
        wdq = cq.dequantize(t, raw, (rows, cols)) if set_blas else None
        for th in threads:
            for n in tokens:
                x = rng.standard_normal((n, cols)).astype(np.float32)
                y = cq.matmul(t, raw, rows, cols, x, pool=pools[th])
                validate(t, raw, rows, cols, x, y)
                dt = best_time(lambda t=t, raw=raw, x=x, th=th: cq.matmul(
                    t, raw, rows, cols, x, pool=pools[th]), args.seconds)
                gf = 2 * rows * cols * n / dt / 1e9
                peer = result["numpy"][th][n]
                if set_blas is not None and wdq is not None:
                    # numpy right next to ours, same thread count, on this type's weight
                    set_blas(th)
                    dtn = best_time(lambda x=x, wdq=wdq: x @ wdq.T, args.seconds)
                    peer = 2 * rows * cols * n / dtn / 1e9
                    result["numpy_per_type"] = result.get("numpy_per_type", {})
                    result["numpy_per_type"].setdefault(t, {}).setdefault(th, {})[n] = peer
                ratio = gf / peer
                result["matmul"].setdefault(t, {}).setdefault(th, {})[n] = {"gflops": gf,
                                                                            "vs_numpy": ratio}
                line += f"{gf:10.1f} {ratio:5.2f} "
                if set_blas is not None:
                    line = line[:-1] + f"({peer:.0f}) "
        print(line, flush=True)

    if "packed" in parts:
        packed_crossover(types, pools[threads[-1]], threads[-1], args.seconds, rng, result)

    thmax = threads[-1]
    print("\ntargets:")
    for t in TARGET_MATVEC:
        if t in result["matvec"]:
            pct = result["matvec"][t][thmax]["pct_bw"]
            print(f"  matvec {t} {thmax}T: {pct:.0f}% of bandwidth (target 80%): "
                  f"{'met' if pct >= 80 else 'NOT met'}")
    for t in types:
        if t in ("F32", "F16", "BF16") or t not in result["matmul"]:
            continue
        worst = min(v["vs_numpy"] for d in result["matmul"][t].values() for v in d.values())
        print(f"  matmul {t}: worst ratio to numpy {worst:.2f} (target 1.00): "
              f"{'met' if worst >= 1 else 'NOT met'}")
    print(f"load average after the run: {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
