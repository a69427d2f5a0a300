#!/usr/bin/env python3
"""Record llama.cpp's ids on two more vocabularies, for colibri's parity tests (beside
tools/record_tokenizer_refs.py, whose helpers this uses):

  --adversarial  bpe_adv.json.gz (make_adversarial's lines, and a byte-level BPE vocabulary trained
                 on their first half) and bpe_adv_refs.npz: llama.cpp's ids of the second half under
                 every byte-level pre name (test_tokenizer_hf.py's LLAMA_CPP_PRES);
  --spm-bpe      bpe_spm.json.gz (a SentencePiece-style BPE vocabulary, Gemma 4's kind) and
                 bpe_spm_refs.npz (see record_spm_bpe), for test_tokenizer_spm_bpe.py.

    PYTHONPATH=. /tmp/lcpenv/bin/python tools/record_bpe_variants.py --adversarial --spm-bpe
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_tokenizer_refs import (  # noqa: E402
    BPE_FIRST,
    BPE_LINES,
    OUT_DIR,
    _detokenize,
    _pack_blobs,
    _pack_lists,
    _piece,
    _put_dedup,
    _read_json_gz,
    _test_tokenizer_hf,
    _tokenize_with,
)

ADV_SEED, ADV_LINES = 20261207, 3000
ADV_WORDS = [
    "getHTTPResponseCode", "iPhone", "McDonald", "ABCdef", "abcDEF", "XMLHttpRequest", "a", "I", "ok", "OK",
    "ÉcOLE", "ǅemal", "ǈubav", "ΑβΓδε", "ПрИвЕт", "straße", "ʰaʲ", "ℌilbert", "Ⅻ", "ⅻ", "ĳssel", "İstanbul'da",
    "Ankara'nın", "don't", "DON'T", "I'M", "we'Ll", "they'VE", "she'D", "it'S", "'re", "'ll", "'S", "''s", "'x",
    "中文字", "日本語", "ひらがな", "カタカナ", "ｶﾀｶﾅ", "한국어", "ᄀᄁ", "ㄱㄴ", "ㄅㄆ", "⼀⼁", "㐀㐁", "豈更", "ภาษาไทย",
    "ភាសាខ្មែរ", "မြန်မာ", "ꩠꩡ", "ꧠꧡ", "ພາສາລາວ", "𠀋𡈽", "עִבְרִית", "العَرَبِيَّة", "हिन्दी", "e\u0301", "\u0301x",
    "a\u20dd", "1\u0301", " \u0301", "x\u200dy", "\u00ad", "\ufeff", "\ue000", "\x00", "\x1f", "\x7f", "\x85",
    "<sentinel:12>", "<sentinel:x>", "IMGIMGABCZ", "IMGIMGABCDEZ", "IMGIMGJZ", "😀", "👩‍💻", "🇫🇷",
]
ADV_PUNCT = ["/", "//", "\\", "(", ")", "!", "?", ".", ",", "...", "…", "。", "，", "、", "।", "۔", "،", "|", "$",
             "+", "<=", ">", "^", "`", "~", "_", "-", "@", "#", "%", "&", "*", "[", "]", "{", "}", ":", ";", '"',
             "'", "！", "？", "“", "”", "‘", "’", "—", "：", "；", "〿", "︰", "﹏", "«", "»", "¿", "©", "°", "±",
             "€", "→", "∑"]
ADV_SPACE = [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", "\r", "\v", "\f", " \n", "\n ", "\u00a0",
             "\u3000", "\u2009", "\u2028", "\u1680", " " * 9, " " * 17, "\t\t", " \t", "\n\n\n"]


def _adv_number(rng: random.Random) -> str:
    digits = rng.choice(["0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "०१२३४५६७८९", "½²³¼"])
    return "".join(rng.choice(digits) for _ in range(rng.randrange(1, 14)))


def make_adversarial(n: int = ADV_LINES, seed: int = ADV_SEED) -> list[str]:
    """Lines that tell the pre-tokenizers apart: case changes inside words, contractions, digit runs
    of every length, punctuation next to letters, newlines and '/', every kind of whitespace run,
    marks, scripts of every llama.cpp character range, chameleon's sentinel and image patterns."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randrange(2, 14)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(ADV_WORDS))
            elif r < 0.55:
                parts.append(_adv_number(rng))
            elif r < 0.75:
                parts.append("".join(rng.choice(ADV_PUNCT) for _ in range(rng.randrange(1, 4))))
            else:
                parts.append(rng.choice(ADV_SPACE))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", " ", "", "\n", "  "]))
        out.append("".join(parts))
    return out


