#!/usr/bin/env python3
"""Fuzzing the whole model path: mutated GGUF files and colibri containers through
`colibri.model.Model(path, ...)` and one short generation each.

    python tools/fuzz/model_fuzz.py --cases 10000 [--seed 0] [--out fuzz-out]
    python tools/fuzz/model_fuzz.py --seconds 600
    python tools/fuzz/model_fuzz.py --replay fuzz-out/crashes/case-123.gguf

Every case is derived from (seed, case index) alone, so a run is reproducible and a case can be
regenerated (`--only 123`). Seeds are tiny runnable models (tools/fuzz/seeds.py: a qwen3moe MoE
with a SentencePiece vocabulary, a dense llama with byte-level BPE, biases and rope scaling, a
gemma3 with sliding windows and K-quants, and the qwen3moe as a colibri container). Mutations:

- metadata values: head counts, key/value lengths, embedding_length, block_count, rope
  (freq_base, dimension_count, scaling type/factor), norm epsilon, context length, expert
  counts, sliding window, softcaps, the architecture name - set to extreme numbers (0, -1,
  2^31, 2^64-1, NaN, inf, 1e-45, ...), retyped (float, string, bool, array), deleted;
- tokenizer arrays: tokens, scores, token types, merges, bos/eos ids, model / pre names
  (emptied, shortened, lengthened, duplicated, NaN scores, ids out of range, retyped);
- tensors: shapes (a dim zeroed, doubled, halved, swapped, one dropped or added), types
  (with the bytes kept, so inconsistent, or re-encoded so the file stays valid), NaN / inf /
  random bytes in the data, a tensor dropped or renamed;
- bytes: flips in the header, truncation, for containers header fields with the checksum
  recomputed (so the structural checks run).

Each case runs `Model(path, threads=1, ctx=32, max_batch=4)` and `generate(prompt,
max_tokens=2)` (greedy or seeded sampling, a random prompt). The outcome must be success or an
exception of an allowed class (ValueError - GGUFError, ContainerError, UnsupportedModel -,
OSError, MemoryError, ColibriError) raised from colibri's own code. Anything else is a failure:
another class (IndexError, KeyError, ZeroDivisionError, OverflowError, TypeError, ...), an
allowed class raised from inside numpy / gguf / the standard library or carrying one of their
generic messages (GENERIC_MESSAGES: a traceback from deep inside, not a message of ours), a crash (the batch's subprocess dies on a signal), or a hang
(a case over --timeout seconds). Cases run in worker subprocesses (--batch cases each); a
failing case's file and its description are saved under OUT/failures/ as a reproducer.
Prints a summary: cases, seconds, outcomes by exception class, failures, crashes, hangs.
Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

# GGUF value type codes
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
        U64: "<Q", I64: "<q", F64: "<d"}
_NAME2CODE = {"uint8": U8, "int8": I8, "uint16": U16, "int16": I16, "uint32": U32, "int32": I32,
              "float32": F32, "bool": BOOL, "string": STR, "uint64": U64, "int64": I64,
              "float64": F64}
_DT = {U8: np.uint8, I8: np.int8, U16: np.uint16, I16: np.int16, U32: np.uint32, I32: np.int32,
       F32: np.float32, BOOL: np.uint8, U64: np.uint64, I64: np.int64, F64: np.float64}

INTS = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 255, 256, 4096, 65535, 2**31 - 1, 2**31,
        2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1, -1, -2, -(2**31), -(2**63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e-38, 1e-6, 1e30, 3.4e38, 1e300, float("nan"),
          float("inf"), float("-inf"), -1e-6, 2.0, 100.0]
PROMPTS = ["hello world", "the", "", " ", "a\u00fc\u20ac\U0001F600", "\x00\x01", "<s></s>",
           "hello " * 6, "x" * 40, "\u2581a", "\ufffd"]
ALLOWED = ("ValueError", "OSError", "MemoryError", "ColibriError")
# Python's / numpy's own wording: an allowed class with one of these messages escaped from a
# builtin or numpy call in colibri's code without a check of its own, so it names nothing
GENERIC_MESSAGES = ("truth value of an array", "math domain error", "invalid literal for int",
                    "could not convert", "cannot convert float", "zero-size array",
                    "division by zero", "only 0-dimensional", "setting an array element",
                    "cannot reshape", "operands could not be broadcast", "out of bounds for",
                    "not enough values to unpack", "too many values to unpack",
                    "negative dimensions", "Maximum allowed dimension", "index out of range")

SEED_KEYS = ["embedding_length", "block_count", "attention.head_count",
             "attention.head_count_kv", "attention.key_length", "attention.value_length",
             "attention.layer_norm_rms_epsilon", "context_length", "rope.freq_base",
             "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor", "expert_count",
             "expert_used_count", "expert_feed_forward_length", "attention.sliding_window",
             "final_logit_softcapping", "attn_logit_softcapping", "feed_forward_length"]
TOK_KEYS = ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"]


# ---- a GGUF model as editable data, and its serializer (no validation: it writes anything) ----

@dataclass
class Tensor:
    name: str
    shape: list[int]  # GGUF order (ne0 first)
    type: int
    data: bytes


@dataclass
class Doc:
    kvs: list[tuple[str, int, Any]]  # (key, type code, value); arrays: (itype, list/ndarray)
    tensors: list[Tensor]
    version: int = 3
    alignment: int = 32
    notes: list[str] = field(default_factory=list)


def load_doc(path: str) -> Doc:
    from colibri.gguf import GGUFFile

    kvs: list[tuple[str, int, Any]] = []
    with GGUFFile(path) as g:
        for k, v in g.metadata.items():
            t = g.metadata_types[k]
            if t.startswith("array["):
                inner = t[6:-1]
                kvs.append((k, ARR, (_NAME2CODE[inner], v if inner == "string" else np.array(v))))
            else:
                kvs.append((k, _NAME2CODE[t], v))
        tensors = [Tensor(t.name, list(t.shape), t.type, bytes(g.data(t.name)))
                   for t in sorted(g.tensors.values(), key=lambda t: t.offset)]
    return Doc(kvs, tensors)


def _enc_str(s: str | bytes) -> bytes:
    b = s if isinstance(s, bytes) else s.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(b)) + b


def _enc_value(code: int, v: Any) -> bytes:
    if code == STR:
        return _enc_str(v)
    if code == ARR:
        itype, items = v
        if itype == STR:
            return struct.pack("<IQ", STR, len(items)) + b"".join(_enc_str(s) for s in items)
        if itype == ARR:
            return struct.pack("<IQ", ARR, len(items)) + b"".join(_enc_value(ARR, x) for x in items)
        with np.errstate(all="ignore"):
            vals = [x if not (isinstance(x, float) and not math.isfinite(x)) or itype in (F32, F64)
                    else 0 for x in items] if not isinstance(items, np.ndarray) else items
            if itype in (F32, F64):
                arr = np.asarray(vals, dtype=np.float64).astype(_DT[itype])
            else:
                arr = np.array([int(x) % (1 << 64) for x in np.asarray(vals).ravel().tolist()],
                               dtype=np.uint64).astype(_DT[itype])
        return struct.pack("<IQ", itype, arr.size) + arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    fmt = _FMT[code]
    if code in (F32, F64):
        with np.errstate(all="ignore"):
            return np.array([float(v)], dtype="<f4" if code == F32 else "<f8").tobytes()
    bits = struct.calcsize(fmt) * 8
    iv = int(v) if not (isinstance(v, float) and not math.isfinite(v)) else 0
    if fmt[1].isupper():
        iv %= 1 << bits
    else:
        iv = (iv + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    return struct.pack(fmt, iv)


def serialize(doc: Doc) -> bytes:
    out = [b"GGUF", struct.pack("<IQQ", doc.version, len(doc.tensors), len(doc.kvs))]
    for k, code, v in doc.kvs:
        out.append(_enc_str(k) + struct.pack("<I", code) + _enc_value(code, v))
    offsets = []
    pos = 0
    for t in doc.tensors:
        pos = -(-pos // doc.alignment) * doc.alignment
        offsets.append(pos)
        pos += len(t.data)
    for t, off in zip(doc.tensors, offsets, strict=True):
        out.append(_enc_str(t.name) + struct.pack("<I", len(t.shape))
                   + b"".join(struct.pack("<Q", d % (1 << 64)) for d in t.shape)
                   + struct.pack("<IQ", t.type, off))
    head = b"".join(out)
    head += bytes(-len(head) % doc.alignment)
    body = bytearray(pos)
    for t, off in zip(doc.tensors, offsets, strict=True):
        body[off:off + len(t.data)] = t.data
    return head + bytes(body)


# ---- mutations ----

def _arch(doc: Doc) -> str:
    for k, _, v in doc.kvs:
        if k == "general.architecture":
            return str(v)
    return "llama"


def _set(doc: Doc, key: str, code: int, value: Any) -> None:
    for i, (k, _, _) in enumerate(doc.kvs):
        if k == key:
            doc.kvs[i] = (key, code, value)
            return
    doc.kvs.append((key, code, value))


def _get(doc: Doc, key: str) -> tuple[int, Any] | None:
    for k, c, v in doc.kvs:
        if k == key:
            return c, v
    return None


def _random_value(rng: random.Random) -> tuple[int, Any]:
    r = rng.random()
    if r < 0.45:
        v = rng.choice(INTS)
        code = rng.choice([U32, I32, U64, I64, U16, I8]) if v >= 0 else rng.choice([I32, I64])
        return code, v
    if r < 0.75:
        return rng.choice([F32, F64]), rng.choice(FLOATS)
    if r < 0.85:
        return STR, rng.choice(["", "none", "linear", "yarn", "llama", "gpt2", "x" * 300, "1e9"])
    if r < 0.92:
        return BOOL, rng.random() < 0.5
    n = rng.choice([0, 1, 2, 5, 64])
    return ARR, (rng.choice([U32, I32, F32]), np.array([rng.choice(INTS[:12]) for _ in range(n)]))


def _scaled(v: Any, rng: random.Random) -> Any:
    if isinstance(v, float):
        return rng.choice([v * 2, v / 2, -v, v + 1e-3, float("nan"), 0.0])
    iv = int(v)
    return rng.choice([iv + 1, iv - 1, iv * 2, iv // 2, 0, iv * 1000, -iv])


def mut_metadata(doc: Doc, rng: random.Random) -> None:
    arch = _arch(doc)
    key = f"{arch}.{rng.choice(SEED_KEYS)}" if rng.random() < 0.85 else rng.choice(
        [k for k, _, _ in doc.kvs])
    cur = _get(doc, key)
    r = rng.random()
    if r < 0.1 and cur is not None:
        doc.kvs = [kv for kv in doc.kvs if kv[0] != key]
        doc.notes.append(f"delete {key}")
        return
    if r < 0.45 and cur is not None and cur[0] in _FMT:
        code, v = cur
        nv = _scaled(v, rng)
        if code not in (F32, F64):
            code = rng.choice([code, I32, I64]) if nv < 0 else code
        _set(doc, key, code, nv)
        doc.notes.append(f"{key} = {nv!r} ({code})")
        return
    if r < 0.55:
        bc = _get(doc, f"{arch}.block_count")
        n = int(bc[1]) if bc is not None and isinstance(bc[1], int | np.integer) else 2
        n = max(0, min(n, 8))
        vals = np.array([rng.choice(INTS[:14]) for _ in range(rng.choice([n, n + 1, 1, 0]))])
        _set(doc, key, ARR, (rng.choice([U32, I32, F32, BOOL]), vals))
        doc.notes.append(f"{key} = array {vals.tolist()}")
        return
    code, v = _random_value(rng)
    _set(doc, key, code, v)
    doc.notes.append(f"{key} = {v!r} (type {code})")


def mut_tokenizer(doc: Doc, rng: random.Random) -> None:
    key = rng.choice(TOK_KEYS)
    cur = _get(doc, key)
    r = rng.random()
    if cur is not None and r < 0.15:
        doc.kvs = [kv for kv in doc.kvs if kv[0] != key]
        doc.notes.append(f"delete {key}")
        return
    if cur is not None and cur[0] == ARR and r < 0.8:
        itype, items = cur[1]
        items = list(items)
        n = len(items)
        op = rng.randrange(9)
        if op == 0:
            items = items[:rng.randrange(n + 1)]
        elif op == 1:
            items = items + items[:rng.randrange(1, 40)]
        elif op == 2 and n:
            i = rng.randrange(n)
            items[i] = items[rng.randrange(n)]
        elif op == 3 and n:
            i = rng.randrange(n)
            if itype == STR:
                items[i] = rng.choice(["", " ", "a b c", "\u2581", "<0xZZ>", "<0x100>", "x" * 5000,
                                       "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
                                       "a  b", "Ġ Ġ", " a", "a "])
            else:
                items[i] = rng.choice(INTS + FLOATS)
        elif op == 4:
            items = []
        elif op == 5 and itype != STR:
            itype = rng.choice([U8, I8, I16, U32, I32, F32, F64, U64, I64, BOOL])
        elif op == 6 and itype != STR:
            items = [rng.choice(INTS + FLOATS) for _ in range(n)]
        elif op == 7 and itype == STR:
            rng.shuffle(items)
        else:
            itype = STR if itype != STR else U32
            items = [str(x) for x in items] if itype == STR else [rng.choice(INTS[:10]) for _ in items]
        if itype in (F32, F64):
            val: Any = np.array([float(x) for x in items], dtype=np.float64)
        elif itype == STR:
            val = items
        else:
            val = np.array([int(x) if not (isinstance(x, float) and not math.isfinite(x)) else 0
                            for x in items], dtype=object)
        _set(doc, key, ARR, (itype, val))
        doc.notes.append(f"{key}: op {op}, {len(items)} items, itype {itype}")
        return
    if key.endswith("_id"):
        voc = _get(doc, "tokenizer.ggml.tokens")
        nv = len(voc[1][1]) if voc and voc[0] == ARR else 10
        v = rng.choice([-1, 0, nv - 1, nv, nv + 1, 2**31 - 1, 2**32 - 1, 2**63])
        code = rng.choice([U32, I32, U64, I64, F32, STR])
        _set(doc, key, code, v if code != STR else str(v))
    else:
        code, v = _random_value(rng)
        if key.endswith((".model", ".pre")) and rng.random() < 0.6:
            code, v = STR, rng.choice(["llama", "gpt2", "bert", "", "llama3", "qwen2", "default",
                                       "gemma4", "t5", "llama-bpe"])
        _set(doc, key, code, v)
    doc.notes.append(f"{key} = {v!r}")


_BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
          8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210), 39: (32, 17)}


def _nbytes(shape: list[int], ttype: int) -> int | None:
    bs = _BLOCK.get(ttype)
    if bs is None or not shape or any(d <= 0 for d in shape) or shape[0] % bs[0]:
        return None
    n = 1
    for d in shape:
        n *= d
    if n > 1 << 24:
        return None
    return n // bs[0] * bs[1]


def mut_tensor(doc: Doc, rng: random.Random) -> None:
    if not doc.tensors:
        return
    i = rng.randrange(len(doc.tensors))
    t = doc.tensors[i]
    op = rng.randrange(10)
    if op == 0:  # a dim changed, data kept (inconsistent unless sizes happen to match)
        d = rng.randrange(len(t.shape))
        t.shape[d] = rng.choice([0, 1, t.shape[d] * 2, max(1, t.shape[d] // 2), t.shape[d] + 1,
                                 2**32, 2**40, 2**63])
    elif op == 1:  # a dim changed and the data resized to match: a valid file, a wrong model
        d = rng.randrange(len(t.shape))
        new = rng.choice([1, 2, t.shape[d] * 2, max(1, t.shape[d] // 2), t.shape[d] + 32, 32, 256])
        shape = list(t.shape)
        shape[d] = new
        nb = _nbytes(shape, t.type)
        if nb is not None:
            t.shape, t.data = shape, bytes(rng.getrandbits(8) for _ in range(min(nb, 64))) * (
                nb // 64) + bytes(nb % 64)
    elif op == 2 and len(t.shape) > 1:
        t.shape = t.shape[::-1]
    elif op == 3:
        if len(t.shape) > 1 and rng.random() < 0.5:
            t.shape = t.shape[:-1]
        else:
            t.shape = t.shape + [rng.choice([1, 2])]
    elif op == 4:  # type changed, bytes kept
        t.type = rng.choice(list(_BLOCK) + [4, 5, 10, 11, 16, 99, 2**31])
    elif op == 5:  # type changed and re-sized (random bytes)
        ty = rng.choice(list(_BLOCK))
        nb = _nbytes(t.shape, ty)
        if nb is not None:
            t.type, t.data = ty, np.random.default_rng(rng.getrandbits(32)).integers(
                0, 256, nb, dtype=np.uint8).tobytes()
    elif op == 6:  # special floats into the data
        b = bytearray(t.data)
        val = rng.choice([float("nan"), float("inf"), -float("inf"), 6e4, 1e38, 0.0])
        pat = struct.pack("<f", val) if t.type == 0 else struct.pack("<e", val if abs(val) < 7e4 or
                                                                       not math.isfinite(val) else 6e4)
        for _ in range(rng.randrange(1, 9)):
            j = rng.randrange(max(1, len(b) - len(pat)))
            b[j:j + len(pat)] = pat
        if rng.random() < 0.2:  # everything
            b = bytearray(pat * (len(b) // len(pat)) + bytes(len(b) % len(pat)))
        t.data = bytes(b)
    elif op == 7:
        del doc.tensors[i]
    elif op == 8:
        t.name = rng.choice([t.name + "x", t.name.replace("blk.0", "blk.9"), "", t.name.upper(),
                             doc.tensors[rng.randrange(len(doc.tensors))].name])
    else:  # random bytes
        t.data = np.random.default_rng(rng.getrandbits(32)).integers(
            0, 256, len(t.data), dtype=np.uint8).tobytes()
    doc.notes.append(f"tensor {t.name!r} op {op} -> shape {t.shape} type {t.type}")


def mut_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    op = rng.randrange(3)
    if op == 0:
        hdr = min(len(b), 4096)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(hdr)] = rng.randrange(256)
    elif op == 1:
        b = b[:rng.randrange(len(b) + 1)]
    else:
        pos = rng.randrange(min(len(b), 8192))
        w = rng.choice([1, 4, 8])
        b[pos:pos + w] = (rng.choice(INTS) % (1 << (8 * w))).to_bytes(w, "little")
    return bytes(b)


# ---- cases ----

class Seeds:
    def __init__(self, workdir: str) -> None:
        from seeds import write_seeds

        self.paths = write_seeds(os.path.join(workdir, "seeds"), containers=False)
        self.docs = {k: load_doc(p) for k, p in self.paths.items()}

    def names(self) -> list[str]:
        return sorted(self.docs)


def make_case(seeds: Seeds, seed: int, index: int, workdir: str) -> tuple[str, dict[str, Any]]:
    """Write case `index` of run `seed` into workdir; returns (path, description)."""
    import copy

    rng = random.Random(seed * 1_000_003 + index)
    name = rng.choice(seeds.names())
    doc = copy.deepcopy(seeds.docs[name])
    container = rng.random() < 0.25
    kinds = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        k = rng.choices(["meta", "tok", "tensor", "bytes"], [45, 25, 25, 5 if not container else 0])[0]
        kinds.append(k)
        if k == "meta":
            mut_metadata(doc, rng)
        elif k == "tok":
            mut_tokenizer(doc, rng)
        elif k == "tensor":
            mut_tensor(doc, rng)
    data = serialize(doc)
    if "bytes" in kinds:
        data = mut_bytes(data, rng)
        doc.notes.append("byte mutation")
    gpath = os.path.join(workdir, "case.gguf")
    with open(gpath, "wb") as f:
        f.write(data)
    desc: dict[str, Any] = {"seed": seed, "index": index, "base": name, "kinds": kinds,
                            "notes": doc.notes, "container": False}
    path = gpath
    if container:
        from colibri.container import convert

        cpath = os.path.join(workdir, "case.colibri")
        try:
            if os.path.exists(cpath):
                os.unlink(cpath)
            convert(gpath, cpath, progress=False, verify=False, check_model=False)
            path = cpath
            desc["container"] = True
            if rng.random() < 0.3:
                _mutate_container(cpath, rng, doc.notes)
        except (ValueError, OSError):
            desc["notes"].append("conversion refused: the GGUF itself is the case")
    desc["prompt"] = rng.choice(PROMPTS)
    desc["temperature"] = rng.choice([0.0, 0.0, 0.8, 1.5])
    desc["expert_mode"] = rng.choice([None, None, "cache", "mmap"])
    return path, desc


def _mutate_container(path: str, rng: random.Random, notes: list[str]) -> None:
    """Overwrite a header field / flip a header byte, then fix the header crc32 (so the
    container's structural checks, not the checksum, meet it)."""
    import zlib

    with open(path, "r+b") as f:
        head = bytearray(f.read(64))
        (hbytes,) = struct.unpack_from("<Q", head, 8)
        if hbytes > 1 << 24:
            return
        header = bytearray(f.read(hbytes))
        if not header:
            return
        pos = rng.randrange(len(header))
        w = rng.choice([1, 4, 8])
        header[pos:pos + w] = (rng.choice(INTS) % (1 << (8 * w))).to_bytes(w, "little")[:len(header) - pos]
        crc = zlib.crc32(bytes(header), zlib.crc32(bytes(head[:24])))
        struct.pack_into("<I", head, 24, crc)
        f.seek(0)
        f.write(head + header[:hbytes])
    notes.append(f"container header byte {pos} width {w} overwritten, crc fixed")


_PKG = os.path.join(ROOT, "colibri") + os.sep


def run_case(path: str, desc: dict[str, Any]) -> tuple[str, str, str]:
    """(outcome, exception class, message): outcome is ok, allowed or unexpected."""
    from colibri.model import Model

    try:
        m = Model(path, threads=1, ctx=32, max_batch=4, expert_mode=desc["expert_mode"],
                  expert_budget=None)
        try:
            m.generate(desc["prompt"], max_tokens=2, temperature=desc["temperature"], seed=1)
        finally:
            m.close()
    except Exception as e:  # noqa: BLE001 - the point is to classify everything
        cls = type(e)
        names = [c.__name__ for c in cls.__mro__]
        allowed = next((a for a in ALLOWED if a in names), None)
        tb = traceback.extract_tb(e.__traceback__)
        origin = tb[-1].filename if tb else ""
        ours = origin.startswith((_PKG, "colibri/"))
        msg = f"{e}"[:300]
        generic = any(g in msg for g in GENERIC_MESSAGES)
        if allowed is None or not ours or not msg or generic:
            detail = "".join(traceback.format_exception(e)[-6:])
            return "unexpected", cls.__name__, f"{msg} | raised at {origin}:{tb[-1].lineno if tb else 0}\n{detail}"
        return "allowed", cls.__name__, msg
    return "ok", "", ""


# ---- worker and driver ----

def worker(args: argparse.Namespace) -> int:
    os.makedirs(args.workdir, exist_ok=True)
    seeds = Seeds(args.workdir)
    out = sys.stdout
    for i in range(args.start, args.end):
        try:
            path, desc = make_case(seeds, args.seed, i, args.workdir)
        except Exception as e:  # noqa: BLE001 - a bug of this generator, reported as such
            msg = f"{type(e).__name__}: {e}".replace("\t", " ").replace("\n", " ")
            out.write(f"start\t{i}\ndone\t{i}\tgenerator\tGENERATOR-BUG\t{msg}\n")
            out.flush()
            continue
        with open(os.path.join(args.workdir, "current.json"), "w") as f:
            json.dump({"path": path, **desc}, f)
        out.write(f"start\t{i}\n")
        out.flush()
        if os.environ.get("COLIBRI_FUZZ_SELFTEST") == f"crash:{i}":  # the harness's own test
            os.kill(os.getpid(), signal.SIGSEGV)
        if os.environ.get("COLIBRI_FUZZ_SELFTEST") == f"hang:{i}":
            time.sleep(3600)
        outcome, cls, msg = run_case(path, desc)
        if outcome == "unexpected":
            _save(args.out, i, path, desc, f"{cls}: {msg}")
        out.write("done\t{}\t{}\t{}\t{}\n".format(i, outcome, cls, msg.split("\n")[0].replace("\t", " ")))
        out.flush()
    out.write("end\n")
    out.flush()
    return 0


def _save(out: str, index: int, path: str, desc: dict[str, Any], why: str) -> str:
    d = os.path.join(out, "failures")
    os.makedirs(d, exist_ok=True)
    ext = os.path.splitext(path)[1]
    dst = os.path.join(d, f"case-{desc.get('seed', 0)}-{index}{ext}")
    try:
        shutil.copyfile(path, dst)
    except OSError:
        pass
    with open(dst + ".json", "w") as f:
        json.dump({**desc, "why": why}, f, indent=1)
    return dst


@dataclass
class Summary:
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)
    messages: dict[str, Counter[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    crashes: int = 0
    hangs: int = 0
    unexpected: int = 0


def drive(seed: int, start: int, cases: int | None, seconds: float | None, batch: int,
          timeout: float, out: str, verbose: bool = False) -> Summary:
    s = Summary()
    t_end = time.monotonic() + seconds if seconds else None
    workdir = tempfile.mkdtemp(prefix="colibri-fuzz-")
    nxt = start
    stop = start + cases if cases is not None else None
    try:
        while (stop is None or nxt < stop) and (t_end is None or time.monotonic() < t_end):
            end = nxt + batch if stop is None else min(stop, nxt + batch)
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(seed),
                   "--start", str(nxt), "--end", str(end), "--workdir", workdir, "--out", out]
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            assert p.stdout is not None
            current = None
            buf = b""
            deadline = time.monotonic() + 120  # seeds + imports
            finished = hung = False
            while not finished:
                r, _, _ = select.select([p.stdout], [], [], 0.5)
                if r:
                    chunk = os.read(p.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        parts = line.decode("utf-8", "replace").split("\t")
                        if parts[0] == "start":
                            current = int(parts[1])
                            deadline = time.monotonic() + timeout
                        elif parts[0] == "done":
                            _record(s, parts, verbose)
                            current = None
                        elif parts[0] == "end":
                            finished = True
                elif p.poll() is not None:
                    break
                if not finished and time.monotonic() > deadline:
                    p.kill()
                    hung = True
                    break
            rc = p.wait()
            err = p.stderr.read().decode("utf-8", "replace") if p.stderr else ""
            if finished:
                nxt = end
                continue
            if current is None:
                raise RuntimeError(f"fuzz worker failed outside a case (rc {rc}):\n{err[-4000:]}")
            s.cases += 1
            if hung:
                s.hangs += 1
                s.classes["HANG"] += 1
                s.failures.append(f"case {current}: hang (over {timeout} s): "
                                  f"{_save_current(workdir, out, current, 'hang')}")
            else:
                s.crashes += 1
                s.classes[f"CRASH(rc={rc})"] += 1
                why = f"crash, exit status {rc}: {err[-2000:]}"
                s.failures.append(f"case {current}: {why[:300]} -> "
                                  f"{_save_current(workdir, out, current, why)}")
            nxt = current + 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return s


def _record(s: Summary, parts: list[str], verbose: bool) -> None:
    i, outcome, cls, msg = int(parts[1]), parts[2], parts[3], "\t".join(parts[4:])
    s.cases += 1
    s.outcomes[outcome] += 1
    key = cls or "ok"
    s.classes[key] += 1
    s.messages.setdefault(key, Counter())[msg[:90]] += 1
    if outcome == "unexpected":
        s.unexpected += 1
        s.failures.append(f"case {i}: {cls}: {msg}")
    if verbose:
        print(f"{i} {outcome} {cls} {msg[:120]}", flush=True)


def _save_current(workdir: str, out: str, index: int, why: str) -> str:
    try:
        with open(os.path.join(workdir, "current.json")) as f:
            desc = json.load(f)
    except (OSError, ValueError):
        desc = {"index": index}
    return _save(out, index, desc.get("path", ""), desc, why)


def print_summary(s: Summary, seconds: float, file: Any = sys.stdout) -> None:
    print(f"cases: {s.cases} in {seconds:.1f} s ({s.cases / max(seconds, 1e-9):.0f}/s)", file=file)
    print(f"outcomes: ok {s.outcomes['ok']}, allowed exceptions {s.outcomes['allowed']}, "
          f"unexpected exceptions {s.unexpected}, crashes {s.crashes}, hangs {s.hangs}", file=file)
    print("by class:", file=file)
    for cls, n in s.classes.most_common():
        print(f"  {cls:28s} {n:7d}", file=file)
        for msg, k in (s.messages.get(cls) or Counter()).most_common(3):
            if msg:
                print(f"      {k:6d}  {msg}", file=file)
    for f in s.failures[:30]:
        print(f"FAIL {f[:500]}", file=file)


def replay(path: str, desc_path: str | None) -> int:
    desc = {"prompt": "hello world", "temperature": 0.0, "expert_mode": None}
    if desc_path or os.path.exists(path + ".json"):
        with open(desc_path or path + ".json") as f:
            desc.update({k: v for k, v in json.load(f).items() if k in desc})
    outcome, cls, msg = run_case(path, desc)
    print(outcome, cls, msg)
    return 0 if outcome != "unexpected" else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="number of cases (default 1000 "
                    "without --seconds)")
    ap.add_argument("--seconds", type=float, default=None, help="time budget instead of a count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--batch", type=int, default=500, help="cases per worker subprocess")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it "
                    "counts as a hang")
    ap.add_argument("--out", default="fuzz-out", help="where failing cases are saved")
    ap.add_argument("--only", type=int, default=None, help="run (and keep) one case by index")
    ap.add_argument("--replay", default=None, help="run one saved case file")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.replay:
        return replay(args.replay, None)
    if args.only is not None:
        d = tempfile.mkdtemp(prefix="colibri-fuzz-one-")
        path, desc = make_case(Seeds(d), args.seed, args.only, d)
        print(json.dumps(desc, indent=1))
        outcome, cls, msg = run_case(path, desc)
        print(outcome, cls, msg)
        saved = _save(args.out, args.only, path, desc, f"{outcome} {cls}: {msg}")
        print(f"case saved as {saved}")
        return 0 if outcome != "unexpected" else 1
    cases = args.cases if args.cases is not None or args.seconds else 1000
    t0 = time.monotonic()
    s = drive(args.seed, args.start, cases, args.seconds, args.batch, args.timeout, args.out,
              args.verbose)
    print_summary(s, time.monotonic() - t0)
    return 1 if (s.unexpected or s.crashes or s.hangs) else 0


if __name__ == "__main__":
    sys.exit(main())
