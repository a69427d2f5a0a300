"""The R16 layouts (include/colibri/quant.h): Q8_0, Q5_0, Q6_K and Q4_K rows re-laid in groups of
16 for the decode matvec.

Each layout is checked against its description (a numpy decoder written from the header, against
the gguf package's dequantization of the same source bytes), the packing, row lookup and
products at every SIMD level: the products are the source matrix's bit for bit at every token
count, thread count and matmul option (the batch-invariant paths; at the scalar level against
AVX2's, whose invariant tiles keep the same float order). Bad input is refused clearly."""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest
from backend_ops import CPU_LEVELS
from quant_util import GT, random_raw

import colibri._core._quant as q
from colibri import simd

SOURCES = ("Q8_0", "Q5_0", "Q6_K", "Q4_K")
SHAPES = [(16, 32), (37, 640), (1, 64), (262, 96), (48, 1024)]
K_SHAPES = [(16, 256), (37, 512), (1, 256), (262, 768), (48, 1024)]  # K-quants: 256-value blocks


def _shape_cases() -> list[tuple[str, int, int]]:
    return [(t, r, c) for t in SOURCES for r, c in (K_SHAPES if t[-1] == "K" else SHAPES)]


def _steps(pk: np.ndarray, t: str, groups: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """The documented layout: per block 8 steps of 64 positions (p = 32*(row/8) + 4*(row%8) +
    value%4 of step value/4), then d[16] as f16. Returns q [groups, nb, 8, 64] (0..255 / 0..31)
    and d [groups, nb, 16]."""
    bst = 544 if t == "Q8_0" else 352
    blocks = pk.reshape(groups, nb, bst)
    d = blocks[:, :, bst - 32:].copy().view(np.float16).astype(np.float32)
    if t == "Q8_0":  # step s: 64 bytes q + 128
        return blocks[:, :, :512].reshape(groups, nb, 8, 64).astype(np.int16), d
    nib = blocks[:, :, :256].reshape(groups, nb, 4, 64).astype(np.int16)
    low = np.concatenate([nib & 0x0F, nib >> 4], axis=2)  # steps v, then v + 4
    bits = np.unpackbits(blocks[:, :, 256:320].reshape(groups, nb, 8, 8), axis=-1,
                         bitorder="little").astype(np.int16)
    return low | bits << 4, d


def _decode_q6k(pk: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q6_K_R16 as documented: per super-block 16 chunks of 192 bytes (chunk k: the low nibbles of
    steps k | k + 32, of steps k + 16 | k + 48, the high 2-bit fields of steps k + 16f), the
    scales int8 [16 sub-blocks][16 rows], d[16] f16; value = d * scale * (q - 32)."""
    nb, groups = cols // 256, -(-rows // 16)
    blk = pk.reshape(groups, nb, 3360)
    ch = blk[:, :, :3072].reshape(groups, nb, 16, 3, 64).astype(np.int16)
    steps = np.empty((groups, nb, 64, 64), np.int16)
    for f in range(4):  # steps k + 16f: nibbles of part f % 2 (high when f >= 2), field f
        nib = ch[:, :, :, f % 2] >> (4 if f >= 2 else 0) & 0x0F
        steps[:, :, 16 * f:16 * f + 16] = nib | (ch[:, :, :, 2] >> (2 * f) & 3) << 4
    sc = blk[:, :, 3072:3328].view(np.int8).reshape(groups, nb, 16, 16).astype(np.float32)
    d = blk[:, :, 3328:].copy().view(np.float16).astype(np.float32)  # [g, nb, row]
    # [g, nb, step s, row j, k] -> row j, value 4s + k (sub-block s // 4)
    qv = steps.reshape(groups, nb, 64, 16, 4).transpose(0, 3, 1, 2, 4).astype(np.float32) - 32
    scale = sc.transpose(0, 3, 1, 2).repeat(16, axis=-1).reshape(groups, 16, nb, 64, 4)
    vals = qv * scale * d.transpose(0, 2, 1)[..., None, None]
    return vals.reshape(groups * 16, cols)


def _decode_q4k(pk: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_K_R16 as documented: per super-block 32 vectors of 64 bytes (vector v: the low nibbles of
    step v | those of step v + 32), 128 bytes [sub-block j][row] scale | (min & 3) << 6, 64 bytes
    [j < 4][row] min_j >> 2 | (min_j+4 >> 2) << 4, d[16], dmin[16]; value = d * sc * q - dmin * m."""
    nb, groups = cols // 256, -(-rows // 16)
    blk = pk.reshape(groups, nb, 2304)
    vec = blk[:, :, :2048].reshape(groups, nb, 32, 64).astype(np.int16)
    steps = np.concatenate([vec & 0x0F, vec >> 4], axis=2)  # steps 0..31, then 32..63
    sb = blk[:, :, 2048:2176].reshape(groups, nb, 8, 16).astype(np.int16)
    nib = blk[:, :, 2176:2240].reshape(groups, nb, 4, 16).astype(np.int16)
    sc = (sb & 63).astype(np.float32)
    hi = np.concatenate([nib & 0x0F, nib >> 4], axis=2)  # min >> 2 of sub-blocks 0..3, 4..7
    mn = (sb >> 6 | hi << 2).astype(np.float32)
    d = blk[:, :, 2240:2272].copy().view(np.float16).astype(np.float32)  # [g, nb, row]
    dmin = blk[:, :, 2272:].copy().view(np.float16).astype(np.float32)
    # [g, nb, step s, row j, k] -> [g, row, nb, sub-block s // 8, 32 values]
    qv = steps.reshape(groups, nb, 8, 8, 16, 4).transpose(0, 4, 1, 2, 3, 5).reshape(groups, 16, nb, 8, 32)
    scale = (d[..., None] * sc.transpose(0, 1, 3, 2)).transpose(0, 2, 1, 3)[..., None]  # [g, row, nb, 8, 1]
    mins = (dmin[..., None] * mn.transpose(0, 1, 3, 2)).transpose(0, 2, 1, 3)[..., None]
    vals = scale * qv.astype(np.float32) - mins
    return vals.reshape(groups * 16, cols)


def _decode(pk: np.ndarray, t: str, rows: int, cols: int) -> np.ndarray:
    if t == "Q6_K":
        return _decode_q6k(pk, rows, cols)
    if t == "Q4_K":
        return _decode_q4k(pk, rows, cols)
    nb, groups = cols // 32, -(-rows // 16)
    qv, d = _steps(pk, t, groups, nb)
    qv = qv - (128 if t == "Q8_0" else 16)
    # [group, block, step s, half h, row j, k] -> row 8h + j, value 4s + k
    qv = qv.reshape(groups, nb, 8, 2, 8, 4).transpose(0, 3, 4, 1, 2, 5).reshape(groups, 16, nb, 32)
    vals = qv.astype(np.float32) * d.transpose(0, 2, 1)[..., None]
    return vals.reshape(groups * 16, cols)


@pytest.mark.parametrize("t,rows,cols", _shape_cases())
def test_layout_is_the_documented_one(t, rows, cols):
    rng = np.random.default_rng(rows * cols)
    raw = random_raw(t, rows, cols, rng)
    lay = q.r16_layout(t)
    pk = q.pack_r16(t, raw, rows, cols)
    assert pk.size == q.r16_bytes(lay, rows, cols) == -(-rows // 16) * 16 * q.row_bytes(t, cols)
    assert q.row_bytes(lay, cols) == q.row_bytes(t, cols)  # in as many bytes
    assert pk.ctypes.data % 64 == 0
    ref = gguf.quants.dequantize(raw.reshape(rows, -1), GT[t]).astype(np.float32)
    full = _decode(pk, t, rows, cols)
    assert np.array_equal(full[:rows], ref)
    assert not full[rows:].any()  # the padding rows are zeros (d = 0)
    ids = rng.integers(0, rows, size=2 * rows)  # get_rows reads the layout, repeats included
    assert np.array_equal(q.get_rows(lay, pk, rows, cols, ids), ref[ids])


@pytest.mark.parametrize("t", SOURCES)
def test_packing_is_the_same_at_every_level(t):
    rng = np.random.default_rng(1)
    rows, cols = 37, 768 if t[-1] == "K" else 640
    raw = random_raw(t, rows, cols, rng)
    packs = {}
    for level in CPU_LEVELS:
        with simd.max_simd(level):
            packs[level] = q.pack_r16(t, raw, rows, cols, pool=q.ThreadPool(2))
    for level, pk in packs.items():
        assert np.array_equal(pk, packs["scalar"]), level


@pytest.mark.parametrize("level", CPU_LEVELS)
@pytest.mark.parametrize("t,rows,cols", _shape_cases())
def test_products_are_the_source_products(t, level, rows, cols):
    """Every token count (the decode matvec, the token tiles and their tails), one and two
    threads: bit-identical to the source matrix's, and a token's row does not depend on the
    batch. At the scalar level the source kernels sum in another order: there the layout's scalar
    tile is checked against the AVX2 level's products (the same order)."""
    rng = np.random.default_rng(rows + cols)
    raw = random_raw(t, rows, cols, rng)
    lay = q.r16_layout(t)
    pk = q.pack_r16(t, raw, rows, cols)
    x = rng.standard_normal((17, cols)).astype(np.float32)
    ref_level = level if level != "scalar" else ("avx2" if "avx2" in CPU_LEVELS else None)
    for n in (1, 2, 3, 4, 5, 8, 9, 17):
        for threads in (1, 2):
            with simd.max_simd(level):
                b = q.matmul(lay, pk, rows, cols, x[:n], threads=threads)
                one = q.matmul(lay, pk, rows, cols, x[0])
            assert b[0].tobytes() == one.tobytes(), (level, n, threads)  # batch invariance
            if ref_level is not None:
                with simd.max_simd(ref_level):
                    a = q.matmul(t, raw, rows, cols, x[:n], threads=threads)
                assert a.tobytes() == b.tobytes(), (level, n, threads)
            else:  # a CPU without AVX2: within the activations' rounding of the exact product
                w = gguf.quants.dequantize(raw.reshape(rows, -1), GT[t]).astype(np.float64)
                exact = x[:n].astype(np.float64) @ w.T
                assert np.abs(b - exact).max() <= 1e-2 * (np.abs(exact).max() + 1)


@pytest.mark.parametrize("t", SOURCES)
def test_options_accumulate_scale_and_ids(t):
    rng = np.random.default_rng(7)
    rows, cols = 40, 512
    raw = random_raw(t, rows, cols, rng)
    lay = q.r16_layout(t)
    pk = q.pack_r16(t, raw, rows, cols)
    x = rng.standard_normal((6, cols)).astype(np.float32)
    scale = rng.uniform(0.5, 2, size=6).astype(np.float32)
    ids = np.array([5, 0, 3, 3, 1, 2], np.int32)
    for kw in ({"token_scale": scale}, {"token_ids": ids}, {"token_scale": scale, "token_ids": ids}):
        outs = []
        for typ, w in ((t, raw), (lay, pk)):
            out = np.full((6, rows), 0.25, np.float32)
            outs.append(q.matmul(typ, w, rows, cols, x, out=out, accumulate=True, threads=2, **kw))
        assert outs[0].tobytes() == outs[1].tobytes(), kw


def test_bad_input_is_refused():
    rng = np.random.default_rng(3)
    raw = random_raw("Q8_0", 20, 64, rng)
    pk = q.pack_r16("Q8_0", raw, 20, 64)
    assert pk.size == 2 * 2 * 544  # 20 rows: two groups of two blocks
    with pytest.raises(ValueError, match="16-row layout"):
        q.dequantize("Q8_0_R16", pk, (20, 64))
    with pytest.raises(ValueError, match="needs 2176 bytes"):
        q.matmul("Q8_0_R16", pk[:-1], 20, 64, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        q.r16_bytes("Q5_0_R16", 4, 48)
    with pytest.raises(ValueError, match="not an R16 layout"):
        q.r16_bytes("Q8_0", 4, 64)
    with pytest.raises(ValueError, match="Q5_K has no R16 layout"):
        q.pack_r16("Q5_K", np.zeros(176, np.uint8), 1, 256)
    with pytest.raises(ValueError, match="needs 1360 bytes"):  # the source must be Q8_0's size
        q.pack_r16("Q8_0", raw[:-1], 20, 64)
    buf = np.zeros(pk.size + 65, np.uint8)
    off = (-buf.ctypes.data) % 64
    with pytest.raises(ValueError, match="64-byte aligned"):
        q.pack_r16("Q8_0", raw, 20, 64, out=buf[off + 1:off + 1 + pk.size])
    assert np.array_equal(q.pack_r16("Q8_0", raw, 20, 64, out=buf[off:off + pk.size]), pk)
    with pytest.raises(ValueError, match="at least 1088 bytes"):
        q.pack_r16("Q8_0", raw[:680], 10, 64, out=buf[off:off + 64])
    with pytest.raises(ValueError, match="out of range"):
        q.get_rows("Q8_0_R16", pk, 20, 64, [20])
    assert set(q.LAYOUTS) == {"Q8_0_R16", "Q5_0_R16", "Q6_K_R16", "Q4_K_R16"}
    assert not set(q.LAYOUTS) & set(q.SUPPORTED)
    assert q.r16_layout("Q4_0") is None and q.r16_layout("Q5_0") == "Q5_0_R16"
    assert q.r16_layout("Q6_K") == "Q6_K_R16" and q.r16_layout("Q4_K") == "Q4_K_R16"
    assert q.r16_layout("Q5_K") is None
    with pytest.raises(ValueError, match="not a multiple of the block size"):
        q.r16_bytes("Q6_K_R16", 4, 128)  # Q6_K_R16's blocks are 256 values
    assert q.r16_bytes("Q6_K_R16", 17, 512) == 2 * 16 * 420