def record_adversarial(out: Path, llama_cpp) -> None:  # type: ignore[no-untyped-def]
    """bpe_adv.json.gz (the lines of make_adversarial and a vocabulary trained on their first half)
    and bpe_adv_refs.npz (llama.cpp's ids of the second half under every name of LLAMA_CPP_PRES)."""
    import tempfile

    t = _test_tokenizer_hf()
    lines = make_adversarial()
    half = len(lines) // 2
    tokens, merges, special = t.hf_vocab(t.train_hf([r"\n"], lines[:half] * 3, ignore_merges=False))
    with open(out / "bpe_adv.json.gz", "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(json.dumps({"lines": lines, "first": half, "tokens": tokens, "merges": merges,
                                 "special": special}, ensure_ascii=False).encode("utf-8"))
    arrays: dict[str, np.ndarray] = {}
    seen: dict[bytes, str] = {}
    enc = [s.encode("utf-8") for s in lines[half:]]
    with tempfile.TemporaryDirectory() as d:
        for pre in t.LLAMA_CPP_PRES:
            path = Path(d) / f"{pre}.gguf"
            t.write_vocab_gguf(tokens, merges, special, pre, path)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            ids = [_tokenize_with(llama_cpp, llm._model.vocab, b) for b in enc]
            _put_dedup(arrays, seen, pre, ids)
            del llm
            print(pre, flush=True)
    np.savez_compressed(out / "bpe_adv_refs.npz", **arrays)


SPM_BPE_CONFIGS = [("gemma4", "gemma4"), ("gpt2", "gemma4"), ("gpt2", "granite-embed-multi-311m"),
                   ("gpt2", "sarvam-moe")]  # (tokenizer.ggml.model, pre)
SPM_BPE_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>"]


def train_spm_bpe(corpus: list[str]) -> dict[str, list]:  # type: ignore[type-arg]
    """A SentencePiece-style BPE vocabulary (Gemma 4's kind): spaces as U+2581, merges over UTF-8
    characters, <0xNN> byte tokens; plus two newline-run tokens no merge forms."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE(byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.pre_tokenizer = pre_tokenizers.Split("\n", "isolated")
    special = SPM_BPE_SPECIAL + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=special, show_progress=False, limit_alphabet=400)
    hf.train_from_iterator(corpus[:2500], trainer=trainer)
    model = json.loads(hf.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for t, i in model["vocab"].items():
        tokens[i] = t
    tokens += ["\n\n", "\n\n\n"]
    n_sp = len(SPM_BPE_SPECIAL)
    types = [3 if i < n_sp else 6 if i < n_sp + 256 else 1 for i in range(len(tokens))]
    assert all(tokens[n_sp + b] == f"<0x{b:02X}>" for b in range(256))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges}


def write_spm_bpe_gguf(v: dict[str, list], model: str, pre: str, path: Path) -> None:  # type: ignore[type-arg]
    import gguf

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


def record_spm_bpe(out: Path, corpus: list[str], llama_cpp) -> None:  # type: ignore[no-untyped-def]
    """bpe_spm.json.gz (train_spm_bpe's vocabulary) and bpe_spm_refs.npz: per SPM_BPE_CONFIGS entry
    MODEL.PRE, llama.cpp's ids (add_special False, parse_special True) of corpus lines BPE_FIRST..
    and of the adversarial held-out lines, the ids of the first 20 corpus lines with add_special,
    and llama_detokenize of the corpus ids and every token's piece (special False and True)."""
    import tempfile

    v = train_spm_bpe(corpus)
    with open(out / "bpe_spm.json.gz", "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(json.dumps(v, ensure_ascii=False).encode("utf-8"))
    adv = make_adversarial()
    lines = [s.encode("utf-8") for s in corpus[BPE_FIRST:BPE_FIRST + BPE_LINES]]
    adv_lines = [s.encode("utf-8") for s in adv[len(adv) // 2:]]
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as d:
        for model, pre in SPM_BPE_CONFIGS:
            name = f"{model}.{pre}"
            path = Path(d) / f"{name}.gguf"
            write_spm_bpe_gguf(v, model, pre, path)
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            vocab = llm._model.vocab
            ids = [_tokenize_with(llama_cpp, vocab, b) for b in lines]
            arrays[name + "_ids"], arrays[name + "_offsets"] = _pack_lists(ids)
            aids = [_tokenize_with(llama_cpp, vocab, b) for b in adv_lines]
            arrays[name + "_adv_ids"], arrays[name + "_adv_offsets"] = _pack_lists(aids)
            sids = [_tokenize_with(llama_cpp, vocab, b, add_special=True) for b in lines[:20]]
            arrays[name + "_special_ids"], arrays[name + "_special_offsets"] = _pack_lists(sids)
            det = [_detokenize(llama_cpp, vocab, x) for x in ids]
            arrays[name + "_detok"], arrays[name + "_detok_offsets"] = _pack_blobs(det)
            for kind, special in (("piece", False), ("special_piece", True)):
                ps = [_piece(llama_cpp, vocab, t, special) for t in range(len(v["tokens"]))]
                arrays[name + "_" + kind + "s"], arrays[name + "_" + kind + "_offsets"] = _pack_blobs(ps)
            del llm
            print(name, flush=True)
    np.savez_compressed(out / "bpe_spm_refs.npz", **arrays)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT_DIR))
    ap.add_argument("--adversarial", action="store_true", help="bpe_adv.json.gz and bpe_adv_refs.npz")
    ap.add_argument("--spm-bpe", action="store_true", help="bpe_spm.json.gz and bpe_spm_refs.npz")
    args = ap.parse_args(argv)
    import llama_cpp

    if args.adversarial:
        record_adversarial(Path(args.out), llama_cpp)
    if args.spm_bpe:
        record_spm_bpe(Path(args.out), _read_json_gz(OUT_DIR / "corpus.json.gz"), llama_cpp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
