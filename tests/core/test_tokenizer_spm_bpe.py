"""SentencePiece-style BPE (tokenizer.ggml.model "gemma4", and the gemma4, granite-embed-multi-311m and
sarvam-moe pre names under "gpt2"): spaces as U+2581, merges by rank over UTF-8 characters, <0xNN>
byte fallback. colibri against llama.cpp's ids, detokenized text and pieces, recorded once by
tools/record_bpe_variants.py --spm-bpe on a vocabulary trained there (bpe_spm.json.gz)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from tokenizer_refs import DATA, byte_strings, id_lists, load_corpus, load_refs  # noqa: E402

from colibri import Tokenizer

CONFIGS = [("gemma4", "gemma4"), ("gpt2", "gemma4"), ("gpt2", "granite-embed-multi-311m"), ("gpt2", "sarvam-moe")]
FIRST, LINES = 6000, 2000  # the corpus lines recorded (record_tokenizer_refs.BPE_FIRST, BPE_LINES)


@pytest.fixture(scope="module")
def vocab() -> dict[str, Any]:
    with gzip.open(DATA / "bpe_spm.json.gz", "rt", encoding="utf-8") as f:
        v: dict[str, Any] = json.load(f)
    return v


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return load_refs("bpe_spm_refs.npz")


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    with gzip.open(DATA / "bpe_adv.json.gz", "rt", encoding="utf-8") as f:
        adv = json.load(f)
    return {"": load_corpus()[FIRST:FIRST + LINES], "_adv": adv["lines"][adv["first"]:]}


def write(v: dict[str, Any], model: str, pre: str, path: Path) -> None:
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(v["tokens"])
    w.add_token_types(v["types"])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=CONFIGS, ids=[f"{m}.{p}" for m, p in CONFIGS])
def tok(request: pytest.FixtureRequest, vocab: dict[str, Any],
        tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Tokenizer]:
    model, pre = request.param
    path = tmp_path_factory.mktemp("spm_bpe") / "v.gguf"
    write(vocab, model, pre, path)
    return f"{model}.{pre}", Tokenizer.from_gguf(path)


@pytest.mark.parametrize("which", ["", "_adv"])
def test_ids_match_llama_cpp(tok: tuple[str, Tokenizer], refs: dict[str, np.ndarray],
                             lines: dict[str, list[str]], which: str) -> None:
    name, t = tok
    want = id_lists(refs, name + which)
    assert len(want) == len(lines[which])
    bad = [f"{s!r}: got {got.tolist()[:12]} want {w.tolist()[:12]}"
           for s, w in zip(lines[which], want, strict=True)
           if not np.array_equal(got := t.encode(s, add_special=False, parse_special=True), w)]
    assert not bad, f"{name}: {len(bad)} of {len(want)} differ, e.g.\n" + "\n".join(bad[:5])


def test_add_special_matches_llama_cpp(tok: tuple[str, Tokenizer], refs: dict[str, np.ndarray],
                                       lines: dict[str, list[str]]) -> None:
    """gemma4 adds bos whatever the file says (llama.cpp's workaround); sarvam-moe does not."""
    name, t = tok
    want = id_lists(refs, name + "_special")
    for s, w in zip(lines[""], want, strict=False):
        assert t.encode(s, add_special=True, parse_special=True).tolist() == w.tolist(), (name, s)
    assert (want[0][0] == 2) == (name != "gpt2.sarvam-moe")


def test_pieces_and_decode_match_llama_cpp(tok: tuple[str, Tokenizer], refs: dict[str, np.ndarray],
                                           lines: dict[str, list[str]]) -> None:
    name, t = tok
    for kind, special in (("piece", False), ("special_piece", True)):
        pieces = byte_strings(refs, name + "_" + kind + "s", name + "_" + kind + "_offsets")
        assert [t.token_to_piece(i, special=special) for i in range(t.vocab_size)] == pieces, (name, kind)
    # llama_detokenize applies clean_spaces for gemma4 (not for sarvam-moe); colibri's decode does not
    # (it is lossless), so compare where clean_spaces changes nothing
    detok = byte_strings(refs, name + "_detok")
    ids = id_lists(refs, name)
    checked = 0
    for s, i, d in zip(lines[""], ids, detok, strict=True):
        if any(p in s for p in (" ?", " !", " .", " ,", " '")):
            continue
        assert t.decode(i).encode("utf-8") == d, (name, s)
        checked += 1
    assert checked > 1000
