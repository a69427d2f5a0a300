"""colibri's CUDA kernels (cuda/routing.cu, cuda/moe_gemm.cu) compiled with g++ against
tests/cuda_emu/cuda_emu.h (a CPU emulation of threads, barriers, ballots, atomics and WMMA)
under ASan/UBSan: what is not an op x backend cell. The cells (every kernel on random inputs
against the NumPy references, on this emulator and on a device) are
tests/core/test_backend_ops.py, with the emulator driver in tests/backend_ops_cuda.py. Here:
the multi-block routing against the single block bit for bit, device error records (bad
input, bad shapes, short shared memory) and every kernel family under ThreadSanitizer. The
real-device tests are tests/cuda/test_cuda_gpu.py. Needs g++ and the CUDA headers
(cuda_fp16.h)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from backend_ops_cuda import (
    build_emu,
    check_moe,
    check_route,
    emu_moe,
    emu_route,
    moe_case,
    moe_ref,
    route_case,
    route_ref,
    run,
    separated_logits,
)
from cuda_util import cuda_include

from colibri._cuda_ref import ExpertLayout, build_pool
from colibri.cuda import gemm_cp_smem_bytes

INC = cuda_include()
pytestmark = [
    pytest.mark.slow,  # about 30-60 s to compile the emulator under sanitizers, ~40 s to run
    pytest.mark.skipif(INC is None or shutil.which("g++") is None,
                       reason="CUDA toolkit headers (cuda_fp16.h) or g++ not installed"),
]


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emu(tmp_path_factory.mktemp("cuda_emu"), INC, "address,undefined")


@pytest.fixture(scope="module")
def emu_tsan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The emulator under ThreadSanitizer: the emulated threads of a block are real threads,
    so shared memory read and written without a barrier between them is a data race it
    reports (the role of compute-sanitizer's racecheck on a device)."""
    return build_emu(tmp_path_factory.mktemp("cuda_emu_tsan"), INC, "thread")


@pytest.mark.parametrize("n_tokens,n_experts,k,gating,tile,blocks", [
    (1, 8, 2, "softmax", 16, 1), (600, 64, 6, "sigmoid", 16, 3), (1100, 128, 8, "softmax", 64, 5)])
def test_route_multi_block(emu, tmp_path, n_tokens, n_experts, k, gating, tile, blocks):
    """cb_route_count + cb_route_place (several blocks, atomics across blocks, a warp per expert
    over the grid) write exactly what the single-block cb_route_topk writes (both against the
    reference: the route_topk / route_multi_block cells of tests/core/test_backend_ops.py)."""
    rng = np.random.default_rng(n_tokens + 5)
    logits = separated_logits(rng, n_tokens, n_experts)
    bias = (rng.integers(-2, 3, n_experts) * 1.5).astype(np.float32)
    slot = np.arange(n_experts, dtype=np.int64) * 512
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    one = emu_route(emu, tmp_path / "one", logits, k, gating, bias, True, 1.5, tile, slot)
    many = emu_route(emu, tmp_path / "many", logits, k, gating, bias, True, 1.5, tile, slot,
                     blocks=blocks)
    assert many["err"].tolist() == [0, 0, 0, 0]
    for key in ("topk_ids", "topk_w", "sel_offset", "counts", "seg_offset", "sorted_token",
                "sorted_weight", "pair_pos", "tile_expert"):
        np.testing.assert_array_equal(many[key], one[key], err_msg=key)


@pytest.mark.parametrize("n_tokens,n_experts,k,gating,bias_on", [
    (1, 128, 8, "softmax", False), (5, 256, 8, "sigmoid", True), (37, 8, 2, "softmax", True),
    (70, 60, 4, "softmax", False), (3, 40, 32, "sigmoid", False), (9, 100, 6, "softmax", True)])
