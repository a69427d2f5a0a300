"""The iteration order of llama.cpp's token_to_id map (std::unordered_map<std::string, llama_token>,
filled with the tokens in id order), which decides a detail of its special-token rules: when a
vocabulary holds two texts of one kind (say "<|fim_pad|>" and "<PAD>") and no metadata names the
kind, llama.cpp takes the first of them in that order.

libstdc++ (GCC 12, which builds llama-cpp-python's llama.cpp here): std::hash<std::string> is
_Hash_bytes (a MurmurHash2 variant, seed 0xc70f6907); a node joins the front of its bucket's run,
and a bucket that was empty goes to the front of the list; a rehash walks the list in order and
re-inserts the same way. The bucket counts (REHASH) were measured from std::unordered_map's
bucket_count() after each insertion. tests/core/test_tokenizer_eog.py checks the result against
llama.cpp on vocabularies whose sizes cross several rehashes."""

from __future__ import annotations

from collections.abc import Sequence

_M64 = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907

# (number of elements whose insertion grows the table, its new bucket count)
REHASH = {1: 13, 14: 29, 30: 59, 60: 127, 128: 257, 258: 541, 542: 1109, 1110: 2357, 2358: 5087,
          5088: 10273, 10274: 20753, 20754: 42043, 42044: 85229, 85230: 172933, 172934: 351061,
          351062: 712697, 712698: 1447153, 1447154: 2938679, 2938680: 5967347, 5967348: 12117689,
          12117690: 24607243}


def stl_hash(b: bytes) -> int:
    """std::hash<std::string> of libstdc++ on 64-bit Linux."""
    n = len(b)
    h = (_SEED ^ (n * _MUL)) & _M64
    aligned = n & ~7
    for i in range(0, aligned, 8):
        d = (int.from_bytes(b[i:i + 8], "little") * _MUL) & _M64
        d = ((d ^ (d >> 47)) * _MUL) & _M64
        h = ((h ^ d) * _MUL) & _M64
    if n & 7:
        h = ((h ^ int.from_bytes(b[aligned:], "little")) * _MUL) & _M64
    h = (h ^ (h >> 47)) * _MUL & _M64
    return h ^ (h >> 47)


def map_order(tokens: Sequence[bytes]) -> list[int]:
    """The ids in the order llama.cpp's token_to_id iterates them (tokens distinct)."""
    hashes = [stl_hash(t) for t in tokens]
    n_buckets = 1
    first_seen: list[int] = []          # buckets, in the order they became non-empty
    runs: dict[int, list[int]] = {}     # bucket -> its nodes, in the order they joined
    for i, h in enumerate(hashes):
        grown = REHASH.get(i + 1)
        if grown is not None:
            walk = [x for b in reversed(first_seen) for x in reversed(runs[b])]
            n_buckets, first_seen, runs = grown, [], {}
            for x in walk:
                b = hashes[x] % n_buckets
                if b not in runs:
                    runs[b] = []
                    first_seen.append(b)
                runs[b].append(x)
        b = h % n_buckets
        if b not in runs:
            runs[b] = []
            first_seen.append(b)
        runs[b].append(i)
    return [x for b in reversed(first_seen) for x in reversed(runs[b])]
