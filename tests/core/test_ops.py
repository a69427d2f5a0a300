"""Float ops (ops.h) against numpy float64 references, on random shapes, at every SIMD level;
RoPE also against transformers' rotary embedding (NeoX ordering, plain and YaRN) and torch's
gelu(approximate="tanh").

Tolerances (float32 results vs float64 references): elementwise ops rtol 1e-5 / atol 1e-6
(the AVX2 exp/tanh polynomials are within ~4e-7 relative); reductions (rmsnorm, softmax, dot)
rtol 1e-5 / atol 1e-6 scaled by the magnitude of the sum; RoPE atol 2e-6 (cos/sin computed in
double, the rotation in float).
"""

from __future__ import annotations

import numpy as np
import pytest

import colibri._core._ops as ops
from colibri.simd import max_simd

LEVELS = ["scalar", "avx2"]
RNG = np.random.default_rng(20261129)


@pytest.fixture(params=LEVELS)
def level(request):
    with max_simd(request.param):
        yield request.param


def _shapes():
    return [(1,), (7,), (8,), (33,), (3, 64), (5, 257), (2, 3, 100), (1, 4096)]


# ---- references (float64) ----


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


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---- normalisation ----


@pytest.mark.parametrize("shape", _shapes())
@pytest.mark.parametrize("weighted,unit", [(False, False), (True, False), (True, True)])
def test_rmsnorm(level, shape, weighted, unit):
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    w = RNG.standard_normal(shape[-1]).astype(np.float32) if weighted else None
    got = ops.rmsnorm(x, w, eps=1e-6, add_unit_offset=unit)
    assert got.shape == x.shape and got.dtype == np.float32
    close(got, ref_rmsnorm(x, w, 1e-6, unit))


def test_rmsnorm_strided_rows_and_eps(level):
    big = RNG.standard_normal((6, 300)).astype(np.float32)
    x = big[:, 10:138]  # rows 300 floats apart, reaching C with that stride
    assert not x.flags.c_contiguous
    w = RNG.standard_normal(128).astype(np.float32)
    close(ops.rmsnorm(x, w, eps=1e-2), ref_rmsnorm(x, w, 1e-2, False))
    tiny = np.full(16, 1e-4, np.float32)
    close(ops.rmsnorm(tiny, eps=1e-5), ref_rmsnorm(tiny, None, 1e-5, False))
    close(ops.rmsnorm(np.zeros(9, np.float32)), np.zeros(9))


def test_rmsnorm_errors():
    with pytest.raises(ValueError, match="weight has shape"):
        ops.rmsnorm(np.ones(8, np.float32), np.ones(7, np.float32))
    with pytest.raises(ValueError, match="eps"):
        ops.rmsnorm(np.ones(8, np.float32), eps=-1.0)


# ---- softmax ----


@pytest.mark.parametrize("shape", _shapes())
@pytest.mark.parametrize("spread", [1.0, 30.0, 1000.0])
def test_softmax(level, shape, spread):
    x = (RNG.standard_normal(shape) * spread).astype(np.float32)
    got = ops.softmax(x)
    close(got, ref_softmax(x), atol=1e-7)
    close(got.sum(axis=-1), 1.0, atol=1e-5)


def test_softmax_masked(level):
    x = RNG.standard_normal((4, 37)).astype(np.float32)
    mask = RNG.random((4, 37)) < 0.6
    mask[:, 0] = False
    x[mask] = -np.inf
    got = ops.softmax(x)
    assert np.all(got[mask] == 0)
    close(got, ref_softmax(x), atol=1e-7)
    allmasked = np.full((2, 19), -np.inf, np.float32)
    assert np.all(ops.softmax(allmasked) == 0)
    nan = np.array([1.0, np.nan, 2.0], np.float32)
    assert np.isnan(ops.softmax(nan)).any()


# ---- activations ----


def _act_inputs(shape):
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    specials = np.array([0.0, -0.0, 1e-8, -1e-8, 0.3, -0.6, 0.62, 0.63, 9.0, -9.0, 30.0,
                         -30.0, 87.0, -87.0, 88.8, -88.8, 100.0, -100.0], np.float32)
    flat[: min(len(flat), len(specials))] = specials[: len(flat)]
    return x


@pytest.mark.parametrize("shape", _shapes())
def test_silu(level, shape):
    x = _act_inputs(shape)
    close(ops.silu(x), ref_silu(x))


@pytest.mark.parametrize("shape", _shapes())
def test_gelu_tanh(level, shape):
    x = _act_inputs(shape)
    close(ops.gelu_tanh(x), ref_gelu_tanh(x))


def test_gelu_tanh_matches_torch(level):
    import torch
    x = np.linspace(-12, 12, 4001, dtype=np.float32)
    want = torch.nn.functional.gelu(torch.from_numpy(x).double(), approximate="tanh").numpy()
    close(ops.gelu_tanh(x), want)


