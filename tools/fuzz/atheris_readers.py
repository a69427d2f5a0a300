#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris, libFuzzer for Python) of colibri's untrusted-input readers:
the tokenizer (colibri.tokenizer: vocabularies built from fuzzed tokens / merges / scores / types,
and encode / decode / stream-decode of fuzzed text and ids with real vocabularies), the GGUF
reader (colibri.gguf.GGUFFile, plus the tokenizer's own metadata parser) and the container
reader (colibri.container.ContainerFile), for a fixed time budget.

    pip install atheris            # or: pip install ".[fuzz]"
    python tools/fuzz/atheris_readers.py --seconds 60 [--target all|tokenizer|gguf|container]
                                         [--corpus DIR] [--artifacts DIR]

Allowed outcomes: success, or ValueError (GGUFError, ContainerError, UnsupportedModel...),
OSError, MemoryError, colibri.errors.ColibriError. Anything else (IndexError, KeyError,
TypeError, OverflowError, ...) and any crash is a finding: libFuzzer stops and writes the
input to --artifacts (crash-<sha1>); replay it with `python tools/fuzz/atheris_readers.py
--target T crash-...`. Seed inputs are the tiny models of colibri/tools/fuzz/seeds.py (their GGUF
bytes, and a dense model's container), so the fuzzer starts from valid files.

atheris 3.0 installs from PyPI as a wheel for CPython 3.11 on Linux x86-64 (tested here); where
it cannot install, this script stops with a message naming the package.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # the checkout's colibri when it is not installed
    sys.path.insert(0, ROOT)

try:
    import atheris
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("atheris_readers.py needs the 'atheris' package (pip install atheris, or pip install "
             "'.[fuzz]'); it could not be imported on this Python "
             f"({sys.version.split()[0]})")

with atheris.instrument_imports(include=["colibri"]):
    from colibri.container import ContainerFile
    from colibri.errors import ColibriError
    from colibri.gguf import GGUFFile
    from colibri.tokenizer import SUPPORTED_PRE, Tokenizer, VocabInfo, read_gguf_vocab

ALLOWED = (ValueError, OSError, MemoryError, ColibriError)
TARGETS = ("tokenizer", "gguf", "container")


class _State:
    path = ""
    target = "all"
    tokenizers: list[Tokenizer] = []


def _seed_corpus(corpus: str) -> None:
    """Write the seed inputs (valid GGUFs, a container, texts) into corpus once."""
    from colibri.tools.fuzz.seeds import gemma3, llama, write_seeds

    if os.listdir(corpus):
        return
    tmp = tempfile.mkdtemp(prefix="colibri-atheris-seeds-")
    paths = write_seeds(tmp, containers=False)
    dense = llama(os.path.join(tmp, "dense.gguf"))
    from colibri.container import convert

    cont = os.path.join(tmp, "dense.colibri")
    convert(dense, cont, progress=False)
    for i, pth in enumerate(list(paths.values()) + [gemma3(os.path.join(tmp, "g.gguf")), cont]):
        with open(pth, "rb") as f:
            data = f.read()
        for t in range(3):  # one copy per target selector byte
            with open(os.path.join(corpus, f"seed-{i}-{t}"), "wb") as out:
                out.write(bytes([t]) + data)
    for j, text in enumerate([b"hello world", "\u00fc\u20ac\U0001F600 the".encode(), b"\xff\xfe"]):
        with open(os.path.join(corpus, f"text-{j}"), "wb") as out:
            out.write(bytes([0, 0]) + text)


def _tokenizers() -> list[Tokenizer]:
    if not _State.tokenizers:
        from colibri.tools.fuzz.seeds import llama, qwen3moe

        tmp = tempfile.mkdtemp(prefix="colibri-atheris-tok-")
        _State.tokenizers = [Tokenizer.from_gguf(qwen3moe(os.path.join(tmp, "a.gguf"))),
                             Tokenizer.from_gguf(llama(os.path.join(tmp, "b.gguf")))]
    return _State.tokenizers


def fuzz_tokenizer(data: bytes) -> None:
    import numpy as np

    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeIntInRange(0, 1) == 0:
        toks = _tokenizers()
        tok = toks[fdp.ConsumeIntInRange(0, len(toks) - 1)]
    else:  # a vocabulary from the fuzzer
        model = ["llama", "gpt2", "gemma4"][fdp.ConsumeIntInRange(0, 2)]
        n = fdp.ConsumeIntInRange(0, 64)
        tokens = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 6)) for _ in range(n)]
        merges = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 6)) for _ in range(fdp.ConsumeIntInRange(0, 16))]
        scores = (np.array([fdp.ConsumeFloat() for _ in range(n)], np.float32)
                  if fdp.ConsumeBool() else None)
        types = (np.array([fdp.ConsumeIntInRange(-2, 8) for _ in range(n)], np.int32)
                 if fdp.ConsumeBool() else None)
        pres = ["", "x", *sorted(SUPPORTED_PRE)]  # every pre-tokenizer colibri reads
        pre = pres[fdp.ConsumeIntInRange(0, len(pres) - 1)]
        ids = [fdp.ConsumeIntInRange(-2, n + 2) for _ in range(2)]
        info = VocabInfo(model=model, pre=pre, tokens=tokens, scores=scores, token_types=types,
                         merges=merges, bos_id=ids[0], eos_id=ids[1],
                         add_bos=[None, True, False][fdp.ConsumeIntInRange(0, 2)],
                         add_space_prefix=[None, True, False][fdp.ConsumeIntInRange(0, 2)])
        try:
            tok = Tokenizer(info, errors=["strict", "replace"][fdp.ConsumeIntInRange(0, 1)])
        except ALLOWED:
            return
    special, parse = fdp.ConsumeBool(), fdp.ConsumeBool()
    if fdp.ConsumeBool():
        text: str | bytes = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 256))
    else:
        text = fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 128))
    try:
        ids = tok.encode(text, add_special=special, parse_special=parse)
        tok.decode(ids)
    except ALLOWED:
        pass
    raw_ids = [fdp.ConsumeIntInRange(-3, tok.vocab_size + 3) for _ in range(fdp.ConsumeIntInRange(0, 16))]
    try:
        tok.decode(raw_ids, special=fdp.ConsumeBool())
    except ALLOWED:
        pass
    sd = tok.stream(special=fdp.ConsumeBool())
    try:
        for i in raw_ids:
            sd.feed(i)
        sd.flush()
    except ALLOWED:
        pass


