"""Dense weights copied to huge pages (colibri.dense, Model(dense_weights="copy"), the default):
the copies hold the file's bytes, the logits are bit-identical to reading through the mapping,
the file's pages of the copied tensors leave the process (resident bytes counted once), an
untied token embedding stays mapped, and the setting is validated like every other."""

from __future__ import annotations

import mmap
import os
import re

import numpy as np
import pytest

import colibri
from colibri import dense, quant
from colibri.config import ConfigError
from colibri.gguf import GGUFFile
from tests.gguf_util import gemma3_gguf_path


def _smaps(path: str) -> list[dict[str, list[str]]]:
    """Each of this process's mappings (VMAs) of `path`, in address order: its /proc/self/smaps
    fields (name -> the words after it)."""
    out: list[dict[str, list[str]]] = []
    inside = False
    real = os.path.realpath(path)
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip().endswith(real)
                if inside:
                    out.append({})
            elif inside and ":" in line:
                key, _, rest = line.partition(":")
                out[-1][key] = rest.split()
    return out


def _file_rss(path: str) -> int:
    """Resident bytes of this process's mappings of `path`."""
    return sum(int(v["Rss"][0]) * 1024 for v in _smaps(path))


def _vmas(path: str) -> list[list[str]]:
    """The VmFlags of each of this process's mappings of `path`, in address order."""
    return [v["VmFlags"] for v in _smaps(path)]


THP = os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.fixture(scope="module")
def gemma() -> str:
    return gemma3_gguf_path()


def test_copies_are_the_bytes_aligned_and_read_only(monkeypatch):
    monkeypatch.setattr(dense, "CHUNK", 1 << 20)  # several chunks, one tensor larger than one
    rng = np.random.default_rng(0)
    store = dense.DenseCopies()
    srcs = {f"t{i}": rng.integers(0, 256, size=n, dtype=np.uint8)
            for i, n in enumerate([1000, 300_000, 3 << 20, 77, 900_000])}
    for name, a in srcs.items():
        store.copy(name, a)
    assert store.names == set(srcs)
    assert store.bytes == sum(a.size for a in srcs.values())
    for name, a in srcs.items():
        c = store.get(name)
        assert np.array_equal(c, a)
        assert c.ctypes.data % dense.ALIGN == 0
        assert not c.flags.writeable
        assert not np.shares_memory(c, a)
    with pytest.raises(KeyError):
        store.get("missing")


def test_drop_pages_keeps_the_data_readable(tmp_path):
    p = tmp_path / "f.bin"
    data = np.arange(5 * mmap.PAGESIZE, dtype=np.uint32).view(np.uint8)[: 5 * mmap.PAGESIZE + 100]
    p.write_bytes(data.tobytes())
    with open(p, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mm, dtype=np.uint8)
    int(view.sum())  # fault every page in
    # whole pages only: an unaligned range drops the pages inside it
    assert dense.drop_pages(mm, 10, 3 * mmap.PAGESIZE) == 2 * mmap.PAGESIZE
    assert dense.drop_pages(mm, 0, 100) == 0
    assert np.array_equal(view, data)  # read back from the page cache
    del view
    mm.close()