def test_route_per_warp_matches_per_thread(emu, tmp_path, n_tokens, n_experts, k, gating,
                                           bias_on):
    """Phase 1 by a warp per token (cb_route_token_warp: shuffles, ballots, k arg-max rounds)
    writes exactly what the serial cb_route_token (the CPU router's routine) makes each thread
    write, single block and multi-block: on logits full of exact ties (small integers, and
    biases that tie selection values), expert counts that are not a multiple of 32, k = 32, and
    a token with a NaN logit (the same error record, the token routed nowhere)."""
    rng = np.random.default_rng(n_tokens * 1000 + n_experts)
    logits = rng.integers(-3, 4, (n_tokens, n_experts)).astype(np.float32)
    bad = n_tokens // 2 if n_tokens > 1 else None  # a lone token stays finite
    if bad is not None:
        logits[bad, n_experts // 3] = np.nan
    bias = (rng.integers(-1, 2, n_experts) * 0.5).astype(np.float32) if bias_on else None
    got = {}
    for blocks in (0, 2):
        for per_warp in (True, False):
            d = tmp_path / f"{blocks}-{per_warp}"
            d.mkdir()
            got[blocks, per_warp] = emu_route(emu, d, logits, k, gating, bias, True, 1.5, 16,
                                              blocks=blocks, per_warp=per_warp)
    want = got[0, False]
    if bad is None:
        assert want["err"].tolist() == [0, 0, 0, 0]
    else:
        assert want["err"].tolist()[0] == 2 and want["err"].tolist()[3] == bad
        assert (want["topk_ids"][bad] == -1).all()
    # ties everywhere: a top-k that is not simply the first ids with the largest logit
    assert (want["topk_ids"] >= 0).sum() == k * (n_tokens - (bad is not None))
    for key, other in got.items():
        for name in ("topk_ids", "topk_w", "sel_offset", "counts", "seg_offset", "sorted_token",
                     "sorted_weight", "pair_pos", "tile_expert", "err"):
            np.testing.assert_array_equal(other[name].view(np.uint8), want[name].view(np.uint8),
                                          err_msg=f"{name}, {key}")


def test_route_kernel_errors(emu, tmp_path):
    logits = np.array([[0.0, 3.0, 1.0], [np.nan, 0.0, 1.0]], np.float32)
    got = emu_route(emu, tmp_path, logits, 1, "softmax", None, False, 1.0, 16,
                    slot=np.array([0, -1, 0]))
    code, line, file_id, value = got["err"].tolist()
    assert file_id == 1 and line > 0
    # Token 1 is not finite (its ids stay -1, it takes no rows); token 0 chose expert 1,
    # which has no slot. Which is recorded first depends on thread timing: either is right.
    assert (code, value) in ((2, 1), (4, 1))
    assert got["topk_ids"].tolist() == [[1], [-1]]
    assert got["pair_pos"].tolist()[1] == -1
    assert got["counts"].tolist() == [0, 1, 0]


def test_moe_kernel_rejects_bad_shape(emu, tmp_path):
    """D not a multiple of 128 with int4 weights: the device error record says so."""
    n_tokens, n_exp, k, d, f, tile = 2, 2, 1, 64, 128, 16
    r = emu_route(emu, tmp_path, np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), k, "softmax",
                  None, False, 1.0, tile)
    np.zeros((n_tokens, d), np.float16).tofile(tmp_path / "x.bin")
    # A pool big enough for the shapes the down projection accepts (K = 128, N = 64).
    np.zeros(32768, np.uint8).tofile(tmp_path / "pool.bin")
    np.array([0, 16384], np.int64).tofile(tmp_path / "offsets.bin")
    run(emu, "moe", tmp_path, n_tokens, n_exp, k, d, f, 1, 0, tile, r["cap"], 32768)
    code, line, file_id, value = np.fromfile(tmp_path / "err.bin", np.int32).tolist()
    assert (code, file_id, value) == (5, 2, 64) and line > 0


@pytest.mark.parametrize("tile", [16, 64])
def test_cp_kernels_refuse_short_shared_memory(emu, tmp_path, tile):
    """A cp.async kernel launched with less dynamic shared memory than its stages need records
    CB_KERR_SMEM with the bytes it needs, and writes nothing past the buffer (ASan)."""
    n_tokens, n_exp, k, d, f = 2, 2, 1, 64, 64
    r = emu_route(emu, tmp_path, np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), k, "softmax",
                  None, False, 1.0, tile)
    np.zeros((n_tokens, d), np.float16).tofile(tmp_path / "x.bin")
    lay = ExpertLayout(d, f, "f16")
    pool, offsets = build_pool([tuple(np.zeros((64, 64)) for _ in range(3))] * n_exp, lay)
    pool.tofile(tmp_path / "pool.bin")
    offsets.astype(np.int64).tofile(tmp_path / "offsets.bin")
    need = gemm_cp_smem_bytes(tile, True)
    run(emu, "moe", tmp_path, n_tokens, n_exp, k, d, f, 0, 0, tile, r["cap"], pool.size,
        need - 16, gemm_cp_smem_bytes(tile, False))
    code, line, file_id, value = np.fromfile(tmp_path / "err.bin", np.int32).tolist()
    assert (code, file_id, value) == (6, 2, need) and line > 0


def test_kernels_race_free(emu_tsan, tmp_path):
    """Every kernel family under ThreadSanitizer (a race between two emulated threads of a
    block - shared memory used across a missing barrier, a cp.async stage reused too early -
    fails the run): routing single- and multi-block, the fp16 GEMMs with both pipelines and
    both tiles, int4, combine. A pipeline with its barrier after the wait removed is reported
    here as a race in the tile loads (checked by hand when this test was written)."""
    for i, case in enumerate([("f16", 64, 192, 6, 2, 1, "silu", 16, "cp"),
                              ("f16", 64, 192, 3, 2, 20, "silu", 64, "cp"),
                              ("f16", 128, 64, 5, 2, 9, "gelu_tanh", 16, "regs"),
                              ("int4-g128", 128, 128, 3, 2, 12, "gelu_tanh", 64, "regs")]):
        d = tmp_path / f"moe{i}"
        d.mkdir()
        c = moe_case(*case)
        check_moe(emu_moe(emu_tsan, d, c), moe_ref(c), c)
    c = route_case(300, 64, 6, "softmax", True, True, 1.0, 16, 4096, seed=300)
    (tmp_path / "route").mkdir()
    got = emu_route(emu_tsan, tmp_path / "route", c["logits"], c["k"], c["gating"], c["bias"],
                    c["renorm"], c["scale"], c["tile"], c["slot"])
    check_route(got, route_ref(c), c)
    test_route_multi_block(emu_tsan, tmp_path, 600, 64, 6, "sigmoid", 16, 3)
