"""Parity with HF `tokenizers` for byte-level BPE: for every supported `tokenizer.ggml.pre`, train a
small BPE vocabulary with HF's ByteLevel + Split pre-tokenizers using that family's regexes, write
it as GGUF vocabulary metadata, load it with colibri and require identical ids on held-out text."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_refs import DATA, load_corpus  # noqa: E402
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from colibri import Tokenizer
from colibri.tokenizer import _CONTROL_LOOKING, SUPPORTED_PRE

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_LLM = [
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7d"
    "ᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ"
    "𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
]
DEEPSEEK_V3 = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]
# SmolLM / SmolLM2: their tokenizer.json's pre-tokenizer is Sequence[Digits(individual_digits=True),
# ByteLevel(use_regex=True)]; Digits isolates every numeric code point and ByteLevel's regex is
# GPT-2's, so the family is these two splits (test_smollm_is_digits_then_byte_level checks that
# they pre-tokenize exactly as SmolLM2's own pre-tokenizer does)
SMOLLM = [r"\p{N}", GPT2]

# tokenizer.ggml.pre -> the regexes of the HF Split pre-tokenizers that the family uses
FAMILIES = {
    "default": DEFAULT,
    "gpt2": [GPT2],
    "olmo": [GPT2],
    "llama-bpe": [LLAMA3],
    "qwen2": [QWEN2],
    "deepseek-v3": DEEPSEEK_V3,
    "smollm": SMOLLM,
}
# Not here: deepseek-llm and gpt-4o, where llama.cpp differs from HF (it runs them through std::regex
# with every non-ASCII letter both upper and lower case, and non-ASCII whitespace outside explicit
# ranges): colibri follows llama.cpp (test_ids_match_llama_cpp). DEEPSEEK_LLM and GPT4O stay as the
# published regexes.
SPECIAL = "<|endoftext|>"


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return load_corpus()


def train_hf(regexes: list[str], texts: list[str], ignore_merges: bool) -> HFTokenizer:
    """A byte-level BPE tokenizer using the family's pre-tokenizer. Its merges are learned on whole
    lines (no pre-split), so they span across the family's split points: encoding with a wrongly
    split word would then give different ids, which makes the comparison sensitive to every regex
    detail."""
    hf = HFTokenizer(models.BPE(ignore_merges=ignore_merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts, trainer=trainer)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return hf


def hf_vocab(hf: HFTokenizer) -> tuple[list[str], list[str], int]:
    """(tokens by id, merges as "a b", id of the special token) of a trained HF BPE tokenizer."""
    model = json.loads(hf.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges, vocab[SPECIAL]


def write_vocab_gguf(tokens: list[str], merges: list[str], special_id: int, pre: str, path: Path,
                     bos_keys: bool = True) -> None:
    """bos_keys=False: no bos id nor add_bos key (the pre-tokenizer's own defaults apply)."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if i == special_id else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(special_id)
    if bos_keys:
        w.add_bos_token_id(special_id)
        w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(hf: HFTokenizer, pre: str, path: Path) -> None:
    write_vocab_gguf(*hf_vocab(hf), pre, path)


def training_text(corpus: list[str]) -> list[str]:
    # Leave out texts llama.cpp would treat as control tokens if they became tokens of their own
    # (e.g. "<end_of_turn>"): HF sees them as ordinary tokens, llama.cpp as control tokens.
    return [s for s in corpus[:2500] if not any(c in s for c in _CONTROL_LOOKING)]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request: pytest.FixtureRequest, corpus: list[str],
         tmp_path_factory: pytest.TempPathFactory) -> tuple[str, HFTokenizer, Tokenizer]:
    pre = request.param
    hf = train_hf(FAMILIES[pre], training_text(corpus), ignore_merges=pre == "llama-bpe")
    path = tmp_path_factory.mktemp("vocab") / f"{pre}.gguf"
    write_gguf(hf, pre, path)
    return pre, hf, Tokenizer.from_gguf(path)


