"""A failed expert read in the middle of a MoE layer (an expert that is neither the first nor the
last of the layer's batch, read by the cache store while the others are resident or being read)
fails the forward with an OSError naming it, leaves no expert acquired (every slot can be taken
again at once) and the model computes the same logits once the fault is gone. The routed experts
compute in one fused dispatch per phase after the layer's reads (colibri/_core/moe.c); the fault
machinery is the store's test read hook, as in test_experts_faults.py."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_models import build, prompt

from colibri.model import Model

KW = dict(threads=2, ctx=128, max_batch=16)
CACHE = dict(expert_mode="cache", expert_budget=0.4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, paths = build("qwen3_moe", tmp_path_factory.mktemp("moe_faults"), ("f32",))
    return paths["f32"]


@pytest.mark.parametrize("kind", ["eio", "eof"])
def test_failed_read_mid_layer_fails_cleanly(tiny, kind):
    ids = prompt(12, seed=5)
    ref = Model(tiny, **KW, **CACHE)
    want = ref.logits(ids)
    moe = [i for i, L in enumerate(ref.desc.layers) if L.n_expert > 0]
    assert len(moe) >= 2
    layer = moe[1]
    used = np.nonzero(ref.experts.route_counts(layer))[0]
    assert len(used) >= 3
    expert = int(used[len(used) // 2])  # neither the layer's first nor its last expert

    m = Model(tiny, **KW, **CACHE)  # cold: every expert of the batch is read
    m.experts._test_set_read_fault(kind, layer, expert)
    with pytest.raises(OSError) as e:
        m.logits(ids)
    assert f"expert {expert} of layer {layer}" in str(e.value), str(e.value)
    # nothing stays acquired: every slot of the store can be taken at once
    left, held = m.expert_info()["n_slots"], []
    for L in moe:
        some = list(range(min(left, m.desc.layers[L].n_expert)))
        if some:
            m.experts.acquire(L, some)
            held.append((L, some))
        left -= len(some)
    assert left == 0
    for L, some in held:
        m.experts.release(L, some)
    assert m.experts._test_set_read_fault(None) > 0
    np.testing.assert_array_equal(m.logits(ids), want)
