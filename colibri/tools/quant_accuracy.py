"""How far a quantized model's logits sit from the exact product of its weights: colibri and
llama.cpp against colibri's `dequantize=True` evaluation of the same file (every weight
dequantized to float32, activations never rounded), over one text, teacher-forced.

Per file and per weight type: a type's figures come from a copy of the file in which only the
matrices of that type stay quantized (every other tensor dequantized to F32, which both engines
multiply in float32), so the error left is that type's activation rounding alone; the reference
is the same for every copy (dequantization does not depend on which tensors were kept).

Measures, per position over the whole vocabulary, in float64: KL(reference || engine) and
whether both put the same token first (top-1 agreement). The code behind
`tools/bench/quant_accuracy.py`; tests use `kl_top1`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.tools.refs import log_softmax, writer_like

# the 2-D weight types whose copies are measured, in this order (others are reported as found)
GGML_F32 = 0


@dataclass
class Figures:
    kl: float  # mean KL(reference || engine), nats per position
    top1: float  # share of positions where the engine's first token is the reference's
    n: int  # positions

    def __str__(self) -> str:
        return f"KL {self.kl:.5f}  top-1 {self.top1:.2%}"


def kl_top1(ref_logits: np.ndarray, logits: np.ndarray, chunk: int = 64) -> Figures:
    """Mean KL(softmax(ref) || softmax(logits)) over rows, and the share of rows with the same
    argmax; both [n, vocab], any float dtype."""
    if ref_logits.shape != logits.shape or ref_logits.ndim != 2:
        raise ValueError(f"shapes differ: {ref_logits.shape} vs {logits.shape}")
    n = ref_logits.shape[0]
    kl = 0.0
    agree = 0
    for i in range(0, n, chunk):
        p = log_softmax(ref_logits[i:i + chunk])
        q = log_softmax(logits[i:i + chunk])
        kl += float((np.exp(p) * (p - q)).sum())
        agree += int((p.argmax(axis=1) == q.argmax(axis=1)).sum())
    return Figures(kl / n, agree / n, n)


def tensor_types(path: str) -> dict[str, int]:
    """name -> GGML type of every tensor of a GGUF."""
    from colibri.gguf import GGUFFile

    gf = GGUFFile(path)
    try:
        return {name: int(t.type) for name, t in gf.tensors.items()}
    finally:
        gf.close()


def matrix_types(path: str) -> dict[int, int]:
    """GGML type -> number of values in 2-D tensors of that type (F32 left out)."""
    from colibri.gguf import GGUFFile

    gf = GGUFFile(path)
    try:
        out: dict[int, int] = {}
        for t in gf.tensors.values():
            if len(t.shape) >= 2 and int(t.type) != GGML_F32:
                out[int(t.type)] = out.get(int(t.type), 0) + int(t.n_elements)
        return out
    finally:
        gf.close()


def type_name(t: int) -> str:
    import gguf

    return gguf.GGMLQuantizationType(t).name


def write_partial(src: str, dst: str, keep: Callable[[str, int], bool]) -> None:
    """Copy a GGUF with every tensor for which keep(name, type) is false dequantized to F32
    (gguf-py's dequantizers; metadata unchanged)."""
    import gguf

    r, w = writer_like(src, dst)
    for t in r.tensors:
        if keep(t.name, int(t.tensor_type)):
            shape = [int(x) for x in reversed(t.shape)]  # numpy order
            w.add_tensor(t.name, t.data, raw_shape=gguf.quant_shape_to_byte_shape(shape, t.tensor_type),
                         raw_dtype=t.tensor_type)
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            w.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def colibri_logits(path: str, ids: Sequence[int], threads: int = 2, dequantize: bool = False,
                   **model_kw: Any) -> np.ndarray:
    """colibri's logits at every position of ids (one sequence, teacher-forced)."""
    from colibri.model import Model

    m = Model(path, threads=threads, ctx=max(1024, len(ids) + 16), max_batch=512,
              dequantize=dequantize, **model_kw)
    try:
        return np.asarray(m.logits(list(ids)), dtype=np.float32)
    finally:
        m.close()


def llama_logits(path: str, ids: Sequence[int], threads: int = 2) -> np.ndarray:
    """llama.cpp's (llama-cpp-python, its defaults: f16 KV cache) logits at every position."""
    from llama_cpp import Llama

    llm = Llama(path, logits_all=True, verbose=False, n_ctx=max(1024, len(ids) + 16),
                n_batch=512, n_threads=threads, seed=0)
    try:
        llm.eval(list(ids))
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def text_ids(path: str, text: str) -> list[int]:
    """The text's token ids by the file's tokenizer (BOS added)."""
    from colibri.model import Model

    m = Model(path, threads=1, ctx=256, max_batch=16)
    try:
        return list(m.tokenize(text))
    finally:
        m.close()


def measure(path: str, ids: Sequence[int], ref: np.ndarray, engines: Sequence[str],
            threads: int = 2, only_type: int | None = None,
            tmpdir: str | None = None) -> dict[str, Figures]:
    """Each engine's figures against ref on the file (only_type None) or on its copy where
    only the matrices of only_type stay quantized."""
    with tempfile.TemporaryDirectory(dir=tmpdir) as tmp:
        run_path = path
        if only_type is not None:
            run_path = os.path.join(tmp, "partial.gguf")
            write_partial(path, run_path, lambda _name, t: t == only_type)
        out = {}
        for engine in engines:
            if engine == "colibri":
                got = colibri_logits(run_path, ids, threads)
            elif engine == "llama.cpp":
                got = llama_logits(run_path, ids, threads)
            else:
                raise ValueError(f"unknown engine {engine!r}")
            out[engine] = kl_top1(ref, got)
            del got
        return out
