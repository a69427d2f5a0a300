"""Q8_0_R16 (include/colibri/quant.h): Q8_0 rows re-laid in groups of 16 for the decode matvec.

The layout is checked against its description (a numpy decoder written from the header, fed the
gguf package's dequantization of the same Q8_0 bytes), the packing is the same at every SIMD
level, and its products are the Q8_0 matrix's bit for bit at every level, token count, thread
count and matmul option (the batch-invariant paths; the scalar level against AVX2's, whose
invariant tiles keep the same float order). Bad input is refused with a clear error."""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest
from backend_ops import CPU_LEVELS
from quant_util import GT, random_raw

import colibri._core._quant as q
from colibri import simd

SHAPES = [(16, 32), (37, 640), (1, 64), (262, 96), (48, 1024)]


def _decode(pk: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The documented layout, decoded: groups of 16 rows, per block of 32 values 8 steps of 64
    bytes (step s: values 4s..4s+3 of rows 0..7, then rows 8..15, as q + 128), then d[16] f32."""
    nb, groups = cols // 32, -(-rows // 16)
    out = np.zeros((groups * 16, cols), np.float32)
    blocks = pk.reshape(groups, nb, 576)
    qv = (blocks[:, :, :512].reshape(groups, nb, 8, 2, 8, 4).astype(np.int16) - 128)
    # [group, block, step s, half h, row j, k] -> row 8h + j, value 4s + k
    qv = qv.transpose(0, 3, 4, 1, 2, 5).reshape(groups, 16, nb * 32)
    d = blocks[:, :, 512:].copy().view(np.float32).reshape(groups, nb, 16)
    vals = qv.astype(np.float32).reshape(groups, 16, nb, 32) * d.transpose(0, 2, 1)[..., None]
    out[:] = vals.reshape(groups * 16, cols)
    return out


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_layout_is_the_documented_one(rows, cols):
    rng = np.random.default_rng(rows * cols)
    raw = random_raw("Q8_0", rows, cols, rng)
    pk = q.pack_q8_0_r16(raw, rows, cols)
    assert pk.size == q.q8_0_r16_bytes(rows, cols) == -(-rows // 16) * cols // 32 * 576
    assert pk.ctypes.data % 64 == 0
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), GT.Q8_0).astype(np.float32)
    full = _decode(pk, rows, cols)
    assert np.array_equal(full[:rows], ref)
    assert not full[rows:].any()  # the padding rows are zeros (d = 0)
    # get_rows reads the layout: the same values, in any order, repeated ids included
    ids = rng.integers(0, rows, size=2 * rows)
    assert np.array_equal(q.get_rows("Q8_0_R16", pk, rows, cols, ids), ref[ids])


def test_packing_is_the_same_at_every_level():
    rng = np.random.default_rng(1)
    rows, cols = 37, 640
    raw = random_raw("Q8_0", rows, cols, rng)
    packs = {}
    for level in CPU_LEVELS:
        with simd.max_simd(level):
            packs[level] = q.pack_q8_0_r16(raw, rows, cols, pool=q.ThreadPool(2))
    for level, pk in packs.items():
        assert np.array_equal(pk, packs["scalar"]), level


@pytest.mark.parametrize("level", CPU_LEVELS)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_products_are_the_q8_0_products(level, rows, cols):
    """Every token count (the decode matvec, the packed path's token tiles and their tails),
    one and two threads: bit-identical to the Q8_0 matrix's, and a token's row does not depend
    on the batch. At the scalar level the Q8_0 kernels sum in another order: there the layout's
    scalar tile is checked against the AVX2 level's Q8_0 products (the same order)."""
    rng = np.random.default_rng(rows + cols)
    raw = random_raw("Q8_0", rows, cols, rng)
    pk = q.pack_q8_0_r16(raw, rows, cols)
    x = rng.standard_normal((17, cols)).astype(np.float32)
    ref_level = level if level != "scalar" else ("avx2" if "avx2" in CPU_LEVELS else None)
    for n in (1, 2, 3, 4, 5, 8, 9, 17):
        for threads in (1, 2):
            with simd.max_simd(level):
                b = q.matmul("Q8_0_R16", pk, rows, cols, x[:n], threads=threads)
                one = q.matmul("Q8_0_R16", pk, rows, cols, x[0])
            # batch invariance: the first token's row is the single-token matvec's
            assert b[0].tobytes() == one.tobytes(), (level, n, threads)
            if ref_level is not None:
                with simd.max_simd(ref_level):
                    a = q.matmul("Q8_0", raw, rows, cols, x[:n], threads=threads)
                assert a.tobytes() == b.tobytes(), (level, n, threads)
            else:  # a CPU without AVX2: within the activations' rounding of the exact product
                w = gguf.quants.dequantize(raw.reshape(rows, -1), GT.Q8_0).astype(np.float64)
                exact = x[:n].astype(np.float64) @ w.T
                assert np.abs(b - exact).max() <= 1e-2 * (np.abs(exact).max() + 1)


def test_options_accumulate_scale_and_ids():
    rng = np.random.default_rng(7)
    rows, cols = 40, 256
    raw = random_raw("Q8_0", rows, cols, rng)
    pk = q.pack_q8_0_r16(raw, rows, cols)
    x = rng.standard_normal((6, cols)).astype(np.float32)
    scale = rng.uniform(0.5, 2, size=6).astype(np.float32)
    ids = np.array([5, 0, 3, 3, 1, 2], np.int32)
    for kw in ({"token_scale": scale}, {"token_ids": ids}, {"token_scale": scale, "token_ids": ids}):
        outs = []
        for t, w in (("Q8_0", raw), ("Q8_0_R16", pk)):
            out = np.full((6, rows), 0.25, np.float32)
            outs.append(q.matmul(t, w, rows, cols, x, out=out, accumulate=True, threads=2, **kw))
        assert outs[0].tobytes() == outs[1].tobytes(), kw


def test_bad_input_is_refused():
    rng = np.random.default_rng(3)
    raw = random_raw("Q8_0", 20, 64, rng)
    pk = q.pack_q8_0_r16(raw, 20, 64)
    with pytest.raises(Exception, match="16-row layout"):
        q.dequantize("Q8_0_R16", pk, (20, 64))
    with pytest.raises(ValueError, match="needs 2304 bytes"):  # 20 rows: two groups of 2 blocks of 576
        q.matmul("Q8_0_R16", pk[:-1], 20, 64, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        q.q8_0_r16_bytes(4, 48)
    with pytest.raises(ValueError, match="needs 1360 bytes"):  # the source must be Q8_0's size
        q.pack_q8_0_r16(raw[:-1], 20, 64)
    buf = np.zeros(q.q8_0_r16_bytes(20, 64) + 65, np.uint8)
    off = (-buf.ctypes.data) % 64
    with pytest.raises(ValueError, match="64-byte aligned"):
        q.pack_q8_0_r16(raw, 20, 64, out=buf[off + 1:off + 1 + pk.size])
    got = q.pack_q8_0_r16(raw, 20, 64, out=buf[off:off + pk.size])
    assert np.array_equal(got, pk)
    with pytest.raises(ValueError, match="at least 1152 bytes"):
        q.pack_q8_0_r16(raw[:680], 10, 64, out=buf[off:off + 64])
    with pytest.raises(ValueError, match="out of range"):
        q.get_rows("Q8_0_R16", pk, 20, 64, [20])
    assert "Q8_0_R16" in q.LAYOUTS and "Q8_0_R16" not in q.SUPPORTED
