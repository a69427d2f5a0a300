"""The measures of tools/bench/quant_accuracy.py (colibri/tools/quant_accuracy.py): KL and top-1
against a direct float64 computation (scipy-free: the definition written out per row)."""

from __future__ import annotations

import numpy as np
import pytest

from colibri.tools.quant_accuracy import kl_top1


def _direct(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    kls, agree = [], 0
    for a, b in zip(ref.astype(np.float64), got.astype(np.float64), strict=True):
        p = np.exp(a - a.max())
        p /= p.sum()
        q = np.exp(b - b.max())
        q /= q.sum()
        kls.append(float(np.sum(p * (np.log(p) - np.log(q)))))
        agree += int(np.argmax(a) == np.argmax(b))
    return float(np.mean(kls)), agree / len(ref)


def test_kl_top1_against_the_definition():
    rng = np.random.default_rng(7)
    ref = rng.normal(size=(37, 300)).astype(np.float32) * 3
    got = ref + rng.normal(size=ref.shape).astype(np.float32) * 0.5
    f = kl_top1(ref, got, chunk=8)  # several chunks, the last one short
    kl, top1 = _direct(ref, got)
    assert f.n == 37
    assert f.kl == pytest.approx(kl, rel=1e-9)
    assert f.top1 == pytest.approx(top1)
    assert 0.0 < f.top1 < 1.0 and f.kl > 0.01  # the case separates the measures


def test_kl_top1_identity_shift_and_direction():
    rng = np.random.default_rng(8)
    ref = rng.normal(size=(5, 64)).astype(np.float32)
    same = kl_top1(ref, ref + 4.0)  # a constant shift is the same distribution
    assert abs(same.kl) < 1e-12 and same.top1 == 1.0
    flat = np.zeros_like(ref)
    # KL(ref || uniform) = log(V) - H(ref), not the other direction
    r64 = ref.astype(np.float64)
    p = np.exp(r64 - r64.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = float(np.mean(np.log(64) + (p * np.log(p)).sum(axis=1)))
    assert kl_top1(ref, flat).kl == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError):
        kl_top1(ref, ref[:4])
