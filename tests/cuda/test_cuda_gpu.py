"""The CUDA kernels on a real device against the NumPy references (colibri._cuda_ref):
routing (ids, weights, grouping, offsets), the grouped expert FFN in fp16 and int4-g128 with
both tiles and both activations, every output element written, bad input reported; the staged
expert path (a device budget, pinned expert store slots) against the whole pool.
Skipped, saying why, without PyCUDA or a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import colibri.cuda as cuda
from colibri import ColibriError
from colibri._cuda_ref import (
    ExpertLayout,
    build_pool,
    group_reference,
    moe_ffn_reference,
    route_reference,
    unpack_expert,
)

_reason = cuda.unavailable_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_reason is not None, reason=f"no CUDA device / PyCUDA not installed: {_reason}"),
]


@pytest.fixture(scope="module")
def rt() -> cuda.CudaRuntime:
    return cuda.get_runtime()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("n_tokens,n_experts,k,tile", [(1, 8, 2, 16), (37, 64, 6, 16),
                                                       (1500, 128, 8, 64), (5, 256, 8, 64)])
def test_route(rt, gating, use_bias, n_tokens, n_experts, k, tile):
    rng = np.random.default_rng(n_tokens + n_experts)
    base = np.arange(n_experts) * (8.0 / n_experts) - 4.0  # separated logits: no near-ties
    logits = np.array([rng.permutation(base) for _ in range(n_tokens)], np.float32)
    bias = (rng.integers(-2, 3, n_experts) * 1.5).astype(np.float32) if use_bias else None
    slot = np.arange(n_experts, dtype=np.int64) * 4096
    r = rt.route(logits, k, gating, bias, renorm=True, scale=1.5, tile=tile, slot_offset=slot)
    h = r.to_host()
    ids, w = route_reference(logits, k, gating, bias, renorm=True, scale=1.5)
    np.testing.assert_array_equal(h["topk_ids"], ids)
    np.testing.assert_allclose(h["topk_w"], w, rtol=2e-5)
    np.testing.assert_array_equal(h["sel_offset"], ids.astype(np.int64) * 4096)
    g = group_reference(ids, h["topk_w"], n_experts, tile, r.cap)
    for key in ("counts", "seg_offset", "sorted_token", "pair_pos", "tile_expert"):
        np.testing.assert_array_equal(h[key].ravel(), g[key].ravel(), err_msg=key)
    np.testing.assert_array_equal(h["sorted_weight"], g["sorted_weight"].astype(np.float32))


@pytest.mark.parametrize("n_tokens,n_experts,k,gating", [
    (1, 128, 8, "softmax"), (16, 256, 8, "sigmoid"), (300, 60, 4, "softmax"),
    (1100, 128, 8, "softmax"), (7, 40, 32, "sigmoid")])
def test_route_variants_bit_identical(rt, n_tokens, n_experts, k, gating):
    """Phase 1 by a warp per token and by a thread per token, single block and multi-block:
    the same bits on the device (the device's own expf in both), on logits full of exact ties
    with a tying bias."""
    rng = np.random.default_rng(n_tokens * 7 + n_experts)
    logits = rng.integers(-3, 4, (n_tokens, n_experts)).astype(np.float32)
    bias = (rng.integers(-1, 2, n_experts) * 0.5).astype(np.float32)
    got = [rt.route(logits, k, gating, bias, renorm=True, scale=1.5, tile=16,
                    multi_block=mb, per_warp=pw).to_host()
           for mb in (False, True) for pw in (True, False)]
    for other in got[1:]:
        for key, a in got[0].items():
            np.testing.assert_array_equal(other[key].view(np.uint8), a.view(np.uint8),
                                          err_msg=key)
    ids, _ = route_reference(logits, k, gating, bias, renorm=True, scale=1.5)
    assert (got[0]["topk_ids"] >= 0).all() and got[0]["topk_ids"].shape == ids.shape


def test_route_reports_missing_expert(rt):
    logits = np.array([[0.0, 5.0, 1.0]], np.float32)
    with pytest.raises(ColibriError, match="not resident"):
        rt.route(logits, 1, slot_offset=np.array([0, -1, 0]))
    with pytest.raises(ValueError):
        rt.route(np.array([[np.nan, 1.0]], np.float32), 1)


def make_experts(rng, n, d, f):
    s_in, s_f = 1 / np.sqrt(d), 1 / np.sqrt(f)
    return [(rng.normal(0, s_in, (f, d)), rng.normal(0, s_in, (f, d)), rng.normal(0, s_f, (d, f)))
            for _ in range(n)]


@pytest.mark.parametrize("fmt,pipeline", [("f16", "cp"), ("f16", "regs"), ("int4-g128", None)])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n_tokens,tile", [(1, 16), (16, 16), (300, 64)])
def test_moe_ffn(rt, fmt, pipeline, act, n_tokens, tile):
    rng = np.random.default_rng(n_tokens)
    d, f, n_exp, k = 256, 384, 16, 4
    lay = ExpertLayout(d, f, fmt)
    pool_bytes, offsets = build_pool(make_experts(rng, n_exp, d, f), lay)
    pool = rt.upload_pool(pool_bytes, offsets, lay)
    x = rng.normal(size=(n_tokens, d)).astype(np.float16)
    r = rt.route(rng.normal(size=(n_tokens, n_exp)).astype(np.float32), k, "softmax",
                 renorm=True, tile=tile)
    h = r.to_host()
    if pipeline == "cp" and not rt.cp_supported:  # before sm_80: refused, clearly
        with pytest.raises(ColibriError, match="pipeline 'cp' is not available"):
            rt.moe_ffn(x, pool, r, act, pipeline=pipeline)
        pipeline = None
    out = rt.moe_ffn(x, pool, r, act, pipeline=pipeline)
    assert out.shape == (n_tokens, d) and np.isfinite(out).all()
    # The reference (float64) uses the weights exactly as the device holds them.
    seen = [unpack_expert(pool_bytes[o:], lay) for o in offsets]
    ref = moe_ffn_reference(x, seen, h["topk_ids"], h["topk_w"], act)
    assert rel_err(out, ref) < 5e-3


@pytest.mark.parametrize("tile", [16, 64])
def test_gemm_pipelines_agree(rt, tile):
    """The cp.async kernels issue the same MMAs on the same shared-memory tiles in the same
    order as the register-prefetch kernels: the outputs are bit-identical. Before sm_80 the
    cp.async kernels are refused with a clear error instead."""
    rng = np.random.default_rng(tile)
    d, f, n_exp, k, n_tokens = 512, 704, 12, 4, 333
    lay = ExpertLayout(d, f, "f16")
    pool = rt.upload_experts(make_experts(rng, n_exp, d, f), lay)
    r = rt.route(rng.normal(size=(n_tokens, n_exp)).astype(np.float32), k, tile=tile)
    x = rng.normal(size=(n_tokens, d)).astype(np.float16)
    if not rt.cp_supported:
        assert rt.gemm_pipeline == "regs"
        with pytest.raises(ColibriError, match="pipeline 'cp' is not available"):
            rt.moe_ffn(x, pool, r, pipeline="cp")
        return
    a = rt.moe_ffn(x, pool, r, pipeline="cp")
    b = rt.moe_ffn(x, pool, r, pipeline="regs")
    assert np.isfinite(a).all()
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_every_output_written(rt):
    """Outputs filled with NaN first: none may survive a run."""
    rng = np.random.default_rng(9)
    d, f, n_exp, k, n_tokens = 128, 256, 8, 2, 40
    lay = ExpertLayout(d, f, "f16")
    pool = rt.upload_experts(make_experts(rng, n_exp, d, f), lay)
    r = rt.route(rng.normal(size=(n_tokens, n_exp)).astype(np.float32), k, tile=16)
    ws = rt.workspace(r, lay)
    rt.poison(ws.out)
    rt.moe_ffn_launch(rt.to_gpu(rng.normal(size=(n_tokens, d)).astype(np.float16)), pool, r,
                      0, ws)
    assert np.isfinite(ws.out.get()).all()
    rt._check_err(ws.err, "moe_ffn")


def test_pin_host_memory(rt):
    """cuMemHostRegister through the driver (colibri.cuda_host; PyCUDA's wrapper fails with
    NumPy 2): a view of the same memory, an overlapping registration refused by the driver,
    an asynchronous copy from a slice of the range arriving whole, unregistering twice
    refused."""
    host = np.arange(1 << 20, dtype=np.uint8)
    pinned = rt.pin_host_memory(host)
    assert np.shares_memory(pinned, host) and pinned.base.registered
    with pytest.raises(ColibriError, match="ALREADY_REGISTERED"):
        rt.pin_host_memory(host[4096:8192])
    dev = rt.alloc(host.nbytes)
    rt.copy_htod(int(dev), host[96:], rt.stream)
    rt.stream.synchronize()
    back = np.empty(host.nbytes - 96, np.uint8)
    rt._drv.memcpy_dtoh(back, int(dev))
    np.testing.assert_array_equal(back, host[96:])
    dev.free()
    rt.unpin_host_memory(pinned)
    assert not pinned.base.registered
    with pytest.raises(ColibriError, match="not registered"):
        rt.unpin_host_memory(pinned)
    again = rt.pin_host_memory(host)  # the range is free to register again
    rt.unpin_host_memory(again)


@pytest.mark.parametrize("family,weights", [("mixtral", "f16"), ("qwen2_moe", "int4-g128")])
def test_model_on_the_device(tmp_path, family, weights):
    """Model(device="cuda") against the CPU forward on a tiny oracle MoE model."""
    from oracle_models import build, prompt

    from colibri.model import Model

    path = build(family, tmp_path)[1]["f32"]
    ids = prompt(40, seed=7)
    ref = Model(path, threads=2, ctx=64, tokenizer=False).logits(ids)
    dev = Model(path, threads=2, ctx=64, tokenizer=False, device="cuda", cuda_weights=weights)
    got = dev.logits(ids)
    assert rel_err(got, ref) < (5e-3 if weights == "f16" else 0.15)
    s = dev.new_sequence()
    steps = np.concatenate([dev.eval([s], tokens=[t]) for t in ids[:8]])
    assert rel_err(steps, got[:8]) < 1e-3


@pytest.mark.parametrize("weights", ["f16", "int4-g128"])
def test_staged_model_matches_the_whole_pool(tmp_path, weights):
    """A device budget of k + 1 experts (cuda_expert_budget): the expert store's slot pool is
    page-locked (cache mode), misses are staged per MoE call; the logits equal the whole-pool
    device path bit for bit (same packed weights, kernels and tile), prefill (split into token
    chunks) and decode."""
    from oracle_models import build, prompt

    from colibri.model import Model

    path = build("mixtral", tmp_path)[1]["f32"]
    ids = prompt(24, seed=5)
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda", cuda_weights=weights)
    whole = Model(path, **kw)
    k = max(L.n_expert_used for L in whole.desc.layers)
    sb = max(lay.slot_bytes for lay in whole.cuda_experts.layouts.values())
    staged = Model(path, expert_mode="cache", cuda_expert_budget=(k + 1) * sb, **kw)
    assert staged.cuda_experts.staged and staged.experts.pool()["pinned"]
    np.testing.assert_array_equal(staged.logits(ids), whole.logits(ids))
    s, w = staged.new_sequence(), whole.new_sequence()
    for t in ids[:6]:
        np.testing.assert_array_equal(staged.eval([s], tokens=[t]), whole.eval([w], tokens=[t]))
    st = staged.device_expert_stats()
    assert st["misses"] > 0 and st["evictions"] > 0 and st["splits"] > 0
    store = staged.experts  # close() drops the Model's reference; the store lives on here
    staged.close()
    assert not store.pool()["pinned"]  # unpinned through the driver (an error would raise)


def test_cuda_check_staged_step(rt, tmp_path):
    """The CUDA check's staged-path step (colibri.tools.cuda_check.staged_check, run by
    tools/bench/cuda_check.py) on the device."""
    from colibri.tools.cuda_check.staged import staged_check

    st = staged_check(rt, np.random.default_rng(8), tmp_path)
    assert st["f16"]["misses"] > 0 and st["int4-g128"]["misses"] > 0


@pytest.mark.parametrize("fmt", ["f16", "int4-g128"])
def test_expert_rows_do_not_depend_on_tile_or_batch(rt, fmt):
    """Batch invariance on the hardware: both GEMM tiles, and a token alone against the same
    token in a batch, give the same bits (the emulated twin: test_cuda_invariance_emulated.py)."""
    from colibri.tools.cuda_check.reference import check_batch_invariance

    check_batch_invariance(rt, fmt)
