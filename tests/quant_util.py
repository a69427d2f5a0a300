"""Shared helpers for the quant tests: random raw blocks of every type and the reference."""

from __future__ import annotations

import gguf
import gguf.quants
import numpy as np

GT = gguf.GGMLQuantizationType

# the low-bit types (issue 45): quant_lowbit.c, quant_iq.c
LOWBIT_TYPES = ["Q2_K", "Q3_K", "Q8_K", "TQ1_0", "TQ2_0", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS",
                "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"]
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q4_K",
         "Q5_K", "Q6_K", *LOWBIT_TYPES]
# f16 scale fields (byte offsets inside a block) that random bytes must not turn into inf/nan
SCALE_OFFSETS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
                 "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q2_K": [80, 82], "Q3_K": [108],
                 "TQ1_0": [52], "TQ2_0": [64], "IQ1_S": [0], "IQ2_XXS": [0], "IQ2_XS": [0],
                 "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ4_NL": [0], "IQ4_XS": [0]}
# signed scales: the types whose d may be negative in a file
SIGNED_SCALES = ("Q4_0", "Q5_0", "Q8_0", "Q3_K", "TQ1_0", "TQ2_0", "IQ4_NL", "IQ4_XS")


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
        d = (rng.uniform(0.2, 2.0, size=nb) * (rng.choice([-1, 1], size=nb) if off ==
             SCALE_OFFSETS[t][0] and t in SIGNED_SCALES else 1) / 64).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    if t == "Q8_K":  # f32 d
        raw[:, :4] = (rng.uniform(0.2, 2.0, size=nb) / 64).astype(np.float32).view(np.uint8).reshape(nb, 4)
    if t == "IQ1_M":  # the f16 d in the top nibbles of the 4 scale words (bytes 48..55)
        d = (rng.uniform(0.2, 2.0, size=nb) / 64).astype(np.float16).view(np.uint16)
        sc = raw[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):
            sc[:, k] |= ((d >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
        raw[:, 48:56] = sc.view(np.uint8)
    return raw.reshape(-1)


def quantized_raw(t: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray | None:
    """Raw bytes from gguf's own quantizer of random floats, where gguf can quantize t."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    try:
        q = gguf.quants.quantize(x, GT[t])
    except NotImplementedError:
        return None
    return np.ascontiguousarray(q).view(np.uint8).reshape(-1)


def q8k_dequant(raw: np.ndarray) -> np.ndarray:
    """Q8_K {f32 d; i8 qs[256]; i16 bsums[16]}: v = d*q (gguf has no dequantizer for it)."""
    b = np.ascontiguousarray(raw).reshape(-1, 292)
    d = b[:, :4].copy().view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return (d * b[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)


def reference_dequant(t: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    bs, bb = block(t)
    if t == "Q8_K":
        return q8k_dequant(raw).reshape(rows, cols)
    data = raw.reshape(rows, cols // bs * bb)
    if t in ("F32", "F16", "BF16"):
        data = raw.view({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t]).reshape(rows, cols)
        if t == "BF16":
            data = data.view(np.uint8).reshape(rows, cols * 2)
    return np.asarray(gguf.quants.dequantize(data, GT[t]), dtype=np.float32).reshape(rows, cols)


def activation_block(t: str) -> int:
    """The block of the activations' int8 quantization: 256 for the 256-value types (the K-quants,
    the i-quants, TQ1_0/TQ2_0; llama.cpp's Q8_K), else 32; 0 = float."""
    if t in ("F32", "F16", "BF16"):
        return 0
    return 256 if block(t)[0] == 256 else 32


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
