"""One extension module, one copy of the C library: every concept module of colibri._core
re-exports names of colibri._core._native, and handles cross between its classes typed."""

import pytest

import colibri.simd as simd
from colibri._core import (
    _arena,
    _forward,
    _mapguard,
    _native,
    _ops,
    _quant,
    _status,
    _tokenizer,
)

CONCEPTS = (_arena, _forward, _mapguard, _ops, _quant, _status, _tokenizer)


def test_every_concept_reexports_the_one_native_module():
    for mod in CONCEPTS:
        assert mod.__all__, mod.__name__
        for name in mod.__all__:
            assert getattr(mod, name) is getattr(_native, name), f"{mod.__name__}.{name}"
    assert _forward.Forward.__module__ == _native.__name__
    assert _quant.ThreadPool.__module__ == _native.__name__


def test_simd_cap_is_process_wide():
    prev = simd.set_max_simd("scalar")
    try:
        assert simd.level() == "scalar"
        assert _status.simd_level() == "scalar"
    finally:
        simd.set_max_simd(prev)
    assert simd.level() == _status.simd_level()


@pytest.mark.parametrize("kv, pool", [(12345, None), (None, None), ("kv", None)])
def test_forward_takes_a_typed_kv_cache(kv, pool):
    with pytest.raises(TypeError):
        _forward.Forward(None, kv, None, pool)


def test_forward_takes_a_typed_thread_pool():
    with _arena.KVArena(1 << 20) as arena:
        kv = _arena.KVCache(arena, 1, 1, 8)
        with pytest.raises(TypeError):
            _forward.Forward(None, kv, None, 12345)
        with pytest.raises(TypeError):
            _forward.Forward(None, kv, _quant.ThreadPool(1), None)  # the store's slot
