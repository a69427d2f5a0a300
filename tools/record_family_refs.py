#!/usr/bin/env python3
"""Record llama.cpp's outputs on the tiny random models of the families of issue 48, for
tests/model/test_family_llama_refs.py, which checks colibri against them without llama.cpp.

    PYTHONPATH=. .venv/bin/python tools/record_family_refs.py --llama-python PY [--out F]

PY: an interpreter with llama-cpp-python (its own venv; 0.3.36 was used). For each family of
tests/family_refs.py (gemma2, phi3, phi3_longrope, phimoe, dots1, glm4moe, ernie4_5_moe,
granitemoe, granitemoeshared, hunyuan_v1_moe, gemma4, gemma4_ple) this:
- builds the seeded model of tests/oracle_models.py twice and converts it with colibri's
  converter to f16 and q8_0, and stops if the two builds' files differ (the test rebuilds them
  and relies on the same bytes); dots1 has as many KV heads as heads (llama.cpp's has no GQA);
- quantizes the f16 file to Q4_K_M with llama.cpp (llama_model_quantize). The models are 64
  wide, so no tensor can take Q4_K or Q6_K (rows of 256): llama.cpp falls back to Q5_0 and
  Q8_0, and the types that resulted are recorded per tensor. Those files are not checked in:
  the gguf package's quantizers give the same tensor bytes (checked here, through the
  tensors' digest), so the test rebuilds them from the f16 file (tests/family_refs.py);
- runs llama.cpp on the three files: teacher-forced on two prompts (48 and 80 tokens), the
  TOP_K most likely next tokens with their log-probabilities at every position, and each
  prompt's greedy continuation (N_GREEDY tokens);
- stores it with the SHA-256 of each file (the Q4_K_M one also as a tensor digest, which the
  rebuild must reproduce) in tests/data/llama_refs/families.npz, and prints colibri's
  agreement with it (top-1, KL, greedy tokens matched).
A family whose file llama.cpp refuses to load is listed with llama.cpp's message (phi3 and
phi3_longrope: "error loading model vocabulary: unordered_map::at", thrown by
llama.cpp's vocabulary loader on the synthetic 320-token vocabulary: a lookup of a token by its
text that the vocabulary does not have) and nothing is recorded.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

LLAMA = r"""
import ctypes, json, sys, numpy as np, llama_cpp
jobs, out_dir, top_k, n_greedy = json.load(open(sys.argv[1]))
out, logs = {}, []
@llama_cpp.llama_log_callback
def keep_log(level, text, user):  # llama.cpp's own reason when it refuses a file
    logs.append(text.decode(errors="replace").strip())
llama_cpp.llama_log_set(keep_log, ctypes.c_void_p(0))
def lsm(x):
    x = x.astype(np.float64); x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
for fam, files, prompts in jobs:
    logs.clear()
    try:
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
        p.nthread = 2
        q4 = files["f16"].replace("-f16.gguf", "-q4_k_m.gguf")
        rc = llama_cpp.llama_model_quantize(files["f16"].encode(), q4.encode(), p)
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize returned {rc}")
        files = dict(files, q4_k_m=q4)
        data = {}
        for t, path in files.items():
            llm = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=2,
                                  seed=0)
            for i, ids in enumerate(prompts):
                llm.reset()
                llm.eval(ids)
                lp = lsm(np.array(llm.scores[:len(ids)], dtype=np.float32))
                top = np.argsort(-lp, axis=1, kind="stable")[:, :top_k]
                data[f"{t}__top_ids_{i}"] = top.astype(np.int16)
                data[f"{t}__top_logprobs_{i}"] = np.take_along_axis(lp, top, 1).astype(np.float32)
                g, nxt = [], int(np.argmax(llm.scores[len(ids) - 1]))
                for _ in range(n_greedy):
                    g.append(nxt)
                    llm.eval([nxt])
                    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                data[f"{t}__greedy_{i}"] = np.array(g, dtype=np.int16)
            del llm
        np.savez(f"{out_dir}/{fam}.npz", **data)
        out[fam] = {"q4_k_m": q4}
    except Exception as e:
        why = [m for m in logs if "error" in m]
        out[fam] = {"error": f"{type(e).__name__}: {e}" + (f" ({why[-1]})" if why else "")}
