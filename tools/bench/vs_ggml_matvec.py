#!/usr/bin/env python3
"""One-token matvec from memory, colibri against ggml's vec_dot (llama-cpp-python's bundled
libggml-cpu) on the same weights: tools/bench/vs_ggml_matvec.c, compiled here with colibri's C
sources (-O3 -march=native, plus --cflags; --far-hint 3 builds the far prefetches into L1, the
A/B of docs/benchmarks.md "Prefetch hints").

    python tools/bench/vs_ggml_matvec.py [--far-hint N] [--cflags=...] [--threads 1] [--rounds 2] [--avx2]
                                         [--in-cache] [--lowbit [--types Q2_K,...] [--tokens 1,16]]

The shapes are the MoE bench model's (tools/make_bench_model.py): an expert's gate/up (Q4_K and
Q8_0 768x2048) and down (Q6_K 2048x768), 200 distinct matrices each, and its 159744x2048 Q6_K
head in the R16 layout colibri reads it in; Gemma's Q5_0 layer shape and Q8_0 head in R16.
--in-cache times one matrix of each expert shape over and over instead (in L2: the compute rate),
in the file's layout and in R16. --lowbit times the low-bit types (issue #45) on DeepSeek-V3's
expert gate/up shape (2048 x 7168), 1 and 16 tokens, with each side's weight GB/s and its share of
the one-thread streaming read bandwidth (tools/bench/membw.c: the memory roofline). Rounds alternate the cases; each line is one run's median over
its iterations (and its best).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = [  # type, rows, cols, matrices, iterations, r16, what
    (12, 768, 2048, 200, 2000, 0, "Q4_K 768x2048 (expert gate/up)"),
    (14, 2048, 768, 200, 2000, 0, "Q6_K 2048x768 (expert down)"),
    (8, 768, 2048, 200, 2000, 0, "Q8_0 768x2048 (Q8_0 expert)"),
    (14, 159744, 2048, 1, 12, 1, "Q6_K_R16 159744x2048 (head)"),
    (6, 2048, 640, 200, 3000, 1, "Q5_0_R16 2048x640 (Gemma layer)"),
    (8, 262144, 640, 1, 12, 1, "Q8_0_R16 262144x640 (Gemma head)"),
]
# --in-cache: one matrix over and over (it stays in L2): what the tiles compute, the file's layout
# (the experts') against R16 (the dense matrices')
LOWBIT = {"Q2_K": 10, "Q3_K": 11, "IQ4_XS": 23, "IQ2_XXS": 16, "IQ3_XXS": 18, "TQ2_0": 35,
          "IQ1_S": 19, "IQ1_M": 29, "IQ2_XS": 17, "IQ2_S": 22, "IQ3_S": 21, "IQ4_NL": 20, "TQ1_0": 34}
CACHE_CASES = [(t, rows, cols, 1, 4000, r16, f"{name} {rows}x{cols} {'R16' if r16 else 'direct'}, in L2")
               for t, rows, cols, name in ((12, 768, 2048, "Q4_K"), (14, 2048, 768, "Q6_K"),
                                           (8, 768, 2048, "Q8_0"))
               for r16 in (0, 1)]


def build(out: Path, cflags: list[str]) -> Path:
    srcs = sorted((ROOT / "colibri" / "_core").glob("*.c"))
    flags = ["-O3", "-march=native", "-std=c11", "-D_GNU_SOURCE", "-pthread", f"-I{ROOT / 'include'}",
             f"-I{ROOT / 'colibri' / '_core'}", f"-I{ROOT / 'cuda'}", *cflags]

    def cc(src: Path) -> Path:
        obj = out / (src.stem + ".o")
        subprocess.run(["gcc", *flags, "-c", str(src), "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        objs = list(ex.map(cc, srcs))
    exe = out / "vs_ggml_matvec"
    subprocess.run(["gcc", *flags, str(ROOT / "tools" / "bench" / "vs_ggml_matvec.c"), *map(str, objs),
                    "-lm", "-ldl", "-o", str(exe)], check=True)
    return exe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cflags", default="", help="extra C flags for colibri's sources")
    ap.add_argument("--far-hint", type=int, choices=(0, 1, 2, 3),
                    help="the far prefetches' locality (CB_PF_FAR_HINT; colibri's: 1, prefetcht2)")
    ap.add_argument("--threads", type=int, default=1, help="colibri's threads (ggml: 1)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--avx2", action="store_true",
                    help="cap colibri at its AVX2 kernels (the R16 cases are skipped: colibri "
                         "uses R16 only with AVX-512 VNNI)")
    ap.add_argument("--in-cache", action="store_true",
                    help="one matrix per expert shape, direct and R16, over and over (in L2)")
    ap.add_argument("--lowbit", action="store_true", help="the low-bit types (see above)")
    ap.add_argument("--types", default=",".join(LOWBIT), help="--lowbit: which types")
    ap.add_argument("--tokens", default="1,16", help="--lowbit: token counts")
    ap.add_argument("--shape", default="2048x7168", help="--lowbit: ROWSxCOLS")
    ap.add_argument("--membw", type=float, help="--lowbit: the roofline in GB/s (default: measured)")
    a = ap.parse_args(argv)
    try:
        import llama_cpp
    except ImportError:
        print("needs llama-cpp-python (pip install llama-cpp-python)", file=sys.stderr)
        return 2
    env = dict(os.environ, GGMLCPU=str(Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"))
    if a.avx2:
        env["VS_GGML_MAX_SIMD"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        cflags = a.cflags.split() + ([f"-DCB_PF_FAR_HINT={a.far_hint}"] if a.far_hint is not None else [])
        exe = build(Path(tmp), cflags)
        if a.lowbit:
            return lowbit(a, exe, env)
        for r in range(a.rounds):
            for t, rows, cols, nm, it, r16, what in (CACHE_CASES if a.in_cache else CASES):
                if r16 and a.avx2:  # colibri re-lays matrices in R16 only with AVX-512 VNNI
                    if r == 0:
                        print(f"skipped {what}: no R16 layout below AVX-512 VNNI", flush=True)
                    continue
                out = subprocess.run([str(exe), str(t), str(rows), str(cols), str(nm), str(it),
                                      str(a.threads), str(r16)], env=env, check=True,
                                     capture_output=True, text=True).stdout.strip()
                print(f"round {r + 1} {what:36s} {out}", flush=True)
    return 0


def lowbit(a: argparse.Namespace, exe: Path, env: dict[str, str]) -> int:
    """The low-bit table: per type and token count, rounds alternating the cases, then the
    medians of the rounds' medians."""
    import re
    import statistics

    from colibri.tools.membw import membw

    rows, cols = (int(v) for v in a.shape.split("x"))
    bws: list[float] = []
    res: dict[tuple[str, int], list[tuple[float, float, float, float]]] = {}
    pat = re.compile(r"colibri ([\d.]+) us \(([\d.]+) GB/s\).*ggml ([\d.]+) us \(([\d.]+) GB/s\)")
    for r in range(a.rounds):
        # the roofline: the best one-thread streaming read of the rounds (a loaded machine reads
        # less in some probes; the best is the closest to what the memory delivers)
        bws.append(a.membw or membw(1, 512))
        print(f"round {r + 1}: one-thread streaming read {bws[-1]:.1f} GB/s; load {os.getloadavg()}", flush=True)
        for name in a.types.split(","):
            for nt in (int(v) for v in a.tokens.split(",")):
                it = max(6, 600 // (nt * 4))
                p = subprocess.run([str(exe), str(LOWBIT[name]), str(rows), str(cols), "24", str(it),
                                    str(a.threads), "0", str(nt)], env=env, capture_output=True, text=True)
                if p.returncode:
                    print(f"round {r + 1} {name} x{nt}: {p.stderr.strip()}", flush=True)
                    continue
                m = pat.search(p.stdout)
                assert m, p.stdout
                res.setdefault((name, nt), []).append(tuple(float(v) for v in m.groups()))  # type: ignore[arg-type]
                print(f"round {r + 1} {name:8s} x{nt:<2d} {p.stdout.strip()}", flush=True)
    bw = max(bws)
    print(f"\nmedians of {a.rounds} rounds, {rows}x{cols}, threads {a.threads}, roofline {bw:.1f} GB/s "
          f"(one-thread membw, best of the rounds)")
    print("| type | tokens | colibri us | GB/s | roofline | ggml us | GB/s | roofline | colibri speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, nt), v in res.items():
        tc, gc, tg, gg = (statistics.median(x[i] for x in v) for i in range(4))
        print(f"| {name} | {nt} | {tc:.0f} | {gc:.1f} | {gc / bw:.0%} | {tg:.0f} | {gg:.1f} | {gg / bw:.0%} "
              f"| {tg / tc:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
