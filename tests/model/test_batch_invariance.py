"""Batch invariance: a sequence's logits do not depend on the batch it runs in.

The logits of sequence A must be bit-identical (np.array_equal) whether A's tokens run
  - alone, the whole prompt in one eval (Model.generate's prefill),
  - one token per eval (decode),
  - in chunks of various sizes (chunked prefill),
  - in one eval together with other sequences' tokens (the Engine's mixed steps),
on every quantized type the models use: Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0), the tiny
random MoE (Q4_K/Q6_K) and its Q8_0 / Q4_0 / Q5_K_M variants and low-bit ones (Q3_K_M, and Q2_K,
IQ2_XXS, IQ3_XXS, IQ4_XS, IQ4_NL, IQ1_S, TQ2_0 for every matrix), and the tiny oracle models of
granitemoe, ernie4_5_moe, phimoe, glm4moe, deepseek_v3 (MLA), gpt_oss, llama4 and qwen3next (linear
attention: its recurrent state advanced chunk by chunk) in F32 and Q8_0. The matmul
kernels choose their path by token count (direct tiles up to a few tokens, packed rows above), so this holds only if every
path sums a row's products in the same order (ARCHITECTURE "Batch invariance").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

import colibri


@pytest.fixture(scope="module")
def gemma() -> Iterator[colibri.Model]:
    with colibri.Model(ctx=1024, verbose=False) as m:
        yield m


def _tiny(tmp: str, kind: str | None) -> str:
    from colibri.tools.make_bench_model import write

    if kind is None:
        return str(write(tmp, n_layers=2, shape="tiny"))
    return str(write(tmp, 2, kind=kind, shape="tiny"))


# the low-bit kinds (issue 45): llama.cpp's Q3_K_M mix, and every matrix one low-bit type (the
# ones with AVX2 tiles, and two with the scalar kernels only)
LOWBIT = ["q3_k_m", "q2_k", "iq2_xxs", "iq3_xxs", "iq4_xs", "iq4_nl", "iq1_s", "tq2_0"]


@pytest.fixture(scope="module", params=[None, "q8_0", "q4_0", "q5_k_m", *LOWBIT],
                ids=["q4_k_m", "q8_0", "q4_0", "q5_k_m", *LOWBIT])
def tiny(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[colibri.Model]:
    p = _tiny(str(tmp_path_factory.mktemp("inv") / "tiny.gguf"), request.param)
    with colibri.Model(p, ctx=1024, verbose=False) as m:
        yield m


def _ids(m: colibri.Model, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(3, min(m.n_vocab, 30000), n)]


def _run_chunks(m: colibri.Model, ids: Sequence[int], chunks: Sequence[int]) -> np.ndarray:
    """Logits of every token of ids in a fresh sequence, fed in chunks of the given sizes
    (the last size repeats)."""
    s = m.new_sequence()
    try:
        out, i, k = [], 0, 0
        while i < len(ids):
            c = chunks[min(k, len(chunks) - 1)]
            out.append(m.eval([s], ids[i:i + c]))
            i += c
            k += 1
        return np.concatenate(out)
    finally:
        m.free_sequence(s)


def _run_mixed(m: colibri.Model, ids: Sequence[int], others: Sequence[Sequence[int]],
               chunk: int) -> np.ndarray:
    """Logits of ids fed `chunk` tokens per eval, each eval also carrying the other
    sequences' next tokens (before and after A's, as the Engine mixes decode and prefill)."""
    sa = m.new_sequence()
    so = [m.new_sequence() for _ in others]
    try:
        out, i, step = [], 0, 0
        while i < len(ids):
            seqs: list[int] = []
            toks: list[int] = []
            want: list[bool] = []
            for j, (s, o) in enumerate(zip(so, others, strict=True)):
                if j % 2 == 0 and step < len(o):
                    seqs.append(s)
                    toks.append(o[step])
                    want.append(False)
            a0 = len(seqs)
            part = list(ids[i:i + chunk])
            seqs += [sa] * len(part)
            toks += part
            want += [True] * len(part)
            for j, (s, o) in enumerate(zip(so, others, strict=True)):
                if j % 2 == 1:
                    extra = list(o[step * 3:(step + 1) * 3])  # a prefill chunk of 3
                    seqs += [s] * len(extra)
                    toks += extra
                    want += [False] * len(extra)
            lg = m.eval(seqs, toks, logits=want)
            assert lg.shape[0] == len(part) and a0 >= 0
            out.append(lg)
            i += chunk
            step += 1
        return np.concatenate(out)
    finally:
        m.free_sequence(sa)
        for s in so:
            m.free_sequence(s)


def _first_diff(a: np.ndarray, b: np.ndarray) -> str:
    rows = np.nonzero(~np.all(a == b, axis=1))[0]
    if len(rows) == 0:
        return "equal"
    r = int(rows[0])
    return (f"{len(rows)} of {len(a)} rows differ, first row {r}: max |diff| "
            f"{float(np.max(np.abs(a[r] - b[r]))):.3g}")


def _check(m: colibri.Model, n: int) -> None:
    ids = _ids(m, n, 1)
    others = [_ids(m, 40, 10 + j) for j in range(5)]
    ref = _run_chunks(m, ids, [len(ids)])
    variants = {
        "decode (1 per eval)": _run_chunks(m, ids, [1]),
        "chunks of 2": _run_chunks(m, ids, [2]),
        "chunks of 3": _run_chunks(m, ids, [3]),
        "chunks 5,7,9,...": _run_chunks(m, ids, [5, 7, 9, 16, 24, 31]),
        "chunks of 4 with others": _run_mixed(m, ids, others, 4),
        "1 per eval with others": _run_mixed(m, ids, others, 1),
        "chunks of 13 with others": _run_mixed(m, ids, others, 13),
    }
    bad = {k: _first_diff(ref, v) for k, v in variants.items() if not np.array_equal(ref, v)}
    assert not bad, bad


def test_tiny_logits_batch_invariant(tiny: colibri.Model) -> None:
    _check(tiny, 40)


def test_gemma_logits_batch_invariant(gemma: colibri.Model) -> None:
    _check(gemma, 40)


# MoE families of issue 48 whose FFN differs from the tiny model's (tests/oracle_models.py):
# Granite's multipliers on embeddings, attention, residual branches and logits; ERNIE 4.5's dense
# layer 0, selection bias and shared expert; PhiMoE's LayerNorms with biases and sparsemixer
# routing (top 2 of 10). In f32 and in Q8_0 (8-bit activations: the quantized tiles).
@pytest.fixture(scope="module", params=[(f, t) for f in ("granitemoe", "ernie4_5_moe", "phimoe",
                                                         "glm4moe", "deepseek_v3", "gpt_oss",
                                                         "llama4", "qwen3next")
                                        for t in ("f32", "q8_0")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def family(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[colibri.Model]:
    from oracle_models import build

    fam, outtype = request.param
    _, paths = build(fam, tmp_path_factory.mktemp(fam), (outtype,))
    with colibri.Model(str(paths[outtype]), ctx=1024, verbose=False) as m:
        yield m


def test_family_logits_batch_invariant(family: colibri.Model) -> None:
    _check(family, 40)


def test_fast_mode_is_an_opt_out(tmp_path) -> None:
    """deterministic=False (the faster kernels that are not batch invariant) still agrees with
    the invariant path within rounding; the default is deterministic."""
    p = _tiny(str(tmp_path / "tiny.gguf"), None)
    ids = list(range(5, 45))
    with colibri.Model(p, ctx=256, verbose=False) as m:
        assert m.deterministic
        ref = _run_chunks(m, ids, [len(ids)])
    with colibri.Model(p, ctx=256, verbose=False, deterministic=False) as m:
        assert not m.deterministic
        whole = _run_chunks(m, ids, [len(ids)])
        one = _run_chunks(m, ids, [1])
    for v in (whole, one):
        np.testing.assert_allclose(v, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max()))


@pytest.mark.parametrize("threads,kv_dtype", [(1, "f32"), (2, "f32"), (3, "f32"), (2, "f16")])
def test_gemma_long_decode_matches_the_prompt(threads: int, kv_dtype: str) -> None:
    """Decoding one token at a time past the 512-token window and across KV pages gives the same
    logits as the whole prompt in one eval. Gemma 3 has one K/V head: a decoded token has fewer
    K/V groups than threads, and its attention splits the rows, then the head dimension, between
    tasks (forward.c, attention_split); the whole prompt runs the per-group tasks."""
    n, tail = 600, 12
    with colibri.Model(ctx=1024, threads=threads, kv_dtype=kv_dtype, verbose=False,
                       tokenizer=False) as m:
        ids = _ids(m, n, 7)
        ref = _run_chunks(m, ids, [n])[-tail:]
        s = m.new_sequence()
        try:
            m.eval([s], ids[:n - tail], logits=[False] * (n - tail))
            got = np.concatenate([m.eval([s], [t]) for t in ids[n - tail:]])
        finally:
            m.free_sequence(s)
    assert np.array_equal(ref, got), _first_diff(ref, got)
