"""The colibri container (colibri/container/, tools/convert_gguf.py).

References are outside the container code: the GGUF file itself (its bytes, metadata and the
logits colibri computes from it, which tests/model/test_forward_oracle.py ties to transformers), the
gguf package's quantizers/dequantizers, and a numpy decoder of the I4_G128 layout written from
its description (include/colibri/quant.h)."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from oracle_models import _convert_module, add_bigram_path, build, family_configs, prompt

from colibri import cli
from colibri.container import (
    EXPERT_ALIGN,
    ContainerError,
    ContainerFile,
    convert,
    is_container,
)
from colibri.gguf import GGUFFile
from colibri.model import Model
from colibri.tokenizer import Tokenizer

MB2 = 2 << 20

pytestmark = pytest.mark.slow  # ~40 s on 2 cores, mostly building the oracle models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Oracle GGUFs: two MoE families (F32, and Q8_0 for mixtral) and a dense one."""
    out = tmp_path_factory.mktemp("container")
    paths = {}
    _, p = build("mixtral", out, ("f32", "q8_0"))
    paths["mixtral-f32"], paths["mixtral-q8_0"] = p["f32"], p["q8_0"]
    _, p = build("qwen3_moe", out, ("f32",))
    paths["qwen3_moe-f32"] = p["f32"]
    _, p = build("llama", out, ("f32",))
    paths["llama-f32"] = p["f32"]
    _, p = build("gemma4", out, ("f32",))  # fused ffn_gate_up_exps
    paths["gemma4-f32"] = p["f32"]
    return out, paths


@pytest.fixture(scope="module")
def kept(models):
    out, paths = models
    return {k: convert(v, out / f"{k}.colibri", "keep", progress=False)["path"]
            for k, v in paths.items()}


def _logits(path, **kw):
    m = Model(path, threads=2, ctx=128, max_batch=4, tokenizer=False, **kw)
    a, b = m.new_sequence(), m.new_sequence()
    outs = [m.eval([a], tokens=prompt(9, seed=3)), m.eval([b], tokens=prompt(4, seed=4))]
    for t in prompt(4, seed=5):
        outs.append(m.eval([a, b], tokens=[t, (t * 7) % m.n_vocab]))
    return np.concatenate(outs)


@pytest.mark.parametrize("name", ["mixtral-f32", "mixtral-q8_0", "qwen3_moe-f32", "gemma4-f32",
                                  "llama-f32"])
def test_keep_gives_identical_logits(models, kept, name):
    _, paths = models
    ref = _logits(str(paths[name]))
    modes = [{}] if name.startswith("llama") else [
        {}, dict(expert_mode="cache", expert_budget=1), dict(expert_mode="cache", expert_budget=0.5,
                                                            expert_policy="lfru"),
        dict(expert_mode="mmap", expert_budget=1)]
    for kw in modes:
        got = _logits(kept[name], **kw)
        assert np.array_equal(got, ref), (name, kw)
    if name == "mixtral-q8_0":  # expanded to F32 at load: the strided expert views dequantize
        ref = _logits(str(paths[name]), dequantize=True)
        assert np.array_equal(_logits(kept[name], dequantize=True), ref)


