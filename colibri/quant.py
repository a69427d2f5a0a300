"""GGUF block types and the CPU kernels, over numpy arrays (see include/colibri/quant.h).

`matmul(type, raw, rows, cols, x)` computes x @ W.T for a weight given as its raw GGUF bytes;
`dequantize`, `get_rows`, `ThreadPool` and the type table come from the C extension. The helpers
below make random valid weights and bound the error of the 8-bit activation scheme; tests and
benchmarks use them.
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

# f16 scale fields (byte offsets in a block) that random payload bytes must not make inf/nan
_SCALE_OFFSETS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                  "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


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
        if off == 0 and t in ("Q4_0", "Q5_0", "Q8_0"):
            d *= rng.choice([-1, 1], size=nb)
        raw[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def activation_block(t: str) -> int:
    """Block length of the activation quantization used with weights of type t (0 = float)."""
    t = type_name(t)
    if t in ("F32", "F16", "BF16"):
        return 0
    return 256 if t.endswith("_K") else 32


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
