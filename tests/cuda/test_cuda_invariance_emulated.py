"""Batch invariance on the device path (issue 15), on the emulated device (tests/fake_pycuda.py,
fixtures in tests/cuda/conftest.py): a token's logits through Model(device="cuda") must not
depend on the batch it runs in: the prompt in one batch, token by token through the KV cache,
and beside other sequences give the same bits; at the runtime level, the 16- and 64-row GEMM
tiles and a token alone against the same token in a batch too. Evidence from the emulation: the
kernels' order of operations, not the hardware's floating point, is what it checks."""

from __future__ import annotations

import numpy as np
import pytest
from fake_pycuda import EMULATION_MARKS

pytestmark = EMULATION_MARKS


@pytest.mark.parametrize("family,weights,n", [("mixtral", "f16", 12), ("qwen2_moe", "int4-g128", 12),
                                              ("mixtral", "f16", 40)])
def test_device_logits_do_not_depend_on_the_batch(rt, moe_models, monkeypatch, family, weights,
                                                  n):
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    ids = prompt(n, seed=11)
    other = prompt(9, seed=12)
    dev = Model(moe_models[family], threads=2, ctx=512, tokenizer=False, device="cuda",
                cuda_weights=weights)
    whole = dev.logits(ids)
    s = dev.new_sequence()
    steps = np.concatenate([dev.eval([s], tokens=[t]) for t in ids])
    np.testing.assert_array_equal(steps, whole)
    # beside another sequence: the two prompts interleaved in one batch
    a, b = dev.new_sequence(), dev.new_sequence()
    seqs = [a] * len(ids) + [b] * len(other)
    mixed = dev.eval(seqs, tokens=list(ids) + list(other))
    np.testing.assert_array_equal(mixed[: len(ids)], whole)


@pytest.mark.parametrize("fmt", ["f16", "int4-g128"])
def test_expert_rows_do_not_depend_on_tile_or_batch(rt, fmt):
    """The grouped expert GEMM: both tiles, and a token alone against the same token among 70,
    give the same bits (the same check runs on a GPU in tests/cuda/test_cuda_gpu.py)."""
    from colibri.tools.cuda_check.reference import check_batch_invariance

    check_batch_invariance(rt, fmt)
