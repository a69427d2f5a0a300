"""GGUF block types and the CPU kernels, over numpy arrays (see include/colibri/quant.h).

`matmul(type, raw, rows, cols, x)` computes x @ W.T for a weight given as its raw GGUF bytes;
`dequantize`, `get_rows`, `ThreadPool` and the type table come from the C extension. The helpers
below make random valid weights and bound the error of the 8-bit activation scheme; tests and
benchmarks use them.

I4_G128 (id 1024, colibri's own type, never in a GGUF): int4 weights with one f16 scale per
group of 128 inputs; one block = {f16 d; u8 qs[64]} (66 bytes), v = d*(q-8), byte i holds value
2i in its low and 2i+1 in its high nibble. `quantize_i4g128` makes it (the same numbers as the
GPU quantizer colibri._cuda_ref.quantize_int4_g128), `i4g128_to_gpu` / `i4g128_from_gpu` convert
between the CPU blocks and the GPU kernels' split layout (quants [R, C/2], scales [R, C/128]).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import colibri._core._quant as _quant

ThreadPool = _quant.ThreadPool
TYPES = _quant.TYPES
SUPPORTED = _quant.SUPPORTED
type_id = _quant.type_id
type_name = _quant.type_name
block_size = _quant.block_size
block_bytes = _quant.block_bytes
row_bytes = _quant.row_bytes
dequantize = _quant.dequantize
get_rows = _quant.get_rows
matmul = _quant.matmul
quantize_q8_0 = _quant.quantize_q8_0
quantize_i4g128 = _quant.quantize_i4g128
COLIBRI_TYPES = _quant.COLIBRI_TYPES
I4_G128: int = _quant.TYPES["I4_G128"]
I4_G128_GROUP = 128
I4_G128_BLOCK_BYTES = 66


def _i4g128_shape(rows: int, cols: int) -> None:
    if rows < 0 or cols < 0 or cols % I4_G128_GROUP:
        raise ValueError(f"I4_G128 needs cols a multiple of 128 and rows >= 0, got ({rows}, {cols})")


def i4g128_to_gpu(raw: npt.ArrayLike, rows: int, cols: int
                  ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float16]]:
    """Split the raw I4_G128 blocks of a (rows, cols) matrix into the GPU layout: quants uint8
    [rows, cols/2] (same nibbles) and scales float16 [rows, cols/128]."""
    _i4g128_shape(rows, cols)
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    ng = cols // I4_G128_GROUP
    if b.size != rows * ng * I4_G128_BLOCK_BYTES:
        raise ValueError(f"I4_G128 ({rows}, {cols}) needs {rows * ng * I4_G128_BLOCK_BYTES} "
                         f"bytes, got {b.size}")
    blk = b.reshape(rows, ng, I4_G128_BLOCK_BYTES)
    scales = np.ascontiguousarray(blk[:, :, :2]).view(np.float16).reshape(rows, ng)
    quants = np.ascontiguousarray(blk[:, :, 2:]).reshape(rows, cols // 2)
    return quants, scales


def i4g128_from_gpu(quants: npt.ArrayLike, scales: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """The raw I4_G128 blocks (uint8, rows * cols/128 * 66 bytes) of a matrix in the GPU
    layout: quants uint8 [rows, cols/2], scales float16 [rows, cols/128]."""
    q = np.asarray(quants)
    s = np.asarray(scales)
    if q.dtype != np.uint8 or s.dtype != np.float16 or q.ndim != 2 or s.ndim != 2:
        raise ValueError("quants must be uint8 [rows, cols/2] and scales float16 [rows, cols/128]")
    rows, half = q.shape
    _i4g128_shape(rows, 2 * half)
    ng = 2 * half // I4_G128_GROUP
    if s.shape != (rows, ng):
        raise ValueError(f"scales of shape {s.shape} do not match quants of shape {q.shape}")
    out = np.empty((rows, ng, I4_G128_BLOCK_BYTES), dtype=np.uint8)
    out[:, :, :2] = np.ascontiguousarray(s).view(np.uint8).reshape(rows, ng, 2)
    out[:, :, 2:] = q.reshape(rows, ng, 64)
    return out.reshape(-1)

# f16 scale fields (byte offsets in a block) that random payload bytes must not make inf/nan
_SCALE_OFFSETS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                  "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "I4_G128": [0],
                  "Q2_K": [80, 82], "Q3_K": [108], "TQ1_0": [52], "TQ2_0": [64], "IQ1_S": [0],
                  "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
                  "IQ4_NL": [0], "IQ4_XS": [0]}


def random_weight(t: str, rows: int, cols: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """Raw bytes of a random valid (rows, cols) weight of type t: random payload bits, finite
    scales of a sane magnitude (values roughly in [-1, 1])."""
    t = type_name(t)
    if t == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8).reshape(-1)
    if t == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8).reshape(-1)
    if t == "BF16":
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    bs, bb = block_size(t), block_bytes(t)
    nb = rows * cols // bs
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    if t == "MXFP4":
        raw[:, 0] = rng.integers(118, 130, size=nb)
    for off in _SCALE_OFFSETS.get(t, []):
        d = rng.uniform(0.2, 2.0, size=nb) / 64
        if off == 0 and t in ("Q4_0", "Q5_0", "Q8_0", "I4_G128"):
            d *= rng.choice([-1, 1], size=nb)
        raw[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if t == "Q8_K":  # f32 d
        raw[:, :4] = (rng.uniform(0.2, 2.0, size=nb) / 64).astype(np.float32).view(np.uint8).reshape(nb, 4)
    if t == "IQ1_M":  # f16 d in the top nibbles of the 4 scale words (bytes 48..55)
        dh = (rng.uniform(0.2, 2.0, size=nb) / 64).astype(np.float16).view(np.uint16)
        sc = raw[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):
            sc[:, k] |= ((dh >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
        raw[:, 48:56] = sc.view(np.uint8)
    return raw.reshape(-1)


def activation_block(t: str) -> int:
    """Block length of the activation quantization used with weights of type t (0 = float)."""
    t = type_name(t)
    if t in ("F32", "F16", "BF16"):
        return 0
    return 256 if block_size(t) == 256 else 32  # the 256-value types meet Q8_K-like blocks


def error_bound(t: str, w: npt.NDArray[np.float32], x: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Bound [n, rows] on |matmul(W, x) - x @ W.T| for the dequantized weight w [rows, cols]:
    the activation rounding sum_b max|x_b|/254 * sum_{c in b} |W[r, c]| plus float32 slack."""
    n, cols = x.shape
    aw = np.abs(w.astype(np.float64))
    ax = np.abs(x.astype(np.float64))
    mag = ax @ aw.T
    slack = 2e-6 * np.sqrt(cols) * mag + 1e-30
    ab = activation_block(t)
    if ab == 0:
        return slack + 1e-6 * mag
    nb = cols // ab
    amax = ax.reshape(n, nb, ab).max(axis=2) / 254.0
    wsum = aw.reshape(w.shape[0], nb, ab).sum(axis=2)
    return np.asarray(amax @ wsum.T * 1.001 + slack)
