#!/usr/bin/env python3
"""The tiny random models of the oracle families (tests/oracle_models.py) in colibri, in
transformers and in llama.cpp, on the same GGUF file:

    PYTHONPATH=. python tools/dev/families_vs_llama.py --llama-python PY [FAMILY ...]

PY: an interpreter with llama-cpp-python installed (its own venv: `pip install
llama-cpp-python` builds llama.cpp). For each family (default: all of oracle_models.FAMILIES)
the model is built and converted (f32) as the oracle tests do, colibri's and transformers'
logits over a 40-token prompt are computed here, llama.cpp's in PY, and the table gives each
pair's largest difference relative to the logits' range and the top-1 agreement of colibri with
llama.cpp. dots1 is built with as many KV heads as heads (llama.cpp's dots1 has no GQA).
llama.cpp refuses some synthetic files (phi3: its vocabulary checks); those rows say so.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

LLAMA = r"""
import json, sys, numpy as np, llama_cpp
out = {}
for fam, path, ids in json.load(open(sys.argv[1])):
    try:
        llm = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=2)
        llm.eval(ids)
        np.save(path + ".llama.npy", np.array(llm.scores[:len(ids)], dtype=np.float32))
        out[fam] = None
    except Exception as e:
        out[fam] = f"{type(e).__name__}: {e}"
json.dump(out, open(sys.argv[2], "w"))
"""


def main(argv: list[str] | None = None) -> int:
    import oracle_models as om

    from colibri.model import Model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("families", nargs="*")
    a = ap.parse_args(argv)
    fams = a.families or list(om.FAMILIES)
    base = om.family_configs

    def no_gqa_dots1():  # llama.cpp's dots1 makes K and V as wide as Q
        cfgs, common = base()
        cls, model, extra = cfgs["dots1"]
        return {**cfgs, "dots1": (cls, model, dict(extra, num_key_value_heads=4))}, common

    om.family_configs = no_gqa_dots1
    tmp = Path(tempfile.mkdtemp(prefix="families-vs-llama-"))
    ids = om.prompt(40, seed=1)
    ours, hf, jobs = {}, {}, []
    for fam in fams:
        model, paths = om.build(fam, tmp, ("f32",))
        with Model(paths["f32"], threads=2, ctx=256, verbose=False) as m:
            ours[fam] = m.logits(ids)
        hf[fam] = om.hf_logits(model, ids)
        jobs.append((fam, str(paths["f32"]), ids))
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    subprocess.run([a.llama_python, "-c", LLAMA, str(tmp / "jobs.json"), str(tmp / "out.json")],
                   check=True, env=dict(os.environ, PYTHONPATH=""))
    errors = json.loads((tmp / "out.json").read_text())

    def rel(x: np.ndarray, ref: np.ndarray) -> float:
        return float(np.abs(x - ref).max() / np.abs(ref).max())

    print(f"{'family':18s} {'colibri-llama.cpp':>18s} {'top-1':>6s} {'llama.cpp-HF':>13s} "
          f"{'colibri-HF':>11s}")
    for fam, path, _ in jobs:
        if errors.get(fam):
            print(f"{fam:18s} llama.cpp refused the file: {errors[fam][:60]}")
            continue
        lg = np.load(path + ".llama.npy")
        top1 = float((lg.argmax(-1) == ours[fam].argmax(-1)).mean())
        print(f"{fam:18s} {rel(ours[fam], lg):18.2e} {top1:6.3f} {rel(lg, hf[fam]):13.2e} "
              f"{rel(ours[fam], hf[fam]):11.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
