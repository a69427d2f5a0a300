"""The low-bit GGML types (issue 45: Q2_K, Q3_K, Q8_K, TQ1_0, TQ2_0 and the i-quants; kernels in
colibri/_core/quant_lowbit.c, quant_iq.c). The op x backend cells (tests/backend_ops_cpu.py,
from quant_util.TYPES) cover random valid blocks at every level; here the adversarial ones:
dequantize bit for bit against gguf-py over random bits (NaN/Inf scales included) and blocks of
extreme indices, signs and scales; the matmul against float64 over gguf-quantized and
extreme-index weights; the generated grid header; agreement between SIMD levels and batch
invariance per type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from backend_ops import CPU_LEVELS
from quant_util import GT, LOWBIT_TYPES, block, matmul_bound, random_raw, reference_dequant

import colibri._core._quant as q
import colibri.simd as simd

ROOT = Path(__file__).resolve().parents[2]
LEVELS = list(CPU_LEVELS)
# byte offsets of a block's f16 scale fields (Q8_K: f32 d at 0; IQ1_M: split, see _set_iq1m_d)
F16_SCALES = {"Q2_K": [80, 82], "Q3_K": [108], "TQ1_0": [52], "TQ2_0": [64], "IQ1_S": [0],
              "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
              "IQ4_NL": [0], "IQ4_XS": [0]}
# adversarial f16 scales: NaN, -NaN, +-Inf, the largest finite, the smallest subnormal, -0
SPECIAL_F16 = [0x7E00, 0xFE01, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001, 0x8000, 0x3C00]


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Bit equality where a NaN matches any NaN."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    return (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))


def _set_iq1m_d(blocks: np.ndarray, dh: np.ndarray) -> None:
    sc = blocks[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
    for k in range(4):
        sc[:, k] |= ((dh >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
    blocks[:, 48:56] = sc.view(np.uint8)


def adversarial_blocks(t: str, rng: np.random.Generator) -> np.ndarray:
    """[n, block_bytes] blocks: random bits (any scale, NaN/Inf included), payloads of all ones
    (the largest grid indices, every sign bit, the largest sub-block scales) and all zeros, and
    every special f16 scale over random payloads."""
    _, bb = block(t)
    parts = [rng.integers(0, 256, size=(64, bb), dtype=np.uint8),
             np.full((2, bb), 0xFF, np.uint8), np.zeros((2, bb), np.uint8)]
    special = rng.integers(0, 256, size=(len(SPECIAL_F16) * 2, bb), dtype=np.uint8)
    special[len(SPECIAL_F16):] = 0xFF  # the special scales over the extreme payload too
    dh = np.array(SPECIAL_F16 * 2, np.uint16)
    if t == "Q8_K":
        f = np.array([np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, -0.0, 1.0] * 2,
                     np.float32)
        special[:, :4] = f.view(np.uint8).reshape(-1, 4)
    elif t == "IQ1_M":
        _set_iq1m_d(special, dh)
    else:
        for off in F16_SCALES[t]:
            special[:, off:off + 2] = dh.view(np.uint8).reshape(-1, 2)
    parts.append(special)
    # the largest index of every grid in a valid block: all payload bits set, a sane scale
    sane = random_raw(t, 1, block(t)[0], rng).reshape(1, bb).copy()
    ones = np.full((1, bb), 0xFF, np.uint8)
    keep = {"Q8_K": [0, 1, 2, 3], "IQ1_M": []}.get(t, sum(([o, o + 1] for o in F16_SCALES.get(t, [])), []))
    ones[:, keep] = sane[:, keep]
    if t == "IQ1_M":
        _set_iq1m_d(ones, np.array([0x2C00], np.uint16))
    parts += [sane, ones]
    return np.concatenate(parts)


@pytest.mark.parametrize("t", LOWBIT_TYPES)
def test_dequantize_adversarial_matches_gguf(t):
    rng = np.random.default_rng(45)
    bs, bb = block(t)
    blocks = adversarial_blocks(t, rng)
    n = blocks.shape[0]
    with np.errstate(all="ignore"):
        want = reference_dequant(t, blocks.reshape(-1), 1, n * bs).reshape(-1)
    got = q.dequantize(t, blocks.reshape(-1), (1, n * bs)).reshape(-1)
    bad = ~_same(got, want)
    assert not bad.any(), f"{t}: {bad.sum()} values differ, first at {np.argmax(bad)}"
    # get_rows reads the same values
    rows = q.get_rows(t, blocks.reshape(-1), n, bs, np.arange(n))
    assert _same(rows.reshape(-1), want).all()
    if t != "Q8_K":  # gguf is the reference; Q8_K's is quant_util.q8k_dequant
        with np.errstate(all="ignore"):
            g = np.asarray(gguf.quants.dequantize(blocks, GT[t]), np.float32).reshape(-1)
        assert _same(got, g).all()


def test_q8_k_layout():
    # {f32 d; i8 qs[256]; i16 bsums[16]}: v = d*q
    blk = np.zeros(292, np.uint8)
    blk[:4] = np.array([0.5], np.float32).view(np.uint8)
    qs = np.arange(-128, 128, dtype=np.int8)
    blk[4:260] = qs.view(np.uint8)
    np.testing.assert_array_equal(q.dequantize("Q8_K", blk, (1, 256))[0], 0.5 * qs.astype(np.float32))


def test_iq_tables_are_generated_from_gguf():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_iq_tables.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _extreme_weights(t: str, rows: int, cols: int, rng) -> np.ndarray:
    """Valid weights whose payload bits are all set (largest indices, every sign) in half the
    blocks: sane scales, so the product is finite."""
    raw = random_raw(t, rows, cols, rng)
    bs, bb = block(t)
    b = raw.reshape(-1, bb)
    ones = adversarial_blocks(t, rng)[-1]
    b[::2] = ones
    return b.reshape(-1)


@pytest.mark.parametrize("t", LOWBIT_TYPES)
def test_matmul_extreme_blocks_within_bound(t):
    rng = np.random.default_rng(46)
    rows, cols = 13, 768 if block(t)[0] == 256 else 96
    raw = _extreme_weights(t, rows, cols, rng)
    w = reference_dequant(t, raw, rows, cols).astype(np.float64)
    assert np.isfinite(w).all()
    # activations with one outlier per row: the int8 rounding is coarsest there
    x = rng.standard_normal((5, cols)).astype(np.float32)
    x[:, 7] = 40.0
    ref = x.astype(np.float64) @ w.T
    bound = matmul_bound(t, w, x)
    for level in LEVELS:
        with simd.max_simd(level):
            for n in (1, 5):
                y = q.matmul(t, raw, rows, cols, x[:n])
                err = np.abs(y - ref[:n])
                assert np.all(err <= bound[:n]), (level, n, float((err / bound[:n]).max()))


@pytest.mark.parametrize("t", LOWBIT_TYPES)
def test_levels_agree_and_batch_invariance(t):
    """Every level's kernel of a low-bit type (scalar, or quant_avx2_lowbit.c's tiles, which
    AVX-512 CPUs run too) computes the scalar kernel's integer super-block sums and float
    operations in its order: the results are bit-identical at every level; and at every level
    a token's row does not depend on the batch or the thread split."""
    rng = np.random.default_rng(47)
    rows, cols = 21, 1024 if block(t)[0] == 256 else 160
    raw = random_raw(t, rows, cols, rng)
    x = rng.standard_normal((19, cols)).astype(np.float32)
    pool = q.ThreadPool(2)
    with simd.max_simd("scalar"):
        ys = q.matmul(t, raw, rows, cols, x)
    for level in LEVELS:
        with simd.max_simd(level):
            y = q.matmul(t, raw, rows, cols, x)
            np.testing.assert_array_equal(y, ys, err_msg=level)
            np.testing.assert_array_equal(q.matmul(t, raw, rows, cols, x, pool=pool), y)
            for n in (1, 2, 3, 4, 5, 8, 17):
                np.testing.assert_array_equal(q.matmul(t, raw, rows, cols, x[:n]), y[:n],
                                              err_msg=f"{level}, {n} tokens")
            for i in (0, 6, 18):
                np.testing.assert_array_equal(q.matmul(t, raw, rows, cols, x[i]), y[i])
            # the rows of a token gathered by ids, scaled and accumulated, as MoE calls it
            ids = np.array([18, 3, 3], np.int32)
            out = np.zeros((19, rows), np.float32)
            q.matmul(t, raw, rows, cols, x, out=out, accumulate=True, token_ids=ids[:1])
            np.testing.assert_array_equal(out[18], y[18])
