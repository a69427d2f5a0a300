"""The routed experts of a MoE layer run in four thread-pool dispatches (colibri/_core/moe.c):
a token's logits must be bit-identical whatever the rest of its batch, the number of threads
(which changes how the dispatches are chunked) or the weight type. tests/c/test_moe.c checks the
fused path against one matmul per expert bit for bit; this runs it through whole models: tiny
MoE families from tests/oracle_models.py (shared expert: qwen2_moe; olmoe; the MoE block beside
a dense FFN with per-expert scales: gemma4; DeepSeek-V3 routing with a dense first layer:
dots1, glm4moe, ernie4_5_moe; q/k norms after RoPE with a shared MLP: hunyuan_v1_moe; Granite's
multipliers: granitemoe, granitemoeshared; sparsemixer routing: phimoe), as f32 and q8_0.
The same runs through the expert store at a 25% budget (cache and mmap) give the mapped
(full-RAM) store's logits bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_models import build, prompt

from colibri.model import Model


@pytest.fixture(scope="module", params=["qwen2_moe", "olmoe", "gemma4", "dots1", "hunyuan_v1_moe",
                                        "glm4moe", "ernie4_5_moe", "granitemoe",
                                        "granitemoeshared", "phimoe"])
def paths(request, tmp_path_factory):
    _, p = build(request.param, tmp_path_factory.mktemp("fused"), ("f32", "q8_0"))
    return p


def _alone(m: Model, ids: list[int]) -> np.ndarray:
    """Logits of ids fed one token per eval."""
    s = m.new_sequence()
    try:
        return np.concatenate([m.eval([s], [t]) for t in ids])
    finally:
        m.free_sequence(s)


def _together(m: Model, a: list[int], b: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Logits of a and b, both whole, in one eval (b's tokens first)."""
    sa, sb = m.new_sequence(), m.new_sequence()
    try:
        lg = m.eval([sb] * len(b) + [sa] * len(a), b + a)
        return lg[len(b):], lg[:len(b)]
    finally:
        m.free_sequence(sa)
        m.free_sequence(sb)


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_batch_equals_each_token_alone(paths, outtype):
    a, b = prompt(24, seed=3), prompt(17, seed=4)
    with Model(paths[outtype], threads=2, ctx=256, max_batch=64) as m:
        ba, bb = _together(m, a, b)
        np.testing.assert_array_equal(ba, _alone(m, a))
        np.testing.assert_array_equal(bb, _alone(m, b))
    for threads in (1, 3):
        with Model(paths[outtype], threads=threads, ctx=256, max_batch=64) as m:
            ta, tb = _together(m, a, b)
            np.testing.assert_array_equal(ta, ba)
            np.testing.assert_array_equal(tb, bb)


@pytest.mark.parametrize("mode", ["cache", "mmap"])
@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_quarter_budget_store_equals_full_ram(paths, outtype, mode):
    """A quarter of the experts' bytes (fewer slots than experts: experts are evicted and read
    again) changes nothing: batched and token-by-token logits equal the mapped store's."""
    a, b = prompt(24, seed=3), prompt(17, seed=4)
    with Model(paths[outtype], threads=2, ctx=256, max_batch=64) as m:
        ref = _together(m, a, b), _alone(m, a)
    with Model(paths[outtype], threads=2, ctx=256, max_batch=64, expert_mode=mode,
               expert_budget=0.25) as m:
        got = _together(m, a, b), _alone(m, a)
        st = m.expert_stats()
    np.testing.assert_array_equal(got[0][0], ref[0][0])
    np.testing.assert_array_equal(got[0][1], ref[0][1])
    np.testing.assert_array_equal(got[1], ref[1])
    assert st["misses"] > 0 and st["evictions"] > 0, st
