"""Decode time per token with the KV cache in pages of 256 tokens against pages of one token
(position-major), in one process, interleaved (ABBA), at a long context.

    PYTHONPATH=. python tools/bench/kv_pages.py -m moe4.gguf --ctx 4000 --threads 1

Both caches hold the same prompt (prefilled once each); the blocks of 8 decode steps alternate
between them, so both see the same machine. Prints each layout's median ms per token and the
ratio (the per-pair median and range too). The logits are the same bit for bit
(tests/model/test_kv_pages.py); only where the rows live differs (include/colibri/arena.h).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import colibri
from colibri._core import _forward
from colibri.kv import KVArena, KVCache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: the default model)")
    ap.add_argument("--ctx", type=int, default=4000, help="prompt tokens before decoding")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8, help="ABBA rounds of 2 blocks each")
    ap.add_argument("--block", type=int, default=8, help="decode steps per timed block")
    ap.add_argument("--kv-dtype", default="f32", choices=["f32", "f16"])
    a = ap.parse_args()
    m = colibri.Model(a.model, threads=a.threads, ctx=64, verbose=False, tokenizer=False)
    d = m.desc
    stride = d.kv_bytes_per_token(a.kv_dtype)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(3, min(m.n_vocab, 30000), a.ctx)]
    steps = 2 * a.block * (2 * a.rounds + 1)
    state = {}
    for page in (1, 256):
        kv = KVCache(KVArena((a.ctx + steps + 16) * stride + (1 << 20)), *d.kv_dims(), a.kv_dtype,
                     page_tokens=page)
        fw = _forward.Forward(d, kv, m.experts, m.pool, 512)
        s = kv.new_sequence()
        for i in range(0, a.ctx, 512):
            ids = prompt[i:i + 512]
            fw.run([s] * len(ids), list(range(i, i + len(ids))), tokens=ids)
        state[page] = [fw, s, a.ctx]

    def block(page: int, k: int) -> float:
        fw, s, pos = state[page]
        t0 = time.perf_counter()
        for i in range(k):
            fw.run([s], [pos + i], tokens=[100 + i])
        state[page][2] = pos + k
        return (time.perf_counter() - t0) / k

    for page in (1, 256):
        block(page, 2)
    res: dict[int, list[float]] = {1: [], 256: []}
    for r in range(a.rounds):
        for page in ((1, 256, 256, 1) if r % 2 == 0 else (256, 1, 1, 256)):
            res[page].append(block(page, a.block))
    one, paged = float(np.median(res[1])), float(np.median(res[256]))
    pairs = [x / y for x, y in zip(res[1], res[256], strict=True)]
    print(f"{d.arch}, {a.kv_dtype} KV, context {a.ctx}, {a.threads} thread(s): pages of 1 token {one * 1e3:.2f} "
          f"ms/token, of 256 tokens {paged * 1e3:.2f}: {one / paged:.3f}x (per pair: median "
          f"{np.median(pairs):.3f}, {min(pairs):.3f}-{max(pairs):.3f})")
    m.close()


if __name__ == "__main__":
    main()
