"""Every index, id, size and shape a caller hands to the Cython wrappers is checked before it
reaches C or an unchecked index: a wrong one raises IndexError / ValueError naming it, never
reads out of bounds (route_counts(99) used to segfault)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch  # noqa: F401  tiny models are built with torch + transformers (test extras)
from oracle_models import build_moe  # noqa: E402

from colibri._core import _forward, _quant
from colibri.kv import KVArena, KVCache
from colibri.model import Model


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return build_moe(tmp_path_factory.mktemp("moe2"))


@pytest.fixture(scope="module")
def moe(moe_path):
    m = Model(moe_path, threads=1, ctx=64, max_batch=8)
    s = m.new_sequence()
    m.eval([s], tokens=[3, 4, 5])
    return m


@pytest.mark.parametrize("layer", [99, 2, -1, -3, 2**40])
def test_route_counts_of_a_layer_out_of_range_is_an_index_error(moe, layer):
    with pytest.raises(IndexError, match=f"layer {layer} is out of range \\[0, 2\\)"):
        moe.route_counts(layer)


def test_route_counts_of_real_layers_count_the_routed_tokens(moe):
    for layer in (0, 1):
        c = moe.route_counts(layer)
        assert c.shape == (10,)
        assert int(c.sum()) == 3 * 4  # 3 tokens, top 4


def test_route_counts_in_a_subprocess_does_not_crash(moe_path):
    """The original report: a segfault, which no in-process test can catch."""
    code = ("from colibri.model import Model\n"
            f"m = Model({moe_path!r}, threads=1, ctx=16, tokenizer=False)\n"
            "for l in (99, 2, -1):\n"
            "    try:\n        m.route_counts(l)\n    except IndexError:\n        print('ok', l)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["ok", "99", "ok", "2", "ok", "-1"]


def test_expert_stats_minus_one_is_all_layers_and_other_bad_layers_fail(moe):
    total = moe.expert_stats(-1)
    assert total["uses"] == moe.expert_stats(0)["uses"] + moe.expert_stats(1)["uses"] > 0
    for layer in (2, 99, -2):
        with pytest.raises(IndexError, match=f"layer {layer} is out of range"):
            moe.expert_stats(layer)


def test_a_layer_without_experts_raises_a_clear_error(moe):
    """A store over a description whose layer 1 is dense."""
    desc = moe.desc
    layers = list(desc.layers)
    layers[1] = layers[1].replace(n_expert=0, n_expert_used=0, experts=None)
    store = _forward.ExpertStore(desc.replace(layers=layers))
    assert store.route_counts(0).shape == (10,)
    for call in (lambda: store.route_counts(1), lambda: store.acquire(1, [0]),
                 lambda: store.prefetch(1, [0])):
        with pytest.raises(ValueError, match="layer 1 has no experts"):
            call()
    assert store.stats(1)["uses"] == 0


def test_store_layer_and_expert_ids_are_checked(moe_path, moe):
    m = Model(moe_path, threads=1, ctx=16, tokenizer=False, expert_mode="cache",
              expert_budget=1.0)
    st = m.experts
    with pytest.raises(IndexError, match="layer 0 has no expert 10 \\(expert ids are in \\[0, 10\\)\\)"):
        st.pin(0, 10)
    with pytest.raises(ValueError, match="layer 0 has no expert -1"):  # also a ValueError
        st.pin(0, -1)
    with pytest.raises(IndexError, match="layer 2 is out of range"):
        st.pin(2, 0)
    st.pin(1, 9)
    assert st.info()["n_pinned"] == 1
    for bad in ([10], [0, -1], [2**33]):
        with pytest.raises(ValueError, match="layer 0 has no expert .* in \\[0, 10\\)"):
            st.acquire(0, bad)
        with pytest.raises(ValueError, match="layer 0 has no expert .* in \\[0, 10\\)"):
            st.release(0, bad)
        with pytest.raises(ValueError, match="layer 0 has no expert .* in \\[0, 10\\)"):
            st.prefetch(0, bad)
    with pytest.raises(IndexError):
        st.acquire(-1, [0])
    with pytest.raises(ValueError, match="uses"):
        st.acquire(0, [1], uses=[-1])
    refs = st.acquire(0, [1, 2])
    assert refs.shape == (2, 3) and (refs != 0).all()
    st.release(0, [1, 2])


@pytest.mark.parametrize("bad", [-1, 320, 2**31, 2**32 + 5, 2**40])
def test_token_ids_out_of_range_are_a_value_error_naming_the_id(moe, bad):
    assert moe.n_vocab == 320
    s = moe.new_sequence()
    try:
        # Model checks ids before the forward (naming the position); the forward checks again
        want = f"= {bad}: out of the vocabulary \\[0, 320\\)"
        with pytest.raises(ValueError, match=want):
            moe.eval([s], tokens=[5, bad])
        assert moe.sequence_length(s) == 0  # nothing was appended
        with pytest.raises(ValueError, match=want):
            moe.generate([1, bad], max_tokens=2, temperature=0)
        with pytest.raises(ValueError, match=f"token id {bad} is out of range \\[0, 320\\)"):
            moe._fw.run([s, s], [0, 1], tokens=[5, bad])  # the Cython boundary itself
        assert moe.sequence_length(s) == 0
    finally:
        moe.free_sequence(s)


def test_forward_run_checks_sequence_ids_positions_and_shapes(moe):
    fw = moe._fw
    s = moe.new_sequence()
    try:
        with pytest.raises(ValueError, match="sequence id 4294967297 is out of range"):
            fw.run([2**32 + 1], [0], tokens=[1])  # used to wrap to sequence 1
        with pytest.raises(ValueError, match="sequence id -1 is out of range"):
            fw.run([-1], [0], tokens=[1])
        with pytest.raises(ValueError, match="sequence 999 is not live"):
            fw.run([999], [0], tokens=[1])
        with pytest.raises(ValueError, match="position 4294967296 is out of range"):
            fw.run([s], [2**32], tokens=[1])  # used to wrap to position 0
        with pytest.raises(ValueError, match="position -1 is out of range"):
            fw.run([s], [-1], tokens=[1])
        with pytest.raises(ValueError, match="embeddings of shape"):
            fw.run([s], [0], embd=np.zeros((1, 3), np.float32))
        with pytest.raises(ValueError, match="logits mask has 2 entries"):
            fw.run([s], [0], tokens=[1], logits=[1, 1])
        with pytest.raises(TypeError, match="integers"):
            fw.run([s], [0.5], tokens=[1])
        out = fw.run([s], [0], tokens=[1], logits=[256])  # any non-zero wants logits
        assert out.shape == (1, 320)
    finally:
        moe.free_sequence(s)
    with pytest.raises(ValueError, match="sequence 12345 is not live"):
        moe.eval([12345], tokens=[1])


def test_kv_sizes_and_ids_are_checked():
    a = KVArena(1 << 20, hugepages="off")
    for bad in (-1, 0):
        with pytest.raises(ValueError):
            a.alloc(bad)
    with pytest.raises(ValueError):
        KVArena(-4096)
    with pytest.raises(ValueError):
        a.view(-1, 4)
    kv = KVCache(a, 2, 1, 8, "f32")
    s = kv.new_sequence()
    with pytest.raises(ValueError, match="n_tokens must be >= 0"):
        kv.reserve(s, -1)
    with pytest.raises(ValueError, match="not live"):
        kv.reserve(s + 1, 4)
    with pytest.raises(ValueError, match="not live"):
        kv.free_sequence(-1)
    kv.reserve(s, 4)
    with pytest.raises(ValueError, match="layer 2"):
        kv.token_offset(s, 0, 2, 0)
    with pytest.raises(ValueError, match="layer -1"):
        kv.keys(s, -1)
    cap = kv.capacity(s)
    assert cap >= 4
    with pytest.raises(ValueError, match=f"positions \\[{cap}, {cap + 1}\\) \\(capacity {cap}\\)"):
        kv.token_offset(s, cap, 0, 0)


def test_quant_shapes_and_ids_are_checked():
    raw = np.zeros(4 * 4 * 4, np.uint8)
    with pytest.raises(ValueError, match="id 4 at position 0 is out of range"):
        _quant.get_rows("F32", raw, 4, 4, [4])
    with pytest.raises(ValueError, match="negative shape"):
        _quant.dequantize("F32", b"", (-1, 32))
    with pytest.raises(ValueError, match="negative shape"):
        _quant.matmul("F32", b"", -1, 4, np.ones(4, np.float32))
    with pytest.raises(ValueError, match="unknown GGML type id"):
        _quant.type_id(2**40)


def test_tokenizer_ids_beyond_int32_are_a_value_error(moe_path):
    tok = Model(moe_path, threads=1, ctx=16).tokenizer
    for bad in (-1, tok.vocab_size, 2**40):
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok._c.piece(bad, False)
        with pytest.raises(ValueError, match=f"token id {bad} "):
            tok._c.stream(False).feed(bad)
