"""The int4-g128 quantizer and expert-slot layout that cuda/moe_gemm.cu reads, and the
float64 grouped-FFN reference, each checked against a straightforward independent
computation written here (loops over bytes and nibbles, per-token sums)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from colibri._cuda_ref import (
    ExpertLayout,
    build_pool,
    dequantize_int4_g128,
    matrix_bytes,
    moe_ffn_reference,
    pack_expert,
    quantize_int4_g128,
    route_reference,
    unpack_expert,
)


def naive_dequant(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Byte by byte: low nibble = even column, high nibble = odd column, (q - 8) * scale."""
    rows, half = packed.shape
    out = np.zeros((rows, half * 2), np.float64)
    for r in range(rows):
        for i in range(half):
            b = int(packed[r, i])
            for c, q in ((2 * i, b & 15), (2 * i + 1, b >> 4)):
                out[r, c] = (q - 8) * float(scales[r, c // 128])
    return out


def test_dequant_matches_naive():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 256)).astype(np.float32)
    q, s = quantize_int4_g128(w)
    assert q.shape == (3, 128) and q.dtype == np.uint8
    assert s.shape == (3, 2) and s.dtype == np.float16
    ref = naive_dequant(q, s)
    # dequantize_int4_g128 additionally rounds each value to fp16, as the kernels do.
    np.testing.assert_array_equal(dequantize_int4_g128(q, s), ref.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("dist", ["normal", "uniform", "outlier", "zeros"])
def test_error_bound(dist):
    rng = np.random.default_rng(2)
    shape = (16, 512)
    if dist == "normal":
        w = rng.normal(0, 0.02, shape)
    elif dist == "uniform":
        w = rng.uniform(-3, 3, shape)
    elif dist == "outlier":
        w = rng.normal(0, 1, shape)
        w[:, ::97] *= 50
    else:
        w = np.zeros(shape)
    w = w.astype(np.float32)
    q, s = quantize_int4_g128(w)
    deq = naive_dequant(q, s)
    step = np.repeat(s.astype(np.float64), 128, axis=1)
    amax = np.repeat(np.abs(w.reshape(16, -1, 128)).max(axis=2), 128, axis=1)
    # Rounding to the nearest level: half a step, the step itself being fp16(amax / 7).
    assert np.all(np.abs(deq - w) <= 0.5 * step * (1 + 1e-6) + 1e-12)
    assert np.all(step <= amax / 7 * (1 + 2**-10) + 1e-30)
    # and the fp16 rounding of the dequantized value adds at most 2^-11 relative.
    d16 = dequantize_int4_g128(q, s)
    assert np.all(np.abs(d16 - deq) <= np.abs(deq) * 2**-11 + 1e-30)


def test_quantizer_rejects_bad_input():
    with pytest.raises(ValueError, match="cols % 128"):
        quantize_int4_g128(np.zeros((2, 100), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        quantize_int4_g128(np.full((1, 128), np.nan, np.float32))
    with pytest.raises(ValueError, match="overflows"):
        quantize_int4_g128(np.full((1, 128), 1e6, np.float32))


def test_slot_layout_bytes():
    """The documented byte positions: gate at 0, up at M, down at 2M; in int4 a matrix is
    quants [R, C/2] then scales [R, C/128] fp16."""
    d, f = 256, 128
    rng = np.random.default_rng(3)
    gate, up = rng.normal(size=(f, d)), rng.normal(size=(f, d))
    down = rng.normal(size=(d, f))
    lay16 = ExpertLayout(d, f, "f16")
    slot = pack_expert(gate, up, down, lay16)
    m = f * d * 2
    assert lay16.matrix_bytes == m and lay16.slot_bytes % 256 == 0 and lay16.slot_bytes >= 3 * m
    # up[5, 7] as fp16 at byte M + (5 * D + 7) * 2
    off = m + (5 * d + 7) * 2
    assert slot[off : off + 2].view(np.float16)[0] == np.float16(up[5, 7])
    off = 2 * m + (9 * f + 3) * 2
    assert slot[off : off + 2].view(np.float16)[0] == np.float16(down[9, 3])

    lay4 = ExpertLayout(d, f, "int4-g128")
    m4 = f * d // 2 + f * (d // 128) * 2
    assert lay4.matrix_bytes == m4 == matrix_bytes(d, f, "int4-g128")
    slot4 = pack_expert(gate, up, down, lay4)
    qd, sd = quantize_int4_g128(down)
    # down[9, 3]: row 9 byte 1 high nibble; scale row 9 group 0 after the quants.
    b = int(slot4[2 * m4 + 9 * (f // 2) + 1])
    assert b >> 4 == int(qd[9, 1]) >> 4
    scale = slot4[2 * m4 + d * f // 2 + 9 * 2 : 2 * m4 + d * f // 2 + 9 * 2 + 2].view(np.float16)[0]
    assert scale == sd[9, 0]
    g2, u2, d2 = unpack_expert(slot4, lay4)
    np.testing.assert_array_equal(d2, dequantize_int4_g128(qd, sd))
    g1, u1, d1 = unpack_expert(slot, lay16)
    np.testing.assert_array_equal(g1, gate.astype(np.float16).astype(np.float32))


def test_layout_validation():
    with pytest.raises(ValueError):
        ExpertLayout(100, 64, "f16")
    with pytest.raises(ValueError):
        ExpertLayout(256, 96, "int4-g128")
    with pytest.raises(ValueError):
        ExpertLayout(256, 128, "q4_0")
    with pytest.raises(ValueError, match="shape"):
        pack_expert(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)), ExpertLayout(64, 64))


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_moe_ffn_reference_per_token(act):
    rng = np.random.default_rng(4)
    n_tokens, d, f, n_exp, k = 9, 32, 64, 5, 2
    experts = [
        (rng.normal(size=(f, d)), rng.normal(size=(f, d)), rng.normal(size=(d, f)))
        for _ in range(n_exp)
    ]
    x = rng.normal(size=(n_tokens, d))
    ids, w = route_reference(rng.normal(size=(n_tokens, n_exp)), k, "softmax", renorm=True)
    out = moe_ffn_reference(x, experts, ids, w, act)
    for t in range(n_tokens):
        acc = np.zeros(d)
        for j in range(k):
            g, u, dn = experts[ids[t, j]]
            for i in range(f):
                a = float(g[i] @ x[t])
                if act == "silu":
                    a = a / (1 + math.exp(-a))
                else:
                    a = 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
                acc += w[t, j] * (a * float(u[i] @ x[t])) * dn[:, i]
        np.testing.assert_allclose(out[t], acc, rtol=1e-10, atol=1e-10)


def test_build_pool_offsets():
    lay = ExpertLayout(128, 128, "int4-g128")
    rng = np.random.default_rng(5)
    experts = [tuple(rng.normal(size=(128, 128)) for _ in range(3)) for _ in range(3)]
    pool, offsets = build_pool(experts, lay)
    assert offsets.tolist() == [0, lay.slot_bytes, 2 * lay.slot_bytes]
    g, _, _ = unpack_expert(pool[offsets[2] :], lay)
    q, s = quantize_int4_g128(experts[2][0])
    np.testing.assert_array_equal(g, dequantize_int4_g128(q, s))
