"""Model(device="cuda") without a GPU, on the emulated device (tests/fake_pycuda.py, fixtures in
tests/cuda/conftest.py): routing and the routed experts through the kernels via the forward's
MoE hook, against the CPU forward; the CLI on the device; the staged path (a device expert
cache over the expert store's pinned slots) against the whole pool, bit for bit; the store's
pinning callbacks."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fake_pycuda import EMULATION_MARKS

from colibri import ColibriError
from colibri._cuda_ref import ExpertLayout

pytestmark = EMULATION_MARKS


@pytest.mark.parametrize("family,weights", [("mixtral", "f16"), ("qwen2_moe", "f16"),
                                            ("gemma4", "f16"), ("mixtral", "int4-g128")])
def test_model_on_the_device_matches_the_cpu(rt, moe_models, monkeypatch, family, weights):
    """Model(device="cuda") runs routing and the routed experts through the kernels (here on
    the CPU emulation); its logits must match the CPU forward within the fp16 / int4 rounding
    of the experts, layer 0's routing (same logits in both) exactly."""
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    ids = prompt(12, seed=7)
    cpu = Model(moe_models[family], threads=2, ctx=64, tokenizer=False)
    dev = Model(moe_models[family], threads=2, ctx=64, tokenizer=False, device="cuda",
                cuda_weights=weights)
    ref_l = cpu.logits(ids)
    got = dev.logits(ids)
    rel = np.linalg.norm(got - ref_l) / np.linalg.norm(ref_l)
    print(f"{family} {weights}: relative logit error {rel:.2e}")
    assert 0 < rel < (5e-3 if weights == "f16" else 0.15), rel
    np.testing.assert_array_equal(dev.route_counts(0), cpu.route_counts(0))
    down = "cb_moe_down_i4_m16" if weights == "int4-g128" else "cb_moe_down_f16_m16_cp"
    n_moe = sum(1 for L in dev.desc.layers if L.n_expert > 0)
    assert rt.calls["cb_route_topk"] == n_moe and rt.calls[down] == n_moe
    # decode through the KV cache uses the device too, and agrees with the batch
    s = dev.new_sequence()
    steps = np.concatenate([dev.eval([s], tokens=[t]) for t in ids])
    np.testing.assert_allclose(steps, got, rtol=0, atol=1e-3 * np.abs(got).max())


def test_device_errors(rt, moe_models, monkeypatch, tmp_path):
    import colibri.cuda as cuda
    from colibri.model import Model

    path = moe_models["mixtral"]
    with pytest.raises(ValueError, match="device must be"):
        Model(path, tokenizer=False, device="gpu")
    with pytest.raises(ValueError, match="cuda_weights"):
        monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
        Model(path, tokenizer=False, device="cuda", cuda_weights="int8")

    def broken(layer, h, logits, out):
        raise RuntimeError("device lost")

    m = Model(path, threads=2, ctx=64, tokenizer=False)
    m._fw.set_moe_hook(broken)
    with pytest.raises(RuntimeError, match="device lost"):
        m.logits([1, 2, 3])
    m._fw.set_moe_hook(None)  # the expert store again
    assert np.isfinite(m.logits([1, 2, 3])).all()


def test_a_routing_the_kernels_lack_is_refused(rt, monkeypatch, tmp_path):
    """phimoe's sparsemixer routing has no device kernel: Model(device="cuda") refuses it by
    name before touching the device (the CPU runs it)."""
    from oracle_models import build

    import colibri.cuda as cuda
    from colibri.arch import UnsupportedModel
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    path = build("phimoe", tmp_path)[1]["f32"]
    with pytest.raises(UnsupportedModel, match="sparsemixer"):
        Model(path, threads=2, ctx=64, tokenizer=False, device="cuda")
    assert np.isfinite(Model(path, threads=2, ctx=64, tokenizer=False).logits([1, 2])).all()


def test_model_device_without_pycuda(monkeypatch, tmp_path):
    """Without PyCUDA (or a device) Model(device="cuda") fails saying what is missing."""
    from oracle_models import build

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(cuda, "_runtimes", {})
    path = build("olmoe", tmp_path)[1]["f32"]
    with pytest.raises(ColibriError, match="PyCUDA not installed"):
        Model(path, tokenizer=False, device="cuda")