def test_activation_extremes(level):
    x = np.array([-1e30, -1000, -100, 100, 1000, 1e30, np.inf, -np.inf], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.array([0, 0, 0, 100, 1000, 1e30], np.float32)
        np.testing.assert_array_equal(ops.silu(x)[:6], want)
        np.testing.assert_array_equal(ops.gelu_tanh(x)[:6], want)
    assert np.isnan(ops.silu(np.array([np.nan], np.float32)))[0]
    assert np.isnan(ops.gelu_tanh(np.array([np.nan], np.float32)))[0]


@pytest.mark.parametrize("act,ref", [("silu", ref_silu), ("gelu_tanh", ref_gelu_tanh)])
@pytest.mark.parametrize("n", [1, 9, 64, 1000])
def test_glu(level, act, ref, n):
    g = _act_inputs((n,))
    u = RNG.standard_normal(n).astype(np.float32)
    close(ops.glu(g, u, act), ref(g) * u.astype(np.float64))


# ---- elementwise, softcap, dot ----


@pytest.mark.parametrize("shape", _shapes())
def test_elementwise(level, shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    b = RNG.standard_normal(shape).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    close(ops.mul(a, b), a64 * b64)
    close(ops.add(a, b), a64 + b64)
    close(ops.axpy(-0.75, a, b), b64 - 0.75 * a64)
    close(ops.scale(a, 0.125), a64 * 0.125)
    for cap in (0.5, 30.0, 50.0):
        close(ops.softcap(a * 40, cap), cap * np.tanh(a64 * 40 / cap))
    # inputs are not modified
    assert np.array_equal(b, b)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 31, 32, 33, 100, 4096])
