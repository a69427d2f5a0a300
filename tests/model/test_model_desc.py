"""Each fact once: the model description is forward.h's field tables filled by name (no Python
copy of the struct, no field-by-field copy), families are data, the tokenizer is built from the
GGUFFile the model parsed, one rule decides end-of-generation tokens, and the enums the CUDA
kernels share come from one header."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from oracle_models import build  # needs torch + transformers (test extras): fails if missing

from colibri import KVArena, KVCache
from colibri._core import _forward
from colibri.arch import FAMILIES, Family, LayerDesc, Mat, ModelDesc
from colibri.gguf import GGUFFile
from colibri.model import Model
from colibri.tokenizer import Tokenizer, VocabInfo, eog_ids

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"i32": 4, "i64": 8, "f32": 4, "enum": 4, "vec": 8}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, paths = build("qwen3_moe", tmp_path_factory.mktemp("desc"), ("f32",))
    return paths["f32"]


@pytest.fixture(scope="module")
def model(tiny):
    with Model(tiny, threads=1, ctx=64, max_batch=8) as m:
        yield m


# ---- the description: forward.h's tables, filled once ----------------------------------------

@pytest.mark.parametrize("layer", [False, True])
def test_the_field_table_covers_the_whole_c_struct(layer):
    """Every byte of cb_layer_desc_t / cb_model_desc_t is a field of forward.h's table (or
    padding, or the model's `layers` pointer): a member added to the struct outside the table
    leaves a gap this finds, so the one place that fills the struct cannot miss it."""
    fields = _forward.desc_fields(layer)
    offsets = [off for _, _, off in fields]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    mats = [off for _, kind, off in _forward.desc_fields(True) if kind == "mat"]
    mat_size = min(b - a for a, b in zip(mats, mats[1:], strict=False))  # wq, wk, wv, wo
    assert mat_size >= 8 + 8 + 8 + 8  # type, rows, cols, row_bytes, data
    ends = [off + SIZES.get(kind, mat_size) for _, kind, off in fields]
    for (name, _, _), end, nxt in zip(fields, ends, offsets[1:], strict=False):
        assert 0 <= nxt - end < 8, f"bytes after {name} belong to no field of the table"
    tail = 0 if layer else 8  # cb_model_desc_t ends with its `layers` pointer
    assert 0 <= _forward.desc_struct_size(layer) - ends[-1] - tail < 8


def test_python_keeps_no_copy_of_the_fields():
    """The description classes are not dataclasses restating the fields, and the Cython
    declaration names no layer field (Forward copies the structs whole)."""
    assert not dataclasses.is_dataclass(LayerDesc) and not dataclasses.is_dataclass(ModelDesc)
    pxd = (ROOT / "colibri/_core/forward.pxd").read_text()
    block = pxd[pxd.index("ctypedef struct cb_layer_desc_t:"):pxd.index("ctypedef struct cb_model_desc_t:")]
    assert block.split(":", 1)[1].split() == ["pass"]
    pxi = (ROOT / "colibri/_core/_forward.pxi").read_text()
    for name, _, _ in _forward.desc_fields(True):
        assert not re.search(rf"\bL\.{name}\s*=(?!=)", pxi), f"_forward.pxi copies {name}"


def test_describe_fills_every_field_through_the_table(model):
    d = model.desc
    assert set(d.c_fields()) == {n for n, _, _ in _forward.desc_fields()}
    for L in d.layers:
        values = L.c_fields()
        assert set(values) == {n for n, _, _ in _forward.desc_fields(True)}
        assert all(values[n] is not None for n in ("attn_norm", "ffn_norm", "wq", "wk", "wo"))
        # the store's stacked experts give the struct its one-expert templates
        assert L.experts is not None and values["exp_gate"] is L.experts.gate
    assert d.n_layer == len(d.layers) and d.n_embd == model.n_embd


def test_fields_are_checked_by_kind_and_typos_refused():
    L = LayerDesc(n_expert=3, sliding_window=True)
    assert (L.n_expert, L.sliding_window, L.rope_base, L.bq, L.wq) == (3, True, 10000.0, None, None)
    with pytest.raises(TypeError, match="no field 'n_experts'"):
        LayerDesc(n_experts=3)
    with pytest.raises(ValueError, match="does not fit in int32"):
        L.n_expert = 2**40
    with pytest.raises(ValueError, match="contiguous float32"):
        L.bq = np.zeros(4, dtype=np.float64)
    with pytest.raises(TypeError):
        L.rope_base = None
    M = Mat(0, 2, 4, 16, np.zeros(32, dtype=np.uint8))
    L2 = L.replace(wq=M, n_expert=0)
    assert (L2.wq, L2.n_expert, L.wq, L.n_expert) == (M, 0, None, 3)


def test_a_field_set_by_name_is_what_the_c_forward_reads(model):
    """final_softcap changed through replace() reaches cb_forward_run (the struct is the
    description, not a copy made from it)."""
    d = model.desc

    def logits(desc):
        arena = KVArena(1 << 22)
        kv = KVCache(arena, *desc.kv_dims(), "f32")
        fw = _forward.Forward(desc, kv, _forward.ExpertStore(desc), None, 4)
        seq = kv.new_sequence()
        return fw.run([seq, seq], [0, 1], tokens=[1, 2])

    base, capped = logits(d), logits(d.replace(final_softcap=0.25))
    assert np.abs(capped).max() <= 0.25 + 1e-6 < np.abs(base).max()
    with pytest.raises(ValueError, match=f"{d.n_layer} layers for n_layer = {d.n_layer + 1}"):
        logits(d.replace(n_layer=d.n_layer + 1))


def test_families_are_data_not_names():
    """No Family field is named after an architecture (the former gemma4 flag): what differs is
    described (per-layer attention reader, V norm, MoE beside the MLP, ...)."""
    names = {f.name for f in dataclasses.fields(Family)}
    assert not names & set(FAMILIES) and "gemma4" not in names
    g4 = FAMILIES["gemma4"]
    assert g4.layer_attn is not None and g4.v_norm and g4.moe_beside_mlp and g4.v_from_k
    assert all(not (f.v_norm or f.moe_beside_mlp or f.layer_attn) for a, f in FAMILIES.items()
               if a != "gemma4")


# ---- the tokenizer from the parsed file -------------------------------------------------------

def test_the_tokenizer_is_built_from_the_parsed_gguffile(tiny, monkeypatch):
    ref = Tokenizer.from_gguf(tiny)
    gf = GGUFFile(tiny)

    def reread(*args, **kwargs):
        raise AssertionError("the model file was parsed a second time")

    monkeypatch.setattr(GGUFFile, "_parse", reread)
    monkeypatch.setattr("colibri.tokenizer._open_metadata", reread)
    tok = Tokenizer.from_gguf(gf)
    text = "Hello, world! héllo"
    assert tok.encode(text).tolist() == ref.encode(text).tolist()
    assert (tok.vocab_size, tok.eos_id, tok.eog_ids) == (ref.vocab_size, ref.eos_id, ref.eog_ids)
    monkeypatch.undo()
    monkeypatch.setattr("colibri.tokenizer._open_metadata", reread)
    with Model(tiny, threads=1, ctx=16) as m:  # Model's tokenizer: from its own GGUFFile
        assert m.tokenize(text) == ref.encode(text).tolist()


# ---- one end-of-generation rule ---------------------------------------------------------------

def test_every_entry_point_reads_the_same_eog_ids(tiny, model, monkeypatch):
    from colibri.engine import Engine
    from colibri.generate import stop_token_ids

    ids = model.eog_ids
    assert ids and ids == model.tokenizer.eog_ids
    assert stop_token_ids(model) == set(ids)
    with Model(tiny, threads=1, ctx=16, tokenizer=False) as bare:
        assert bare.eog_ids == ids
    with Engine(model) as eng:
        assert eng._eog == set(ids)
    import llguidance  # the serve grammar's engine (test extras)

    from colibri.serve.grammar import GrammarFactory

    seen = {}

    def fake(wrapper, n_vocab, eos_token):
        seen["eos"] = eos_token

    monkeypatch.setattr(llguidance, "LLTokenizer", fake)
    GrammarFactory(model)
    assert seen["eos"] == sorted(ids)


def test_the_eog_rule():
    toks = [b"<unk>", b"<s>", b"</s>", b"a", b"<|im_end|>", b"<end_of_turn>", b"<|eot_id|>"]

    def info(**special):
        return VocabInfo(model="llama", pre="", tokens=toks, scores=None, token_types=None,
                         eos_id=special.get("eos"), special_ids=special)

    # named by the metadata (eos, eot, eom) and by text; out-of-range ids are ignored
    assert eog_ids(info(eos=2, eot=3, eom=99), 5) == {2, 3, 4}
    assert eog_ids(info(eos=2), 7) == {2, 4, 5, 6}
    # nothing named: the tokenizer's eos (SentencePiece's default 2)
    assert eog_ids(info(), 4) == {2}
    assert eog_ids(info(), 2) == frozenset()


# ---- enums shared with the CUDA kernels --------------------------------------------------------

def test_cuda_enums_come_from_kernel_abi_h():
    from colibri import cuda

    common = (ROOT / "cuda/common.cuh").read_text()
    assert not re.search(r"#define\s+CB_(ACT|KERR)_", common)
    assert '#include "kernel_abi.h"' in common
    assert "typedef enum cb_act" not in (ROOT / "include/colibri/ops.h").read_text()
    assert set(cuda._KERR_NAMES) == set(_forward.cb_kerr) - {_forward.cb_kerr.CB_KERR_NONE}
    for kfile, name in cuda._FILE_IDS.items():
        src = (ROOT / "cuda" / name).read_text()
        assert re.search(rf"#define CB_FILE_ID {kfile.name}\b", src), name