def test_cli_run_on_the_device(rt, moe_models, monkeypatch, capsys):
    """`colibri run --device cuda` generates the same greedy tokens through the kernels as on
    the CPU (a margin-rich oracle model: the bigram path), and fails clearly without PyCUDA."""
    import colibri.cuda as cuda
    from colibri.cli import main

    path = str(moe_models["mixtral"])
    args = ["run", "-m", path, "-p", "hello", "-n", "8", "--temp", "0", "--ctx", "64"]
    assert main(args) == 0
    cpu_text = capsys.readouterr().out
    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    assert main(args + ["--device", "cuda"]) == 0
    assert capsys.readouterr().out == cpu_text
    assert rt.calls["cb_moe_combine"] >= 8
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(cuda, "_runtimes", {})
    assert main(args + ["--device", "cuda"]) == 1
    assert "PyCUDA not installed" in capsys.readouterr().err


# ------------------------------------------------ the staged path: a device expert cache

def _slot_bytes(model_or_desc, weights):
    """Bytes of one device expert slot of a model in a weights format."""
    from colibri._cuda_ref import SLOT_ALIGN
    from colibri.cuda_moe import _pad_to

    desc = getattr(model_or_desc, "desc", model_or_desc)
    mult = 128 if weights == "int4-g128" else 64
    sb = max(ExpertLayout(_pad_to(desc.n_embd, mult), _pad_to(L.n_ff_exp, mult), weights).slot_bytes
             for L in desc.layers if L.n_expert > 0)
    return -(-sb // SLOT_ALIGN) * SLOT_ALIGN


@pytest.mark.parametrize("family,weights,mode,extra", [
    ("mixtral", "int4-g128", "cache", 1), ("qwen2_moe", "f16", "mapped", 0),
    ("gemma4", "f16", "cache", 2)])
def test_staged_matches_the_whole_pool(rt, moe_models, monkeypatch, family, weights, mode,
                                       extra):
    """A device budget of k (+ extra) experts: the 8-token prompt needs more distinct experts
    per layer than that (split into token chunks), decode evicts all the time; logits equal
    the whole-pool device path bit for bit (same packed weights, kernels and tile)."""
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    ids = prompt(8, seed=7)
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda", cuda_weights=weights)
    whole = Model(moe_models[family], **kw)
    k = max(L.n_expert_used for L in whole.desc.layers)
    budget = (k + extra) * _slot_bytes(whole, weights)
    staged = Model(moe_models[family], expert_mode=mode, cuda_expert_budget=budget, **kw)
    assert not whole.cuda_experts.staged and staged.cuda_experts.staged
    assert staged.cuda_experts.n_slots == k + extra
    want = whole.logits(ids)
    got = staged.logits(ids)
    assert np.array_equal(got, want)
    st = staged.device_expert_stats()
    assert st["splits"] > 0 and st["evictions"] > 0
    assert st["hits"] + st["misses"] > 0 and st["uses"] == 8 * sum(
        L.n_expert_used for L in staged.desc.layers if L.n_expert > 0)
    for layer in range(staged.desc.n_layer):
        if staged.desc.layers[layer].n_expert:
            np.testing.assert_array_equal(staged.route_counts(layer), whole.route_counts(layer))
    s, w = staged.new_sequence(), whole.new_sequence()
    for t in ids[:2]:
        assert np.array_equal(staged.eval([s], tokens=[t]), whole.eval([w], tokens=[t]))
    # the store served exactly the device misses
    assert staged.expert_stats()["acquired"] == staged.device_expert_stats()["misses"]
    staged.close()
    whole.close()


def test_staged_pins_once_and_counts_hits(rt, moe_models, monkeypatch):
    """The cache store's slot pool is registered once (the whole mapping), the staging buffer
    once, both unregistered at close; every expert copy is asynchronous from a registered
    range; hits, misses and evictions follow the LRU for a routing chosen by hand; each call's
    result equals the whole pool's."""
    import colibri.cuda as cuda
    from colibri.cuda_moe import CudaExperts
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    reg = sys.modules["pycuda.driver"].registry
    m = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False, expert_mode="cache")
    whole = CudaExperts(m.desc, rt, "f16")
    sb = _slot_bytes(m, "f16")
    async_before = reg.async_bytes
    dev = CudaExperts(m.desc, rt, "f16", store=m.experts, budget=3 * sb)
    pool = m.experts.pool()
    assert pool["pinned"] and dev.n_slots == 3
    regs = [entry for entry in reg.log if entry[0] == "register"]
    assert ("register", pool["address"], pool["bytes"]) in regs
    assert reg.pinned == {pool["address"]: pool["address"] + pool["bytes"],
                          dev._staging.ctypes.data: dev._staging.ctypes.data + dev._staging.nbytes}
    with pytest.raises(ValueError, match="already pinned"):
        m.experts.pin_pool(rt.pin_host_memory, rt.unpin_host_memory)
    rng = np.random.default_rng(5)
    E, D = m.desc.layers[0].n_expert, m.desc.n_embd

    def call(layer, pair, n=3):
        logits = np.zeros((n, E), np.float32)
        logits[:, pair] = (4.0, 3.0)
        h = rng.normal(size=(n, D)).astype(np.float32)
        out, ref_out = np.zeros((n, D), np.float32), np.zeros((n, D), np.float32)
        dev(layer, h, logits, out)
        whole(layer, h, logits, ref_out)
        assert np.array_equal(out, ref_out)
        return dev.stats(layer)

    seq = [((1, 2), (0, 2, 0)), ((1, 2), (2, 2, 0)), ((3, 4), (2, 4, 1)), ((2, 4), (4, 4, 1)),
           ((1, 4), (5, 5, 2))]  # LRU order after each: 12, 12, 234, 342, 241
    for pair, (hits, misses, evictions) in seq:
        st = call(0, list(pair))
        assert (st["hits"], st["misses"], st["evictions"]) == (hits, misses, evictions), pair
    assert dev.stats(0)["bytes_staged"] == 5 * ExpertLayout(64, 64, "f16").slot_bytes
    st = call(1, [0, 9])  # layer 1 evicts layer 0's two least recent (3: gone; 2, 4)
    assert (st["misses"], dev.stats()["evictions"]) == (2, 4)
    assert reg.async_bytes - async_before == dev.stats()["bytes_staged"]
    dev.close()
    dev.close()
    assert reg.pinned == {} and not m.experts.pool()["pinned"]
    assert [e for e in reg.log if e[0] == "unregister"][-2:] == [
        ("unregister", pool["address"], pool["bytes"]),
        ("unregister", dev._staging.ctypes.data, dev._staging.nbytes)]
    with pytest.raises(ColibriError, match="closed"):
        call(0, [1, 2])


