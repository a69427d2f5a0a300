"""The tokenizer tests' recorded data (tests/data/tokenizer/, written by
tools/record_tokenizer_refs.py): the corpus and llama.cpp's recordings, packed as flat arrays
with offsets."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "tokenizer"


def load_corpus() -> list[str]:
    with gzip.open(DATA / "corpus.json.gz", "rt", encoding="utf-8") as f:
        lines = json.load(f)
    assert len(lines) >= 10_000
    return lines


def load_refs(file: str) -> dict[str, np.ndarray]:
    with np.load(DATA / file) as z:
        return {k: z[k] for k in z.files}


def id_lists(refs: dict[str, np.ndarray], name: str) -> list[np.ndarray]:
    """The lists of ids stored as NAME_ids (flat) and NAME_offsets."""
    ids, off = refs[name + "_ids"], refs[name + "_offsets"]
    return [ids[off[i]:off[i + 1]].astype(np.int32) for i in range(len(off) - 1)]


def byte_strings(refs: dict[str, np.ndarray], name: str,
                 offsets: str | None = None) -> list[bytes]:
    """The byte strings stored as NAME (one blob) and NAME_offsets (or `offsets`)."""
    blob, off = refs[name].tobytes(), refs[offsets or name + "_offsets"]
    return [blob[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def write_family(f: dict[str, Any], path: Path) -> None:
    """The vocabulary-only GGUF of a family spec of eog_refs.json (tools/record_eog_refs.py):
    model, pre, tokens, types, ids (tokenizer.ggml.KEY_token_id -> id); merges: False for none."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(f["model"])
    w.add_tokenizer_pre(f["pre"])
    w.add_token_list(f["tokens"])
    w.add_token_types(f["types"])
    if f["model"] == "llama":
        w.add_token_scores([0.0] * len(f["tokens"]))
    elif f.get("merges", True):
        w.add_token_merges(["w 0", "w 1"])
    for key, v in f["ids"].items():
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", int(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
