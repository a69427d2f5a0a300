"""Quantized kernels (include/colibri/quant.h) against outside references: gguf-py's
dequantizers and a float64 product of the gguf-dequantized weights.

Tolerance of matvec/matmul: the kernels quantize the activations to 8 bits (blocks of 32 or
256, see quant.h), so |y - W x| may reach sum_b max|x_b|/254 * sum_{c in b} |W[r, c]|; the tests
require the error to stay under that rigorous bound (plus float32 rounding slack), which a wrong
nibble order, scale or offset exceeds by orders of magnitude. Float weights (F32/F16/BF16) get
only the float32 slack.
"""

from __future__ import annotations

import gguf
import gguf.quants
import numpy as np
import pytest
from quant_util import (
    GT,
    TYPES,
    block,
    matmul_bound,
    quantized_raw,
    random_raw,
    reference_dequant,
)

import colibri._core._quant as q
import colibri.simd as simd

# every level up to the CPU's: scalar, avx2, and avx512 on AVX-512 machines
LEVELS = list(simd.LEVELS[: simd.LEVELS.index(simd.detected()) + 1])


def test_type_table_matches_gguf():
    for name, tid in q.TYPES.items():
        if name in q.COLIBRI_TYPES:
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
        q.matmul("Q2_K", np.zeros(84, np.uint8), 1, 256, np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError):
        q.ThreadPool(0)


@pytest.mark.parametrize("t", TYPES)
def test_dequantize_matches_gguf_exactly(t):
    rng = np.random.default_rng(1)
    bs, _ = block(t)
    rows, cols = 5, 2 * max(bs, 32) * 2
    raws = [random_raw(t, rows, cols, rng)]
    qr = quantized_raw(t, rows, cols, rng)
    if qr is not None:
        raws.append(qr)
    for raw in raws:
        ref = reference_dequant(t, raw, rows, cols)
        got = q.dequantize(t, raw, (rows, cols))
        assert got.shape == (rows, cols)
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("t", TYPES)
def test_get_rows(t):
    rng = np.random.default_rng(2)
    bs, _ = block(t)
    rows, cols = 9, max(bs, 32) * 2
    raw = random_raw(t, rows, cols, rng)
    ref = reference_dequant(t, raw, rows, cols)
    ids = np.array([3, 0, 8, 3], dtype=np.int32)
    got = q.get_rows(t, raw, rows, cols, ids)
    np.testing.assert_array_equal(got.view(np.uint32), ref[ids].view(np.uint32))
    for bad in ([9], [-1], [0, 2**31 - 1]):
        with pytest.raises(ValueError, match="out of range"):
            q.get_rows(t, raw, rows, cols, np.array(bad, dtype=np.int64))


def _check_matmul(t, raw, rows, cols, x, **kw):
    w = reference_dequant(t, raw, rows, cols)
    yref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = matmul_bound(t, w, x)
    y = q.matmul(t, raw, rows, cols, x, **kw)
    assert y.shape == (x.shape[0], rows)
    err = np.abs(y - yref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (
        f"{t}: error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst} "
        f"(y={y[worst]:.6g}, ref={yref[worst]:.6g})")
    return y


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("level", LEVELS)
def test_matvec_and_matmul_random_shapes(t, level):
    rng = np.random.default_rng(abs(hash((t, level))) % 2**32)
    bs, _ = block(t)
    ab = 256 if t.endswith("_K") else 32
    pool = q.ThreadPool(2)
    with simd.max_simd(level):
        for trial in range(4):
            rows = int(rng.integers(1, 40)) | (trial & 1)  # odd counts included
            cols = ab * int(rng.integers(1, 5)) if bs > 1 else int(rng.integers(1, 300))
            n = [1, int(rng.integers(2, 34)), 1, int(rng.integers(2, 34))][trial]
            raw = random_raw(t, rows, cols, rng) if trial % 2 == 0 or bs == 1 else (
                quantized_raw(t, rows, cols, rng))
            if raw is None:
                raw = random_raw(t, rows, cols, rng)
            x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10)).astype(np.float32)
            y1 = _check_matmul(t, raw, rows, cols, x)
            y2 = _check_matmul(t, raw, rows, cols, x, pool=pool)
            # threads split rows: each row is computed the same way
            np.testing.assert_array_equal(y1, y2)
            yv = q.matmul(t, raw, rows, cols, x[0])
            assert yv.shape == (rows,)
            np.testing.assert_array_equal(yv, q.matmul(t, raw, rows, cols, x[:1])[0])


