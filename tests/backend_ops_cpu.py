"""The rows of colibri._core's ops (include/colibri/ops.h, quant.h) in the op x backend table
(backend_ops.py): float ops against numpy float64, quantized ops against gguf-py's dequantizers
and quantizer. None has a CUDA version: the CUDA side (cuda/*.cu) is the MoE path only.
"""

from __future__ import annotations

from typing import Any

import gguf.quants
import numpy as np
from backend_ops import Case, Missing, Op, close
from quant_util import GT, matmul_bound, quantized_raw, random_raw, reference_dequant
from quant_util import TYPES as GGUF_TYPES

import colibri._core._ops as ops
import colibri._core._quant as q
from colibri._cuda_ref import quantize_int4_g128

NO_CUDA = Missing("no kernel in cuda/*.cu (the CUDA side runs only the MoE experts)")
CUDA_MOE = Missing("no standalone kernel: the MoE GEMMs multiply F16 / int4-g128 expert "
                   "weights inside moe_ffn.* (their rows)")
QUANT_TYPES = [*GGUF_TYPES, "I4_G128"]


def cpu_only(fn: Any) -> dict[str, Any]:
    return {"cpu": fn, "cuda-emu": NO_CUDA, "cuda": NO_CUDA}


# ---------------------------------------------------------------- float64 references


def ref_rmsnorm(x, w, eps, unit):
    x = x.astype(np.float64)
    r = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    if w is not None:
        r = r * (w.astype(np.float64) + (1.0 if unit else 0.0))
    return r


