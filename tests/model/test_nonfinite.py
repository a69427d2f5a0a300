"""Non-finite values in the forward pass (a corrupt GGUF has no checksum) raise a ColibriError
naming the first layer and part whose output went NaN/Inf, instead of greedy returning '' or
sampling failing inside numpy; a healthy model is unaffected."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch  # noqa: F401  tiny models are built with torch + transformers (test extras)
from oracle_models import build_moe  # noqa: E402

from colibri.errors import ColibriError
from colibri.gguf import GGUFFile
from colibri.model import Model


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return build_moe(tmp_path_factory.mktemp("nonfinite"), n_layers=3)


def poisoned(healthy: str, tmp_path, tensor: str, value: float) -> str:
    """A copy of the healthy f32 model with every value of one tensor set to value (in the
    file's bytes, as corruption would)."""
    out = str(tmp_path / f"{tensor}-{value}.gguf")
    shutil.copyfile(healthy, out)
    info = GGUFFile(out).tensors[tensor]
    mm = np.memmap(out, dtype=np.uint8, mode="r+", offset=info.offset, shape=(info.nbytes,))
    mm.view(np.float32)[:] = value
    mm.flush()
    del mm
    return out


def test_a_healthy_model_generates_and_its_logits_are_finite(healthy):
    m = Model(healthy, threads=1, ctx=64)
    lg = m.logits([1, 5, 9, 13])
    assert np.isfinite(lg).all()
    assert m.generate([1, 5, 9], max_tokens=4, temperature=0) == m.generate(
        [1, 5, 9], max_tokens=4, temperature=0)


@pytest.mark.parametrize("tensor,value,part", [
    ("blk.1.ffn_down_exps.weight", np.nan, "FFN \\(MoE block\\)"),
    ("blk.2.attn_output.weight", np.inf, "attention"),
    ("blk.1.attn_q.weight", np.nan, "attention"),
])
def test_non_finite_weights_in_a_layer_name_that_layer(healthy, tmp_path, tensor, value, part):
    layer = int(tensor.split(".")[1])
    m = Model(poisoned(healthy, tmp_path, tensor, value), threads=1, ctx=64)
    want = f"layer {layer} of 3 is the first whose output went non-finite \\(\\w+ after its {part}"
    with pytest.raises(ColibriError, match=want):
        m.generate([1, 5, 9], max_tokens=4, temperature=0)
    with pytest.raises(ColibriError, match=want):
        m.generate([1, 5, 9], max_tokens=4, temperature=0.8, seed=1)
    s = m.new_sequence()
    with pytest.raises(ColibriError, match=want):
        m.eval([s], tokens=[1, 5])
    assert m.sequence_length(s) == 0  # the failed batch left nothing behind


def test_non_finite_output_weights_name_the_output_layer(healthy, tmp_path):
    m = Model(poisoned(healthy, tmp_path, "output.weight", np.nan), threads=1, ctx=64)
    with pytest.raises(ColibriError, match="the logits went non-finite .* every layer's output "
                                           "was finite: the output norm or output projection"):
        m.generate([1, 5, 9], max_tokens=4, temperature=0)


@pytest.mark.parametrize("row", [[np.nan], [np.nan, -np.inf], [-np.inf, np.nan, -np.inf] * 4])
def test_softmax_of_a_row_without_a_finite_max_is_nan_when_it_holds_a_nan(row):
    """A NaN score used to make a single-key (or all-NaN) attention row read as masked: all
    zeros, so NaN query weights went unnoticed. Masked rows stay zeros."""
    from colibri._core import _ops
    from colibri.simd import set_max_simd

    for level in ("scalar", "avx2"):
        prev = set_max_simd(level)
        try:
            assert np.isnan(_ops.softmax(np.array(row, np.float32))).all()
            assert (_ops.softmax(np.full(len(row), -np.inf, np.float32)) == 0).all()
        finally:
            set_max_simd(prev)
