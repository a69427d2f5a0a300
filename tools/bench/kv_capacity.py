"""How much of its configured size the KV cache holds before MemoryError, per workload.

    python tools/bench/kv_capacity.py [--ctx 4096]

The cache has the default model's shape (Gemma 3 270M: 18 layers, 1 KV head of 256, f32:
36 KiB per token) in an arena sized as colibri.model.Model sizes it (ctx tokens + 1 MiB).
Workloads: 16-token sequences until full; random lengths 1..ctx arriving and leaving (the
lowest held + request / ctx at which a reserve was refused, over three seeds); 1, 5, 16, 64
sequences growing one token at a time in turn. Prints tokens held / ctx (above 1.0: the 1 MiB).
tests/core/test_kv_capacity.py asserts >= 0.95 for the same workloads.
"""

from __future__ import annotations

import argparse
import random

from colibri.kv import KVArena, KVCache

DIMS = (18, 1, 256)
STRIDE = DIMS[0] * 2 * DIMS[1] * DIMS[2] * 4


def make(ctx: int) -> KVCache:
    arena = KVArena(max(ctx, 1) * STRIDE + (1 << 20), hugepages="off")
    return KVCache(arena, *DIMS, "f32", max_sequences=4096)


def fill16(ctx: int) -> float:
    kv, held = make(ctx), 0
    try:
        while True:
            s = kv.new_sequence()
            kv.reserve(s, 16)
            kv.set_length(s, 16)
            held += 16
    except MemoryError:
        return held / ctx


def mixed(ctx: int, seed: int) -> float:
    rng, kv, held, worst = random.Random(seed), make(ctx), 0, float("inf")
    live: list[tuple[int, int]] = []
    for _ in range(3000):
        if live and rng.random() < 0.3:
            s, n = live.pop(rng.randrange(len(live)))
            kv.free_sequence(s)
            held -= n
            continue
        n, s = rng.randint(1, ctx), kv.new_sequence()
        try:
            kv.reserve(s, n)
            kv.set_length(s, n)
            live.append((s, n))
            held += n
        except MemoryError:
            kv.free_sequence(s)
            worst = min(worst, (held + n) / ctx)
    return worst


def grow(ctx: int, n_seq: int) -> tuple[float, str]:
    kv, held = make(ctx), 0
    seqs = [kv.new_sequence() for _ in range(n_seq)]
    try:
        while True:
            for s in seqs:
                n = kv.length(s) + 1
                kv.reserve(s, n)
                kv.set_length(s, n)
                held += 1
    except MemoryError as e:
        return held / ctx, str(e)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=4096)
    ctx = ap.parse_args().ctx
    print(f"ctx {ctx}, {STRIDE} bytes/token")
    print(f"16-token sequences: {fill16(ctx):.4f}")
    print(f"random lengths, lowest refused (held + request) / ctx: "
          f"{min(mixed(ctx, s) for s in range(3)):.4f}")
    msg = ""
    for n in (1, 5, 16, 64):
        frac, msg = grow(ctx, n)
        print(f"{n} sequences growing a token at a time: {frac:.4f}")
    print("last MemoryError:", msg)


if __name__ == "__main__":
    main()
