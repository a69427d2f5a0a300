"""Float ops (ops.h): the special cases that are not op x backend cells, at every CPU SIMD
level. The op x level cells (every op on random shapes against its float64 reference, with the
tolerances and their reasons) are tests/core/test_backend_ops.py, from the table in
tests/backend_ops_cpu.py; here: strided rows, masked and non-finite inputs, extremes, error
paths, identities between modes, RoPE against transformers' rotary embedding (NeoX ordering,
plain and YaRN) and gelu against torch's gelu(approximate="tanh").
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_ops import CPU_LEVELS
from backend_ops_cpu import ref_rmsnorm, ref_softmax, ref_yarn_corr_dims

import colibri._core._ops as ops
from colibri.simd import max_simd

RNG = np.random.default_rng(20261129)


@pytest.fixture(params=CPU_LEVELS)
def level(request):
    with max_simd(request.param):
        yield request.param


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---- normalisation ----


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


# ---- elementwise, softcap, dot ----


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
