"""The low-bit files llama.cpp itself makes (issue 45's end-to-end check), shared by
tools/quantize_lowbit_refs.py (which makes and records them) and
tests/model/test_lowbit_llama_refs.py (which checks colibri against the recording without
llama.cpp).

The source: colibri's MoE bench model (make_bench_model, shape `tiny-lowbit`: one qwen3moe layer,
hidden 256, 4 experts of FFN 256, top-2, vocabulary 512; every row whole 256-blocks, so every
K- and i-quant applies to every matrix) written in Q8_0 with calibrated (`spread`) routers, then
expanded to F32 (exactly: a Q8_0 value is an f16 scale times an int8) with the output head
scaled by OUTPUT_SCALE. llama.cpp then makes an importance matrix over IMATRIX_TEXT
(`llama-imatrix`) and quantizes the F32 file once per RECIPES entry (`llama-quantize`, its
own recipes: the tensor types in each file are llama.cpp's choice, recorded and asserted).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from colibri.tools.refs import kl_top, log_softmax, matched, writer_like

SHAPE = "tiny-lowbit"
LAYERS = 1
SEED = 0
# the random output head of the bench model gives logits of spread 0.4 (near-uniform next-token
# distributions whose top-1 is a coin toss between near-ties); 4x gives ~1.5, a trained model's
# peakier distributions, and a top-TOP_K that holds most of the mass
OUTPUT_SCALE = 4.0
TOP_K = 64
N_GREEDY = 16
THREADS = 2
IMATRIX_CTX = 128  # llama-imatrix's chunk (tokens): the text is ~20 chunks

# (file name, llama-quantize type, with the importance matrix, extra llama-quantize arguments)
RECIPES: list[tuple[str, str, bool, list[str]]] = [
    ("q2_k", "Q2_K", False, []),
    ("q3_k_s", "Q3_K_S", False, []),
    ("q3_k_m", "Q3_K_M", False, []),
    ("q3_k_l", "Q3_K_L", False, []),
    ("iq2_xxs", "IQ2_XXS", True, []),
    ("iq2_m", "IQ2_M", True, []),
    ("iq1_s", "IQ1_S", True, []),
    ("iq3_xxs", "IQ3_XXS", True, []),  # its attn_k is IQ2_S: llama.cpp requires the imatrix
    ("iq4_xs", "IQ4_XS", False, []),
    ("tq2_0", "TQ2_0", False, []),
    # an Unsloth 'UD-..._XL'-like mix: a Q4_K_M base, the routed experts in 2-3 bit i-quants,
    # attention in Q6_K and Q8_0, the embedding Q4_K
    ("ud_iq2_xxs", "Q4_K_M", True,
     ["--tensor-type", "ffn_gate_exps=iq2_xxs", "--tensor-type", "ffn_up_exps=iq2_xs",
      "--tensor-type", "ffn_down_exps=iq3_s", "--tensor-type", "attn_q=q6_k",
      "--tensor-type", "attn_k=q6_k", "--tensor-type", "attn_v=q8_0",
      "--tensor-type", "attn_output=q6_k", "--token-embedding-type", "q4_k"]),
]
NAMES = [r[0] for r in RECIPES]


def prompts() -> list[list[int]]:
    """The teacher-forced prompts: 48 and 96 token ids drawn from the whole vocabulary."""
    from colibri.tools.bench_shapes import SHAPES

    n_vocab = SHAPES[SHAPE]["n_vocab"]
    rng = np.random.default_rng(45)
    return [[int(t) for t in rng.integers(0, n_vocab, n)] for n in (48, 96)]


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tensor_types(path: str | Path) -> list[tuple[str, str]]:
    """(name, GGML type name) of every tensor, in file order (the gguf package's reader)."""
    import gguf

    return [(t.name, t.tensor_type.name) for t in gguf.GGUFReader(str(path)).tensors]


def write_dequantized(src: str | Path, dst: str | Path,
                      scale: dict[str, float] | None = None) -> None:
    """Copy a GGUF with every tensor dequantized to F32 by the gguf package (metadata
    unchanged); the tensors named in `scale` multiplied by their factor."""
    import gguf

    r, w = writer_like(src, dst)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if scale and t.name in scale:
            data = data * np.float32(scale[t.name])
        w.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def greedy(m: Any, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids (a fresh sequence of Model m: the prompt in one batch, then
    one token at a time)."""
    seq = m.new_sequence()
    try:
        logits = m.eval([seq], tokens=ids, logits=[False] * (len(ids) - 1) + [True])
        out: list[int] = []
        for _ in range(n):
            out.append(int(np.argmax(logits[-1])))
            logits = m.eval([seq], tokens=[out[-1]])
        return out
    finally:
        m.free_sequence(seq)


def compare(path: str | Path, refs: Any, name: str, **model_kw: Any) -> dict[str, Any]:
    """colibri on one file against llama.cpp's recording: teacher-forced top-1 agreement over
    every position of every prompt, mean and max KL(llama.cpp || colibri), each prompt's greedy
    tokens matched, and llama.cpp's own agreement with itself (its logits when fed one token at a
    time, against its batched ones)."""
    from colibri.model import Model

    kw: dict[str, Any] = dict(threads=THREADS, ctx=256, verbose=False, tokenizer=False)
    kw.update(model_kw)
    agree = total = self_agree = 0
    kls, greedy_ok = [], []
    with Model(str(path), **kw) as m:
        for i, ids in enumerate(prompts()):
            lp = log_softmax(m.logits(ids))
            top = refs[f"{name}__top_ids_{i}"]
            agree += int((lp.argmax(axis=1) == top[:, 0]).sum())
            self_agree += int((refs[f"{name}__decode_top1_{i}"] == top[:, 0]).sum())
            total += len(ids)
            kls.append(kl_top(top, refs[f"{name}__top_logprobs_{i}"], lp))
            want = refs[f"{name}__greedy_{i}"].tolist()
            greedy_ok.append(matched(greedy(m, ids, len(want)), want))
    kl = np.concatenate(kls)
    return {"top1": agree / total, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "greedy": greedy_ok, "llama_self_top1": self_agree / total}


# run by llama-cpp-python's interpreter (tools/quantize_lowbit_refs.py --llama-python): for each
# file, the prompts teacher-forced in one batch (top TOP_K log-probabilities per position), one
# token at a time (top-1 per position: llama.cpp's agreement with itself), and greedy; with an
# F32 KV cache (colibri's default; llama.cpp's f16 one alone moves the logits by KL ~1e-4 here)
LLAMA_SCRIPT = r"""
import json, sys, numpy as np, llama_cpp
jobs, prompts, top_k, n_greedy, threads, out = json.load(open(sys.argv[1]))
def lsm(x):
    x = x.astype(np.float64); x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
data = {}
for name, path in jobs:
    kv = dict(type_k=0, type_v=0)  # GGML_TYPE_F32: colibri's default KV cache, not llama.cpp's f16
    llm = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=threads,
                          seed=0, **kv)
    one = llama_cpp.Llama(path, n_ctx=256, logits_all=True, verbose=False, n_threads=threads,
                          n_batch=1, n_ubatch=1, seed=0, **kv)
    for i, ids in enumerate(prompts):
        llm.reset()
        llm.eval(ids)
        lp = lsm(np.array(llm.scores[:len(ids)], dtype=np.float32))
        top = np.argsort(-lp, axis=1, kind="stable")[:, :top_k]
        data[f"{name}__top_ids_{i}"] = top.astype(np.int16)
        data[f"{name}__top_logprobs_{i}"] = np.take_along_axis(lp, top, 1).astype(np.float32)
        g, nxt = [], int(np.argmax(llm.scores[len(ids) - 1]))
        for _ in range(n_greedy):
            g.append(nxt)
            llm.eval([nxt])
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        data[f"{name}__greedy_{i}"] = np.array(g, dtype=np.int16)
        one.reset()
        one.eval(ids)
        data[f"{name}__decode_top1_{i}"] = np.array(one.scores[:len(ids)]).argmax(1).astype(np.int16)
    del llm, one
data["llama_cpp_version"] = np.array(llama_cpp.__version__)
np.savez(out, **data)
"""
