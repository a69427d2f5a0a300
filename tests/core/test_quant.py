"""Quantized kernels (include/colibri/quant.h): what is not an op x backend cell. The cells
(dequantize, get_rows and matmul of every block type at every CPU SIMD level, decode and batched
shapes on both sides of the packed-row thresholds, quantize_q8_0 / quantize_i4g128, against
gguf-py and float64 references with the activation-quantization bound) are
tests/core/test_backend_ops.py, from the table in tests/backend_ops_cpu.py. Here: the type
table, error paths, agreement between levels (tighter than the reference bound), thread and
batch invariance (bit for bit), matmul's options (accumulate, token scale and ids), read-only
buffers, the I4_G128 quantizer's error and its GPU layout.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from backend_ops import CPU_LEVELS
from backend_ops_cpu import i4_random, i4_reference
from quant_util import GT, TYPES, block, matmul_bound, random_raw, reference_dequant

import colibri._core._quant as q
import colibri.simd as simd

LEVELS = list(CPU_LEVELS)  # every level up to the CPU's


def test_type_table_matches_gguf():
    for name, tid in q.TYPES.items():
        if name in q.COLIBRI_TYPES or name in q.LAYOUTS:
            continue
        assert GT[name].value == tid
        bs, bb = gguf.GGML_QUANT_SIZES[GT[name]]
        assert q.block_size(tid) == bs
        assert q.block_bytes(name) == bb
        assert q.type_name(tid) == name
    assert set(q.SUPPORTED) == set(TYPES) | set(q.COLIBRI_TYPES)
    # colibri's own id collides with no GGML id
    assert q.TYPES["I4_G128"] == 1024 and all(int(t) != 1024 for t in GT)
    assert (q.block_size("I4_G128"), q.block_bytes(1024), q.type_name(1024)) == (128, 66, "I4_G128")


def test_row_bytes_and_bad_shapes():
    assert q.row_bytes("Q4_K", 512) == 2 * 144
    assert q.row_bytes("F16", 3) == 6
    with pytest.raises(ValueError, match="not a multiple of the block size 256"):
        q.row_bytes("Q6_K", 300)
    with pytest.raises(ValueError, match="block size 32"):
        q.dequantize("Q4_0", np.zeros(18, np.uint8), (1, 20))
    with pytest.raises(ValueError, match="multiple of the block size"):
        q.matmul("Q8_0", np.zeros(34, np.uint8), 1, 33, np.zeros((1, 33), np.float32))
    with pytest.raises(ValueError, match="needs"):
        q.matmul("Q8_0", np.zeros(33, np.uint8), 1, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="columns"):
        q.matmul("Q8_0", np.zeros(34, np.uint8), 1, 32, np.zeros((1, 64), np.float32))
    with pytest.raises(ValueError, match="unknown"):
        q.row_bytes(5, 32)
    with pytest.raises(ValueError, match="not supported"):
        q.matmul("Q8_1", np.zeros(40, np.uint8), 1, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError):
        q.ThreadPool(0)


@pytest.mark.parametrize("t", TYPES)
def test_get_rows_out_of_range(t):
    rng = np.random.default_rng(2)
    bs, _ = block(t)
    rows, cols = 9, max(bs, 32) * 2
    raw = random_raw(t, rows, cols, rng)
    for bad in ([9], [-1], [0, 2**31 - 1]):
        with pytest.raises(ValueError, match="out of range"):
            q.get_rows(t, raw, rows, cols, np.array(bad, dtype=np.int64))


@pytest.mark.parametrize("t", ["Q4_0", "Q4_K", "F16", "I4_G128"])
def test_simd_agrees_with_scalar(t):
    """Tighter than the reference bound of the op x level cells: every level computes the same
    integer block sums as the scalar path, so results differ only in float summation order."""
    rng = np.random.default_rng(3)
    rows, cols = 13, 1024
    raw = i4_random(rows, cols, rng) if t == "I4_G128" else random_raw(t, rows, cols, rng)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    with simd.max_simd("scalar"):
        ys = q.matmul(t, raw, rows, cols, x)
    for level in LEVELS[1:]:
        with simd.max_simd(level):
            ya = q.matmul(t, raw, rows, cols, x)
        np.testing.assert_allclose(ya, ys, rtol=1e-4, atol=1e-4 * np.abs(ys).max(),
                                   err_msg=level)


@pytest.mark.parametrize("level", LEVELS)
def test_threads_and_batch_invariance(level):
    """A token's output row is bit-identical whatever the batch (decode, a batch on either
    side of the packed-row threshold) and however many threads split the rows (quant.h,
    cb_matmul_opts_t.fast = 0)."""
    rng = np.random.default_rng(7)
    pool = q.ThreadPool(2)
    with simd.max_simd(level):
        for t in [*TYPES, "I4_G128"]:
            cols = 512 if q.block_size(t) > 1 else 70
            rows = 21
            raw = i4_random(rows, cols, rng) if t == "I4_G128" else random_raw(t, rows, cols, rng)
            x = rng.standard_normal((27, cols)).astype(np.float32)
            y = q.matmul(t, raw, rows, cols, x)
            np.testing.assert_array_equal(q.matmul(t, raw, rows, cols, x, pool=pool), y, t)
            for n in (1, 3, 26):
                np.testing.assert_array_equal(q.matmul(t, raw, rows, cols, x[:n]), y[:n], t)
            np.testing.assert_array_equal(q.matmul(t, raw, rows, cols, x[5]), y[5], t)


@pytest.mark.parametrize("level", LEVELS)
def test_matmul_ex_accumulate_scale_ids(level):
    rng = np.random.default_rng(4)
    t, rows, cols = "Q4_K", 11, 256
    raw = random_raw(t, rows, cols, rng)
    w = reference_dequant(t, raw, rows, cols).astype(np.float64)
    x = rng.standard_normal((6, cols)).astype(np.float32)
    ids = np.array([4, 1, 4, 0], dtype=np.int32)  # token 4 twice: both add
    scale = np.array([0.5, -2.0, 1.5, 3.0], dtype=np.float32)
    out = rng.standard_normal((6, rows)).astype(np.float32)
    expect = out.astype(np.float64)
    bound = np.zeros_like(expect)
    xq = x[ids]
    part = xq.astype(np.float64) @ w.T
    b = matmul_bound(t, w, xq)
    for i, tok in enumerate(ids):
        expect[tok] += scale[i] * part[i]
        bound[tok] += abs(scale[i]) * b[i]
    with simd.max_simd(level):
        q.matmul(t, raw, rows, cols, x, out=out, accumulate=True, token_scale=scale,
                 token_ids=ids, threads=2)
    assert np.all(np.abs(out - expect) <= bound + 1e-5)
    # scale without accumulate overwrites
    y = q.matmul(t, raw, rows, cols, x[:4], token_scale=scale)
    ref = (x[:4].astype(np.float64) @ w.T) * scale[:, None]
    assert np.all(np.abs(y - ref) <= matmul_bound(t, w, x[:4]) * np.abs(scale)[:, None])
    with pytest.raises(ValueError, match="out of range"):
        q.matmul(t, raw, rows, cols, x, out=out, token_ids=np.array([6], np.int32))


def test_empty_and_zero_rows():
    y = q.matmul("Q8_0", np.zeros(0, np.uint8), 0, 32, np.ones((3, 32), np.float32))
    assert y.shape == (3, 0)
    y = q.matmul("Q8_0", np.zeros(34 * 2, np.uint8), 2, 32, np.ones((0, 32), np.float32))
    assert y.shape == (0, 2)


def test_read_only_and_typed_buffers():
    # mapped GGUF tensors are read-only; raw may be any array (its bytes are used, not cast)
    rng = np.random.default_rng(6)
    w16 = rng.standard_normal((3, 64)).astype(np.float16)
    w16.setflags(write=False)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    x.setflags(write=False)
    ref = x.astype(np.float64) @ w16.astype(np.float64).T
    np.testing.assert_allclose(q.matmul("F16", w16, 3, 64, x), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(q.dequantize("F16", w16.tobytes(), (3, 64)),
                                  w16.astype(np.float32))
    np.testing.assert_array_equal(q.get_rows("F16", memoryview(w16.tobytes()), 3, 64, [2])[0],
                                  w16[2].astype(np.float32))


def test_i4g128_bad_shapes():
    with pytest.raises(ValueError, match="block size 128"):
        q.row_bytes("I4_G128", 64)
    with pytest.raises(ValueError, match="block size 128"):
        q.dequantize("I4_G128", np.zeros(66, np.uint8), (1, 96))
    with pytest.raises(ValueError, match="multiple of the block size"):
        q.matmul("I4_G128", np.zeros(66, np.uint8), 1, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(ValueError, match="needs"):
        q.matmul("I4_G128", np.zeros(65, np.uint8), 1, 128, np.zeros((1, 128), np.float32))
    with pytest.raises(ValueError, match="group size 128"):
        q.quantize_i4g128(np.zeros(100, np.float32))
    for bad in (np.nan, np.inf):
        x = np.zeros(256, np.float32)
        x[200] = bad
        with pytest.raises(ValueError, match="not finite"):
            q.quantize_i4g128(x)
    with pytest.raises(ValueError, match="overflows"):
        q.quantize_i4g128(np.full(128, 6e5, np.float32))


def test_i4g128_quantize_error_and_gpu_layout():
    import colibri.quant as cq
    from colibri._cuda_ref import dequantize_int4_g128, quantize_int4_g128

    rng = np.random.default_rng(14)
    rows, cols = 6, 512
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 100, (rows, 1))).astype(np.float32)
    x[0, :128] = 0.0  # an all-zero group: d = 0, q = 8
    x[1, 5] = 3 * np.abs(x[1]).max()  # one outlier
    raw = q.quantize_i4g128(x)
    assert raw.size == rows * cols // 128 * 66
    w = i4_reference(raw, rows, cols)
    d = np.abs(raw.reshape(rows, cols // 128, 66)[:, :, :2].copy().view(np.float16)
               .astype(np.float64))
    # round to nearest: every value within half a step (d = f16(max|x|/7): no clamping)
    err = np.abs(w - x).reshape(rows, cols // 128, 128)
    assert np.all(err <= d * (0.5 + 1e-6) + 1e-30)
    assert np.all(w[0, :128] == 0)
    # the same numbers as the GPU quantizer, and the GPU layout round-trips
    qg, sg = quantize_int4_g128(x)
    np.testing.assert_array_equal(cq.i4g128_from_gpu(qg, sg), raw)
    q2, s2 = cq.i4g128_to_gpu(raw, rows, cols)
    np.testing.assert_array_equal(q2, qg)
    np.testing.assert_array_equal(s2.view(np.uint16), sg.view(np.uint16))
    np.testing.assert_array_equal(dequantize_int4_g128(q2, s2),
                                  w.astype(np.float16).astype(np.float32))