@pytest.mark.parametrize("t", TYPES)
def test_packed_path_forced_on_and_off(t):
    """matmul(packed=True/False/None): the packed-row path forced on (down to one token), off
    (up to many), or chosen by the batch size; every result within the bound of the float64
    reference, at token counts on both sides of every type's threshold."""
    rng = np.random.default_rng(abs(hash(t)) % 2**32)
    bs, _ = block(t)
    cols = (256 if t.endswith("_K") else 32) * 3 if bs > 1 else 70
    rows = 19
    raw = random_raw(t, rows, cols, rng)
    pool = q.ThreadPool(2)
    for n in (1, 2, 3, 5, 7, 11, 17):
        x = (rng.standard_normal((n, cols)) * 3).astype(np.float32)
        for packed in (None, True, False):
            _check_matmul(t, raw, rows, cols, x, pool=pool, packed=packed)


@pytest.mark.parametrize("t", ["Q4_0", "Q4_K", "F16"])
def test_simd_agrees_with_scalar(t):
    rng = np.random.default_rng(3)
    rows, cols = 13, 512
    raw = random_raw(t, rows, cols, rng)
    x = rng.standard_normal((6, cols)).astype(np.float32)
    with simd.max_simd("scalar"):
        ys = q.matmul(t, raw, rows, cols, x)
    ya = q.matmul(t, raw, rows, cols, x)
    # same integer block sums, only the float summation order differs
    np.testing.assert_allclose(ya, ys, rtol=1e-4, atol=1e-4 * np.abs(ys).max())


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


def test_quantize_q8_0_matches_gguf():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 128)) * rng.uniform(0.01, 100, size=(8, 1))).astype(np.float32)
    x[0, :32] = 0.0
    ref = gguf.quants.quantize(x, GT.Q8_0).view(np.uint8).reshape(-1)
    np.testing.assert_array_equal(q.quantize_q8_0(x), ref)


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


# ---------------------------------------------------------------------------- I4_G128
# colibri's own block type (quant.h): {f16 d; u8 qs[64]}, v = d*(q-8), byte i holds value 2i in
# its low and value 2i+1 in its high nibble. The reference below is written from that layout
# alone, in float64.


def i4_reference(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    blk = raw.reshape(rows, cols // 128, 66)
    d = blk[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)
    qs = blk[:, :, 2:].astype(np.int64)
    v = np.empty((rows, cols // 128, 128), np.int64)
    v[:, :, 0::2] = qs & 15
    v[:, :, 1::2] = qs >> 4
    return ((v - 8) * d[:, :, None]).reshape(rows, cols)


def i4_random(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    nb = rows * cols // 128
    raw = rng.integers(0, 256, size=(nb, 66), dtype=np.uint8)
    d = (rng.uniform(0.2, 2.0, nb) * rng.choice([-1, 1], nb) / 16).astype(np.float16)
    raw[:, :2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def test_i4g128_dequantize_and_get_rows():
    rng = np.random.default_rng(11)
    rows, cols = 7, 384
    raw = i4_random(rows, cols, rng)
    ref = i4_reference(raw, rows, cols)
    got = q.dequantize("I4_G128", raw, (rows, cols))
    # |d*(q-8)| has at most 11+4 significant bits: exact in float32
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    ids = np.array([6, 0, 3, 3], dtype=np.int32)
    np.testing.assert_array_equal(q.get_rows(1024, raw, rows, cols, ids).astype(np.float64),
                                  ref[ids])


@pytest.mark.parametrize("level", LEVELS)
def test_i4g128_matvec_matmul(level):
    rng = np.random.default_rng(12)
    pool = q.ThreadPool(2)
    with simd.max_simd(level):
        for rows, cols, n in [(1, 128, 1), (37, 256, 1), (8, 512, 5), (13, 128 * 5, 33)]:
            raw = i4_random(rows, cols, rng)
            w = i4_reference(raw, rows, cols)
            x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10)).astype(np.float32)
            yref = x.astype(np.float64) @ w.T
            # 8-bit activations in blocks of 32 (a weight group meets four of them)
            bound = matmul_bound("Q4_0", w, x)
            for kw in ({}, {"pool": pool}):
                y = q.matmul("I4_G128", raw, rows, cols, x, **kw)
                assert np.all(np.abs(y - yref) <= bound), float((np.abs(y - yref) / bound).max())


def test_i4g128_simd_agrees_with_scalar():
    rng = np.random.default_rng(13)
    rows, cols = 11, 1024
    raw = i4_random(rows, cols, rng)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    with simd.max_simd("scalar"):
        ys = q.matmul("I4_G128", raw, rows, cols, x)
    ya = q.matmul("I4_G128", raw, rows, cols, x)
    np.testing.assert_allclose(ya, ys, rtol=1e-4, atol=1e-4 * np.abs(ys).max())


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
