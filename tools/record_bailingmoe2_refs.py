#!/usr/bin/env python3
"""Record llama.cpp's outputs on the tiny bailingmoe2 (Ling/Ring 2.0) model of
tests/oracle_models.build_bailingmoe2, for tests/model/test_bailingmoe2.py: transformers has no
BailingMoeV2 class, so llama.cpp is the reference.

    python tools/record_bailingmoe2_refs.py --llama-python PY [--out tests/data/llama_refs/bailingmoe2.npz]

PY: an interpreter with llama-cpp-python (0.3.36 was used). For the f32 and q8_0 files it
stores the GGUF's SHA-256 (the test rebuilds the file and refuses a different one), llama.cpp's
TOP_K best next tokens with their log-probabilities at every position of a 40-token prompt
(teacher-forced), and its greedy continuation (N_GREEDY tokens) of a 12-token prompt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
TOP_K = 32
N_GREEDY = 16
OUTTYPES = ("f32", "q8_0")

LLAMA = r"""
import json, sys, numpy as np, llama_cpp
path, ids, start, n = json.load(open(sys.argv[1]))
llm = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=2)
llm.eval(ids)
np.save(path + ".logits.npy", np.array(llm.scores[:len(ids)], dtype=np.float32))
llm.reset()
llm.eval(start)
greedy = []
for _ in range(n):
    t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    greedy.append(t)
    llm.eval([t])
np.save(path + ".greedy.npy", np.array(greedy, dtype=np.int32))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--out", default=str(ROOT / "tests/data/llama_refs/bailingmoe2.npz"))
    args = ap.parse_args()
    from oracle_models import build_bailingmoe2, prompt

    ids, start = prompt(40, seed=1), prompt(12, seed=2)
    rec: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as d:
        paths = build_bailingmoe2(Path(d), OUTTYPES)
        for o in OUTTYPES:
            p = str(paths[o])
            job = Path(d) / f"{o}.json"
            job.write_text(json.dumps([p, ids, start, N_GREEDY]))
            subprocess.run([args.llama_python, "-c", LLAMA, str(job)], check=True)
            logits = np.load(p + ".logits.npy").astype(np.float64)
            lp = logits - logits.max(1, keepdims=True)
            lp -= np.log(np.exp(lp).sum(1, keepdims=True))
            top = np.argsort(-lp, axis=1, kind="stable")[:, :TOP_K]
            rec[f"{o}_sha256"] = np.array(hashlib.sha256(Path(p).read_bytes()).hexdigest())
            rec[f"{o}_top_ids"] = top.astype(np.int32)
            rec[f"{o}_top_logprobs"] = np.take_along_axis(lp, top, 1).astype(np.float32)
            rec[f"{o}_greedy"] = np.load(p + ".greedy.npy")
            print(f"{o}: {Path(p).stat().st_size} bytes, greedy {rec[f'{o}_greedy'].tolist()}")
    rec["ids"], rec["start"] = np.array(ids, np.int32), np.array(start, np.int32)
    np.savez_compressed(args.out, **rec)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