EXTRA = [
    "Hello world", " Hello  world ", "I'll've DON'T 'S 'Re", "a\r\nb\n\n\nc  \n  d\t\te   ",
    "x  y   z    ", "   ", "\n", " \n ", "123456789 1234567.8901 ١٢٣٤٥", "ÀÉÎõü ǅǈ ŉ Ⅷ ⅷ",
    "CamelCaseWord HTTPServer getHTTPResponseCode iPhone", "e\u0301\u0302 \u0301abc ́x",
    "日本語のテキスト、カタカナ。한국어", "<|endoftext|>hi<|endoftext|> <|endoftext|>",
    "path/to/file.txt\n// comment\n/* x */", "$x+=1; a<=b; c^~d|e", "ＡＢＣ　ｘｙｚ！？",
    "\u2028\u2029\u0085\u00a0 \u3000x", "'s's 'T 'LL'll", "a1b22c333d4444", "🙂🙃 👩‍💻 🇫🇷",
]


def test_ids_match_hf_on_held_out_text(pair: tuple[str, HFTokenizer, Tokenizer], corpus: list[str]) -> None:
    pre, hf, tok = pair
    held_out = corpus[6000:7500] + EXTRA
    bad = []
    for s in held_out:
        want = hf.encode(s, add_special_tokens=False).ids
        got = tok.encode(s, add_special=False, parse_special=True).tolist()
        if got != want:
            bad.append(f"{s!r}: got {got[:16]} want {want[:16]}")
    assert not bad, f"{pre}: {len(bad)} of {len(held_out)} differ, e.g.\n" + "\n".join(bad[:5])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=st.text(st.characters(blacklist_categories=("Cs", "Cn", "Co")), max_size=40))
def test_ids_match_hf_hypothesis(pair: tuple[str, HFTokenizer, Tokenizer], s: str) -> None:
    pre, hf, tok = pair
    assert tok.encode(s, add_special=False, parse_special=True).tolist() == \
        hf.encode(s, add_special_tokens=False).ids, pre
    # byte-level BPE is lossless
    assert tok.decode(tok.encode(s, add_special=False)) == s


def test_every_token_round_trips(pair: tuple[str, HFTokenizer, Tokenizer]) -> None:
    pre, hf, tok = pair
    special = hf.token_to_id(SPECIAL)
    for t in range(tok.vocab_size):
        piece = tok.token_to_piece(t, special=True)
        # HF's ByteLevel decoder maps the token back to bytes and decodes them lossily
        assert piece.decode("utf-8", "replace") == hf.decode([t], skip_special_tokens=False), (pre, t)
        assert tok.decode([t], special=True) == piece.decode("utf-8", "replace")
        if t == special:
            assert tok.token_to_piece(t) == b""
            continue
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError:
            continue
        ids = tok.encode(text, add_special=False).tolist()
        assert ids == hf.encode(text, add_special_tokens=False).ids, (pre, t)
        assert tok.decode(ids) == text


def test_unknown_pre_is_an_error(corpus: list[str], tmp_path: Path) -> None:
    hf = train_hf([GPT2], training_text(corpus)[:200], ignore_merges=False)
    path = tmp_path / "bad.gguf"
    write_gguf(hf, "no-such-pre", path)
    with pytest.raises(ValueError, match="no-such-pre.*supported: .*gpt2"):
        Tokenizer.from_gguf(path)


def test_smollm_is_digits_then_byte_level(corpus: list[str]) -> None:
    """FAMILIES["smollm"] (two Split regexes, then ByteLevel without its regex) pre-tokenizes like
    SmolLM2's tokenizer.json pre-tokenizer: the pieces and their offsets, on the whole corpus."""
    ours = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SMOLLM]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    smollm2 = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    numerals = "".join(chr(c) for c in range(0x110000) if chr(c).isnumeric())  # \p{N}, CJK numerals
    for s in corpus + EXTRA + [numerals, " " + numerals, "a" + "1a".join(numerals)]:
        assert ours.pre_tokenize_str(s) == smollm2.pre_tokenize_str(s), s


def test_special_token_only_when_asked(pair: tuple[str, HFTokenizer, Tokenizer]) -> None:
    _, hf, tok = pair
    sid = hf.token_to_id(SPECIAL)
    assert sid in tok.encode("a<|endoftext|>b", add_special=False, parse_special=True).tolist()
    assert sid not in tok.encode("a<|endoftext|>b", add_special=False).tolist()
    assert np.array_equal(tok.encode("ab", add_special=True), tok.encode("ab", add_special=False))


