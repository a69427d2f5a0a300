"""colibri.gguf against gguf.GGUFReader (the reference reader) on valid files, and the clear
errors on hostile ones (hand-built with gguf_util.RawGGUF)."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf_util import RawGGUF, gemma3_gguf_path, write_gguf

from colibri.gguf import SUPPORTED_TYPES, GGUFError, GGUFFile

RNG = np.random.default_rng(1234)


def _random_bytes_layout(qtype: T, rows: int, row_len: int) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return RNG.integers(0, 256, (rows, row_len // block * size), dtype=np.uint8)


def _sample_file(tmp_path, name="m.gguf", alignment=None):
    w = RNG.standard_normal((3, 64)).astype(np.float32)
    tensors = {
        "tok_embd.weight": w,
        "f16.weight": w.astype(np.float16),
        "bf16.weight": (w, T.BF16),
        "q8.weight": (w, T.Q8_0),
        "q4.weight": (w, T.Q4_0),
        "q41.weight": (w, T.Q4_1),
        "q5.weight": (w, T.Q5_0),
        "q51.weight": (w, T.Q5_1),
        "mxfp4.weight": (w, T.MXFP4),
        "q4k.weight": (_random_bytes_layout(T.Q4_K, 2, 512), T.Q4_K),
        "q5k.weight": (_random_bytes_layout(T.Q5_K, 1, 256), T.Q5_K),
        "q6k.weight": (_random_bytes_layout(T.Q6_K, 3, 256), T.Q6_K),
        "norm.weight": np.arange(7, dtype=np.float32),
        "blk.0.ffn_gate_exps.weight": RNG.standard_normal((2, 3, 32)).astype(np.float32),
    }
    meta = {
        "llama.block_count": 2,
        "llama.rope.freq_base": 10000.0,
        "general.name": "tiny ✓",
        "llama.flag": True,
        "llama.neg": -5,
        "llama.big": 2**40,
        "llama.u8": (7, V.UINT8),
        "llama.f64": (0.125, V.FLOAT64),
        "tokenizer.ggml.tokens": ["<s>", "a", "ü", ""],
        "tokenizer.ggml.scores": np.array([0.0, -1.5, 2.25, 3.0], dtype=np.float32),
        "tokenizer.ggml.token_type": [1, 2, 3, 1],
        "llama.bools": [True, False, True],
    }
    return write_gguf(tmp_path / name, "llama", meta, tensors, alignment=alignment), tensors


@pytest.mark.parametrize("alignment", [None, 64, 4096])
def test_agrees_with_gguf_reader(tmp_path, alignment):
    path, tensors = _sample_file(tmp_path, alignment=alignment)
    ref = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert f.version == 3
        assert f.architecture == "llama"
        assert f.alignment == ref.alignment == (alignment or 32)
        assert f.data_offset == ref.data_offset
        assert len(f.tensors) == len(ref.tensors) == len(tensors)
        for rt in ref.tensors:
            t = f.tensors[rt.name]
            assert t.type == int(rt.tensor_type)
            assert t.type_name == rt.tensor_type.name
            assert t.shape == tuple(int(d) for d in rt.shape)
            assert t.n_elements == rt.n_elements
            assert t.nbytes == rt.n_bytes
            assert t.offset == rt.data_offset
            assert t.offset % f.alignment == 0
            d = f.data(rt.name)
            assert d.dtype == np.uint8 and not d.flags.writeable
            assert d.tobytes() == np.asarray(rt.data).tobytes()
        # metadata: every key of the reader (less its GGUF.* pseudo-keys) with the same value
        keys = [k for k in ref.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == keys
        for k in keys:
            want = ref.fields[k].contents()
            got = f.metadata[k]
            if isinstance(got, np.ndarray):
                assert not got.flags.writeable
                np.testing.assert_array_equal(got, np.array(want, dtype=got.dtype))
            else:
                assert got == want, k
                assert type(got) is type(want), k
    assert f.closed


def test_values_and_shapes(tmp_path):
    path, tensors = _sample_file(tmp_path)
    with GGUFFile(path) as f:
        m = f.metadata
        assert m["general.name"] == "tiny ✓"
        assert m["llama.block_count"] == 2 and f.metadata_types["llama.block_count"] == "uint32"
        assert m["llama.flag"] is True
        assert m["llama.neg"] == -5 and m["llama.big"] == 2**40
        assert m["llama.f64"] == 0.125 and f.metadata_types["llama.f64"] == "float64"
        assert m["tokenizer.ggml.tokens"] == ["<s>", "a", "ü", ""]
        assert f.metadata_types["tokenizer.ggml.scores"] == "array[float32]"
        np.testing.assert_array_equal(m["tokenizer.ggml.scores"], [0.0, -1.5, 2.25, 3.0])
        assert m["llama.bools"].dtype == np.bool_
        # GGUF order: ne0 (row length) first
        assert f.tensors["blk.0.ffn_gate_exps.weight"].shape == (32, 3, 2)
        assert f.tensors["q4k.weight"].shape == (512, 2)
        q8 = f.tensors["q8.weight"]
        assert (q8.n_rows, q8.row_nbytes, q8.block_size) == (3, 68, 32)
        np.testing.assert_array_equal(
            f.data("tok_embd.weight").view(np.float32).reshape(3, 64), tensors["tok_embd.weight"])
        ref_q8 = gguf.quants.dequantize(f.data("q8.weight").reshape(3, 68), T.Q8_0)
        np.testing.assert_allclose(ref_q8, tensors["tok_embd.weight"], atol=0.05)
        with pytest.raises(KeyError):
            f.data("nope")
        view = f.data("norm.weight")
    # views outlive close()
    np.testing.assert_array_equal(view.view(np.float32), np.arange(7))
    with pytest.raises(GGUFError, match="closed"):
        f.data("norm.weight")


def test_missing_file_is_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "nope.gguf")


# ---- hostile files ----


def _base() -> RawGGUF:
    r = RawGGUF()
    r.kv("general.architecture", V.STRING, "llama")
    r.kv("tokenizer.ggml.tokens", V.ARRAY, ["a", "bb"], V.STRING)
    r.kv("llama.scores", V.ARRAY, [1.0, 2.0], V.FLOAT32)
    r.tensor("a.weight", [32, 2], T.F32, 0)
    r.tensor("b.weight", [32], T.Q8_0, 256)
    r.tensor_data = bytes(256 + 34)
    return r


def _open(tmp_path, data: bytes, **kw) -> GGUFFile:
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    return GGUFFile(p, **kw)


def _patch(data: bytes, field: tuple[int, int], value: int) -> bytes:
    off, size = field
    fmt = {4: "<I", 8: "<Q"}[size]
    return data[:off] + struct.pack(fmt, value) + data[off + size :]


def test_base_is_valid(tmp_path):
    with _open(tmp_path, _base().build()) as f:
        assert f.tensors["b.weight"].offset == f.data_offset + 256
        assert f.metadata["tokenizer.ggml.tokens"] == ["a", "bb"]


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("version", 1, "version 1"),
        ("version", 4, "version 4"),
        ("version", 3 << 24, "big-endian"),
        ("n_kv", 2**63, "key/value count"),
        ("n_tensors", 2**40, "tensor count"),
        ("kv[0].key.len", 2**62, "key of metadata entry 0"),
        ("kv[0].value.len", 10**6, "value of 'general.architecture'"),
        ("kv[1].value.alen", 2**62, "tokenizer.ggml.tokens"),
        ("kv[2].value.alen", 2**62, "llama.scores"),
        ("kv[2].value.itype", 99, "unknown element type 99"),
        ("kv[0].type", 13, "unknown type 13"),
        ("tensor[0].n_dims", 5, "5 dimensions"),
        ("tensor[0].n_dims", 0, "0 dimensions"),
        ("tensor[0].dim1", 0, "every dimension must be >= 1"),
        ("tensor[0].dim1", 2**60, "a.weight"),
        ("tensor[1].dim0", 48, "not a multiple of its block size 32"),
        ("tensor[0].type", 9, "Q8_1, which colibri does not support"),
        ("tensor[0].type", 999, "unknown type id 999"),
        ("tensor[1].offset", 250, "not a multiple of the alignment"),
        ("tensor[1].offset", 224, "overlaps tensor 'a.weight'"),
        ("tensor[1].offset", 2**64 - 32, "past the end of the file"),
        ("tensor[0].name.len", 2**63, "name of tensor 0"),
    ],
)
def test_corrupt_field(tmp_path, field, value, match):
    r = _base()
    data = _patch(r.build(), r.fields[field], value)
    with pytest.raises(GGUFError, match=match) as e:
        _open(tmp_path, data)
    assert "bad.gguf" in str(e.value)


def test_tensor_error_names_tensor(tmp_path):
    r = _base()
    data = _patch(r.build(), r.fields["tensor[1].type"], int(T.Q8_1))
    with pytest.raises(GGUFError, match=r"tensor 'b.weight' has type Q8_1"):
        _open(tmp_path, data)


def test_lenient_accepts_unsupported_types(tmp_path):
    r = _base()
    r.tensor_infos[1] = ("b.weight", [256], int(T.Q8_1), 256)  # known to GGML, no kernels
    r.tensor_data = bytes(256 + 320)
    data = r.build()
    with pytest.raises(GGUFError, match="Q8_1"):
        _open(tmp_path, data)
    with _open(tmp_path, data, lenient=True) as f:
        assert f.tensors["b.weight"].type_name == "Q8_1"
        assert f.tensors["b.weight"].nbytes == 320


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda r: setattr(r, "magic", b"GGML"), "bad magic"),
        (lambda r: r.tensor("a.weight", [32], T.F32, 512), "appears twice"),
        (lambda r: r.kv("llama.scores", V.UINT32, 1), "appears twice"),
        (lambda r: r.tensor(b"\xffab", [32], T.F32, 512), "UTF-8"),
        (lambda r: r.kv("general.alignment", V.UINT32, 48), "power of two"),
        (lambda r: r.kv("general.alignment", V.UINT32, 0), "power of two"),
        (lambda r: r.kv("general.alignment", V.UINT64, 32), "must be a uint32"),
        (lambda r: r.kv("bad", V.STRING, b"\xff\xfe"), "'bad' is not valid UTF-8"),
        (lambda r: r.kv("deep", V.ARRAY, [(V.ARRAY, [(V.UINT8, [1])])], V.ARRAY), "nested"),
        (lambda r: setattr(r, "tensor_data", r.tensor_data[:-1]), "past the end"),
    ],
)
def test_hostile_structure(tmp_path, mutate, match):
    r = _base()
    mutate(r)
    raw = r.build()
    with pytest.raises(GGUFError, match=match):
        _open(tmp_path, raw)


def test_nested_arrays_one_level_ok(tmp_path):
    r = _base()
    r.kv("nest", V.ARRAY, [(V.UINT8, [1, 2]), (V.STRING, ["x"])], V.ARRAY)
    with _open(tmp_path, r.build()) as f:
        a, b = f.metadata["nest"]
        assert a.tolist() == [1, 2] and b == ["x"]
        assert f.metadata_types["nest"].startswith("array[array")


@pytest.mark.parametrize("n", [0, 1, 3, 4, 8, 23, 24, 40, 100])
def test_truncated(tmp_path, n):
    data = _base().build()
    with pytest.raises(GGUFError):
        _open(tmp_path, data[:n])


def test_huge_array_is_rejected_fast(tmp_path):
    # gguf.GGUFReader loops over the claimed length (reading empty slices past the end); we
    # must reject it from the byte count alone.
    r = RawGGUF().kv("x", V.ARRAY, [], V.UINT8)
    data = _patch(r.build(), r.fields["kv[0].value.alen"], 2**63)
    with pytest.raises(GGUFError, match="array 'x'"):
        _open(tmp_path, data)


@pytest.fixture(scope="module")
def gemma3_path():
    return gemma3_gguf_path()


@pytest.mark.slow  # gguf.GGUFReader takes ~20 s on its 262k-token vocabulary
def test_real_gemma3(gemma3_path):
    ref = gguf.GGUFReader(gemma3_path)
    with GGUFFile(gemma3_path) as f:
        assert f.architecture == "gemma3"
        assert f.alignment == ref.alignment
        assert f.data_offset == ref.data_offset
        assert len(f.tensors) == len(ref.tensors) == ref.fields["GGUF.tensor_count"].contents()
        assert len(f.metadata) == ref.fields["GGUF.kv_count"].contents()
        for rt in ref.tensors:
            t = f.tensors[rt.name]
            assert t.type in SUPPORTED_TYPES
            assert (t.type, t.offset, t.nbytes, t.n_elements) == (
                int(rt.tensor_type), rt.data_offset, rt.n_bytes, rt.n_elements)
            assert t.shape == tuple(int(d) for d in rt.shape)
        assert {t.type_name for t in f.tensors.values()} <= {"F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"}
        assert f.metadata["gemma3.block_count"] == 18
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144
        assert f.metadata["tokenizer.ggml.tokens"][:3] == ref.fields["tokenizer.ggml.tokens"].contents(
            slice(0, 3))
        emb = f.tensors["token_embd.weight"]
        np.testing.assert_array_equal(
            f.data(emb.name)[:4096], np.asarray(ref.tensors[
                [t.name for t in ref.tensors].index(emb.name)].data).reshape(-1)[:4096])


def test_version_2_is_read(tmp_path):
    r = _base()
    r.version = 2
    data = r.build()
    p = tmp_path / "v2.gguf"
    p.write_bytes(data)
    ref = gguf.GGUFReader(p)
    with GGUFFile(p) as f:
        assert f.version == 2
        assert {t.name: t.data_offset for t in ref.tensors} == {
            n: t.offset for n, t in f.tensors.items()}
        a, b = f.data("a.weight"), f.data("a.weight")
        assert np.shares_memory(a, b)  # both views of the one mapping, no copies