def test_staged_store_freed_unpins(rt, moe_models, monkeypatch):
    """Dropping a Model without close(): the C store unpins its pool before unmapping it."""
    import gc

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    reg = sys.modules["pycuda.driver"].registry
    m = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False, expert_mode="cache",
              device="cuda", cuda_expert_budget=0.3)
    pool = m.experts.pool()
    assert reg.pinned.get(pool["address"]) == pool["address"] + pool["bytes"]
    assert np.isfinite(m.logits([1, 2, 3])).all()
    del m
    gc.collect()
    assert pool["address"] not in reg.pinned
    assert ("unregister", pool["address"], pool["bytes"]) in reg.log


def test_staged_budget_errors(rt, moe_models, monkeypatch):
    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    path = moe_models["qwen2_moe"]  # top-4 routing
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda")
    sb = _slot_bytes(Model(path, tokenizer=False).desc, "f16")
    with pytest.raises(ValueError, match=r"holds 3 experts .* one token needs 4"):
        Model(path, cuda_expert_budget=3 * sb + 100, **kw)
    with pytest.raises(ValueError, match="cuda_expert_budget=.lots.: expected bytes"):
        Model(path, cuda_expert_budget="lots", **kw)
    m = Model(path, cuda_expert_budget=1.0, **kw)  # everything fits: the whole pool
    assert not m.cuda_experts.staged and m.device_expert_stats()["staged"] == 0


@pytest.fixture(scope="module")
def f16_mixtral(tmp_path_factory):
    """A mixtral whose expert tensors are F16 with FFN width 64: their file bytes already are
    the kernels' fp16 layout (no padding, no scale)."""
    import torch
    import transformers as T
    from oracle_models import _convert_module, add_bigram_path, family_configs

    out = tmp_path_factory.mktemp("cuda_f16")
    configs, common = family_configs()
    cfg = T.MixtralConfig(**{**common, **configs["mixtral"][2], "intermediate_size": 64})
    torch.manual_seed(4321)
    model = T.MixtralForCausalLM(cfg).eval()
    add_bigram_path(model, seed=3)
    model.save_pretrained(out / "hf")
    return _convert_module().convert(out / "hf", out / "mixtral64-f16.gguf", "f16")