# llama.cpp's ids on the same kind of vocabulary, recorded by tools/record_tokenizer_refs.py: every
# tokenizer.ggml.pre value llama.cpp reads (llama-vocab.cpp at llama-cpp-python 0.3.36's vendored
# llama.cpp) whose words are byte-level encoded (gemma4, sarvam-moe, granite-embed-multi-311m and
# whitespace are not: test_tokenizer_spm_bpe.py)
LLAMA_CPP_PRES = [
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
    "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "falcon",
    "mpt", "starcoder", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
    "a.x-4.0", "mellum", "modern-bert", "jais-2", "jina-v1-en", "jina-v2-code", "roberta-bpe", "refact",
    "command-r", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx",
    "smaug-bpe", "poro-chat", "chatglm-bpe", "glm4", "glm5", "viking", "jais", "tekken", "smollm", "codeshell",
    "bloom", "gpt3-finnish", "exaone", "exaone4", "exaone-moe", "chameleon", "minerva-7b", "megrez", "gpt-4o",
    "llama4", "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe", "trillion",
    "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "hunyuan", "hunyuan-dense",
    "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe", "laguna", "minimax-m2", "solar-open",
    "mellum2",
]
BOS_TEXT = "Hello world"  # encoded with add_special=True and no bos keys: the name's bos defaults


def _load_refs(name: str) -> dict[str, np.ndarray]:
    """NAME_ids / NAME_offsets per pre name; a name whose ids equal an earlier name's is stored as
    NAME_same (that name)."""
    with np.load(DATA / name) as z:
        refs = {k: z[k] for k in z.files}
    for k in [k for k in refs if k.endswith("_same")]:
        pre, same = k[:-len("_same")], str(refs[k])
        refs[pre + "_ids"], refs[pre + "_offsets"] = refs[same + "_ids"], refs[same + "_offsets"]
    return refs


@pytest.fixture(scope="module")
def llama_cpp_data(corpus: list[str]) -> dict[str, tuple[dict[str, Any], list[str], dict[str, np.ndarray]]]:
    """corpus: the vocabulary trained on the corpus and 2,000 held-out corpus lines; adversarial: one
    trained on tools/record_bpe_variants.py's make_adversarial lines and their held-out half."""
    with gzip.open(DATA / "bpe_vocab.json.gz", "rt", encoding="utf-8") as f:
        v = json.load(f)
    refs = _load_refs("bpe_refs.npz")
    first = int(refs["first_line"])
    with gzip.open(DATA / "bpe_adv.json.gz", "rt", encoding="utf-8") as f:
        adv = json.load(f)
    return {"corpus": (v, corpus[first:first + len(refs["default_offsets"]) - 1], refs),
            "adversarial": (adv, adv["lines"][adv["first"]:], _load_refs("bpe_adv_refs.npz"))}


@pytest.mark.parametrize("data", ["corpus", "adversarial"])
@pytest.mark.parametrize("pre", LLAMA_CPP_PRES)
def test_ids_match_llama_cpp(pre: str, data: str, llama_cpp_data: dict[str, Any], tmp_path: Path) -> None:
    v, lines, refs = llama_cpp_data[data]
    path = tmp_path / "v.gguf"
    write_vocab_gguf(v["tokens"], v["merges"], v["special"], pre, path)
    tok = Tokenizer.from_gguf(path)
    ids, off = refs[pre + "_ids"], refs[pre + "_offsets"]
    assert len(off) - 1 == len(lines)
    bad = []
    for i, s in enumerate(lines):
        got = tok.encode(s, add_special=False, parse_special=True)
        if not np.array_equal(got, ids[off[i]:off[i + 1]]):
            bad.append(f"{s!r}: got {got.tolist()[:16]} want {ids[off[i]:off[i + 1]].tolist()[:16]}")
    assert not bad, f"{pre}: {len(bad)} of {len(lines)} lines differ, e.g.\n" + "\n".join(bad[:5])
    if data == "corpus":
        write_vocab_gguf(v["tokens"], v["merges"], v["special"], pre, path, bos_keys=False)
        assert Tokenizer.from_gguf(path).encode(BOS_TEXT).tolist() == refs[pre + "_bos"].tolist()


def test_every_llama_cpp_pre_is_read() -> None:
    """All 91 names of llama-vocab.cpp but "whitespace" (the pre of tokenizer.ggml.model "whitespace",
    which colibri does not read; under "gpt2" llama.cpp aborts on any text with a space)."""
    assert len(LLAMA_CPP_PRES) == 87 and len(set(LLAMA_CPP_PRES)) == 87
    assert set(LLAMA_CPP_PRES) | {"gemma4", "sarvam-moe", "granite-embed-multi-311m"} == set(SUPPORTED_PRE) - {"gpt2"}