def test_layout_and_contents_match_the_gguf(models, kept):
    _, paths = models
    for name in ("mixtral-f32", "mixtral-q8_0", "qwen3_moe-f32", "gemma4-f32"):
        cpath = kept[name]
        assert is_container(cpath) and not is_container(paths[name])
        with GGUFFile(paths[name]) as g, ContainerFile(cpath) as c:
            assert c.architecture == g.architecture
            assert list(c.metadata) == list(g.metadata)
            assert c.metadata_types == g.metadata_types
            for k, v in g.metadata.items():
                if isinstance(v, np.ndarray):
                    assert v.dtype == c.metadata[k].dtype and np.array_equal(v, c.metadata[k]), k
                else:
                    assert c.metadata[k] == v, k
            assert set(c.tensors) == set(g.tensors)
            n_layer = g.metadata[f"{g.architecture}.block_count"]
            n_expert = g.metadata[f"{g.architecture}.expert_count"]
            assert [grp.layer for grp in c.groups] == list(range(n_layer))
            for t in g.tensors.values():
                ct = c.tensors[t.name]
                assert (ct.type, ct.shape, ct.nbytes) == (t.type, t.shape, t.nbytes)
                want = g.data(t.name)
                got = c.data(t.name)
                if len(t.shape) == 3 and "_exps" in t.name:
                    assert got.shape == (n_expert, t.nbytes // n_expert)
                    want = want.reshape(n_expert, -1)
                assert np.array_equal(got, want), t.name
            prev_end = c.dense_end
            for grp in c.groups:
                assert grp.base % EXPERT_ALIGN == 0 and grp.stride % EXPERT_ALIGN == 0
                assert grp.base >= prev_end
                names = [p.name for p in grp.parts]
                kinds = ("gate_up", "down") if name.startswith("gemma4") else ("gate", "up", "down")
                assert names == [f"blk.{grp.layer}.ffn_{k}_exps.weight" for k in kinds]
                rel = 0
                for p in grp.parts:  # gate, up, down adjacent
                    assert p.rel == rel
                    assert c.tensors[p.name].offset == grp.base + rel
                    rel += p.nbytes
                assert rel == grp.used <= grp.stride
                for e in range(grp.n_expert):
                    a, b = grp.expert_range(e)
                    assert a % MB2 == 0 and b - a == grp.used
                prev_end = grp.base + grp.n_expert * grp.stride
        st = os.stat(cpath)
        assert st.st_blocks * 512 < st.st_size // 4  # padding is holes
        assert st.st_mode & 0o044  # readable like any file (not mkstemp's 0600)


def test_tokenizer_from_container(models, kept):
    _, paths = models
    a, b = Tokenizer.from_gguf(paths["mixtral-f32"]), Tokenizer.from_gguf(kept["mixtral-f32"])
    assert a.vocab_size == b.vocab_size and a.bos_id == b.bos_id and a.eos_id == b.eos_id
    for i in range(a.vocab_size):
        assert a.token_to_piece(i, special=True) == b.token_to_piece(i, special=True)
    text = "".join(a.token_to_piece(i).decode("utf-8", "replace") for i in range(3, 60))
    assert list(a.encode(text)) == list(b.encode(text))


def test_store_descriptor_is_uniform(kept):
    m = Model(kept["qwen3_moe-f32"], threads=1, ctx=16, tokenizer=False)
    cf = m.gguf
    assert isinstance(cf, ContainerFile)
    for L, grp in zip(m.desc.layers, cf.groups, strict=True):
        X = L.experts
        assert X.gate_stride == X.up_stride == X.down_stride == grp.stride
        assert X.gate_info.offset == grp.base
        assert X.up_info.offset == grp.base + X.gate.rows * X.gate.row_bytes
        assert X.down_info.offset == X.up_info.offset + X.up.rows * X.up.row_bytes
    # the experts' size counts bytes, not the padding between experts
    assert m.desc.expert_bytes() == sum(grp.used * grp.n_expert for grp in cf.groups)


# ---- failures: checksums, atomicity, refusals ----

def _flip(path, offset, bit=0):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << bit)]))


def test_checksum_corruption_is_detected(models, tmp_path):
    _, paths = models
    p = tmp_path / "c.colibri"
    convert(paths["mixtral-q8_0"], p, progress=False)
    cf = ContainerFile(p)
    grp = cf.groups[1]
    a, _ = grp.expert_range(3)
    dense_mid = (cf.dense_start + cf.dense_end) // 2
    cf.close()
    ref = _logits(str(paths["mixtral-q8_0"]))

    _flip(p, a + 5)
    with pytest.raises(ContainerError, match=r"c\.colibri.*expert 3 of layer 1"):
        ContainerFile(p)
    with pytest.raises(ContainerError, match="expert 3 of layer 1"):
        Model(str(p), tokenizer=False)
    ContainerFile(p, verify=False).close()
    assert not np.array_equal(_logits(str(p), verify=False), ref)  # the flip is real
    _flip(p, a + 5)
    assert np.array_equal(_logits(str(p)), ref)

    _flip(p, dense_mid, 3)
    with pytest.raises(ContainerError, match="dense region"):
        ContainerFile(p)
    ContainerFile(p, verify=False).close()
    _flip(p, dense_mid, 3)

    _flip(p, 64 + 20)  # inside the header: always checked
    with pytest.raises(ContainerError, match="header checksum"):
        ContainerFile(p, verify=False)


def test_truncated_and_bad_preamble(models, tmp_path):
    _, paths = models
    p = tmp_path / "t.colibri"
    convert(paths["mixtral-q8_0"], p, progress=False)
    raw = p.read_bytes()
    for cut in (0, 10, 63, 64, 1000, len(raw) - 1):
        q = tmp_path / "cut.colibri"
        q.write_bytes(raw[:cut])
        with pytest.raises(ContainerError, match=r"cut\.colibri"):
            ContainerFile(q)
    q = tmp_path / "magic.colibri"
    q.write_bytes(b"COLX" + raw[4:])
    with pytest.raises(ContainerError, match="magic"):
        ContainerFile(q)
    q.write_bytes(raw[:4] + struct.pack("<I", 99) + raw[8:])
    with pytest.raises(ContainerError, match="version 99"):
        ContainerFile(q)


