"""KVCache: the documented paged layout checked against a numpy reference (pages of 1, 3 and 256
tokens), K/V data surviving the growth (and moves, and the last page's re-layout) of its own and
other sequences, failure leaving a sequence unchanged, memory returned on free, dtypes, close,
threads."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from colibri import ColibriError, KVArena, KVCache

L, H, D = 3, 2, 8


def make(capacity: int = 1 << 20, dtype: object = "f32", **kw: object) -> tuple[KVArena, KVCache]:
    arena = KVArena(capacity, min_block=256, hugepages="off")
    return arena, KVCache(arena, L, H, D, dtype, **kw)


PAGES = [1, 3, 256]


def raw_block(kv: KVCache, seq: int, n_tokens: int) -> np.ndarray:
    """The sequence's first n_tokens tokens [t][layer][K/V][head][dim], read from the block's
    bytes as arena.h documents the layout: pages of P tokens, page p at p * P token strides,
    holding r = min(P, capacity - p * P) tokens as [layer][K/V][head][r][dim]."""
    off, cap, P = kv.offset(seq), kv.capacity(seq), kv.page_tokens
    if n_tokens == 0:
        return np.empty((0, L, 2, H, D), kv.dtype)
    assert off is not None and n_tokens <= cap
    block = np.frombuffer(kv.arena.view(off, cap * kv.token_stride), dtype=kv.dtype)
    per_token = L * 2 * H * D
    pages = []
    for start in range(0, n_tokens, P):
        r = min(P, cap - start)
        page = block[start * per_token:(start + r) * per_token].reshape(L, 2, H, r, D)
        pages.append(page.transpose(3, 0, 1, 2, 4))
    return np.concatenate(pages)[:n_tokens]


def fill(kv: KVCache, seq: int, ref: np.ndarray, start: int = 0) -> None:
    """Write ref [n][layer][K/V][head][dim] at tokens [start, start + n)."""
    for layer in range(L):
        kv.set_keys(seq, layer, ref[:, layer, 0], start)
        kv.set_values(seq, layer, ref[:, layer, 1], start)


@pytest.mark.parametrize("page", PAGES)
def test_layout_matches_the_documented_reference(page):
    arena, kv = make(page_tokens=page)
    itemsize = 4
    assert kv.token_stride == L * 2 * H * D * itemsize and kv.page_tokens == page
    s = kv.new_sequence()
    assert kv.offset(s) is None and kv.length(s) == 0 and kv.capacity(s) == 0
    kv.reserve(s, 5)
    kv.set_length(s, 5)
    cap = kv.capacity(s)
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((5, L, 2, H, D)).astype(np.float32)
    fill(kv, s, ref)
    assert np.array_equal(raw_block(kv, s, 5), ref)
    base = kv.offset(s)
    for t in range(5):
        start = t - t % page
        r = min(page, cap - start)
        for layer in range(L):
            for k in range(2):
                for h in range(H):
                    g = (layer * 2 + k) * H + h
                    assert kv.token_offset(s, t, layer, k, h) == (
                        base + start * kv.token_stride + (g * r + t % page) * D * itemsize)
    k1 = kv.keys(s, 1)
    assert k1.shape == (5, H, D) and np.array_equal(k1, ref[:, 1, 0])
    assert k1.dtype == np.float32
    k1[:] = 0  # a copy: the cache is unchanged
    assert np.array_equal(kv.keys(s, 1), ref[:, 1, 0])


@pytest.mark.parametrize("page", PAGES)
def test_data_survives_growth_of_this_and_other_sequences(page):
    # A small arena and interleaved growth force blocks to move; pages of 3 tokens re-lay the
    # last page out at every growth and cross page boundaries.
    arena, kv = make(capacity=96 * 1024, chunk_tokens=2, page_tokens=page)
    seqs = [kv.new_sequence() for _ in range(3)]
    target = {seqs[0]: 40, seqs[1]: 25, seqs[2]: 12}
    ref = {s: np.zeros((target[s], L, 2, H, D), np.float32) for s in seqs}
    rng = np.random.default_rng(1)
    offsets_seen = {s: set() for s in seqs}
    for t in range(max(target.values())):
        for s in seqs:
            if t >= target[s]:
                continue
            kv.reserve(s, t + 1)
            kv.set_length(s, t + 1)
            offsets_seen[s].add(kv.offset(s))
            tok = rng.standard_normal((L, 2, H, D)).astype(np.float32)
            ref[s][t] = tok
            fill(kv, s, tok[None], t)
            for q in seqs:  # every sequence still holds everything written so far
                n = kv.length(q)
                assert np.array_equal(raw_block(kv, q, n), ref[q][:n])
                for layer in range(L):
                    assert np.array_equal(kv.keys(q, layer), ref[q][:n, layer, 0])
                    assert np.array_equal(kv.values(q, layer), ref[q][:n, layer, 1])
    assert max(len(v) for v in offsets_seen.values()) > 1, "no block ever moved"
    arena.check()


def test_reserve_that_cannot_fit_leaves_the_sequence_unchanged():
    arena, kv = make(capacity=64 * 1024, chunk_tokens=1)
    s = kv.new_sequence()
    kv.reserve(s, 10)
    kv.set_length(s, 10)
    kv.set_keys(s, 2, np.full((10, H, D), 7.5))
    before = (kv.length(s), kv.capacity(s), kv.offset(s), arena.stats())
    with pytest.raises(MemoryError, match=f"sequence {s}"):
        kv.reserve(s, 10_000)
    assert (kv.length(s), kv.capacity(s), kv.offset(s), arena.stats()) == before
    assert np.all(kv.keys(s, 2) == 7.5)
    kv.reserve(s, 10)  # no-op
    assert kv.capacity(s) == before[1]


def test_free_returns_memory_and_ids():
    arena, kv = make()
    s1, s2 = kv.new_sequence(), kv.new_sequence()
    kv.reserve(s1, 100)
    kv.reserve(s2, 30)
    assert kv.sequences() == [s1, s2]
    assert arena.stats()["used"] >= 130 * kv.token_stride
    kv.free_sequence(s1)
    assert kv.sequences() == [s2]
    assert arena.stats()["n_blocks"] == 1
    with pytest.raises(ValueError, match="not live"):
        kv.free_sequence(s1)
    with pytest.raises(ValueError):
        kv.length(s1)
    kv.free_sequence(s2)
    s = arena.stats()
    assert s["used"] == 0 and s["n_free_blocks"] == 1
    arena.check()


def test_chunk_and_doubling_policies():
    _, kv = make(chunk_tokens=16)
    s = kv.new_sequence()
    kv.reserve(s, 1)
    assert kv.capacity(s) == 16
    kv.reserve(s, 17)
    assert kv.capacity(s) == 32
    _, kv2 = make(chunk_tokens=4, doubling=True)
    s = kv2.new_sequence()
    kv2.reserve(s, 3)
    assert kv2.capacity(s) == 4
    for want, cap in ((5, 8), (9, 16), (17, 32), (33, 64)):
        kv2.reserve(s, want)
        assert kv2.capacity(s) == cap


@pytest.mark.parametrize("dtype,np_dtype", [("f16", np.float16), ("f32", np.float32),
                                            (np.float16, np.float16), (np.dtype("float32"), np.float32),
                                            ("float16", np.float16)])
def test_dtypes(dtype, np_dtype):
    _, kv = make(dtype=dtype)
    assert kv.dtype == np.dtype(np_dtype)
    assert kv.token_stride == L * 2 * H * D * np.dtype(np_dtype).itemsize
    s = kv.new_sequence()
    kv.reserve(s, 3)
    kv.set_length(s, 3)
    kv.set_values(s, 0, np.arange(3 * H * D).reshape(3, H, D))
    assert np.array_equal(raw_block(kv, s, 3)[:, 0, 1], np.arange(3 * H * D, dtype=np_dtype).reshape(3, H, D))


@pytest.mark.parametrize("dtype", ["f64", np.int8, "bf16", "nonsense", np.float64])
def test_bad_dtype(dtype):
    arena = KVArena(1 << 16)
    with pytest.raises(ValueError, match="dtype"):
        KVCache(arena, L, H, D, dtype)


def test_bad_arguments():
    arena, kv = make()
    for dims in ((0, H, D), (L, 0, D), (L, H, -1)):
        with pytest.raises(ValueError):
            KVCache(arena, *dims, "f32")
    s = kv.new_sequence()
    kv.reserve(s, 4)
    with pytest.raises(ValueError, match="capacity"):
        kv.set_length(s, 100)
    for bad in (-1, L):
        with pytest.raises(ValueError):
            kv.keys(s, bad)
    for seq in (-1, 99, 1 << 40):
        with pytest.raises(ValueError):
            kv.reserve(seq, 1)
    with pytest.raises(ValueError):
        kv.token_offset(s, kv.capacity(s), 0, 0)
    with pytest.raises(ValueError):
        kv.token_offset(s, 0, 0, 2)
    with pytest.raises(ValueError):
        kv.token_offset(s, 0, 0, 0, H)
    assert kv.keys(s, 0).shape == (0, H, D)
    with pytest.raises(ValueError, match="capacity"):
        kv.set_keys(s, 0, np.zeros((1, H, D)), kv.capacity(s))
    with pytest.raises(ValueError, match="shape"):
        kv.set_keys(s, 0, np.zeros((2, H, D + 1)))
    with pytest.raises(ValueError):
        kv.set_values(s, L, np.zeros((1, H, D)))
    for page in (0, -1, (1 << 20) + 1):
        with pytest.raises(ValueError, match="page_tokens"):
            KVCache(arena, L, H, D, "f32", page_tokens=page)


def test_sequence_ids_run_out_cleanly():
    _, kv = make(max_sequences=2)
    a, b = kv.new_sequence(), kv.new_sequence()
    with pytest.raises(MemoryError, match="max_sequences"):
        kv.new_sequence()
    kv.free_sequence(a)
    assert kv.new_sequence() == a
    assert kv.sequences() == sorted([a, b])


def test_cache_keeps_its_arena_alive_and_close_frees_blocks():
    _, kv = make()
    gc.collect()
    s = kv.new_sequence()
    kv.reserve(s, 50)
    arena = kv.arena
    assert arena.stats()["n_blocks"] == 1
    kv.close()
    kv.close()
    assert kv.closed and arena.stats()["n_blocks"] == 0
    with pytest.raises(ColibriError, match="closed"):
        kv.new_sequence()
    with pytest.raises(ColibriError, match="closed"):
        kv.keys(s, 0)


def test_closed_arena_makes_cache_calls_fail_cleanly():
    arena, kv = make()
    s = kv.new_sequence()
    kv.reserve(s, 4)
    kv.set_length(s, 4)
    arena.close()
    with pytest.raises(ColibriError, match="closed"):
        kv.reserve(s, 100)
    with pytest.raises(ColibriError, match="closed"):
        kv.keys(s, 0)
    with pytest.raises(ColibriError, match="closed"):
        KVCache(arena, L, H, D, "f32")
    kv.free_sequence(s)
    kv.close()


def _copy_until_closed(kv: KVCache, s: int, data: np.ndarray, outcomes: list[str]) -> None:
    for i in range(200):
        try:
            if i % 2:
                kv.set_keys(s, 1, data)
            else:
                assert kv.keys(s, 1).shape == data.shape
        except ColibriError as e:
            assert "closed" in str(e)
            outcomes.append("closed")
            return
    outcomes.append("done")


def test_arena_closed_while_other_threads_copy_rows():
    """keys()/set_keys() copy with the block pinned: a close from another thread mid-copy defers
    the unmap (the copy finishes, or the next one says "closed"), never a crash."""
    for _ in range(5):
        arena, kv = make(capacity=64 << 20, page_tokens=7)
        s = kv.new_sequence()
        kv.reserve(s, 4000)
        kv.set_length(s, 4000)
        outcomes: list[str] = []
        t = threading.Thread(target=_copy_until_closed,
                             args=(kv, s, np.ones((4000, H, D), np.float32), outcomes))
        t.start()
        arena.close()
        t.join()
        assert outcomes in (["closed"], ["done"])


@pytest.mark.parametrize("page", [3, 256])
def test_threads_grow_their_own_sequences(page):
    arena, kv = make(capacity=2 << 20, chunk_tokens=4, page_tokens=page)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            rng = np.random.default_rng(w)
            for _round in range(5):
                s = kv.new_sequence()
                n = int(rng.integers(20, 60))
                ref = rng.standard_normal((n, L, 2, H, D)).astype(np.float32)
                for t in range(n):
                    kv.reserve(s, t + 1)
                    kv.set_length(s, t + 1)
                    fill(kv, s, ref[t:t + 1], t)
                for layer in range(L):
                    assert np.array_equal(kv.keys(s, layer), ref[:, layer, 0])
                    assert np.array_equal(kv.values(s, layer), ref[:, layer, 1])
                kv.free_sequence(s)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert kv.sequences() == [] and arena.stats()["used"] == 0
    arena.check()


@pytest.mark.parametrize("dtype,page", [("f16", 256), ("f32", 256), ("f32", 1), ("f16", 3),
                                        ("f32", 16)])
def test_copy_prefix_copies_every_layer_k_and_v(dtype, page):
    _, kv = make(dtype=dtype, page_tokens=page)
    rng = np.random.default_rng(1)
    src, dst, other = kv.new_sequence(), kv.new_sequence(), kv.new_sequence()
    kv.reserve(src, 40)
    kv.set_length(src, 40)
    ref = rng.standard_normal((40, L, 2, H, D)).astype(kv.dtype)
    fill(kv, src, ref)
    kv.reserve(other, 50)  # a longer destination: its length becomes n
    kv.set_length(other, 50)
    for d, n in ((dst, 25), (other, 40), (dst, 1), (dst, 33)):
        kv.copy_prefix(src, d, n)
        assert kv.length(d) == n and kv.capacity(d) >= n
        assert np.array_equal(raw_block(kv, d, n), ref[:n])
        for layer in range(L):
            assert np.array_equal(kv.keys(d, layer), ref[:n, layer, 0])
            assert np.array_equal(kv.values(d, layer), ref[:n, layer, 1])
    assert kv.length(src) == 40 and np.array_equal(raw_block(kv, src, 40), ref)
    kv.copy_prefix(src, dst, 0)
    assert kv.length(dst) == 0


def test_copy_prefix_checks_its_arguments_and_fits_or_leaves_dst_unchanged():
    arena, kv = make(capacity=64 * 1024)
    src, dst = kv.new_sequence(), kv.new_sequence()
    kv.reserve(src, 10)
    kv.set_length(src, 10)
    kv.set_keys(src, 2, np.full((10, H, D), 7.0))
    with pytest.raises(ValueError, match="holds 10"):
        kv.copy_prefix(src, dst, 11)
    with pytest.raises(ValueError, match="same sequence"):
        kv.copy_prefix(src, src, 5)
    with pytest.raises(ValueError, match="not live"):
        kv.copy_prefix(src, 999, 5)
    with pytest.raises(ValueError):
        kv.copy_prefix(src, dst, -1)
    kv.free_sequence(dst)
    with pytest.raises(ValueError, match="not live"):
        kv.copy_prefix(dst, src, 0)
    # a destination that cannot hold the prefix: MemoryError, its length unchanged
    dst = kv.new_sequence()
    kv.reserve(dst, 2)
    kv.set_length(dst, 2)
    hog = kv.new_sequence()
    n = 1
    while True:
        try:
            kv.reserve(hog, n)
        except MemoryError:
            break
        n += 1
    with pytest.raises(MemoryError):
        kv.copy_prefix(src, dst, 10)
    assert kv.length(dst) == 2
    kv.free_sequence(hog)
    kv.copy_prefix(src, dst, 10)
    assert np.all(kv.keys(dst, 2) == 7.0) and np.all(kv.keys(dst, 1) == 0.0)
    arena.check()
    kv.close()
    with pytest.raises(ColibriError):
        kv.copy_prefix(src, dst, 1)


def test_recurrent_state_per_sequence() -> None:
    """state_bytes: a zeroed state per sequence, copied out and in, restored by copy_prefix
    from a snapshot, never truncated but to 0; wrong sizes are ValueErrors."""
    a, kv = make(state_bytes=12)
    assert kv.state_bytes == 12
    s, d = kv.new_sequence(), kv.new_sequence()
    assert kv.get_state(s) == bytes(12)
    kv.set_state(s, bytes(range(12)))
    kv.reserve(s, 8)
    kv.set_length(s, 8)
    snap = kv.get_state(s)
    kv.set_state(s, bytes([7] * 12))
    with pytest.raises(ColibriError, match="cannot be truncated"):
        kv.set_length(s, 3)
    with pytest.raises(ColibriError, match="recurrent state"):
        kv.copy_prefix(s, d, 5)
    kv.copy_prefix(s, d, 5, snap)
    assert kv.get_state(d) == bytes(range(12)) and kv.length(d) == 5
    kv.copy_prefix(s, d, 8)  # the source's end: its state
    assert kv.get_state(d) == bytes([7] * 12)
    with pytest.raises(ValueError, match="state of 3 bytes"):
        kv.set_state(d, b"abc")
    with pytest.raises(ValueError, match="state_bytes must be"):
        KVCache(a, 1, 1, 4, state_bytes=-1)
    kv.set_length(s, 0)
    assert kv.get_state(s) == bytes(12)
    _, plain = make()
    with pytest.raises(ValueError, match="state_bytes 0"):
        plain.set_state(plain.new_sequence(), b"")
