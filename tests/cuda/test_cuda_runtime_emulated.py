"""colibri/cuda.py end to end without a GPU: the stand-in `pycuda` package of
tests/fake_pycuda.py (driver, gpuarray, compiler) backed by host memory launches the real
kernels compiled for the CPU with tests/cuda_emu (emu_lib.cpp + cuda_emu.h). This exercises the
runtime's argument packing (against the kernels' C signatures, through ctypes), buffer sizes,
grids, tile choice, the cubin cache and the device error records; results are compared with
the NumPy references. The model on the emulated device: test_cuda_model_emulated.py; the GPU
check script's path: test_cuda_check_emulated.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fake_pycuda import EMULATION_MARKS, install_fake_pycuda

from colibri import ColibriError
from colibri._cuda_ref import (
    ExpertLayout,
    build_pool,
    group_reference,
    moe_ffn_reference,
    route_reference,
    unpack_expert,
)
from colibri.tools.cuda_check.reference import separated_logits

pytestmark = EMULATION_MARKS


def test_compile_once_and_cache(rt, tmp_path):
    import colibri.cuda as cuda

    assert rt.arch == "sm_90" and rt.calls["nvcc"] == 2
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(cached) == 2 and all(n.endswith("_sm_90.cubin") for n in cached)
    cuda.CudaRuntime(0).close()
    assert rt.calls["nvcc"] == 2  # second runtime: both cubins from the cache


@pytest.mark.parametrize("n_tokens,n_experts,k,gating,bias_on,tile,multi", [
    (3, 16, 2, "softmax", False, None, None), (200, 32, 4, "sigmoid", True, None, None),
    (200, 32, 4, "sigmoid", True, None, True), (2100, 16, 2, "softmax", False, None, None),
])
def test_route(rt, n_tokens, n_experts, k, gating, bias_on, tile, multi):
    rng = np.random.default_rng(n_tokens)
    logits = separated_logits(rng, n_tokens, n_experts)
    bias = (rng.integers(-2, 3, n_experts) * 1.5).astype(np.float32) if bias_on else None
    slot = np.arange(n_experts, dtype=np.int64)[::-1] * 512
    r = rt.route(logits, k, gating, bias, renorm=True, scale=2.0, tile=tile, slot_offset=slot,
                 multi_block=multi)
    assert r.tile == (64 if n_tokens * k >= 32 * n_experts else 16)
    # the multi-block pair when asked for, or where route_plan says
    assert ("cb_route_place" in rt.calls) == (multi or n_tokens * n_experts > 2048)
    assert ("cb_route_topk" in rt.calls) != ("cb_route_place" in rt.calls)
    h = r.to_host()
    ids, w = route_reference(logits, k, gating, bias, True, 2.0)
    np.testing.assert_array_equal(h["topk_ids"], ids)
    np.testing.assert_allclose(h["topk_w"], w, rtol=2e-6)
    np.testing.assert_array_equal(h["sel_offset"], slot[ids])
    g = group_reference(ids, h["topk_w"], n_experts, r.tile, r.cap)
    for key in ("counts", "seg_offset", "sorted_token", "pair_pos", "tile_expert"):
        np.testing.assert_array_equal(h[key].ravel(), g[key].ravel(), err_msg=key)


def test_route_errors(rt):
    with pytest.raises(ColibriError, match=r"not resident.*cuda/routing\.cu:\d+"):
        rt.route(np.array([[0.0, 5.0, 1.0]], np.float32), 1, slot_offset=np.array([0, -1, 0]))
    with pytest.raises(ValueError, match="NaN"):
        rt.route(np.array([[np.nan, 1.0]], np.float32), 1)
    with pytest.raises(ValueError, match="k="):
        rt.route(np.zeros((1, 4), np.float32), 5)
    with pytest.raises(ValueError, match="tile"):
        rt.route(np.zeros((1, 4), np.float32), 1, tile=32)
    with pytest.raises(ValueError, match="per_warp routing takes at most 256 experts"):
        rt.route(np.zeros((1, 300), np.float32), 2, per_warp=True)


def test_route_plan():
    """The variant route() picks where the H200 sweep timed it fastest (docs/benchmarks.md)."""
    from colibri.cuda import route_plan as plan

    assert plan(1, 128) == (False, True) and plan(16, 128) == (False, True)
    assert plan(64, 128) == (True, True) and plan(1024, 256) == (True, True)
    assert plan(4, 256) == (False, True) and plan(16, 256) == (True, True)
    assert plan(16, 8) == (False, True) and plan(1024, 8) == (False, False)
    assert plan(4096, 8) == (True, True) and plan(100, 512) == (True, False)
    assert plan(1, 512) == (False, False) and plan(5000, 128, False) == (False, True)


@pytest.mark.parametrize("multi", [False, True])
def test_route_per_warp_or_thread(rt, multi):
    """colibri.cuda sizes cb_route_count's grid for a warp or a thread per token and passes
    the mode to both kernels; the two write the same outputs (300 experts: a thread per token
    whatever was asked for by default)."""
    rng = np.random.default_rng(3)
    for n_experts in (64, 300):
        logits = separated_logits(rng, 40, n_experts)
        outs = [rt.route(logits, 4, "softmax", None, renorm=True, multi_block=multi,
                         per_warp=pw).to_host() for pw in ((True, False) if n_experts <= 256
                                                           else (None, False))]
        for key, a in outs[0].items():
            np.testing.assert_array_equal(outs[1][key], a, err_msg=key)
        np.testing.assert_array_equal(outs[0]["topk_ids"],
                                      route_reference(logits, 4, "softmax", None, True, 1.0)[0])


@pytest.mark.parametrize("fmt,tile,act,pipeline", [
    ("f16", 16, "silu", None), ("f16", 64, "gelu_tanh", None), ("f16", 16, "silu", "regs"),
    ("f16", 64, "silu", "regs"), ("int4-g128", 64, "gelu_tanh", None),
])
def test_moe_ffn(rt, fmt, tile, act, pipeline):
    """Both GEMM pipelines against the float64 reference; on the emulated sm_90 the default is
    the cp.async one for fp16 (int4 always uses the register-prefetch kernels)."""
    rng = np.random.default_rng(11)
    d, f, n_exp, k, n_tokens = 128, 128, 4, 2, 21
    lay = ExpertLayout(d, f, fmt)
    experts = [(rng.normal(0, d**-0.5, (f, d)), rng.normal(0, d**-0.5, (f, d)),
                rng.normal(0, f**-0.5, (d, f))) for _ in range(n_exp)]
    pool, offsets = build_pool(experts, lay)
    dp = rt.upload_pool(pool, offsets, lay)
    x = rng.normal(size=(n_tokens, d)).astype(np.float16)
    r = rt.route(rng.normal(size=(n_tokens, n_exp)).astype(np.float32), k, renorm=True, tile=tile)
    assert rt.gemm_pipeline == "cp" and rt.cp_supported
    out = rt.moe_ffn(x, dp, r, act, pipeline=pipeline)
    h = r.to_host()
    seen = [unpack_expert(pool[o:], lay) for o in offsets]
    ref = moe_ffn_reference(x, seen, h["topk_ids"], h["topk_w"], act)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
    w = "i4" if fmt == "int4-g128" else "f16"
    sfx = "_cp" if fmt == "f16" and pipeline is None else ""
    assert rt.calls[f"cb_moe_gate_up_{w}_m{tile}{sfx}"] == 1
    assert rt.calls[f"cb_moe_down_{w}_m{tile}{sfx}"] == 1 and rt.calls["cb_moe_combine"] == 1


@pytest.mark.parametrize("tile", [16, 64])
def test_gemm_pipelines_agree_bit_for_bit(rt, tile):
    """The cp.async kernels multiply the same slices in the same order as the register-prefetch
    ones: in the emulation their outputs are bit-identical (copies landing early or late at
    random, CB_EMU_SEED; a stage read before it is complete, or overwritten while in use,
    shows here as a difference), over K spanning fewer slices than the pipeline has stages
    and many more, N not a multiple of the block's columns, and padding rows."""
    rng = np.random.default_rng(tile)
    for d, f, n_exp, k, n_tokens in ((64, 192, 3, 2, 5), (256, 320, 6, 3, 70)):
        lay = ExpertLayout(d, f, "f16")
        experts = [(rng.normal(0, d**-0.5, (f, d)), rng.normal(0, d**-0.5, (f, d)),
                    rng.normal(0, f**-0.5, (d, f))) for _ in range(n_exp)]
        pool, offsets = build_pool(experts, lay)
        dp = rt.upload_pool(pool, offsets, lay)
        x = rng.normal(size=(n_tokens, d)).astype(np.float16)
        r = rt.route(separated_logits(rng, n_tokens, n_exp), k, tile=tile)
        a = rt.moe_ffn(x, dp, r, "silu", pipeline="cp")
        b = rt.moe_ffn(x, dp, r, "silu", pipeline="regs")
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("cc,optin,env,want", [
    ((9, 0), 232448, None, "cp"), ((8, 0), 166912, None, "cp"), ((8, 6), 101376, None, "cp"),
    ((7, 5), 65536, None, "regs"), ((8, 9), 65536, None, "regs"), ((9, 0), 232448, "regs", "regs"),
    ((7, 5), 65536, "cp", "error"), ((9, 0), 232448, "fast", "error"),
])
def test_gemm_pipeline_choice(emu_lib, monkeypatch, tmp_path, cc, optin, env, want):
    """cp.async kernels on sm_80+ when the device gives a block enough shared memory (their
    limits raised to exactly what they launch with), else the register-prefetch kernels;
    COLIBRI_CUDA_GEMM_PIPELINE overrides, and asking for what the device cannot do fails
    clearly, at construction or at the call."""
    calls: dict[str, int] = {}
    install_fake_pycuda(monkeypatch, emu_lib, calls, cc=cc, smem_optin=optin)
    monkeypatch.setenv("COLIBRI_CUDA_CACHE", str(tmp_path / "cache"))
    if env is None:
        monkeypatch.delenv("COLIBRI_CUDA_GEMM_PIPELINE", raising=False)
    else:
        monkeypatch.setenv("COLIBRI_CUDA_GEMM_PIPELINE", env)
    import colibri.cuda as cuda

    if want == "error":
        with pytest.raises(ColibriError, match="COLIBRI_CUDA_GEMM_PIPELINE"):
            cuda.CudaRuntime(0)
        return
    rt = cuda.CudaRuntime(0)
    try:
        assert rt.gemm_pipeline == want and rt.cp_supported == (optin >= 82944 and cc >= (8, 0))
        for t in cuda.TILES:
            for part in ("gate_up", "down"):
                fn = rt._fn[f"cb_moe_{part}_f16_m{t}_cp"]
                assert fn.max_dynamic_smem == (cuda.gemm_cp_smem_bytes(t, part == "gate_up")
                                               if rt.cp_supported else 48 * 1024)
        rng = np.random.default_rng(0)
        lay = ExpertLayout(64, 64, "f16")
        pool, offsets = build_pool([tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3))
                                    for _ in range(2)], lay)
        dp = rt.upload_pool(pool, offsets, lay)
        r = rt.route(np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), 1)
        x = rng.normal(size=(2, 64)).astype(np.float16)
        out = rt.moe_ffn(x, dp, r)
        assert np.isfinite(out).all()
        assert calls.get("cb_moe_gate_up_f16_m16_cp", 0) == (want == "cp")
        if not rt.cp_supported:
            with pytest.raises(ColibriError, match="pipeline 'cp' is not available"):
                rt.moe_ffn(x, dp, r, pipeline="cp")
    finally:
        rt.close()


