"""The model fuzzer's cases: mutations of a GGUF `Doc` (metadata values, tokenizer arrays,
tensors, raw bytes, a container's header), and `make_case`, which derives case `index` of run
`seed` from those two numbers alone (so any case can be regenerated)."""

from __future__ import annotations

import math
import os
import random
import struct
from typing import Any

import numpy as np

from colibri.tools.fuzz.gguf_doc import (
    _FMT,
    ARR,
    BOOL,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    STR,
    U8,
    U16,
    U32,
    U64,
    Doc,
    _arch,
    _get,
    _set,
    load_doc,
    serialize,
)

INTS = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 255, 256, 4096, 65535, 2**31 - 1, 2**31,
        2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1, -1, -2, -(2**31), -(2**63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e-38, 1e-6, 1e30, 3.4e38, 1e300, float("nan"),
          float("inf"), float("-inf"), -1e-6, 2.0, 100.0]
PROMPTS = ["hello world", "the", "", " ", "a\u00fc\u20ac\U0001F600", "\x00\x01", "<s></s>",
           "hello " * 6, "x" * 40, "\u2581a", "\ufffd"]

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
        v: Any = rng.choice([-1, 0, nv - 1, nv, nv + 1, 2**31 - 1, 2**32 - 1, 2**63])
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
        from colibri.tools.fuzz.seeds import write_seeds

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
