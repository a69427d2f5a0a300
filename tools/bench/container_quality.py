#!/usr/bin/env python3
"""What a colibri container costs: the quality of requantized experts and the time of
checksum verification at load.

    python tools/bench/container_quality.py [--model IN.gguf] [--tokens 300] [--quants ...]

Without --model, a seeded qwen3moe oracle model (transformers, random weights with a bigram
path as in tests/oracle_models.py; hidden 256, 16 experts of 256, top-4, 4 layers) is built
and converted to an F32 GGUF. With --model, any GGUF (e.g. tools/make_bench_model.py's
Qwen3-30B-A3B-shaped file: `python tools/make_bench_model.py /tmp/b.gguf --layers 2`).

For each --quants entry the GGUF is converted (`keep` must give logits bit-identical to the
GGUF: checked first, the run stops otherwise), then teacher-forced logits over --tokens tokens
are compared with the original file's: mean and p99 KL(original || container), top-1
agreement. Load cost: ContainerFile open with verify=True vs verify=False (warm page cache,
best of 3), the crc32 throughput, and Model() load time both ways; ratios against the
no-verify open measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the installed colibri (not the source tree, which has no built modules unless built in
# place); the tests' model builders from the checkout
sys.path.insert(0, os.path.join(ROOT, "tests"))

from colibri.container import ContainerFile, convert  # noqa: E402
from colibri.model import Model  # noqa: E402


def oracle_model(out: str) -> str:
    import torch
    from oracle_models import _convert_module, add_bigram_path, family_configs

    configs, common = family_configs()
    cfg_cls, model_cls, extra = configs["qwen3_moe"]
    cfg = cfg_cls(**{**common, **extra, "hidden_size": 256, "moe_intermediate_size": 256,
                     "intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
                     "num_hidden_layers": 4, "head_dim": 64})
    cfg._attn_implementation = "eager"
    torch.manual_seed(5)
    model = model_cls(cfg).eval()
    add_bigram_path(model, seed=5)
    model.save_pretrained(os.path.join(out, "hf"))
    return str(_convert_module().convert(os.path.join(out, "hf"), os.path.join(out, "oracle-f32.gguf"),
                                         "f32"))


def kl_top1(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    def logsm(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = logsm(ref), logsm(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return float(kl.mean()), float(np.percentile(kl, 99)), float(np.mean(ref.argmax(-1) == got.argmax(-1)))


def best(fn, n: int = 3) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a GGUF (default: build the oracle model)")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quants", nargs="+", default=["keep", "q8_0", "q4_0", "int4-g128"])
    ap.add_argument("--dir", help="where to write the containers (default: a temporary dir)")
    args = ap.parse_args()
    tmp = args.dir or tempfile.mkdtemp(prefix="colibri-cq-")
    os.makedirs(tmp, exist_ok=True)
    src = args.model or oracle_model(tmp)
    m0 = Model(src, threads=args.threads, ctx=args.tokens + 8, tokenizer=False)
    rng = np.random.default_rng(0)
    ids = [int(x) for x in rng.integers(3, m0.n_vocab, size=args.tokens)]
    t0 = time.perf_counter()
    ref = m0.logits(ids)
    t_ref = time.perf_counter() - t0
    gguf_load = m0.load_s
    del m0
    print(f"model {os.path.basename(src)}: {args.tokens} teacher-forced tokens "
          f"({t_ref:.1f} s on the GGUF)")
    print(f"{'quant':10s} {'convert s':>9s} {'file MiB':>9s} {'disk MiB':>9s} {'mean KL':>9s} "
          f"{'p99 KL':>9s} {'top-1':>7s}")
    rows = []
    for q in args.quants:
        dst = os.path.join(tmp, f"c-{q}.colibri")
        s = convert(src, dst, q, progress=False)
        m = Model(dst, threads=args.threads, ctx=args.tokens + 8, tokenizer=False)
        got = m.logits(ids)
        del m
        if q == "keep" and not np.array_equal(got, ref):
            print("ERROR: keep container logits differ from the GGUF's", file=sys.stderr)
            return 1
        kl, p99, top1 = kl_top1(ref, got)
        rows.append((q, dst))
        print(f"{q:10s} {s['seconds']:9.1f} {s['file_size'] / 2**20:9.1f} "
              f"{s['disk_bytes'] / 2**20:9.1f} {kl:9.2e} {p99:9.2e} {top1 * 100:6.1f}%")
    # load cost of verification (warm page cache)
    q, dst = rows[0]
    with ContainerFile(dst) as c:
        data_bytes = (c.dense_end - c.dense_start) + sum(g.used * g.n_expert for g in c.groups)
    t_nv = best(lambda: ContainerFile(dst, verify=False).close())
    t_v = best(lambda: ContainerFile(dst, verify=True).close())
    ml_nv = best(lambda: Model(dst, threads=1, ctx=16, tokenizer=False, verify=False), 2)
    ml_v = best(lambda: Model(dst, threads=1, ctx=16, tokenizer=False, verify=True), 2)
    ml_g = best(lambda: Model(src, threads=1, ctx=16, tokenizer=False), 2)
    print(f"\nverification ({q} container, {data_bytes / 2**20:.1f} MiB of data, warm cache):")
    print(f"  ContainerFile open: verify {t_v * 1e3:.1f} ms, no verify {t_nv * 1e3:.1f} ms "
          f"({t_v / t_nv:.1f}x); crc32 {data_bytes / max(t_v - t_nv, 1e-9) / 2**30:.2f} GiB/s")
    print(f"  Model load: verify {ml_v * 1e3:.0f} ms, no verify {ml_nv * 1e3:.0f} ms "
          f"({ml_v / ml_nv:.2f}x), the GGUF {ml_g * 1e3:.0f} ms (first GGUF load {gguf_load:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
