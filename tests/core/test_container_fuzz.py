"""Fuzzing colibri.container.ContainerFile: a small valid container (two MoE layers, dense
tensors of several types) mutated by flipped bytes, truncations, and counts / offsets / sizes /
strides overwritten with extreme values, with the header checksum left stale or recomputed (so
that the structural checks behind it are exercised too). Every outcome is a ContainerError
naming the file, or, when the mutation keeps the file valid, a directory whose every tensor
byte can be read inside the file. Never another exception, never a crash."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf_util import write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colibri.container import ContainerError, ContainerFile, convert

INTERESTING = [0, 1, 2, 3, 7, 8, 63, 64, 4095, 4096, 2**20, 2**21 - 1, 2**21, 2**21 + 64,
               2**22, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63, 2**64 - 1]


def _base(tmp: str) -> str:
    rng = np.random.default_rng(0)
    tensors = {
        "token_embd.weight": rng.standard_normal((8, 32)).astype(np.float32),
        "output_norm.weight": (rng.standard_normal(32).astype(np.float32), T.F32),
        "output.weight": (quants.quantize(rng.standard_normal((8, 32)).astype(np.float32), T.Q8_0),
                          T.Q8_0),
    }
    for b in range(2):
        for k, shape in (("gate", (3, 16, 32)), ("up", (3, 16, 32)), ("down", (3, 32, 16 * 2))):
            w = rng.standard_normal(shape).astype(np.float32)
            tensors[f"blk.{b}.ffn_{k}_exps.weight"] = (quants.quantize(w, T.Q8_0), T.Q8_0) \
                if k == "down" else w
    src = write_gguf(os.path.join(tmp, "fz.gguf"), "qwen3moe",
                     {"qwen3moe.expert_count": 3, "tokenizer.ggml.tokens": ["a", "b", "ü"],
                      "tokenizer.ggml.scores": np.array([0.0, 1.0, 2.0], np.float32),
                      "qwen3moe.block_count": 2, "f": 0.5}, tensors)
    dst = os.path.join(tmp, "fz.colibri")
    convert(src, dst, progress=False, check_model=False)  # not a runnable model
    return dst


def _segments(path: str) -> tuple[list[tuple[int, bytes]], int, dict[str, list[tuple[int, int]]]]:
    """The file as (offset, bytes) pieces (its holes left out), its size, and the positions of
    the header's numeric fields (name -> [(offset, width)]), located from the documented
    format (docs/ARCHITECTURE.md) rather than from the reader."""
    size = os.path.getsize(path)
    with ContainerFile(path) as c:
        dense_end = c.dense_end
        ranges = [g.expert_range(e) for g in c.groups for e in range(g.n_expert)]
        kv_end = 64 + len(c.gguf_metadata_image()) - 16
        hbytes = c.header_bytes
    with open(path, "rb") as f:
        data = f.read(dense_end)
        segs = [(0, data)]
        for a, b in ranges:
            f.seek(a)
            segs.append((a, f.read(b - a)))
    fields: dict[str, list[tuple[int, int]]] = {
        "version": [(4, 4)], "header_bytes": [(8, 8)], "file_size": [(16, 8)], "n_kv": [(64, 8)]}
    pos = kv_end
    fields["n_tensors"] = [(pos, 8)]
    (n_t,) = struct.unpack_from("<Q", data, pos)
    pos += 8
    for _ in range(n_t):
        (n,) = struct.unpack_from("<Q", data, pos)
        fields.setdefault("name_len", []).append((pos, 8))
        pos += 8 + n
        (nd,) = struct.unpack_from("<I", data, pos)
        fields.setdefault("n_dims", []).append((pos, 4))
        pos += 4
        for _ in range(nd):
            fields.setdefault("dim", []).append((pos, 8))
            pos += 8
        for name, w in (("type", 4), ("offset", 8), ("nbytes", 8), ("group", 4)):
            fields.setdefault(name, []).append((pos, w))
            pos += w
    fields["n_groups"] = [(pos, 8)]
    (n_g,) = struct.unpack_from("<Q", data, pos)
    pos += 8
    for _ in range(n_g):
        for name, w in (("layer", 4), ("n_expert", 4), ("base", 8), ("stride", 8), ("used", 8),
                        ("n_parts", 4)):
            fields.setdefault(name, []).append((pos, w))
            pos += w
        n_exp, n_parts = struct.unpack_from("<I", data, pos - 32)[0], struct.unpack_from("<I", data, pos - 4)[0]
        for _ in range(n_parts):
            for name, w in (("part_tensor", 4), ("part_rel", 8), ("part_bytes", 8)):
                fields.setdefault(name, []).append((pos, w))
                pos += w
        for _ in range(n_exp):
            fields.setdefault("crc", []).append((pos, 4))
            pos += 4
    for name, w in (("dense_start", 8), ("dense_end", 8), ("dense_crc", 4)):
        fields[name] = [(pos, w)]
        pos += w
    assert pos == 64 + hbytes  # the documented layout accounts for every header byte
    return segs, size, fields


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("cfuzz"))
    return _segments(_base(tmp))


def _write(path: str, segs: list[tuple[int, bytearray]], size: int) -> None:
    with open(path, "wb") as f:
        for off, b in segs:
            if off < size:
                f.seek(off)
                f.write(b[:size - off])
        f.truncate(size)


def _fix_crc(head: bytearray) -> None:
    (hbytes,) = struct.unpack_from("<Q", head, 8)
    end = min(64 + hbytes, len(head))
    struct.pack_into("<I", head, 24, zlib.crc32(bytes(head[64:end]), zlib.crc32(bytes(head[:24]))))


def _check(path: str, verify: bool) -> None:
    try:
        c = ContainerFile(path, verify=verify)
    except ContainerError as e:
        assert path in str(e)
        return
    with c:
        size = os.path.getsize(path)
        assert c.file_size == size
        for t in c.tensors.values():
            v = c.data(t.name)
            assert v.nbytes == t.nbytes
            int(v.sum(dtype=np.uint64))  # every byte readable (a bad range would SIGBUS)
        for g in c.groups:
            assert g.base % (2 << 20) == 0 and g.stride % (2 << 20) == 0
            assert g.expert_range(g.n_expert - 1)[1] <= size


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_containers_fail_cleanly(base, tmp_path, data):
    segs0, size, fields = base
    segs = [(off, bytearray(b)) for off, b in segs0]
    kind = data.draw(st.sampled_from(["field", "field", "flip", "truncate", "extend"]))
    if kind == "field":
        name = data.draw(st.sampled_from(sorted(fields)))
        pos, w = data.draw(st.sampled_from(fields[name]))
        v = data.draw(st.sampled_from(INTERESTING) | st.integers(0, 2**64 - 1))
        old = int.from_bytes(segs[0][1][pos:pos + w], "little")
        v = data.draw(st.sampled_from([v, old + 1, old - 1 if old else 1, old * 2, old + (2 << 20)]))
        segs[0][1][pos:pos + w] = (v % (1 << (8 * w))).to_bytes(w, "little")
    elif kind == "flip":
        i = data.draw(st.integers(0, len(segs) - 1))
        off, b = segs[i]
        j = data.draw(st.integers(0, len(b) - 1))
        b[j] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        size = data.draw(st.integers(0, size - 1))
    else:
        size += data.draw(st.integers(1, 3 << 20))
    if data.draw(st.booleans()):
        _fix_crc(segs[0][1])
    path = str(tmp_path / "m.colibri")
    _write(path, segs, size)
    _check(path, data.draw(st.booleans()))


def test_unmutated_base_opens(base, tmp_path):
    segs, size, _ = base
    path = str(tmp_path / "ok.colibri")
    _write(path, [(o, bytearray(b)) for o, b in segs], size)
    with ContainerFile(path) as c:
        assert len(c.groups) == 2 and c.groups[0].n_expert == 3


@pytest.mark.parametrize("name,value,match", [
    ("n_kv", 2**40, "metadata key/value count"),
    ("n_tensors", 2**40, "tensor count"),
    ("n_groups", 2**40, "expert group count"),
    ("stride", (2 << 20) + 64, "misaligned experts"),
    ("base", (2 << 20) * 3 + 4096, "misaligned experts"),
    ("n_expert", 2**31, "experts"),
    ("offset", 2**40, "outside the dense region|disagree"),
    ("dim", 2**62, "more elements than the file|should take|last dimension"),
    ("type", 99, "unknown|not support"),
    ("part_rel", 64, "adjacent"),
    ("dense_end", 2**40, "dense region"),
])
def test_inflated_fields_name_the_problem(base, tmp_path, name, value, match):
    segs0, size, fields = base
    segs = [(o, bytearray(b)) for o, b in segs0]
    pos, w = fields[name][-1]
    segs[0][1][pos:pos + w] = (value % (1 << (8 * w))).to_bytes(w, "little")
    _fix_crc(segs[0][1])
    path = str(tmp_path / "f.colibri")
    _write(path, segs, size)
    with pytest.raises(ContainerError, match=match):
        ContainerFile(path)