out["version"] = llama_cpp.__version__
json.dump(out, open(f"{out_dir}/out.json", "w"))
"""


def main(argv: list[str] | None = None) -> int:
    import family_refs as fr

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--out", default=str(fr.REFS))
    ap.add_argument("families", nargs="*")
    a = ap.parse_args(argv)
    fams = a.families or fr.FAMILIES
    tmp = Path(tempfile.mkdtemp(prefix="family-refs-"))
    jobs, hashes = [], {}
    for fam in fams:
        one = fr.build_ggufs(fam, tmp / "a")
        two = fr.build_ggufs(fam, tmp / "b")
        for t in one:
            h1, h2 = fr.sha256(one[t]), fr.sha256(two[t])
            if h1 != h2:
                print(f"{fam} {t}: two builds differ ({h1[:12]} vs {h2[:12]}): not "
                      "deterministic, nothing recorded", file=sys.stderr)
                return 1
            hashes[(fam, t)] = h1
        jobs.append((fam, {t: str(p) for t, p in one.items()}, fr.PROMPTS))
    (tmp / "jobs.json").write_text(json.dumps([jobs, str(tmp), fr.TOP_K, fr.N_GREEDY]))
    subprocess.run([a.llama_python, "-c", LLAMA, str(tmp / "jobs.json")], check=True,
                   env=dict(os.environ, PYTHONPATH=""))
    res = json.loads((tmp / "out.json").read_text())
    data: dict[str, np.ndarray] = {}
    recorded, refused = [], []
    for fam, files, _ in jobs:
        if "error" in res[fam]:
            refused.append(f"{fam}: {res[fam]['error']}")
            print(f"{fam}: llama.cpp refused it: {res[fam]['error']}")
            continue
        q4 = Path(res[fam]["q4_k_m"])
        types = fr.tensor_types(q4)
        digest = fr.tensor_digest(q4)
        rebuilt = fr.write_q4_k_m(Path(files["f16"]), types, tmp / f"{fam}-rebuilt.gguf")
        if fr.tensor_digest(rebuilt) != digest:
            print(f"{fam}: the gguf package's Q4_K_M rebuild differs from llama.cpp's tensors",
                  file=sys.stderr)
            return 1
        recorded.append(fam)
        for k, v in np.load(tmp / f"{fam}.npz").items():
            t, what = k.split("__")
            data[fr.key(fam, t, what)] = v
        for t in ("f16", "q8_0"):
            data[fr.key(fam, t, "sha256")] = np.array(hashes[(fam, t)])
        data[fr.key(fam, "q4_k_m", "sha256")] = np.array(fr.sha256(q4))
        data[fr.key(fam, "q4_k_m", "tensor_digest")] = np.array(digest)
        data[fr.key(fam, "q4_k_m", "tensor_names")] = np.array([n for n, _ in types])
        data[fr.key(fam, "q4_k_m", "tensor_types")] = np.array([t for _, t in types])
    data["families"] = np.array(recorded)
    data["refused"] = np.array(refused)
    data["llama_cpp_version"] = np.array(res["version"])
    data["top_k"] = np.array(fr.TOP_K)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(a.out, **data)
    print(f"wrote {a.out} ({Path(a.out).stat().st_size} bytes)")
    refs = np.load(a.out)
    print(f"{'family':18s} {'type':7s} {'top-1':>6s} {'KL mean':>9s} {'KL max':>9s} "
          f"{'greedy':>8s}  Q4_K_M types")
    for fam, files, _ in jobs:
        if fam not in recorded:
            continue
        paths = {"f16": Path(files["f16"]), "q8_0": Path(files["q8_0"]),
                 "q4_k_m": tmp / f"{fam}-rebuilt.gguf"}
        kinds = sorted(set(str(x) for x in refs[fr.key(fam, "q4_k_m", "tensor_types")]))
        for t in fr.TYPES:
            r = fr.compare(paths[t], refs, fam, t)
            print(f"{fam:18s} {t:7s} {r['top1']:6.3f} {r['kl_mean']:9.2e} {r['kl_max']:9.2e} "
                  f"{str(r['greedy']):>8s}  {','.join(kinds) if t == 'q4_k_m' else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