def test_atomic_write(models, tmp_path):
    _, paths = models
    dst = tmp_path / "out.colibri"
    with pytest.raises(RuntimeError, match="simulated failure"):
        convert(paths["mixtral-q8_0"], dst, progress=False, _fail_after=4)
    assert os.listdir(tmp_path) == []

    def interrupt(msg):
        if msg.startswith("layer 1"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(paths["mixtral-q8_0"], dst, progress=interrupt)
    assert os.listdir(tmp_path) == []
    # an existing file under the final name survives a failed conversion untouched
    dst.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        convert(paths["mixtral-q8_0"], dst, progress=False, _fail_after=1, force=True)
    assert os.listdir(tmp_path) == ["out.colibri"] and dst.read_bytes() == b"old"
    lines: list[str] = []
    with pytest.raises(ContainerError, match="already exists.*--force"):
        convert(paths["mixtral-q8_0"], dst, progress=lines.append)
    assert dst.read_bytes() == b"old"
    convert(paths["mixtral-q8_0"], dst, progress=lines.append, force=True)
    assert any(s.startswith("layer 2") for s in lines) and "verified" in " ".join(lines)
    assert os.listdir(tmp_path) == ["out.colibri"] and is_container(dst)


def test_refusals(models, kept, tmp_path):
    _, paths = models
    with pytest.raises(ContainerError, match="is the input file"):
        convert(paths["mixtral-q8_0"], paths["mixtral-q8_0"], progress=False)
    with pytest.raises(ContainerError, match="already a colibri container"):
        convert(kept["mixtral-q8_0"], tmp_path / "x.colibri", progress=False)
    with pytest.raises(ContainerError, match="unknown quant"):
        convert(paths["mixtral-q8_0"], tmp_path / "x.colibri", "q3_k", progress=False)
    # mixtral's expert rows of 48 values cannot be Q4_0 blocks of 32
    with pytest.raises(ContainerError, match="ffn_down_exps.*48.*q4_0"):
        convert(paths["mixtral-f32"], tmp_path / "x.colibri", "q4_0", progress=False)
    with pytest.raises(FileNotFoundError):
        convert(tmp_path / "missing.gguf", tmp_path / "x.colibri", progress=False)
    with pytest.raises(ContainerError, match="directory"):
        convert(paths["mixtral-q8_0"], tmp_path, progress=False)
    with pytest.raises(FileNotFoundError, match="output directory"):
        convert(paths["mixtral-q8_0"], tmp_path / "no" / "x.colibri", progress=False)
    # a GGUF colibri cannot run: refused before anything is written
    from gguf_util import write_gguf

    bad = write_gguf(tmp_path / "bert.gguf", "bert", {"bert.block_count": 1},
                     {"token_embd.weight": np.zeros((4, 32), np.float32)})
    with pytest.raises(ValueError, match="architecture 'bert' is not supported"):
        convert(bad, tmp_path / "x.colibri", progress=False)
    assert sorted(os.listdir(tmp_path)) == ["bert.gguf"]


def test_cli_convert(models, tmp_path, capsys):
    _, paths = models
    out = tmp_path / "cli.colibri"
    assert cli.main(["convert", str(paths["qwen3_moe-f32"]), str(out), "--quant", "q8_0"]) == 0
    err = capsys.readouterr().err
    assert "layer 2" in err and "verified" in err
    assert is_container(out)
    assert cli.main(["convert", str(out), str(tmp_path / "again.colibri"), "-q"]) == 1
    assert "already a colibri container" in capsys.readouterr().err
    import subprocess
    import sys

    tool = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "convert_gguf.py")
    r = subprocess.run([sys.executable, tool, str(paths["llama-f32"]), str(tmp_path / "d.colibri"),
                        "-q"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    with ContainerFile(tmp_path / "d.colibri") as c:
        assert c.groups == [] and c.architecture == "llama"


# ---- requantized experts ----

@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A qwen3moe oracle model with rows of 128 (int4-g128 needs groups of 128), F32 GGUF."""
    import torch

    out = tmp_path_factory.mktemp("wide")
    configs, common = family_configs()
    cfg_cls, model_cls, extra = configs["qwen3_moe"]
    cfg = cfg_cls(**{**common, **extra, "hidden_size": 128, "moe_intermediate_size": 128,
                     "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
                     "num_hidden_layers": 2})
    cfg._attn_implementation = "eager"
    torch.manual_seed(77)
    model = model_cls(cfg).eval()
    add_bigram_path(model, seed=7)
    model.save_pretrained(out / "hf")
    return _convert_module().convert(out / "hf", out / "wide-f32.gguf", "f32")


def _i4g128_dequant(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Decode I4_G128 from its description: block = {f16 d; u8 qs[64]}, byte i holds value 2i
    (low nibble) and 2i+1 (high nibble), v = d * (q - 8)."""
    b = raw.reshape(rows, cols // 128, 66)
    d = b[:, :, :2].copy().view(np.float16).astype(np.float64)
    q = b[:, :, 2:]
    vals = np.empty((rows, cols // 128, 128))
    vals[:, :, 0::2] = (q & 15).astype(np.float64) - 8
    vals[:, :, 1::2] = (q >> 4).astype(np.float64) - 8
    return (vals * d).reshape(rows, cols)


def _kl(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    def logsm(x):
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = logsm(ref), logsm(got)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


@pytest.mark.parametrize("quant,max_kl,min_top1", [("q8_0", 2e-3, 0.95), ("q4_0", 5e-2, 0.8),
                                                   ("int4-g128", 5e-2, 0.8)])
def test_requantized_experts(wide, tmp_path, quant, max_kl, min_top1):
    dst = tmp_path / f"w-{quant}.colibri"
    convert(wide, dst, quant, progress=False)
    with GGUFFile(wide) as g, ContainerFile(dst) as c:
        for name, t in g.tensors.items():
            ct = c.tensors[name]
            if "_exps" not in name:
                assert ct.type == t.type and np.array_equal(c.data(name), g.data(name))
                continue
            cols, rows, n_exp = t.shape
            w = g.data(name).view(np.float32).reshape(n_exp, rows, cols)
            got = c.data(name)
            for e in range(n_exp):
                if quant == "int4-g128":
                    assert ct.type_name == "I4_G128"
                    deq = _i4g128_dequant(got[e], rows, cols)
                    # round to nearest with d = max|x| / 7 (or finer): error <= d/2 per value
                    d = np.abs(w[e]).reshape(rows, cols // 128, 128).max(axis=2) / 7
                    err = np.abs(deq - w[e]).reshape(rows, cols // 128, 128).max(axis=2)
                    assert np.all(err <= d * 0.5 * 1.01 + 1e-6), name
                else:
                    qt = GGMLQuantizationType.Q8_0 if quant == "q8_0" else GGMLQuantizationType.Q4_0
                    assert ct.type == qt
                    # exactly gguf's reference quantizer on the original floats
                    assert np.array_equal(got[e], quants.quantize(w[e], qt).reshape(-1)), name
    ids = prompt(200, seed=11)
    ref = Model(str(wide), threads=2, ctx=256, tokenizer=False).logits(ids)
    outs = []
    for kw in ({}, dict(expert_mode="cache", expert_budget=1)):
        out = Model(str(dst), threads=2, ctx=256, tokenizer=False, **kw).logits(ids)
        kl = _kl(ref, out)
        top1 = float(np.mean(ref.argmax(-1) == out.argmax(-1)))
        assert kl.mean() < max_kl and top1 >= min_top1, (quant, kl.mean(), top1)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])  # the store mode never changes logits


def test_checksum_helper_is_crc32(models, kept):
    """The recorded per-expert checksums are zlib's crc32 of the expert's bytes in the GGUF."""
    _, paths = models
    with GGUFFile(paths["mixtral-f32"]) as g, ContainerFile(kept["mixtral-f32"]) as c:
        for grp in c.groups:
            for e in range(grp.n_expert):
                want = 0
                for p in grp.parts:
                    want = zlib.crc32(g.data(p.name).reshape(grp.n_expert, -1)[e].tobytes(), want)
                assert grp.crcs[e] == want


def test_cache_mode_reads_whole_experts(kept):
    """Each expert the cache store reads is exactly its used bytes (no padding), in one read
    when the store supports single reads of adjacent ranges."""
    m = Model(kept["mixtral-q8_0"], threads=2, ctx=64, tokenizer=False, expert_mode="cache",
              expert_budget=1)
    m.logits(prompt(10, seed=2))
    st, info = m.expert_stats(), m.expert_info()
    used = m.gguf.groups[0].used
    assert st["misses"] > 0 and st["bytes_read"] % used == 0
    assert st["bytes_read"] >= st["misses"] * used
    if "one_read_layers" in info:
        assert info["one_read_layers"] == len(m.gguf.groups)
        assert st["reads"] * used == st["bytes_read"]