def test_no_huge_pages_outside_the_experts(tmp_path):
    """Before the copies, the mapping is advised MADV_NOHUGEPAGE ("nh") in the gaps between the
    expert spans, one advice per gap (overlapping and touching spans are one), the spans keep
    MADV_HUGEPAGE ("hg"): five VMAs here, not one per dropped tensor."""
    mib = 1 << 20
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(8 * mib))
    with open(p, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    assert dense.no_huge_outside(None, []) == 0
    huge = mm.madvise(mmap.MADV_HUGEPAGE) is None if THP else False
    spans = [(4 * mib, 2 * mib), (mib + 100, 2 * mib), (3 * mib + mib // 2, mib // 2)]
    n = dense.no_huge_outside(mm, spans)
    vmas = _vmas(str(p))
    if huge:
        assert n == 3
        assert [("nh" in v, "hg" in v) for v in vmas] == [(True, False), (False, True)] * 2 + [
            (True, False)]
    else:
        assert n in (0, 3) and len(vmas) in (1, 5)
    mm.close()


def test_gemma_copy_equals_mapped_and_drops_the_file_pages(gemma):
    """The tied head and every layer matrix are copied; logits bit-identical to the mapped
    model's (prefill and decode); the file mapping's resident bytes fall by about the copied
    bytes and stay there after prefault()."""
    mapped = colibri.Model(gemma, threads=2, ctx=256, dense_weights="mapped", tokenizer=False)
    assert mapped.desc.dense_copied == set()
    ids = [2, 651, 6037, 529, 7001, 563, 1234, 88]
    s0 = mapped.new_sequence()
    ref = [mapped.eval([s0], ids), mapped.eval([s0], [77])]
    ref_embed = mapped.embed(ids)
    mapped.prefault()
    rss_mapped = _file_rss(gemma)
    mapped.close()
    del mapped

    m = colibri.Model(gemma, threads=2, ctx=256, tokenizer=False)  # the default
    assert m.dense_weights == "copy"
    copied = m.desc.dense_copied
    assert "token_embd.weight" in copied  # Gemma ties the head to the embedding
    assert "blk.0.attn_q.weight" in copied and "blk.17.ffn_down.weight" in copied
    assert not any(n.endswith("_norm.weight") for n in copied)  # vectors stay as they are
    # the Q8_0, Q5_0, Q6_K and Q4_K matrices (the tied head, attention, FFN) are packed in their
    # R16 layouts where the kernels run at the AVX512-VNNI level, else copied as they are
    q8, q5, q6, q4 = ({n for n in copied if m.gguf.tensors[n].type == quant.TYPES[t]}
                      for t in ("Q8_0", "Q5_0", "Q6_K", "Q4_K"))
    assert "token_embd.weight" in q8 and len(q8) > 1 and "blk.0.ffn_up.weight" in q5 and q6 and q4
    assert m.desc.dense_packed == ((q8 | q5 | q6 | q4) if dense.packs_r16() else set())
    for src, names in (("Q6_K", q6), ("Q4_K", q4)):
        il, fld = next((i, f) for i in range(len(m.desc.layers))
                       for f in ("ffn_down", "attn_v", "attn_q", "attn_k", "ffn_gate")
                       if f"blk.{i}.{f}.weight" in names)
        want = src + "_R16" if dense.packs_r16() else src
        assert getattr(m.desc.layers[il], fld).type == quant.TYPES[want]
    want = "Q8_0_R16" if dense.packs_r16() else "Q8_0"
    assert m.desc.output.type == m.desc.tok_embd.type == quant.TYPES[want]
    assert m.desc.layers[0].ffn_up.type == quant.TYPES["Q5_0_R16" if dense.packs_r16() else "Q5_0"]
    s1 = m.new_sequence()
    got = [m.eval([s1], ids), m.eval([s1], [77])]
    for a, b in zip(ref, got, strict=True):
        assert a.tobytes() == b.tobytes()
    # the embedding lookup reads the packed head's rows
    assert np.array_equal(m.embed(ids), ref_embed)
    m.prefault()  # must not fault the copied tensors' file pages back in
    copied_bytes = sum(m.gguf.tensors[n].nbytes for n in copied)
    rss_copy = _file_rss(gemma)
    assert copied_bytes > 200e6
    assert rss_copy < rss_mapped - 0.9 * copied_bytes, (rss_copy, rss_mapped, copied_bytes)
    # no routed experts: the whole mapping is advised no huge pages, and stays one VMA (the
    # drops do not split it per tensor)
    assert _vmas(gemma) == [_vmas(gemma)[0]] and ("nh" in _vmas(gemma)[0]) == THP
    m.close()


def test_untied_embedding_is_not_copied(tmp_path, monkeypatch):
    """A model with its own output.weight: the head is copied, the embedding (read a row per
    token) stays mapped; outputs equal the mapped model's. A model this small is not copied by
    default (its dense bytes are under COPY_MIN)."""
    from colibri.tools.make_bench_model import write

    path = write(tmp_path / "tiny.gguf", n_layers=1, shape="tiny")
    m = colibri.Model(path, threads=1, ctx=64, tokenizer=False)
    assert m.dense_weights == "copy" and m.desc.dense_copied == set()
    m.close()
    monkeypatch.setattr(dense, "COPY_MIN", 0)
    gf = GGUFFile(path)
    assert "output.weight" in gf.tensors
    gf.close()
    out = {}
    for mode in ("copy", "mapped"):
        m = colibri.Model(path, threads=1, ctx=64, dense_weights=mode, tokenizer=False)
        if mode == "copy":
            assert "output.weight" in m.desc.dense_copied
            assert "token_embd.weight" not in m.desc.dense_copied
            assert not any("_exps" in n for n in m.desc.dense_copied)  # experts: the store's
        s = m.new_sequence()
        out[mode] = m.eval([s], [1, 2, 3, 4, 5]).tobytes()
        m.close()
    assert out["copy"] == out["mapped"]


def test_setting_is_validated(gemma, monkeypatch):
    with pytest.raises(ValueError, match="copy"):
        colibri.Model(gemma, dense_weights="huge", tokenizer=False)
    monkeypatch.setenv("COLIBRI_DENSE_WEIGHTS", "nope")
    with pytest.raises(ConfigError, match="COLIBRI_DENSE_WEIGHTS"):
        colibri.Model(gemma, tokenizer=False)
    monkeypatch.setenv("COLIBRI_DENSE_WEIGHTS", "mapped")
    m = colibri.Model(gemma, ctx=64, tokenizer=False)
    assert m.dense_weights == "mapped" and m.desc.dense_copied == set()
    m.close()


def test_a_copy_that_cannot_fit_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(dense, "mem_available", lambda: 1 << 20)
    store = dense.DenseCopies()
    with pytest.raises(MemoryError, match="dense_weights='mapped'"):
        store.copy("big", np.zeros(8 << 20, np.uint8))


def _anon_rss() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return int(re.search(r"Anonymous:\s+(\d+)", f.read()).group(1)) * 1024


def test_close_returns_the_copies(gemma):
    """Model.close() frees the copies at once (their chunks unmapped), not at some later GC."""
    before = _anon_rss()
    m = colibri.Model(gemma, threads=1, ctx=64, tokenizer=False)
    copied = sum(m.gguf.tensors[n].nbytes for n in m.desc.dense_copied)
    loaded = _anon_rss()
    assert loaded - before > 0.9 * copied
    m.close()
    assert _anon_rss() < loaded - 0.9 * copied
