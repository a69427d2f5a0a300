"""Parity with llama.cpp on the real SmolLM2 vocabulary (the chat model, SmolLM2-135M-Instruct:
byte-level BPE, 49,152 tokens, tokenizer.ggml.pre = "smollm": each \\p{N} alone, then the GPT-2
regex). The reference ids, pieces, attributes and detokenized texts were recorded from
llama-cpp-python by `tools/record_tokenizer_refs.py --smollm2 PATH` over the first lines of the
corpus in tests/data/tokenizer/corpus.json.gz (prose in many scripts, code, digits of several
scripts, emoji, combining marks, whitespace runs, special-token strings, random code points). HF
`tokenizers` with SmolLM2's own pre-tokenizer is a second reference, on the whole corpus."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_refs import byte_strings, id_lists, load_corpus, load_refs  # noqa: E402

import colibri
from colibri import Tokenizer
from colibri.tokenizer import ATTR_CONTROL, read_gguf_vocab


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    return str(colibri.chat_model_path())


@pytest.fixture(scope="module")
def tok(smollm2_path: str) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_path)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return load_corpus()


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return load_refs("smollm2_refs.npz")


def _variant(refs: dict[str, np.ndarray], name: str) -> list[np.ndarray]:
    """llama.cpp's ids for one add_special/parse_special pair: the file keeps "special" whole and
    the others only on the lines where they differ from it."""
    want = id_lists(refs, "special")
    if name != "special":
        for i, ids in zip(refs[name + "_lines"].tolist(), id_lists(refs, name), strict=True):
            want[i] = ids
    return want


def _mismatches(tok: Tokenizer, corpus: list[str], want: list[np.ndarray], **kw: bool) -> list[str]:
    bad = []
    for i, expected in enumerate(want):
        got = tok.encode(corpus[i], **kw)
        if got.dtype != np.int32 or not np.array_equal(got, expected):
            bad.append(f"line {i} {corpus[i]!r}: got {got.tolist()[:24]} want {expected.tolist()[:24]}")
    return bad


def test_vocab_facts(tok: Tokenizer, refs: dict[str, np.ndarray]) -> None:
    n_lines, n_vocab = (int(x) for x in refs["meta"])
    assert tok.vocab_size == n_vocab == 49152
    assert tok.model == "gpt2" and tok.pre == "smollm"
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert not tok.add_bos and not tok.add_eos and not tok.add_space_prefix
    assert n_lines >= 3000 and len(refs["special_offsets"]) == n_lines + 1


def test_recording_covers_every_kind_of_line(corpus: list[str], refs: dict[str, np.ndarray]) -> None:
    lines = corpus[:int(refs["meta"][0])]
    assert sum(any("0" <= c <= "9" for c in s) for s in lines) > 500
    assert sum(any("\u0660" <= c <= "\u0669" or "\uff10" <= c <= "\uff19" for c in s) for s in lines) > 50
    assert sum(any(c in s for c in "😀🚀👍🏽") for s in lines) > 50
    assert sum(any("\u4e00" <= c <= "\u9fff" for c in s) for s in lines) > 200
    assert sum(any("\u0400" <= c <= "\u04ff" for c in s) for s in lines) > 200
    assert sum(any("\u0900" <= c <= "\u097f" for c in s) for s in lines) > 200
    assert sum("def " in s or "{" in s for s in lines) > 100
    assert sum("<|endoftext|>" in s or "<|im_start|>" in s for s in lines) > 20
    assert sum(any(0x20000 <= ord(c) <= 0x2A6DF or 0xE000 <= ord(c) <= 0xE0FF for c in s) for s in lines) > 100
    # parse_special changes the ids of some lines, and every variant is checked on every line
    assert len(refs["plain_lines"]) > 20


def test_token_attributes_match_llama_cpp(tok: Tokenizer, refs: dict[str, np.ndarray]) -> None:
    ours = tok.token_attrs.astype(np.uint16)
    theirs = refs["attrs"]
    bad = np.nonzero(ours != theirs)[0]
    assert bad.size == 0, [(int(i), int(ours[i]), int(theirs[i])) for i in bad[:10]]


@pytest.mark.parametrize("name,add_special,parse_special", [
    ("special", True, True), ("plain", True, False), ("nospecial", False, True), ("raw", False, False)])
def test_ids_match_llama_cpp(tok: Tokenizer, corpus: list[str], refs: dict[str, np.ndarray],
                             name: str, add_special: bool, parse_special: bool) -> None:
    want = _variant(refs, name)
    bad = _mismatches(tok, corpus, want, add_special=add_special, parse_special=parse_special)
    assert not bad, f"{name}: {len(bad)} of {len(want)} lines differ, e.g.\n" + "\n".join(bad[:8])


def test_digits_are_single_tokens(tok: Tokenizer) -> None:
    # the smollm pre-tokenizer isolates every numeric code point before the GPT-2 regex, so no
    # merge joins a digit to anything: "in 1999, 3.14" is "in" " " 1 9 9 9 "," " " 3 "." 1 4
    def one(piece: str) -> int:
        ids = tok.encode(piece, add_special=False).tolist()
        assert len(ids) == 1, (piece, ids)
        return int(ids[0])

    pieces = ["in", " ", "1", "9", "9", "9", ",", " ", "3", ".", "1", "4"]
    assert tok.encode("in 1999, 3.14", add_special=False).tolist() == [one(p) for p in pieces]
    assert tok.encode(" 2024", add_special=False).tolist() == [one(p) for p in " 2024"]
    arabic = tok.encode("x\u0661\u0662", add_special=False).tolist()  # Arabic-Indic 1 2
    assert arabic[0] == one("x") and arabic[1:] == tok.encode("\u0661", add_special=False).tolist() \
        + tok.encode("\u0662", add_special=False).tolist()


def _byte_tokens(tok: Tokenizer) -> set[int]:
    """The bytes that have a token of their own. SmolLM2's vocabulary lacks some (0x04, 0x06, 0x13,
    0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF): llama.cpp (and HF) drop such a byte
    when no merge covers it, so only text without them round-trips."""
    return {p[0] for p in (tok.token_to_piece(t, special=True) for t in range(tok.vocab_size)) if len(p) == 1}


@pytest.fixture(scope="module")
def byte_tokens(tok: Tokenizer) -> set[int]:
    return _byte_tokens(tok)


def _lossless(s: str, byte_tokens: set[int]) -> bool:
    return all(b in byte_tokens for b in s.encode("utf-8"))


# GPT-2's bytes_to_unicode, inverted: the byte each character of a byte-level token's text stands for
_PRINTABLE = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
_BYTE_OF = {chr(b): b for b in _PRINTABLE} | \
    {chr(256 + k): b for k, b in enumerate(b for b in range(256) if b not in _PRINTABLE)}


def _byte_level_decode(text: bytes) -> bytes | None:
    """tools/record_tokenizer_refs.py's byte_level_decode: None outside the byte alphabet."""
    try:
        return bytes(_BYTE_OF[c] for c in text.decode("utf-8"))
    except (KeyError, UnicodeDecodeError):
        return None


