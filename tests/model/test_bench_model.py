"""The benchmark model's `spread` routing (colibri/tools/make_bench_model.py): a router calibrated on
hidden states that share a large common direction and have very unequal variances must route
held-out states of the same kind evenly over the experts, where a random router (what the
`raw` model has) concentrates on a few. The hidden states here are synthetic, drawn from a known
distribution, so the expectation comes from that distribution, not from the code."""

from __future__ import annotations

import numpy as np

from colibri.tools.make_bench_model import _router_from

D, E, K = 256, 64, 4


def _states(rng: np.random.Generator, n: int, common: np.ndarray, basis: np.ndarray,
            sd: np.ndarray) -> np.ndarray:
    # a common vector 3x the token part's norm plus anisotropic token-specific variation
    return common + (rng.standard_normal((n, len(sd))) * sd) @ basis


def _usage(router: np.ndarray, h: np.ndarray) -> np.ndarray:
    top = np.argsort(-(h @ router.T), axis=1)[:, :K]
    return np.bincount(top.ravel(), minlength=E)


def test_spread_router_balances_held_out_states():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((D, D)))[0].T  # orthonormal rows
    sd = np.geomspace(4.0, 0.05, D)  # variances spanning 4 orders of magnitude
    common = rng.standard_normal(D)
    common *= 3 * np.sqrt((sd**2).sum()) / np.linalg.norm(common)
    calib = _states(rng, 1024, common, basis, sd)
    held = _states(rng, 4000, common, basis, sd)
    router = _router_from(calib, E, rng, logit_std=1.5)
    assert router.shape == (E, D) and router.dtype == np.float32
    z = held @ router.T.astype(np.float64)
    # every expert's logit: mean near zero against its spread, spreads close to 1.5
    assert np.abs(z.mean(0)).max() < 0.25 * z.std(0).mean(), np.abs(z.mean(0)).max()
    assert 1.0 < z.std(0).mean() < 2.0 and z.std(0).std() < 0.25 * z.std(0).mean()
    spread = _usage(router, held)
    expect = len(held) * K / E  # 250 per expert if uniform; multinomial cv ~ 1/sqrt(250)
    assert spread.min() > 0.5 * expect and spread.max() < 1.6 * expect, (spread.min(), spread.max())
    # the same data through a random router (the raw model) piles onto a few experts
    raw = _usage(rng.standard_normal((E, D)), held)
    assert (raw > 0).sum() < E / 2 and raw.max() > 5 * expect, ((raw > 0).sum(), raw.max())
