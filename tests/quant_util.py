"""Shared helpers for the quant tests: random raw blocks of every type and the reference."""

from __future__ import annotations

import gguf
import gguf.quants
import numpy as np

GT = gguf.GGMLQuantizationType

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K",
         "Q5_K", "Q6_K"]
# f16 scale fields (byte offsets inside a block) that random bytes must not turn into inf/nan
SCALE_OFFSETS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                 "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def block(t: str) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[GT[t]]


def random_raw(t: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes (uint8 [rows * row_bytes]) of a random valid (rows, cols) tensor of type t:
    random payload bits, finite scales of sane magnitude."""
    if t == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8).reshape(-1)
    if t == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8).reshape(-1)
    if t == "BF16":
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        return gguf.quants.quantize(x, GT.BF16).view(np.uint8).reshape(-1)
    bs, bb = block(t)
    nb = rows * cols // bs
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    if t == "MXFP4":
        raw[:, 0] = rng.integers(118, 130, size=nb)
    for off in SCALE_OFFSETS.get(t, []):
        d = (rng.uniform(0.2, 2.0, size=nb) * (rng.choice([-1, 1], size=nb) if off == 0 and
             t in ("Q4_0", "Q5_0", "Q8_0") else 1) / 64).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def quantized_raw(t: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray | None:
    """Raw bytes from gguf's own quantizer of random floats, where gguf can quantize t."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    try:
        q = gguf.quants.quantize(x, GT[t])
    except NotImplementedError:
        return None
    return np.ascontiguousarray(q).view(np.uint8).reshape(-1)


def reference_dequant(t: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    bs, bb = block(t)
    data = raw.reshape(rows, cols // bs * bb)
    if t in ("F32", "F16", "BF16"):
        data = raw.view({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t]).reshape(rows, cols)
        if t == "BF16":
            data = data.view(np.uint8).reshape(rows, cols * 2)
    return np.asarray(gguf.quants.dequantize(data, GT[t]), dtype=np.float32).reshape(rows, cols)


def activation_block(t: str) -> int:
    if t in ("F32", "F16", "BF16"):
        return 0
    return 256 if t.endswith("_K") else 32


def matmul_bound(t: str, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Rigorous bound [n, rows] of the error that quantizing the activations adds:
    sum over activation blocks b of max|x_b|/254 * sum_{c in b} |W[r, c]|, plus float32
    rounding slack."""
    n, cols = x.shape
    aw = np.abs(w.astype(np.float64))
    ax = np.abs(x.astype(np.float64))
    slack = 2e-6 * np.sqrt(cols) * (ax @ aw.T) + 1e-30
    ab = activation_block(t)
    if ab == 0:
        return slack + 1e-6 * (ax @ aw.T)
    nb = cols // ab
    amax = ax.reshape(n, nb, ab).max(axis=2) / 254.0  # [n, nb]
    wsum = aw.reshape(w.shape[0], nb, ab).sum(axis=2)  # [rows, nb]
    return amax @ wsum.T * 1.001 + slack