def _file(data: bytes) -> str:
    with open(_State.path, "wb") as f:
        f.write(data)
    return _State.path


def fuzz_gguf(data: bytes) -> None:
    path = _file(data)
    try:
        with GGUFFile(path) as g:
            for name in list(g.tensors)[:8]:
                g.data(name)[:64].sum()
    except ALLOWED:
        pass
    try:
        read_gguf_vocab(path)  # the tokenizer's checks over GGUFFile's metadata
    except ALLOWED:
        pass


def fuzz_container(data: bytes) -> None:
    path = _file(data)
    try:
        with ContainerFile(path, verify=len(data) < (1 << 20)) as c:
            for name in list(c.tensors)[:8]:
                c.data(name).sum()
            c.gguf_metadata_image()
    except ALLOWED:
        pass


def one_input(data: bytes) -> None:
    if not data:
        return
    target = TARGETS[data[0] % len(TARGETS)] if _State.target == "all" else _State.target
    body = data[1:]
    if target == "tokenizer":
        fuzz_tokenizer(body)
    elif target == "gguf":
        fuzz_gguf(body)
    else:
        fuzz_container(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], add_help=True)
    ap.add_argument("--seconds", type=int, default=60, help="time budget (libFuzzer -max_total_time)")
    ap.add_argument("--target", choices=("all",) + TARGETS, default="all")
    ap.add_argument("--corpus", default=None, help="corpus directory (default: a temporary one "
                    "seeded with colibri/tools/fuzz/seeds.py's models)")
    ap.add_argument("--artifacts", default="atheris-artifacts", help="where failing inputs go")
    args, rest = ap.parse_known_args()
    _State.target = args.target
    _State.path = os.path.join(tempfile.mkdtemp(prefix="colibri-atheris-"), "input.bin")
    corpus = args.corpus or tempfile.mkdtemp(prefix="colibri-atheris-corpus-")
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(args.artifacts, exist_ok=True)
    replay = [a for a in rest if not a.startswith("-")]
    if not replay:
        _seed_corpus(corpus)
    # libFuzzer's RSS limit reads the peak RSS, which a child inherits across fork and exec (a
    # test runner at 4 GB would trip it before the first input): 4 GiB on top of what we start at
    import resource

    start_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    libfuzzer = [sys.argv[0], f"-max_total_time={args.seconds}", f"-rss_limit_mb={4096 + start_mb}",
                 "-max_len=1048576", "-timeout=20",
                 f"-artifact_prefix={os.path.join(args.artifacts, '')}"]
    libfuzzer += rest if replay else rest + [corpus]
    atheris.Setup(libfuzzer, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