def test_every_token_piece_matches_llama_cpp(tok: Tokenizer, smollm2_path: str,
                                             refs: dict[str, np.ndarray]) -> None:
    # the file keeps llama_token_to_piece only where it is not the byte-level decoding of the
    # token's text (the control tokens with special=False: empty)
    tokens = read_gguf_vocab(smollm2_path).tokens
    natural = [_byte_level_decode(t if isinstance(t, bytes) else t.encode()) for t in tokens]
    bad = []
    for name, special in (("piece", False), ("special_piece", True)):
        odd = dict(zip(refs[name + "_ids"].tolist(), byte_strings(refs, name + "s", name + "_offsets"), strict=True))
        for t in range(tok.vocab_size):
            want = odd[t] if t in odd else natural[t]
            assert want is not None, t
            if tok.token_to_piece(t, special=special) != want:
                bad.append((t, special, tok.token_to_piece(t, special=special), want))
    assert not bad, bad[:10]
    assert refs["piece_ids"].tolist() == np.nonzero(tok.token_attrs & ATTR_CONTROL)[0].tolist()


def test_decode_matches_llama_detokenize(tok: Tokenizer, corpus: list[str], refs: dict[str, np.ndarray]) -> None:
    # the recording keeps llama_detokenize's text only where it differs from the line itself
    ids = _variant(refs, "special")
    for name, special in (("detok", False), ("detok_unparse", True)):
        differ = dict(zip(refs[name + "_lines"].tolist(), byte_strings(refs, name), strict=True))
        bad = []
        for i, line_ids in enumerate(ids):
            want = differ[i].decode("utf-8", "replace") if i in differ else corpus[i]
            got = tok.decode(line_ids, special=special)
            if got != want:
                bad.append(f"line {i}: got {got!r} want {want!r}")
        assert not bad, f"{name}: {len(bad)} lines differ, e.g.\n" + "\n".join(bad[:5])