@pytest.mark.parametrize("mode", ["cache", "mapped"])
def test_staged_copies_fp16_experts_from_the_store_as_they_are(rt, f16_mixtral, monkeypatch,
                                                               mode):
    """F16 experts that need no padding go from the store to the device without conversion:
    three copies per expert straight from the store's bytes (asynchronous from the pinned
    slot pool in cache mode, synchronous from the file mapping otherwise), and the logits
    equal the whole pool's."""
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    reg = sys.modules["pycuda.driver"].registry
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda")
    whole = Model(f16_mixtral, **kw)
    staged = Model(f16_mixtral, expert_mode=mode, cuda_expert_budget=3 * 3 * 64 * 64 * 2, **kw)
    ce = staged.cuda_experts
    assert all(ce.direct.values()) and ce.n_slots == 3
    before = reg.async_bytes
    ids = prompt(10, seed=2)
    assert np.array_equal(staged.logits(ids), whole.logits(ids))
    st = staged.device_expert_stats()
    assert st["bytes_staged"] == st["misses"] * 3 * 64 * 64 * 2 and st["misses"] > 0
    # cache mode: every staged byte came asynchronously from the pinned pool, nothing went
    # through the staging buffer; mapped: synchronous copies from the mapping
    assert reg.async_bytes - before == (st["bytes_staged"] if mode == "cache" else 0)
    staged.close()



def test_store_pin_pool_callbacks(moe_models):
    """ExpertStore.pin_pool: pin's exception propagates and nothing stays pinned; unpin is
    called once with pin's handle, by unpin_pool or by the store's own free; an exception in
    unpin is raised by unpin_pool; the mapped store has no pool."""
    import gc

    from colibri.model import Model

    m = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False, expert_mode="cache")
    store = m.experts

    def bad_pin(view):
        raise OSError("cannot lock")

    with pytest.raises(OSError, match="cannot lock"):
        store.pin_pool(bad_pin, lambda h: None)
    assert not store.pool()["pinned"]
    seen: list = []
    store.pin_pool(lambda view: ("handle", view.nbytes), seen.append)
    assert store.pool()["pinned"] and seen == []
    store.unpin_pool()
    store.unpin_pool()
    assert seen == [("handle", store.pool()["bytes"])]

    def bad_unpin(handle):
        raise RuntimeError("driver gone")

    store.pin_pool(lambda view: 1, bad_unpin)
    with pytest.raises(RuntimeError, match="driver gone"):
        store.unpin_pool()
    store.pin_pool(lambda view: 2, seen.append)
    del m, store
    gc.collect()
    assert seen[-1] == 2  # the freed store unpinned itself
    mapped = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False)
    with pytest.raises(ValueError, match="only the cache store"):  # INVALID_ARGUMENT
        mapped.experts.pool()


@pytest.mark.parametrize("kind", ["iq2_xxs", "q3_k_m"])
def test_lowbit_experts_on_the_device(rt, monkeypatch, tmp_path, kind):
    """The low-bit types (issue 45) on the device: the experts are dequantized on the CPU
    (colibri's dequantizers, as for every type) on their way to the fp16 kernels; logits within
    the fp16 rounding of the CPU forward's, and the staged path equal to the whole pool."""
    import colibri.cuda as cuda
    from colibri.model import Model
    from colibri.tools.make_bench_model import write

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    path = str(write(str(tmp_path / f"{kind}.gguf"), 1, kind=kind, shape="tiny", routing="raw"))
    ids = [int(t) for t in np.random.default_rng(2).integers(3, 2000, 10)]
    ref = Model(path, threads=2, ctx=64, tokenizer=False).logits(ids)
    got = Model(path, threads=2, ctx=64, tokenizer=False, device="cuda",
                cuda_weights="f16").logits(ids)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"{kind} f16 on the device: relative logit error {rel:.2e}")
    # the CPU experts' 8-bit activations against the device's fp16 weights and activations
    assert 0 < rel < 0.05, rel
    staged = Model(path, threads=2, ctx=64, tokenizer=False, device="cuda", cuda_weights="f16",
                   cuda_expert_budget=0.5, expert_mode="cache", expert_budget=1).logits(ids)
    np.testing.assert_array_equal(staged, got)
