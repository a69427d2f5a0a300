#!/usr/bin/env python3
"""Make the low-bit files of issue 45 with llama.cpp's own quantizer and record llama.cpp's
outputs on them, for tests/model/test_lowbit_llama_refs.py (which checks colibri against the
recording without llama.cpp):

    PYTHONPATH=. .venv/bin/python tools/quantize_lowbit_refs.py --llama-python PY
        [--bin-dir DIR] [--out-dir tests/data/lowbit] [--refs tests/data/llama_refs/lowbit.npz]

PY: an interpreter with llama-cpp-python (0.3.36 was used). llama-quantize and llama-imatrix
come from --bin-dir, else are built from the same release's sdist in ~/.cache/colibri/llama.cpp
(colibri.tools.llama_build, as tools/bench/serve.py builds llama-server; minutes). Steps
(colibri/tools/lowbit_refs.py has the recipes):
- the MoE bench model (make_bench_model, shape tiny-lowbit, 1 layer, Q8_0, spread routers),
  expanded to F32 with its output head scaled (lowbit_refs.OUTPUT_SCALE);
- `llama-imatrix` over tests/data/lowbit/imatrix.txt (chunks of 128 tokens);
- `llama-quantize` once per recipe: Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, IQ2_XXS (imatrix), IQ2_M
  (imatrix), IQ1_S (imatrix), IQ3_XXS, IQ4_XS, TQ2_0 and a per-tensor override mix
  (`--tensor-type`, imatrix), written to --out-dir as NAME.gguf;
- llama.cpp on each file: two prompts teacher-forced (top-64 log-probabilities per position),
  the same fed one token at a time (top-1: llama.cpp's agreement with itself), 16 greedy tokens;
- the recording (with each file's SHA-256 and tensor types, the imatrix text's SHA-256) in
  --refs, then colibri's agreement with it printed per file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from colibri.tools import llama_build
from colibri.tools import lowbit_refs as lr

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "lowbit"
REFS = ROOT / "tests" / "data" / "llama_refs" / "lowbit.npz"


def run(argv: list[str]) -> None:
    print("$", " ".join(argv), flush=True)
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"{os.path.basename(argv[0])} failed ({p.returncode})")


def make_files(bins: dict[str, str], tmp: Path, out_dir: Path) -> dict[str, Path]:
    from colibri.tools.make_bench_model import write

    src = write(str(tmp / "src-q8_0.gguf"), lr.LAYERS, kind="q8_0", seed=lr.SEED,
                shape=lr.SHAPE, routing="spread")
    f32 = tmp / "src-f32.gguf"
    lr.write_dequantized(src, f32, {"output.weight": lr.OUTPUT_SCALE})
    imatrix = tmp / "imatrix.gguf"
    run([bins["llama-imatrix"], "-m", str(f32), "-f", str(out_dir / "imatrix.txt"), "-o",
         str(imatrix), "-c", str(lr.IMATRIX_CTX), "-b", str(lr.IMATRIX_CTX), "-t",
         str(lr.THREADS), "--no-ppl"])
    files = {}
    for name, qtype, use_imatrix, extra in lr.RECIPES:
        dst = out_dir / f"{name}.gguf"
        args = [bins["llama-quantize"]] + (["--imatrix", str(imatrix)] if use_imatrix else [])
        run(args + extra + [str(f32), str(dst), qtype, str(lr.THREADS)])
        files[name] = dst
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--bin-dir", help="where llama-quantize and llama-imatrix are (default: "
                    "build them in ~/.cache/colibri/llama.cpp)")
    ap.add_argument("--out-dir", default=str(OUT_DIR))
    ap.add_argument("--refs", default=str(REFS))
    a = ap.parse_args(argv)
    targets = ("llama-quantize", "llama-imatrix")
    bins = ({t: str(Path(a.bin_dir) / t) for t in targets} if a.bin_dir
            else llama_build.build(*targets))
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lowbit-refs-") as t:
        tmp = Path(t)
        files = make_files(bins, tmp, out_dir)
        job = [[[n, str(p)] for n, p in files.items()], lr.prompts(), lr.TOP_K,
               lr.N_GREEDY, lr.THREADS, str(tmp / "llama.npz")]
        (tmp / "job.json").write_text(json.dumps(job))
        subprocess.run([a.llama_python, "-c", lr.LLAMA_SCRIPT, str(tmp / "job.json")],
                       check=True, env=dict(os.environ, PYTHONPATH=""))
        data = dict(np.load(tmp / "llama.npz"))
    for name, path in files.items():
        types = lr.tensor_types(path)
        data[f"{name}__sha256"] = np.array(lr.sha256(path))
        data[f"{name}__tensor_names"] = np.array([n for n, _ in types])
        data[f"{name}__tensor_types"] = np.array([t for _, t in types])
    data["names"] = np.array(list(files))
    data["imatrix_text_sha256"] = np.array(lr.sha256(out_dir / "imatrix.txt"))
    data["top_k"] = np.array(lr.TOP_K)
    Path(a.refs).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(a.refs, **data)
    total = sum(p.stat().st_size for p in files.values())
    print(f"wrote {a.refs} ({Path(a.refs).stat().st_size} bytes) and {len(files)} files in "
          f"{out_dir} ({total / 2**20:.2f} MiB)")
    refs = np.load(a.refs)
    print(f"{'file':11s} {'MiB':>5s} {'top-1':>6s} {'llama self':>10s} {'KL mean':>9s} "
          f"{'KL max':>9s} {'greedy':>8s}  types")
    for name, path in files.items():
        r = lr.compare(path, refs, name)
        kinds = sorted(set(str(x) for x in refs[f"{name}__tensor_types"]) - {"F32"})
        print(f"{name:11s} {path.stat().st_size / 2**20:5.2f} {r['top1']:6.3f} "
              f"{r['llama_self_top1']:10.3f} {r['kl_mean']:9.2e} {r['kl_max']:9.2e} "
              f"{str(r['greedy']):>8s}  {','.join(kinds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
