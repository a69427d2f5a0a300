"""The C status codes reach Python as the right exception, with the C detail message."""

import pytest

from colibri import ColibriError, simd
from colibri._core import _status

S = _status.cb_status  # the codes of include/colibri/status.h
CASES = [
    (S.CB_STATUS_INVALID_ARGUMENT, ValueError),
    (S.CB_STATUS_OUT_OF_MEMORY, MemoryError),
    (S.CB_STATUS_IO, OSError),
    (S.CB_STATUS_NOT_FOUND, FileNotFoundError),
    (S.CB_STATUS_CORRUPT, ValueError),
    (S.CB_STATUS_UNSUPPORTED, ColibriError),
    (S.CB_STATUS_CLOSED, ColibriError),
    (S.CB_STATUS_INTERNAL, ColibriError),
    (S.CB_STATUS_NOT_FINITE, ColibriError),
]


@pytest.mark.parametrize("code,exc", CASES)
def test_status_maps_to_exception_with_detail(code, exc):
    with pytest.raises(exc) as info:
        _status.raise_status(code, f"detail for {code} é")
    assert str(info.value) == f"detail for {code} é"
    assert type(info.value) is exc


def test_empty_detail_falls_back_to_status_name():
    with pytest.raises(MemoryError, match="out of memory"):
        _status.raise_status(S.CB_STATUS_OUT_OF_MEMORY, "")


def test_ok_status_raises_nothing():
    assert _status.raise_status(S.CB_OK, "ignored") is None


def test_status_names_are_distinct():
    names = {_status.status_str(c) for c, _ in CASES}
    assert len(names) == len(CASES) == len(S) - 1  # every failure status, each named
    assert _status.status_str(S.CB_OK) == "ok"


def test_simd_cap_reaches_the_kernels_and_is_restored():
    best = simd.detected()
    assert best in simd.LEVELS
    with simd.max_simd("scalar"):
        assert simd.level() == "scalar"
    assert simd.level() == best
    with pytest.raises(ValueError, match="unknown SIMD level"):
        simd.set_max_simd("sse9")
