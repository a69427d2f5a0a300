"""What the reference recorders and agreement checks share: log-probabilities, the KL over a
recorded top-k, the common length of two continuations, and a GGUF writer that starts as a
copy of another file's metadata (tests/family_refs.py, colibri.tools.lowbit_refs,
colibri.tools.quant_accuracy)."""

from __future__ import annotations

from typing import Any

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_top(ref_ids: np.ndarray, ref_lp: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """KL(ref || ours) per position over the reference's top tokens plus one bucket for the
    rest of the vocabulary (a lower bound of the full KL: data-processing inequality)."""
    p = np.exp(ref_lp.astype(np.float64))
    q_top = np.take_along_axis(lp, ref_ids.astype(np.int64), axis=1)
    p_rest = np.clip(1.0 - p.sum(axis=1), 1e-12, 1.0)
    q_rest = np.clip(1.0 - np.exp(q_top).sum(axis=1), 1e-12, 1.0)
    return (p * (ref_lp - q_top)).sum(axis=1) + p_rest * (np.log(p_rest) - np.log(q_rest))


def matched(a: list[int], b: list[int]) -> int:
    """How many leading tokens two continuations share."""
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def writer_like(src: Any, dst: Any, skip: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """(gguf.GGUFReader of src, gguf.GGUFWriter of dst holding src's metadata, every key but
    the names in skip): the caller adds the tensors and writes the file."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), str(r.fields["general.architecture"].contents()))
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in skip:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    return r, w