def test_bytes_without_a_token_are_dropped(tok: Tokenizer, byte_tokens: set[int]) -> None:
    missing = set(range(256)) - byte_tokens
    assert {0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2} <= missing and len(missing) < 32
    assert tok.encode("\x16", add_special=False).tolist() == []
    assert tok.decode(tok.encode("a\x14b", add_special=False)) == "ab"


def test_decode_inverts_encode_on_corpus(tok: Tokenizer, byte_tokens: set[int], corpus: list[str]) -> None:
    # byte-level BPE is lossless where every byte has a token, and clean_spaces is off for smollm
    n = 0
    for s in corpus:
        if not _lossless(s, byte_tokens):
            continue
        n += 1
        assert tok.decode(tok.encode(s, parse_special=False)) == s
        assert tok.decode(tok.encode(s, parse_special=True), special=True) == s
    assert n > 9000


def test_stream_decoder_matches_decode_on_corpus(tok: Tokenizer, corpus: list[str]) -> None:
    for s in corpus[::7]:
        ids = tok.encode(s)
        dec = tok.stream()
        chunks = [dec.feed(int(i)) for i in ids]
        assert "".join(chunks) + dec.flush() == tok.decode(ids)


def _hf_smollm2(path: str):  # type: ignore[no-untyped-def]
    """HF `tokenizers` built from the GGUF's vocabulary with SmolLM2's tokenizer.json pipeline:
    BPE, pre-tokenizer Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)],
    ByteLevel decoder, and the control tokens as special added tokens."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    info = read_gguf_vocab(path)
    assert info.merges is not None and info.token_types is not None
    tokens = [t.decode("utf-8") if isinstance(t, bytes) else t for t in info.tokens]
    merges = [tuple((m.decode("utf-8") if isinstance(m, bytes) else m).split(" ", 1)) for m in info.merges]
    hf = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    control = [tokens[i] for i, t in enumerate(info.token_types.tolist()) if t == 3]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return hf


def test_ids_match_hf_smollm2_pipeline(tok: Tokenizer, smollm2_path: str, corpus: list[str]) -> None:
    hf = _hf_smollm2(smollm2_path)
    bad = []
    for s in corpus:
        want = hf.encode(s, add_special_tokens=False).ids
        got = tok.encode(s, add_special=False, parse_special=True).tolist()
        if got != want:
            bad.append(f"{s!r}: got {got[:24]} want {want[:24]}")
    assert not bad, f"{len(bad)} of {len(corpus)} lines differ, e.g.\n" + "\n".join(bad[:5])


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=texts)
def test_roundtrip_hypothesis(tok: Tokenizer, byte_tokens: set[int], s: str) -> None:
    ids = tok.encode(s, parse_special=False)
    dec = tok.stream()
    out = [dec.feed(int(i)) for i in ids]
    assert "".join(out) + dec.flush() == tok.decode(ids)
    if _lossless(s, byte_tokens):
        assert tok.decode(ids) == s
