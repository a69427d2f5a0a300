"""The KV cache's page size (include/colibri/arena.h) moves K/V rows, never the numbers: a forward
over caches with pages of 1 (position-major), 7 and 256 tokens gives bit-identical logits, with
sequences crossing pages, growing (the last page re-laid out at each reserve), several in one
batch, and Gemma 3's local layers (window 512) whose window starts inside a page; the tiny MoE
model too, in f32 and f16 caches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import colibri
from colibri._core import _forward
from colibri.kv import KVArena, KVCache


@pytest.fixture(scope="module")
def gemma() -> Iterator[colibri.Model]:
    with colibri.Model(ctx=1024, verbose=False, tokenizer=False) as m:
        yield m


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[colibri.Model]:
    from colibri.tools.make_bench_model import write

    p = str(write(str(tmp_path_factory.mktemp("pages") / "tiny.gguf"), n_layers=2, shape="tiny"))
    with colibri.Model(p, ctx=1024, verbose=False, tokenizer=False) as m:
        yield m


def run_plan(m: colibri.Model, page: int, dtype: str, lengths: tuple[int, ...],
             chunk: int, decode: int) -> list[np.ndarray]:
    """Every logit row of: each sequence's prompt of lengths[i] tokens prefilled `chunk` tokens
    at a time (sequences interleaved chunk by chunk), then `decode` steps of all sequences in
    one batch; in a fresh cache with pages of `page` tokens."""
    d = m.desc
    ctx = max(lengths) + decode
    stride = d.kv_bytes_per_token(dtype)
    arena = KVArena(len(lengths) * (ctx + 16) * stride + (1 << 20), hugepages="off")
    kv = KVCache(arena, *d.kv_dims(), dtype, page_tokens=page)
    fw = _forward.Forward(d, kv, m.experts, m.pool, 128)
    rng = np.random.default_rng(7)
    seqs = [kv.new_sequence() for _ in lengths]
    prompts = [[int(t) for t in rng.integers(3, min(m.n_vocab, 3000), n)] for n in lengths]
    out = []
    for a in range(0, max(lengths), chunk):
        for s, p in zip(seqs, prompts, strict=True):
            ids = p[a:a + chunk]
            if ids:
                out.append(fw.run([s] * len(ids), list(range(a, a + len(ids))), tokens=ids))
    for step in range(decode):
        ids = [int(t) for t in rng.integers(3, min(m.n_vocab, 3000), len(seqs))]
        pos = [n + step for n in lengths]
        out.append(fw.run(seqs, pos, tokens=ids))
    assert [kv.length(s) for s in seqs] == [n + decode for n in lengths]
    return out


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_gemma_pages_and_windows_give_the_same_logits(gemma):
    """Prompts of 530 and 37 tokens (the first crosses pages and Gemma's 512-token window)."""
    plan = dict(lengths=(530, 37), chunk=128, decode=3)
    ref = run_plan(gemma, 1, "f32", **plan)
    for page in (7, 256):
        assert same(run_plan(gemma, page, "f32", **plan), ref), page


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_moe_pages_give_the_same_logits(tiny, dtype):
    plan = dict(lengths=(45, 20, 3), chunk=16, decode=4)
    ref = run_plan(tiny, 1, dtype, **plan)
    for page in (7, 256):
        assert same(run_plan(tiny, page, dtype, **plan), ref), (page, dtype)


def test_caches_of_other_row_shapes(tiny):
    """The forward addresses K/V through the cache's rows, whatever their shape: rows of two heads
    (each head inside one row) work in pages, rows of half a head only with pages of one token
    (a head split across rows is refused by name, never read wrong); every accepted shape gives
    the logits of the model's own."""
    d = tiny.desc
    n_layers, n_kv, hd = d.kv_dims()
    if n_kv % 2:
        pytest.fail(f"the tiny model's {n_kv} K/V heads do not pair up")  # a broken fixture

    def logits(dims: tuple[int, int, int], page: int) -> np.ndarray:
        kv = KVCache(KVArena(1 << 24, hugepages="off"), *dims, "f32", page_tokens=page)
        fw = _forward.Forward(d, kv, tiny.experts, tiny.pool, 32)
        s = kv.new_sequence()
        return fw.run([s] * 20, list(range(20)), tokens=list(range(3, 23)))

    ref = logits((n_layers, n_kv, hd), 7)
    assert np.array_equal(logits((n_layers, n_kv // 2, 2 * hd), 7), ref)
    assert np.array_equal(logits((n_layers, 2 * n_kv, hd // 2), 1), ref)
    with pytest.raises(ValueError, match="page_tokens 1"):
        logits((n_layers, 2 * n_kv, hd // 2), 7)