def ref_softmax(x):
    x = x.astype(np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def ref_silu(x):
    x = x.astype(np.float64)
    return x / (1.0 + np.exp(-x))


def ref_gelu_tanh(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def ref_yarn_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    def corr(n_rot):
        return n_dims * np.log(n_ctx_orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))

    return max(0.0, np.floor(corr(beta_fast))), min(n_dims - 1.0, np.ceil(corr(beta_slow)))


def ref_rope(x, positions, mode="normal", n_dims=0, freq_base=10000.0, freq_scale=1.0,
             ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0,
             freq_factors=None):
    """ggml_rope_ext's formulas in float64: pair i rotates by theta_i(p), magnitude mscale."""
    x = x.astype(np.float64).copy()
    hd = x.shape[-1]
    nd = n_dims or hd
    i = np.arange(nd // 2)
    extrap = np.asarray(positions, np.float64)[:, None] * float(freq_base) ** (-2.0 * i / nd)
    if freq_factors is not None:
        extrap = extrap / np.asarray(freq_factors, np.float64)
    interp = freq_scale * extrap
    mscale = attn_factor
    theta = interp
    if ext_factor != 0:
        lo, hi = ref_yarn_corr_dims(nd, n_ctx_orig, freq_base, beta_fast, beta_slow)
        ramp = 1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
        mix = ramp * ext_factor
        theta = interp * (1 - mix) + extrap * mix
        mscale *= 1 + 0.1 * np.log(1 / freq_scale)
    c = (np.cos(theta) * mscale)[:, None, :]
    s = (np.sin(theta) * mscale)[:, None, :]
    if mode == "neox":
        a, b = x[..., : nd // 2].copy(), x[..., nd // 2 : nd].copy()
        x[..., : nd // 2] = a * c - b * s
        x[..., nd // 2 : nd] = a * s + b * c
    else:
        a, b = x[..., 0:nd:2].copy(), x[..., 1:nd:2].copy()
        x[..., 0:nd:2] = a * c - b * s
        x[..., 1:nd:2] = a * s + b * c
    return x


# ---------------------------------------------------------------- float op inputs

SHAPES = [(1,), (7,), (8,), (33,), (3, 64), (5, 257), (2, 3, 100), (1, 4096)]
SPECIALS = np.array([0.0, -0.0, 1e-8, -1e-8, 0.3, -0.6, 0.62, 0.63, 9.0, -9.0, 30.0, -30.0,
                     87.0, -87.0, 88.8, -88.8, 100.0, -100.0], np.float32)


def act_input(rng, shape):
    """Normal values times 4, the first ones replaced by the activations' hard points (the
    exp/tanh polynomials' range ends, overflow of exp(-x), signed zeros)."""
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    flat[: min(flat.size, SPECIALS.size)] = SPECIALS[: flat.size]
    return x


def unary_cases(rng, scale=1.0):
    return [{"label": f"shape {s}", "x": (rng.standard_normal(s) * scale).astype(np.float32)}
            for s in SHAPES]


def binary_cases(rng):
    return [{"label": f"shape {s}", "a": rng.standard_normal(s).astype(np.float32),
             "b": rng.standard_normal(s).astype(np.float32)} for s in SHAPES]


def checker(rtol, atol):
    def check(got, want, case):
        assert np.shape(got) == np.shape(want), (np.shape(got), np.shape(want))
        assert np.asarray(got).dtype == np.float32
        close(got, want, rtol, atol)
    return check


ELEMENTWISE_TOL = ("rtol 1e-5, atol 1e-6: float32 results of float64 formulas; the AVX2/AVX-512 "
                   "exp and tanh polynomials are within ~4e-7 relative")


def rmsnorm_cases(rng):
    out = []
    for s in SHAPES:
        for weighted, unit in ((False, False), (True, False), (True, True)):
            out.append({"label": f"shape {s}, weight {weighted}, unit offset {unit}",
                        "x": (rng.standard_normal(s) * 3).astype(np.float32),
                        "w": rng.standard_normal(s[-1]).astype(np.float32) if weighted else None,
                        "unit": unit})
    return out


def softmax_cases(rng):
    return [{"label": f"shape {s}, spread {sp}",
             "x": (rng.standard_normal(s) * sp).astype(np.float32)}
            for s in SHAPES for sp in (1.0, 30.0, 1000.0)]


def check_softmax(got, want, case):
    checker(1e-5, 1e-7)(got, want, case)
    close(np.sum(got, axis=-1), 1.0, 0, 1e-5)


def glu_cases(act):
    def gen(rng):
        return [{"label": f"n {n}", "act": act, "g": act_input(rng, (n,)),
                 "u": rng.standard_normal(n).astype(np.float32)} for n in (1, 9, 64, 1000)]
    return gen


def dot_cases(rng):
    return [{"label": f"n {n}", "a": rng.standard_normal(n).astype(np.float32),
             "b": rng.standard_normal(n).astype(np.float32)}
            for n in (0, 1, 7, 8, 31, 32, 33, 100, 4096)]


def check_dot(got, want, case):
    a64, b64 = case["a"].astype(np.float64), case["b"].astype(np.float64)
    bound = 1e-6 * float(np.abs(a64) @ np.abs(b64)) + 1e-7
    assert abs(got - want) <= bound, (got, want, bound)


def dot_rows_cases(rng):
    return [{"label": f"{n} rows of {d}", "q": rng.standard_normal(d).astype(np.float32),
             "k": rng.standard_normal((n, d)).astype(np.float32), "scale": d**-0.5}
            for n, d in ((1, 8), (13, 80), (7, 128), (40, 33))]


ROPE_POS = np.array([0, 1, 17, 4095, 100000])
ROPE_VARIANTS = {
    "rope.normal": [
        dict(mode="normal"),
        dict(mode="normal", freq_base=500000.0, freq_scale=0.25),  # linear scaling
        dict(mode="normal", freq_base=500000.0, freq_factors="ff"),  # llama-3.1 rope_freqs
    ],
    "rope.neox": [
        dict(mode="neox"),
        dict(mode="neox", n_dims=32),  # partial rotation (phi-2 / stablelm style)
        dict(mode="neox", freq_base=1e6),
    ],
    "rope.yarn": [
        dict(mode="normal", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=4096),
        dict(mode="neox", freq_scale=1 / 40, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=4096,
             beta_fast=32.0, beta_slow=1.0),  # deepseek-style YaRN
        dict(mode="neox", freq_scale=0.5, ext_factor=0.5, n_ctx_orig=2048, beta_fast=16.0,
             beta_slow=2.0),
    ],
}


def rope_cases(name):
    def gen(rng):
        out = []
        for kw in ROPE_VARIANTS[name]:
            for hd in (64, 128):
                kw2 = dict(kw)
                if kw2.get("freq_factors") == "ff":
                    kw2["freq_factors"] = (1 + rng.random(hd // 2) * 7).astype(np.float32)
                out.append({"label": f"head_dim {hd}, {kw}", "kw": kw2,
                            "x": rng.standard_normal((5, 3, hd)).astype(np.float32)})
        return out
    return gen


def _rope_row(name: str) -> Op:
    return Op(name, rope_cases(name), lambda c: ref_rope(c["x"], ROPE_POS, **c["kw"]),
              checker(1e-5, 2e-6),
              "rtol 1e-5, atol 2e-6: cos/sin in double, the rotation in float32",
              cpu_only(lambda ctx, c: ops.rope(c["x"], ROPE_POS, **c["kw"])), api=("rope",))


def _unary(name, fn, ref, cases=unary_cases):
    return Op(name, cases, lambda c: ref(c["x"]), checker(1e-5, 1e-6), ELEMENTWISE_TOL,
              cpu_only(lambda ctx, c: fn(c["x"])), api=(name,))


def _binary(name, fn, ref):
    return Op(name, binary_cases, lambda c: ref(c["a"].astype(np.float64),
                                                  c["b"].astype(np.float64)),
              checker(1e-5, 1e-6), ELEMENTWISE_TOL,
              cpu_only(lambda ctx, c: fn(c["a"], c["b"])), api=(name,))


def softcap_cases(rng):
    return [{**c, "label": f"{c['label']}, cap {cap}", "x": c["x"] * 40, "cap": cap}
            for c in unary_cases(rng) for cap in (0.5, 30.0, 50.0)]


FLOAT_ROWS = [
    Op("rmsnorm", rmsnorm_cases, lambda c: ref_rmsnorm(c["x"], c["w"], 1e-6, c["unit"]),
       checker(1e-5, 1e-6), "rtol 1e-5, atol 1e-6: a float32 sum of squares (SIMD lanes, then "
       "a tree) against float64",
       cpu_only(lambda ctx, c: ops.rmsnorm(c["x"], c["w"], eps=1e-6, add_unit_offset=c["unit"])),
       api=("rmsnorm",)),
    Op("softmax", softmax_cases, lambda c: ref_softmax(c["x"]), check_softmax,
       "rtol 1e-5, atol 1e-7 (and rows sum to 1 within 1e-5): float32 exp polynomial and sum",
       cpu_only(lambda ctx, c: ops.softmax(c["x"])), api=("softmax",)),
    _unary("silu", ops.silu, ref_silu, lambda rng: [
        {"label": f"shape {s}", "x": act_input(rng, s)} for s in SHAPES]),
    _unary("gelu_tanh", ops.gelu_tanh, ref_gelu_tanh, lambda rng: [
        {"label": f"shape {s}", "x": act_input(rng, s)} for s in SHAPES]),
    *[Op(f"glu.{act}", glu_cases(act), lambda c, r=r: r(c["g"]) * c["u"].astype(np.float64),
         checker(1e-5, 1e-6), ELEMENTWISE_TOL,
         cpu_only(lambda ctx, c: ops.glu(c["g"], c["u"], c["act"])), api=("glu",))
      for act, r in (("silu", ref_silu), ("gelu_tanh", ref_gelu_tanh))],
    _binary("mul", ops.mul, lambda a, b: a * b),
    _binary("add", ops.add, lambda a, b: a + b),
    _binary("axpy", lambda a, b: ops.axpy(-0.75, a, b), lambda a, b: b - 0.75 * a),
    Op("scale", unary_cases, lambda c: c["x"].astype(np.float64) * 0.125, checker(1e-5, 1e-6),
       ELEMENTWISE_TOL, cpu_only(lambda ctx, c: ops.scale(c["x"], 0.125)), api=("scale",)),
    Op("softcap", softcap_cases,
       lambda c: c["cap"] * np.tanh(c["x"].astype(np.float64) / c["cap"]), checker(1e-5, 1e-6),
       ELEMENTWISE_TOL, cpu_only(lambda ctx, c: ops.softcap(c["x"], c["cap"])),
       api=("softcap",)),
    Op("dot", dot_cases, lambda c: float(c["a"].astype(np.float64) @ c["b"].astype(np.float64)),
       check_dot, "|err| <= 1e-6 * sum|a*b| + 1e-7: float32 accumulation in SIMD lanes",
       cpu_only(lambda ctx, c: ops.dot(c["a"], c["b"])), api=("dot",)),
    Op("dot_rows", dot_rows_cases,
       lambda c: (c["k"].astype(np.float64) @ c["q"].astype(np.float64)) * c["scale"],
       checker(1e-5, 1e-5), "rtol 1e-5, atol 1e-5: float32 dot products of up to 128 terms",
       cpu_only(lambda ctx, c: ops.dot_rows(c["q"], c["k"], scale=c["scale"])),
       api=("dot_rows",)),
    *[_rope_row(n) for n in ROPE_VARIANTS],
]


# ---------------------------------------------------------------- quantized ops
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


def weights(t: str, rows: int, cols: int, rng, gguf_quantized: bool):
    """(raw bytes, float64 reference values) of a random (rows, cols) tensor of type t: random
    payload bits with sane scales, or (gguf_quantized) gguf's own quantization of normal floats
    where gguf can quantize t."""
    if t == "I4_G128":
        raw = i4_random(rows, cols, rng)
        return raw, i4_reference(raw, rows, cols)
    raw = quantized_raw(t, rows, cols, rng) if gguf_quantized else None
    if raw is None:
        raw = random_raw(t, rows, cols, rng)
    return raw, reference_dequant(t, raw, rows, cols).astype(np.float64)


def check_exact(got, want, case):
    assert got.shape == want.shape and got.dtype == np.float32
    # bit for bit (signed zeros too): the references are float32 values held in float64
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


EXACT_TOL = ("exact: one scale times a small integer (or an f16/bf16 widening) is exact in "
             "float32, as in gguf-py")


def dequant_cases(t):
    def gen(rng):
        bs = q.block_size(t)
        rows, cols = 5, 4 * max(bs, 32)
        return [{"label": f"{rows}x{cols}, {'gguf-quantized' if gq else 'random bits'}",
                 "t": t, "rows": rows, "cols": cols, "w": weights(t, rows, cols, rng, gq)}
                for gq in (False, True)]
    return gen


def get_rows_cases(t):
    def gen(rng):
        bs = q.block_size(t)
        rows, cols = 9, 2 * max(bs, 32)
        return [{"label": f"{rows}x{cols}, ids {ids}", "t": t, "rows": rows, "cols": cols,
                 "w": weights(t, rows, cols, rng, False), "ids": np.array(ids, np.int32)}
                for ids in ([3, 0, 8, 3], [8])]
    return gen


# Batch variants of matmul: decode (1 token, the matvec, through the 1-D API too), a batch
# below every packed-row threshold, 25 tokens (above every per-level threshold of quant.c
# rp_min_tokens, the largest being Q4_K's 16 with AVX2 only: the packed tiles where the type
# has them), the packed path forced on a tiny batch and off a large one, the fast (not batch
# invariant: the AVX-512 direct tiles) kernels, and 2 threads splitting rows.
MATMUL_VARIANTS = [
    ("decode, 1-D x", 19, 1, {"vector": True}),
    ("decode, 2 threads", 37, 1, {"threads": 2}),
    ("3 tokens", 19, 3, {}),
    ("25 tokens, 2 threads", 19, 25, {"threads": 2}),
    ("2 tokens, packed forced", 19, 2, {"packed": True}),
    ("25 tokens, packed off", 21, 25, {"packed": False}),
    ("9 tokens, fast", 19, 9, {"fast": True}),
    ("decode, fast", 19, 1, {"fast": True}),
]


def matmul_cols(t: str) -> tuple[int, int]:
    """A short and a long row: 3 blocks (odd) or 70 floats, and several blocks."""
    return {1: (70, 512), 32: (96, 512), 128: (128, 640), 256: (256, 768)}[q.block_size(t)]


def matmul_cases(t):
    def gen(rng):
        out = []
        for cols in matmul_cols(t):
            for i, (label, rows, n, kw) in enumerate(MATMUL_VARIANTS):
                raw, w = weights(t, rows, cols, rng, gguf_quantized=i % 2 == 1)
                x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10)).astype(np.float32)
                out.append({"label": f"{rows}x{cols}, {label}", "t": t, "rows": rows,
                            "cols": cols, "raw": raw, "w": w, "x": x, "kw": kw})
        return out
    return gen


def matmul_ref(c: Case):
    # I4_G128 meets the activations in blocks of 32, as Q4_0
    bound_t = "Q4_0" if c["t"] == "I4_G128" else c["t"]
    return c["x"].astype(np.float64) @ c["w"].T, matmul_bound(bound_t, c["w"], c["x"])


def run_matmul(ctx, c: Case):
    kw = dict(c["kw"])
    if kw.pop("vector", False):
        y = q.matmul(c["t"], c["raw"], c["rows"], c["cols"], c["x"][0], **kw)
        assert y.shape == (c["rows"],)
        return y[None]
    return q.matmul(c["t"], c["raw"], c["rows"], c["cols"], c["x"], **kw)


def check_matmul(got, want, case):
    yref, bound = want
    assert got.shape == yref.shape and got.dtype == np.float32, (got.shape, yref.shape)
    err = np.abs(got - yref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at "
                                  f"{worst} (y={got[worst]:.6g}, ref={yref[worst]:.6g})")


MATMUL_TOL = ("|y - W x| <= sum_b max|x_b|/254 * sum_{c in b} |W[r,c]| + float32 slack: the "
              "kernels quantize x to int8 blocks of 32 (256 for K-quants), a rigorous bound; F32/"
              "F16/BF16 keep x float (slack only)")


def quantize_cases(rng):
    x = (rng.standard_normal((8, 256)) * rng.uniform(0.01, 100, size=(8, 1))).astype(np.float32)
    x[0, :128] = 0.0  # all-zero blocks / groups
    x[1, 5] = 3 * np.abs(x[1]).max()  # an outlier
    return [{"label": "8x256", "x": x}, {"label": "1x128", "x": x[2, :128].copy()}]


def ref_quantize_i4g128(c: Case):
    x = c["x"].reshape(-1, c["x"].shape[-1])
    qs, sc = quantize_int4_g128(x)
    # the CPU block layout of the GPU quantizer's numbers: {f16 d; u8 qs[64]} per group
    rows, ng = sc.shape
    out = np.empty((rows, ng, 66), np.uint8)
    out[:, :, :2] = sc.view(np.uint8).reshape(rows, ng, 2)
    out[:, :, 2:] = qs.reshape(rows, ng, 64)
    return out.reshape(-1)


def check_bytes(got, want, case):
    np.testing.assert_array_equal(got, want)


QUANT_ROWS = [
    *[Op(f"dequantize.{t}", dequant_cases(t), lambda c: c["w"][1], check_exact, EXACT_TOL,
         cpu_only(lambda ctx, c: q.dequantize(c["t"], c["w"][0], (c["rows"], c["cols"]))),
         api=("dequantize",)) for t in QUANT_TYPES],
    *[Op(f"get_rows.{t}", get_rows_cases(t), lambda c: c["w"][1][c["ids"]], check_exact,
         EXACT_TOL,
         cpu_only(lambda ctx, c: q.get_rows(c["t"], c["w"][0], c["rows"], c["cols"], c["ids"])),
         api=("get_rows",)) for t in QUANT_TYPES],
    *[Op(f"matmul.{t}", matmul_cases(t), matmul_ref, check_matmul, MATMUL_TOL,
         {"cpu": run_matmul, "cuda-emu": CUDA_MOE if t in ("F16", "I4_G128") else NO_CUDA,
          "cuda": CUDA_MOE if t in ("F16", "I4_G128") else NO_CUDA},
         api=("matmul",)) for t in QUANT_TYPES],
    Op("quantize_q8_0", quantize_cases,
       lambda c: gguf.quants.quantize(c["x"], GT.Q8_0).view(np.uint8).reshape(-1), check_bytes,
       "exact bytes: GGML's rounding (d = f16(max|x|/127), q = round(x/d)), as gguf-py",
       cpu_only(lambda ctx, c: q.quantize_q8_0(c["x"])), api=("quantize_q8_0",)),
    Op("quantize_i4g128", quantize_cases, ref_quantize_i4g128, check_bytes,
       "exact bytes: the GPU reference quantizer's numbers (colibri._cuda_ref), CPU layout",
       cpu_only(lambda ctx, c: q.quantize_i4g128(c["x"])), api=("quantize_i4g128",)),
]

ROWS = FLOAT_ROWS + QUANT_ROWS

# colibri._core exports that are not ops (no cell): what they are, and where they are tested.
NOT_OPS = {
    "ROPE_MAX_DIMS": "a constant",
    "THREADPOOL_MAX_THREADS": "a constant (the thread pool's limit)",
    "rope_cache": "rope's cos/sin table helper, scalar double: test_ops.py::test_rope_cache_and_corr_dims",
    "rope_yarn_corr_dims": "a scalar formula: test_ops.py::test_rope_cache_and_corr_dims",
    "cb_act": "an enum", "cb_rope_mode": "an enum", "cb_type": "an enum",
    "TYPES": "the type table: test_quant.py::test_type_table_matches_gguf",
    "COLIBRI_TYPES": "the type table", "SUPPORTED": "the type table",
    "type_id": "type table lookup", "type_name": "type table lookup",
    "block_size": "type table lookup", "block_bytes": "type table lookup",
    "supported": "type table lookup", "row_bytes": "size arithmetic: test_quant.py",
    "ThreadPool": "the thread pool the matmul rows use (2 threads in some variants)",
    "LAYOUTS": "the type table", "r16_bytes": "size arithmetic: test_r16.py",
    "r16_layout": "type table lookup: test_r16.py",
    "pack_r16": "layouts of Q8_0 and Q5_0, whose get_rows and matmul equal theirs bit for bit at "
                "every level: test_r16.py",
}
