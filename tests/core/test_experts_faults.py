"""I/O faults under the cache expert store reach Model.generate's caller as an OSError naming
the file, the layer and the expert; EINTR and short reads are absorbed; the model keeps
working once the fault is gone (same text and logits as a clean run). A lack of slots reaches
Python as MemoryError and leaves the store usable. The faults come from the store's test-only
read hook (ExpertStore._test_set_read_fault); the C side is tests/c/test_experts_faults.c."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_models import build, prompt

from colibri.model import Model

KW = dict(threads=2, ctx=128, max_batch=8)
CACHE = dict(expert_mode="cache", expert_budget=0.4, prefetch=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, paths = build("qwen3_moe", tmp_path_factory.mktemp("faults"), ("f32",))
    return paths["f32"]


@pytest.fixture(scope="module")
def clean(tiny):
    """A clean run: the greedy text, the logits, and the most used expert of the first MoE layer."""
    m = Model(tiny, **KW, **CACHE)
    ids = prompt(9, seed=2)
    text = m.generate(ids, max_tokens=8, temperature=0)
    logits = m.logits(ids)
    layer = next(i for i, L in enumerate(m.desc.layers) if L.n_expert > 0)
    expert = int(np.argmax(m.experts.route_counts(layer)))
    return ids, text, logits, layer, expert


@pytest.mark.parametrize("kind", ["eio", "eof"])
def test_read_error_reaches_generate_and_the_model_recovers(tiny, clean, kind):
    ids, text, logits, layer, expert = clean
    m = Model(tiny, **KW, **CACHE)  # cold cache: the expert must be read
    m.experts._test_set_read_fault(kind, layer, expert)
    for _ in range(2):  # the failure repeats while the fault is there
        with pytest.raises(OSError) as e:
            m.generate(ids, max_tokens=8, temperature=0)
        msg = str(e.value)
        assert str(tiny) in msg and f"expert {expert} of layer {layer}" in msg, msg
        assert ("Input/output error" if kind == "eio" else "ends before byte") in msg, msg
        assert type(e.value) is OSError
    st = m.expert_stats()
    assert st["hits"] + st["misses"] <= st["acquired"]
    assert m.experts._test_set_read_fault(None) > 0
    assert m.generate(ids, max_tokens=8, temperature=0) == text
    np.testing.assert_array_equal(m.logits(ids), logits)


@pytest.mark.parametrize("kind", ["eintr", "short"])
def test_interrupted_and_short_reads_are_invisible(tiny, clean, kind):
    ids, text, logits, layer, expert = clean
    m = Model(tiny, **KW, **CACHE)
    m.experts._test_set_read_fault(kind, layer, expert)
    assert m.generate(ids, max_tokens=8, temperature=0) == text
    np.testing.assert_array_equal(m.logits(ids), logits)
    assert m.experts._test_set_read_fault(None) > 0


def test_fault_hook_arguments_are_checked(tiny, clean):
    _, _, _, layer, _ = clean
    m = Model(tiny, **KW, **CACHE)
    with pytest.raises(ValueError, match="read fault"):
        m.experts._test_set_read_fault("ebusy", layer, 0)
    with pytest.raises(ValueError, match="no expert"):
        m.experts._test_set_read_fault("eio", layer, 10**6)


def test_out_of_slots_is_memory_error_and_the_store_stays_usable(tiny, clean):
    _, _, _, layer, _ = clean
    m = Model(tiny, threads=1, ctx=16, max_batch=1, tokenizer=False, expert_mode="cache",
              expert_budget=1)
    ref = Model(tiny, threads=1, ctx=16, max_batch=1, tokenizer=False)
    n = m.desc.layers[layer].n_expert
    slots = m.expert_info()["n_slots"]
    assert slots < n
    with pytest.raises(MemoryError, match=r"needs \d+ experts at once but the store has"):
        m.experts.acquire(layer, list(range(n)))
    got = m.experts.acquire(layer, [0])
    want = ref.experts.acquire(layer, [0])
    assert got.shape == want.shape
    m.experts.release(layer, [0])
    ref.experts.release(layer, [0])
    np.testing.assert_array_equal(m.logits(prompt(5, seed=1)), ref.logits(prompt(5, seed=1)))
