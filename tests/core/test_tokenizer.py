"""Tokenizer API, UTF-8 handling and error paths, on small vocabularies written as GGUF files.
Parity with llama.cpp and HF is in test_tokenizer_gemma.py and test_tokenizer_hf.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import colibri._core._tokenizer as _tok
from colibri import Tokenizer
from colibri.tokenizer import read_gguf_vocab

ROOT = Path(__file__).resolve().parents[2]


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes -> printable characters map, written out from its definition."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write_vocab(path: Path, model: str, tokens: list[str], types: list[int] | None = None,
                scores: list[float] | None = None, merges: list[str] | None = None, pre: str | None = None,
                **kv: object) -> Path:
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for k, v in kv.items():
        getattr(w, "add_" + k)(v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def spm(tmp_path: Path) -> Tokenizer:
    """A tiny SentencePiece vocabulary: control tokens, the 256 byte tokens and a few pieces."""
    tokens = ["<unk>", "<s>", "</s>", "<ctrl>", "<user>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 3, 4] + [6] * 256
    pieces = ["\u2581", "\u2581h", "\u2581he", "\u2581hel", "\u2581hell", "\u2581hello", "e", "l", "o", "h",
              "ll", "lo", "\u2581w", "\u2581wo", "\u2581wor", "\u2581worl", "\u2581world", "w", "r", "d", "é"]
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * (5 + 256) + [-float(i) for i in range(len(pieces))]
    return Tokenizer.from_gguf(write_vocab(tmp_path / "spm.gguf", "llama", tokens, types, scores,
                                           bos_token_id=1, eos_token_id=2, add_eos_token=True))


@pytest.fixture()
def bpe(tmp_path: Path) -> Tokenizer:
    alpha = _byte_alphabet()
    tokens = alpha + ["Ġt", "he", "Ġthe", "<|end|>", "<|user|>"]
    merges = ["Ġ t", "h e", "Ġt he"]
    types = [1] * 259 + [3, 4]
    return Tokenizer.from_gguf(write_vocab(tmp_path / "bpe.gguf", "gpt2", tokens, types, merges=merges,
                                           pre="llama-bpe", bos_token_id=259, add_bos_token=False))


# ---- UTF-8 ------------------------------------------------------------------------------------


HARD = [b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
        b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\xfe",
        b"\x80", b"\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3(", b"\xe2\x82("]


@pytest.mark.parametrize("bad", HARD)
@pytest.mark.parametrize("prefix", [b"", b"ok ", "é€😀".encode()])
def test_strict_utf8_names_the_byte_offset(spm: Tokenizer, bad: bytes, prefix: bytes) -> None:
    with pytest.raises(ValueError, match=f"byte offset {len(prefix)}"):
        spm.encode(prefix + bad + b" tail")
    with pytest.raises(ValueError, match=f"byte offset {len(prefix)}"):
        _tok.utf8_validate(prefix + bad)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=40))
def test_utf8_repair_equals_python_replace(data: bytes) -> None:
    # Python's decoder substitutes maximal subparts, the same rule as WHATWG
    assert _tok.utf8_sanitize(data).decode("utf-8") == data.decode("utf-8", "replace")
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    if valid:
        _tok.utf8_validate(data)
    else:
        with pytest.raises(ValueError, match="byte offset"):
            _tok.utf8_validate(data)


def test_lenient_mode_replaces(spm: Tokenizer, tmp_path: Path) -> None:
    bad = b"he\xffllo \xed\xa0\x80 wor\xe2\x82"
    fixed = bad.decode("utf-8", "replace")
    assert np.array_equal(spm.encode(bad, errors="replace"), spm.encode(fixed))
    path = tmp_path / "spm.gguf"
    assert spm.decode(spm.encode(bad, errors="replace")) == fixed
    lenient = Tokenizer.from_gguf(path, errors="replace")
    assert np.array_equal(lenient.encode(bad), spm.encode(fixed))
    with pytest.raises(ValueError, match="errors must be"):
        spm.encode("x", errors="ignore")


def test_str_with_lone_surrogate(spm: Tokenizer) -> None:
    with pytest.raises(ValueError, match="surrogate at character offset 2"):
        spm.encode("ab\ud800c")
    assert np.array_equal(spm.encode("ab\ud800c", errors="replace"), spm.encode("ab\ufffdc"))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=50))
def test_bpe_arbitrary_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    tok = _BPE_CACHE.get("tok")
    if tok is None:
        tok = _BPE_CACHE["tok"] = _make_bpe(tmp_path_factory.mktemp("b"))
    fixed = data.decode("utf-8", "replace")
    ids = tok.encode(data, errors="replace")
    assert tok.decode(ids) == fixed  # byte-level BPE is lossless on valid text
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(ValueError, match="byte offset"):
            tok.encode(data)


_BPE_CACHE: dict[str, Tokenizer] = {}


def _make_bpe(d: Path) -> Tokenizer:
    alpha = _byte_alphabet()
    return Tokenizer.from_gguf(write_vocab(d / "b.gguf", "gpt2", alpha + ["Ġt"], [1] * 257,
                                           merges=["Ġ t"], pre="gpt2"))


# ---- SPM --------------------------------------------------------------------------------------


def test_spm_encode_decode(spm: Tokenizer) -> None:
    t = {spm.token_to_piece(i, special=True): i for i in range(spm.vocab_size)}
    ids = spm.encode("hello world").tolist()
    # BOS, " hello" (space prefix), " world", EOS (add_eos_token)
    assert ids == [1, t[b" hello"], t[b" world"], 2]
    assert spm.decode(ids) == "hello world"
    assert spm.decode(ids, special=True) == "<s>hello world</s>"
    assert spm.encode("hello", add_special=False).tolist() == [t[b" hello"]]
    # unknown characters fall back to bytes
    ids = spm.encode("☃", add_special=False).tolist()
    assert ids == [t[b" "], t[b"\xe2"], t[b"\x98"], t[b"\x83"]]
    assert spm.decode(ids) == "☃"


def test_spm_special_tokens(spm: Tokenizer) -> None:
    ids = spm.encode("hello<ctrl>world<user>", add_special=False).tolist()
    assert 3 not in ids and ids[-1] == 4  # user-defined tokens are always recognised
    ids = spm.encode("hello<ctrl>world", add_special=False, parse_special=True).tolist()
    assert 3 in ids
    # text after a special token gets the space prefix again
    t = {spm.token_to_piece(i, special=True): i for i in range(spm.vocab_size)}
    assert ids == [t[b" hello"], 3, t[b" world"]]
    assert spm.token_to_piece(3) == b"" and spm.token_to_piece(3, special=True) == b"<ctrl>"


def test_empty_and_whitespace(spm: Tokenizer, bpe: Tokenizer) -> None:
    assert spm.encode("").tolist() == [1, 2]
    assert spm.encode("", add_special=False).tolist() == []
    assert spm.encode(b"").dtype == np.int32
    assert bpe.encode("").tolist() == []
    assert spm.decode([]) == "" and bpe.decode(np.array([], dtype=np.int64)) == ""
    for s in [" ", "  ", "\n", " \t\n "]:
        assert spm.decode(spm.encode(s)) == s
        assert bpe.decode(bpe.encode(s)) == s


def test_api_errors(spm: Tokenizer) -> None:
    n = spm.vocab_size
    for bad in ([n], [-1], [0, 2**40]):
        with pytest.raises(ValueError, match="out of range"):
            spm.decode(bad)
    with pytest.raises(ValueError, match="out of range"):
        spm.token_to_piece(n)
    with pytest.raises(ValueError, match="out of range"):
        spm.stream().feed(-3)
    with pytest.raises(ValueError, match="integers"):
        spm.decode(np.array([1.5]))
    with pytest.raises(TypeError):
        spm.encode(123)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_gguf("/nonexistent/model.gguf")


# ---- BPE --------------------------------------------------------------------------------------


def test_bpe_merges_and_specials(bpe: Tokenizer) -> None:
    assert bpe.pre == "llama3"
    ids = bpe.encode(" the", add_special=False).tolist()
    assert ids == [258]  # Ġthe
    assert bpe.token_to_piece(258) == b" the"
    assert bpe.encode("a<|end|>b<|user|>", add_special=False).tolist()[-1] == 260
    assert 259 not in bpe.encode("a<|end|>b", add_special=False).tolist()
    assert 259 in bpe.encode("a<|end|>b", add_special=False, parse_special=True).tolist()
    assert bpe.bos_id == 259 and not bpe.add_bos


def test_bad_vocabularies(tmp_path: Path) -> None:
    alpha = _byte_alphabet()
    with pytest.raises(ValueError, match="unsupported tokenizer.ggml.pre 'nope'"):
        Tokenizer.from_gguf(write_vocab(tmp_path / "a.gguf", "gpt2", alpha, merges=["a b"], pre="nope"))
    with pytest.raises(ValueError, match="unsupported tokenizer.ggml.model 'bert'"):
        Tokenizer.from_gguf(write_vocab(tmp_path / "b.gguf", "bert", alpha))
    with pytest.raises(ValueError, match="duplicate token"):
        Tokenizer.from_gguf(write_vocab(tmp_path / "c.gguf", "llama", ["a", "b", "a"]))
    with pytest.raises(ValueError, match="without tokenizer.ggml.merges"):
        Tokenizer.from_gguf(write_vocab(tmp_path / "d.gguf", "gpt2", alpha, pre="gpt2"))
    with pytest.raises(ValueError, match="scores has 1 entries"):
        Tokenizer.from_gguf(write_vocab(tmp_path / "e.gguf", "llama", ["a", "b"], scores=[0.0]))
    with pytest.raises(ValueError, match="byte token"):
        Tokenizer.from_gguf(write_vocab(tmp_path / "f.gguf", "llama", ["<0xZZ>"], types=[6],
                                        add_bos_token=False))
    p = tmp_path / "g.gguf"
    write_vocab(p, "llama", ["a", "b"])
    data = p.read_bytes()
    for cut in (3, 20, len(data) // 2):
        (tmp_path / "h.gguf").write_bytes(data[:cut])
        with pytest.raises(ValueError):
            Tokenizer.from_gguf(tmp_path / "h.gguf")


def test_metadata_reader_agrees_with_gguf_package(tmp_path: Path) -> None:
    alpha = _byte_alphabet()
    p = write_vocab(tmp_path / "m.gguf", "gpt2", alpha + ["Ġt"], [1] * 257, merges=["Ġ t"], pre="qwen2",
                    bos_token_id=3, eos_token_id=4, add_bos_token=True, add_eos_token=False)
    info = read_gguf_vocab(p)
    r = gguf.GGUFReader(p)
    assert info.tokens == [t.encode() for t in r.fields["tokenizer.ggml.tokens"].contents()]
    assert info.merges == [m.encode() for m in r.fields["tokenizer.ggml.merges"].contents()]
    assert info.token_types is not None
    assert info.token_types.tolist() == r.fields["tokenizer.ggml.token_type"].contents()
    assert info.pre == "qwen2" and info.model == "gpt2"
    assert (info.bos_id, info.eos_id, info.add_bos, info.add_eos) == (3, 4, True, False)


def test_stream_decoder_small(spm: Tokenizer) -> None:
    ids = spm.encode("hé☃llo", add_special=False).tolist()
    dec = spm.stream()
    out = [dec.feed(i) for i in ids]
    assert "".join(out) + dec.flush() == spm.decode(ids) == "hé☃llo"
    assert all(o.encode("utf-8").decode("utf-8") == o for o in out)


def test_encode_releases_the_gil(spm: Tokenizer) -> None:
    # another Python thread makes progress while a long encode runs in C
    text = ("hello world " * 50_000).encode()
    ticks = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(1)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        before = len(ticks)
        spm.encode(text)
        during = len(ticks) - before
    finally:
        stop.set()
        th.join()
    assert during > 0


def test_unicode_tables_are_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_unicode_tables.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
