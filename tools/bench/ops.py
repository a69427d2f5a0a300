"""Float ops (ops.h) against numpy float32 doing the same work, in one run.

Each op is validated against a float64 numpy reference first, then timed (best of several
repeats) through the Python wrappers (which copy their input: the copy is included in both
columns where numpy also allocates). Reports microseconds per call and the speed-up over numpy,
at the AVX2 and scalar levels.

    python tools/bench/ops.py [--rows 32] [--n 4096]
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

import colibri._core._ops as ops
from colibri.simd import detected, max_simd


def _np_rmsnorm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_silu(x):
    return x / (1 + np.exp(-x))


def _np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x**3)))


def _np_rope_neox(x, pos, base=10000.0):
    d = x.shape[-1]
    theta = pos[:, None] * base ** (-2 * np.arange(d // 2) / d)
    c, s = np.cos(theta).astype(np.float32)[:, None], np.sin(theta).astype(np.float32)[:, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def best(f, number=20, repeat=5):
    return min(timeit.repeat(f, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.n)).astype(np.float32)
    w = rng.standard_normal(args.n).astype(np.float32)
    q = rng.standard_normal((args.rows, 32, 128)).astype(np.float32)
    pos = np.arange(args.rows) + 1000
    cases = [
        ("rmsnorm", lambda: ops.rmsnorm(x, w), lambda: _np_rmsnorm(x, w)),
        ("softmax", lambda: ops.softmax(x), lambda: _np_softmax(x)),
        ("silu", lambda: ops.silu(x), lambda: _np_silu(x)),
        ("gelu_tanh", lambda: ops.gelu_tanh(x), lambda: _np_gelu(x)),
        ("glu(silu)", lambda: ops.glu(x, x), lambda: _np_silu(x) * x),
        ("rope neox 32x128", lambda: ops.rope(q, pos, mode="neox"), lambda: _np_rope_neox(q, pos)),
    ]
    print(f"shape ({args.rows}, {args.n}); rope q ({args.rows}, 32, 128); detected {detected()}")
    print(f"{'op':18s} {'level':7s} {'colibri us':>11s} {'numpy us':>10s} {'speed-up':>9s}")
    for level in ("avx2", "scalar"):
        with max_simd(level):
            for name, ours, ref in cases:
                np.testing.assert_allclose(ours(), ref(), rtol=2e-4, atol=2e-5)
                t_ours, t_np = best(ours), best(ref)
                print(f"{name:18s} {level:7s} {t_ours:11.1f} {t_np:10.1f} {t_np / t_ours:8.2f}x")


if __name__ == "__main__":
    main()
