"""cuda/routing_logic.h (the routing math shared by the CUDA kernel and the CPU router),
compiled with gcc into a small shared object and called through ctypes, against the float64
NumPy reference colibri._cuda_ref.route_reference; and the grouping reference (what the
routing kernel writes besides ids and weights) against an independent formulation."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from backend_ops_cuda import routing_lib

from colibri._cuda_ref import group_reference, route_reference, routing_capacity


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return routing_lib()  # cuda/routing_logic.h built with gcc (the op table's CPU router)


def c_route(lib, logits, k, gating, bias, renorm, scale):
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    t, e = logits.shape
    ids = np.empty((t, k), np.int32)
    w = np.empty((t, k), np.float32)
    b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    bad = lib.route_rows(logits, t, e, k, {"softmax": 0, "sigmoid": 1, "sparsemixer": 2}[gating],
                         None if b is None else b.ctypes.data, int(renorm), scale, ids, w)
    return bad, ids, w


def separated_logits(rng, t, e, gap=1e-3):
    """Random logits whose selection values are pairwise at least `gap` apart in logit space
    (a shuffled grid plus small noise), so float32 and float64 agree on the order."""
    base = np.arange(e, dtype=np.float64) * (8.0 / e)
    rows = [rng.permutation(base) for _ in range(t)]
    return (np.array(rows) - 4.0 + rng.uniform(0, 0.25 * 8.0 / e, (t, e))).astype(np.float32)


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("renorm", [False, True])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6), (128, 8), (256, 8), (16, 16)])
def test_matches_numpy(lib, gating, use_bias, renorm, e, k):
    rng = np.random.default_rng(e * 100 + k + 7 * use_bias + 13 * renorm)
    logits = separated_logits(rng, 50, e)
    # A bias that reorders experts but keeps selection values separated: multiples of 1.5,
    # more than the spread of the scores (0..1), so no score + bias can nearly tie another.
    bias = (rng.integers(-3, 4, e) * 1.5).astype(np.float32) if use_bias else None
    scale = 2.5 if renorm else 1.0
    bad, ids, w = c_route(lib, logits, k, gating, bias, renorm, scale)
    rids, rw = route_reference(logits, k, gating, bias, renorm, scale)
    assert bad == 0
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_allclose(w, rw, rtol=3e-6, atol=1e-9)


@pytest.mark.parametrize("e", [4, 16, 64])
def test_sparsemixer_matches_transformers(lib, e):
    """PhiMoE's routing (CB_GATING_SPARSEMIXER) against transformers' own sparsemixer (eval
    mode, jitter 0.01, top 2): logits whose neighbours fall inside and outside the jitter band
    of the maximum (rows with all logits near 0, mixed signs, a row of equal logits and zeros)."""
    import torch
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    rng = np.random.default_rng(e)
    rows = [rng.normal(0, s, e) for s in (0.01, 0.3, 3.0) for _ in range(20)]
    near = rng.normal(2.0, 1.0, e)
    near[:3] = [2.0, 1.99, 1.97]  # inside, inside, outside the band of 2.0 (2 * 0.01 relative)
    rows += [near, np.full(e, 0.5), np.zeros(e), -np.abs(rng.normal(1, 1, e))]
    logits = np.array(rows, np.float32)
    bad, ids, w = c_route(lib, logits, 2, "sparsemixer", None, False, 1.0)
    want_w, want_ids = sparsemixer(torch.from_numpy(logits), jitter_eps=0.01, training=False)
    assert bad == 0
    np.testing.assert_array_equal(ids, want_ids.numpy())
    np.testing.assert_allclose(w, want_w.numpy(), rtol=2e-6, atol=0)
    assert (w < 0.999).any() and (w[:, 1] < 0.999).any()  # some bands hold several experts


def test_ties_go_to_lower_id(lib):
    logits = np.zeros((3, 10), np.float32)
    logits[1, [2, 7]] = 1.0
    logits[2] = [0, 5, 0, 5, 0, 5, 0, 5, 0, 5]
    bad, ids, _ = c_route(lib, logits, 3, "softmax", None, False, 1.0)
    rids, _ = route_reference(logits, 3, "softmax")
    assert bad == 0
    np.testing.assert_array_equal(ids, rids)
    assert ids.tolist() == [[0, 1, 2], [2, 7, 0], [1, 3, 5]]


def test_bias_selects_but_does_not_weight(lib):
    logits = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    bias = np.array([0.0, 0.0, 0.0, 5.0], np.float32)
    bad, ids, w = c_route(lib, logits, 2, "sigmoid", bias, False, 1.0)
    assert bad == 0 and ids.tolist() == [[3, 0]]
    np.testing.assert_allclose(w[0], 1 / (1 + np.exp(-np.array([-1.0, 2.0]))), rtol=1e-6)


def test_rejects_nonfinite(lib):
    logits = np.array([[0.0, np.nan, 1.0], [0.0, 1.0, 2.0]], np.float32)
    bad, ids, w = c_route(lib, logits, 2, "softmax", None, False, 1.0)
    assert bad == 1
    assert ids[0].tolist() == [-1, -1] and w[0].tolist() == [0.0, 0.0]
    assert ids[1].tolist() == [2, 1]


def independent_grouping(ids, weights, n_experts, tile):
    """Sort the (expert, token) pairs with lexsort and lay the segments out."""
    t, k = ids.shape
    flat_e = ids.ravel()
    flat_t = np.repeat(np.arange(t), k)
    order = np.lexsort((flat_t, flat_e))
    rows = []
    for e in range(n_experts):
        sel = order[flat_e[order] == e]
        rows.extend(int(i) for i in sel)
        rows.extend([-1] * ((-len(sel)) % tile))
    return rows


@pytest.mark.parametrize("tile", [16, 64])
def test_group_reference(tile):
    rng = np.random.default_rng(tile)
    n_tokens, n_experts, k = 37, 12, 3
    ids, w = route_reference(rng.normal(size=(n_tokens, n_experts)), k, "softmax")
    g = group_reference(ids, w, n_experts, tile)
    cap = routing_capacity(n_tokens, k, n_experts, tile)
    rows = independent_grouping(ids, w, n_experts, tile)
    assert len(rows) <= cap and cap % tile == 0
    expect_tok = [r // k if r >= 0 else -1 for r in rows] + [-1] * (cap - len(rows))
    assert g["sorted_token"].tolist() == expect_tok
    flat_w = w.ravel()
    np.testing.assert_array_equal(
        g["sorted_weight"], [flat_w[r] if r >= 0 else 0.0 for r in rows] + [0.0] * (cap - len(rows))
    )
    for row, r in enumerate(rows):
        if r >= 0:
            assert g["pair_pos"][r] == row
    np.testing.assert_array_equal(g["counts"], np.bincount(ids.ravel(), minlength=n_experts))
    assert g["seg_offset"][-1] == len(rows)
    for i, e in enumerate(g["tile_expert"]):
        if i * tile < len(rows):
            seg = g["seg_offset"]
            assert seg[e] <= i * tile < seg[e + 1]
        else:
            assert e == -1


def test_capacity_bounds_worst_case():
    # Every pair on a different expert: each needs a full tile.
    assert routing_capacity(1, 8, 128, 16) >= 8 * 16
    assert routing_capacity(1024, 8, 128, 64) >= 1024 * 8 + 128 * 63
