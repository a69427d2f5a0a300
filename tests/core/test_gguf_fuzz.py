"""Fuzzing colibri.gguf: mutated small valid GGUF files (flipped bytes, truncations, inflated
counts, lengths, offsets, dims and types) must give a GGUFError or, when the mutation happens to
keep the file valid, a directory whose every tensor lies inside the file. Never another
exception, never a crash, never a hang (hypothesis deadline; a subprocess batch proves no
segfault)."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf_util import RawGGUF, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colibri.gguf import SUPPORTED_TYPES, GGUFError, GGUFFile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INTERESTING = [0, 1, 2, 3, 4, 5, 7, 31, 32, 33, 64, 255, 256, 4096, 2**16, 2**31 - 1, 2**31,
               2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 32, 2**64 - 1]


def _raw_base() -> RawGGUF:
    r = RawGGUF()
    r.kv("general.architecture", V.STRING, "llama")
    r.kv("general.alignment", V.UINT32, 32)
    r.kv("tokenizer.ggml.tokens", V.ARRAY, ["<s>", "a", "bc", "ü"], V.STRING)
    r.kv("tokenizer.ggml.scores", V.ARRAY, [0.0, 1.0, 2.0, 3.0], V.FLOAT32)
    r.kv("llama.block_count", V.UINT32, 2)
    r.kv("nest", V.ARRAY, [(V.UINT16, [1, 2]), (V.STRING, ["x"])], V.ARRAY)
    r.tensor("a.weight", [32, 2], T.F32, 0)
    r.tensor("b.weight", [64], T.Q8_0, 256)
    r.tensor("c.weight", [256, 1], T.Q4_K, 352)
    r.tensor_data = bytes(range(256)) * 2
    return r


def _written_base(tmp: str) -> bytes:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 64)).astype(np.float32)
    p = write_gguf(os.path.join(tmp, "w.gguf"), "qwen3moe",
                   {"qwen3moe.expert_count": 4, "tokenizer.ggml.tokens": ["a", "b"],
                    "tokenizer.ggml.token_type": [1, 1], "f": 0.5},
                   {"x.weight": w, "y.weight": (w, T.Q4_0), "z.weight": (w, T.MXFP4)})
    with open(p, "rb") as f:
        return f.read()


_RAW = _raw_base()
RAW_BYTES = _RAW.build()
RAW_FIELDS = [(k, v) for k, v in _RAW.fields.items() if k != "data"]


def _check_outcome(data: bytes, path: str) -> None:
    """Open the mutated file; only GGUFError may escape, and success must be consistent."""
    with open(path, "wb") as f:
        f.write(data)
    try:
        g = GGUFFile(path)
    except GGUFError as e:
        assert path in str(e)
        return
    with g:
        end = 0
        for t in sorted(g.tensors.values(), key=lambda t: t.offset):
            assert t.type in SUPPORTED_TYPES
            assert t.offset >= max(end, g.data_offset)
            assert t.offset % g.alignment == 0
            assert t.offset + t.nbytes <= g.file_size == len(data)
            assert len(g.data(t.name)) == t.nbytes
            end = t.offset + t.nbytes


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzzbase"))
    return [RAW_BYTES, _written_base(tmp)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz") / "m.gguf")


FUZZ = settings(max_examples=300, deadline=2000,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_bases_are_valid(bases, scratch):
    for b in bases:
        with open(scratch, "wb") as f:
            f.write(b)
        with GGUFFile(scratch) as g:
            assert len(g.tensors) == 3


@FUZZ
@given(which=st.integers(0, 1), flips=st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8))
def test_flipped_bytes(bases, scratch, which, flips):
    data = bytearray(bases[which])
    header_end = min(len(data), 400)  # most flips in the header, where they matter
    for pos, val in flips:
        data[pos % header_end] = val
    _check_outcome(bytes(data), scratch)


@FUZZ
@given(which=st.integers(0, 1), cut=st.integers(0, 10**6))
def test_truncated(bases, scratch, which, cut):
    data = bases[which]
    _check_outcome(data[: cut % (len(data) + 1)], scratch)


@FUZZ
@given(field=st.sampled_from(RAW_FIELDS), value=st.one_of(
    st.sampled_from(INTERESTING), st.integers(0, 2**64 - 1)))
def test_inflated_field(scratch, field, value):
    _name, (off, size) = field
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[size]
    value &= (1 << (8 * size)) - 1
    data = RAW_BYTES[:off] + struct.pack(fmt, value) + RAW_BYTES[off + size:]
    _check_outcome(data, scratch)


@FUZZ
@given(fields=st.lists(st.tuples(st.sampled_from(RAW_FIELDS), st.sampled_from(INTERESTING)),
                       min_size=2, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(RAW_BYTES))))
def test_combined(scratch, fields, cut):
    data = bytearray(RAW_BYTES)
    for (_name, (off, size)), value in fields:
        fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[size]
        data[off:off + size] = struct.pack(fmt, value & ((1 << (8 * size)) - 1))
    _check_outcome(bytes(data[:cut] if cut is not None else data), scratch)


def test_every_field_every_interesting_value(scratch):
    """Exhaustive over the small grid: each numeric header field set to each interesting value."""
    for _name, (off, size) in RAW_FIELDS:
        fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[size]
        for v in INTERESTING:
            data = RAW_BYTES[:off] + struct.pack(fmt, v & ((1 << (8 * size)) - 1)) + RAW_BYTES[off + size:]
            _check_outcome(data, scratch)


def test_no_segfault_in_subprocess(tmp_path):
    """A seeded batch of random mutations in a child process: it must exit normally."""
    script = textwrap.dedent(f"""
        import random, sys
        sys.path[:0] = [{os.path.dirname(os.path.abspath(__file__))!r}, {HERE!r}]
        from test_gguf_fuzz import RAW_BYTES, RAW_FIELDS, INTERESTING
        from colibri.gguf import GGUFError, GGUFFile
        import struct
        rng = random.Random(42)
        path = {str(tmp_path / "m.gguf")!r}
        ok = err = 0
        for i in range(2000):
            data = bytearray(RAW_BYTES)
            kind = i % 3
            if kind == 0:
                for _ in range(rng.randint(1, 6)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            elif kind == 1:
                data = data[: rng.randrange(len(data) + 1)]
            else:
                _n, (off, size) = rng.choice(RAW_FIELDS)
                fmt = {{1: "<B", 2: "<H", 4: "<I", 8: "<Q"}}[size]
                v = rng.choice(INTERESTING) & ((1 << (8 * size)) - 1)
                data[off:off + size] = struct.pack(fmt, v)
            open(path, "wb").write(bytes(data))
            try:
                with GGUFFile(path) as g:
                    for t in g.tensors.values():
                        g.data(t.name).sum()
                ok += 1
            except GGUFError:
                err += 1
        print(ok, err)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    ok, err = map(int, r.stdout.split())
    assert ok + err == 2000 and err > 600


def test_random_mutation_reference_reader_agrees_when_valid(tmp_path):
    """Where a mutation keeps the file valid for us, gguf.GGUFReader must read the same
    directory (we are not more lenient than the reference)."""
    import gguf

    rng = random.Random(7)
    path = str(tmp_path / "m.gguf")
    checked = 0
    for _ in range(400):
        data = bytearray(RAW_BYTES)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(min(len(data), 400))] = rng.randrange(256)
        with open(path, "wb") as f:
            f.write(bytes(data))
        try:
            g = GGUFFile(path)
        except GGUFError:
            continue
        with g:
            ref = gguf.GGUFReader(path)
            assert {t.name: (int(t.tensor_type), t.data_offset, t.n_bytes) for t in ref.tensors} == {
                t.name: (t.type, t.offset, t.nbytes) for t in g.tensors.values()}
            checked += 1
    assert checked > 20