def test_bad_pools_and_inputs(rt):
    lay = ExpertLayout(128, 128, "f16")
    pool = np.zeros(3 * lay.matrix_bytes, np.uint8)
    with pytest.raises(ValueError, match="offsets"):
        rt.upload_pool(pool, np.array([8]), lay)  # runs past the end
    with pytest.raises(ValueError, match="offsets"):
        rt.upload_pool(pool, np.array([-2]), lay)
    dp = rt.upload_pool(pool, np.array([0, -1]), lay)
    r = rt.route(np.array([[0.0, 1.0]], np.float32), 1)
    with pytest.raises(ValueError, match="x must have shape"):
        rt.moe_ffn(np.zeros((1, 64), np.float16), dp, r)
    with pytest.raises(ColibriError, match=r"not resident.*moe_gemm\.cu"):
        rt.moe_ffn(np.zeros((1, 128), np.float16), dp, r)


def test_pin_host_memory(rt):
    """Pinning registers the range once (a second registration of it fails, as
    cuMemHostRegister does), unpinning ends it (twice fails); async copies need pinned
    memory and stay inside the device allocation."""
    reg = sys.modules["pycuda.driver"].registry
    host = np.arange(4096, dtype=np.uint8)
    pinned = rt.pin_host_memory(host)
    assert np.shares_memory(pinned, host) and reg.log == [("register", host.ctypes.data, 4096)]
    with pytest.raises(ColibriError, match="ALREADY_REGISTERED"):
        rt.pin_host_memory(host[100:200])
    dev = rt.alloc(4096)
    rt.copy_htod(int(dev) + 96, host[:4000], rt.stream)  # from a slice of the pinned range
    assert np.array_equal(dev.owner[96:], host[:4000])
    with pytest.raises(AssertionError, match="no allocation"):
        rt.copy_htod(int(dev) + 97, host[:4000], rt.stream)
    rt.unpin_host_memory(pinned)
    with pytest.raises(ColibriError, match="cuMemHostUnregister"):
        rt.unpin_host_memory(pinned)
    with pytest.raises(AssertionError, match="pageable"):
        rt.copy_htod(int(dev), host[:16], rt.stream)
    rt.copy_htod(int(dev), host[:16])  # synchronous copies take any host memory