def test_dot(level, n):
    a = RNG.standard_normal(n).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    want = float(a.astype(np.float64) @ b.astype(np.float64))
    scale = float(np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    assert abs(ops.dot(a, b) - want) <= 1e-6 * scale + 1e-7


def test_dot_rows(level):
    q = RNG.standard_normal(80).astype(np.float32)
    kbig = RNG.standard_normal((13, 96)).astype(np.float32)
    k = kbig[:, :80]  # strided rows, as a K cache with padding
    got = ops.dot_rows(q, k, scale=80**-0.5)
    want = (k.astype(np.float64) @ q.astype(np.float64)) * 80**-0.5
    close(got, want, rtol=1e-5, atol=1e-5)
    # scores -> softmax -> weighted sum of V rows with axpy: an attention head by hand
    v = RNG.standard_normal((13, 80)).astype(np.float32)
    p = ops.softmax(got)
    acc = np.zeros(80, np.float32)
    for j in range(13):
        acc = ops.axpy(float(p[j]), v[j], acc)
    want_att = ref_softmax(want) @ v.astype(np.float64)
    close(acc, want_att, rtol=1e-5, atol=1e-5)


def test_elementwise_errors():
    with pytest.raises(ValueError, match="shapes differ"):
        ops.mul(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="cap"):
        ops.softcap(np.ones(3), 0.0)
    with pytest.raises(ValueError, match="activation"):
        ops.glu(np.ones(3), np.ones(3), "relu")


# ---- RoPE ----

ROPE_CASES = [
    dict(mode="normal"),
    dict(mode="neox"),
    dict(mode="neox", n_dims=32),  # partial rotation (phi-2 / stablelm style)
    dict(mode="normal", freq_base=500000.0, freq_scale=0.25),  # linear scaling
    dict(mode="neox", freq_base=1e6),
    dict(mode="normal", freq_scale=0.25, ext_factor=1.0, n_ctx_orig=4096),  # YaRN
    dict(mode="neox", freq_scale=1 / 40, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=4096,
         beta_fast=32.0, beta_slow=1.0),  # deepseek-style YaRN
    dict(mode="neox", freq_scale=0.5, ext_factor=0.5, n_ctx_orig=2048, beta_fast=16.0,
         beta_slow=2.0),
]


@pytest.mark.parametrize("case", ROPE_CASES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope(level, case, head_dim):
    if case.get("n_dims", 0) > head_dim:
        pytest.fail("bad case")
    n_tokens, n_heads = 5, 3
    x = RNG.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    pos = np.array([0, 1, 17, 4095, 100000])
    got = ops.rope(x, pos, **case)
    close(got, ref_rope(x, pos, **case), rtol=1e-5, atol=2e-6)
    if case.get("n_dims"):
        np.testing.assert_array_equal(got[..., case["n_dims"]:], x[..., case["n_dims"]:])


def test_rope_freq_factors(level):
    x = RNG.standard_normal((3, 2, 64)).astype(np.float32)
    ff = (1 + RNG.random(32) * 7).astype(np.float32)  # llama-3.1 rope_freqs style divisors
    pos = [3, 900, 70000]
    close(ops.rope(x, pos, freq_base=500000.0, freq_factors=ff),
          ref_rope(x, pos, freq_base=500000.0, freq_factors=ff), atol=2e-6)


def test_rope_normal_is_neox_on_interleaved_layout(level):
    """NORMAL on (x0, y0, x1, y1, ...) equals NEOX on (x0, x1, ..., y0, y1, ...): the relation
    the GGUF converters rely on when they permute llama's Q/K weights."""
    x = RNG.standard_normal((4, 2, 64)).astype(np.float32)
    perm = np.concatenate([np.arange(0, 64, 2), np.arange(1, 64, 2)])
    pos = [0, 5, 77, 3000]
    a = ops.rope(x, pos, mode="normal")[..., perm]
    b = ops.rope(x[..., perm], pos, mode="neox")
    close(a, b, atol=1e-6)


def test_rope_cache_and_corr_dims():
    c, s = ops.rope_cache(123, 64, freq_base=10000.0)
    theta = 123 * 10000.0 ** (-2 * np.arange(32) / 64)
    close(c, np.cos(theta), atol=1e-7)
    close(s, np.sin(theta), atol=1e-7)
    for nd, ctx, base in [(64, 4096, 10000.0), (128, 8192, 1e6), (64, 2048, 500000.0)]:
        got = ops.rope_yarn_corr_dims(nd, ctx, base, 32.0, 1.0)
        assert got == pytest.approx(ref_yarn_corr_dims(nd, ctx, base, 32.0, 1.0))


def _hf_rope(x, pos, head_dim, base, rope_scaling=None):
    """transformers' RoPE: its inv_freq and attention scaling for the rope type (the part that
    encodes YaRN), its apply_rotary_pos_emb (the rotate_half layout). HF multiplies pos by
    inv_freq in float32, which alone is off by ~pos * 1e-8 rad; we take its inv_freq and do the
    product in float64 so the comparison measures the formulas, not HF's rounding."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    kw = dict(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
              max_position_embeddings=131072, rope_theta=base)
    if rope_scaling:
        kw["rope_scaling"] = rope_scaling
    emb = LlamaRotaryEmbedding(LlamaConfig(**kw))
    inv_freq = emb.inv_freq.double()
    freqs = torch.tensor(pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    full = torch.cat([freqs, freqs], dim=-1)[None]  # (1, tokens, d)
    cos, sin = full.cos() * emb.attention_scaling, full.sin() * emb.attention_scaling
    t = torch.from_numpy(x.astype(np.float64)).permute(1, 0, 2)[None]  # (1, heads, tokens, d)
    q, _ = apply_rotary_pos_emb(t, t, cos, sin)
    return q[0].permute(1, 0, 2).numpy(), emb.attention_scaling


@pytest.mark.slow  # importing transformers takes ~10-20 s here
def test_rope_neox_matches_transformers(level):
    """transformers' rotate_half RoPE (llama/qwen/gemma in HF layout) is our NEOX mode."""
    x = RNG.standard_normal((4, 2, 64)).astype(np.float32)
    pos = [0, 1, 37, 1500]
    want, scaling = _hf_rope(x, pos, 64, 10000.0)
    assert scaling == 1.0
    close(ops.rope(x, pos, mode="neox", freq_base=10000.0), want, atol=1e-4)


@pytest.mark.slow
def test_rope_yarn_matches_transformers(level):
    x = RNG.standard_normal((4, 2, 64)).astype(np.float32)
    pos = [0, 7, 900, 2000]
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
               "beta_fast": 32.0, "beta_slow": 1.0}
    want, mscale = _hf_rope(x, pos, 64, 10000.0, scaling)
    assert mscale == pytest.approx(1 + 0.1 * np.log(4.0))
    got = ops.rope(x, pos, mode="neox", freq_base=10000.0, freq_scale=0.25, ext_factor=1.0,
                   n_ctx_orig=4096)
    close(got, want, atol=1e-4)


def test_rope_errors():
    x = np.ones((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match="mode"):
        ops.rope(x, [0], mode="glm")
    with pytest.raises(ValueError, match="n_dims"):
        ops.rope(x, [0], n_dims=3)
    with pytest.raises(ValueError, match="n_dims"):
        ops.rope(x, [0], n_dims=10)
    with pytest.raises(ValueError, match="YaRN"):
        ops.rope(x, [0], ext_factor=1.0)
    with pytest.raises(ValueError, match="positions"):
        ops.rope(x, [0, 1])
    with pytest.raises(ValueError, match="freq_factors"):
        ops.rope(x, [0], freq_factors=np.ones(3))
    with pytest.raises(ValueError, match="freq_base"):
        ops.rope(x, [0], freq_base=-1.0)