def test_every_output_written(rt):
    rng = np.random.default_rng(12)
    lay = ExpertLayout(64, 64, "f16")
    experts = [tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3)) for _ in range(3)]
    dp = rt.upload_experts(experts, lay)
    r = rt.route(rng.normal(size=(5, 3)).astype(np.float32), 2, tile=16)
    ws = rt.workspace(r, lay)
    for buf in (ws.out, ws.z, ws.h):
        rt.poison(buf)
    assert np.isnan(ws.out.get()).all() and np.isnan(ws.h.get()).all()
    rt.moe_ffn_launch(rt.to_gpu(rng.normal(size=(5, 64)).astype(np.float16)), dp, r, 0, ws)
    rt._check_err(ws.err, "moe_ffn")
    assert np.isfinite(ws.out.get()).all()
    real = r.to_host()["sorted_token"] >= 0
    z = ws.z.get().reshape(r.cap, 64)
    assert np.isfinite(z[real]).all() and np.isnan(z[~real]).all()


def test_write_slot_replaces_an_expert(rt):
    """The expert store refills slot 1 with another expert: results follow the new weights."""
    rng = np.random.default_rng(13)
    lay = ExpertLayout(64, 64, "f16")
    experts = [tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3)) for _ in range(3)]
    pool, offsets = build_pool(experts, lay)
    dp = rt.upload_pool(pool, offsets, lay)
    new = tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3))
    pool2, _ = build_pool([experts[0], new, experts[2]], lay)
    sb = lay.slot_bytes
    pinned = rt.pin_host_memory(pool2)
    rt.write_slot(dp, int(offsets[1]), pinned[sb : 2 * sb], stream=rt.stream)
    rt.unpin_host_memory(pinned)
    x = rng.normal(size=(4, 64)).astype(np.float16)
    r = rt.route(np.tile(np.array([[0.0, 3.0, 1.0]], np.float32), (4, 1)), 2, tile=16)
    out = rt.moe_ffn(x, dp, r)
    h = r.to_host()
    seen = [unpack_expert(pool2[o:], lay) for o in offsets]
    ref = moe_ffn_reference(x, seen, h["topk_ids"], h["topk_w"], "silu")
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
    with pytest.raises(ValueError, match="outside"):
        rt.write_slot(dp, dp.nbytes - 1, pool2[:2])
