#!/usr/bin/env python3
"""Write a benchmark GGUF with random weights in the shape of Qwen3-30B-A3B.

    python tools/make_bench_model.py OUT.gguf [--layers 12] [--type q4_k_m|q8_0|q4_0]

Shape (per layer): hidden 2048, 32 query heads and 4 KV heads of 128, q/k RMSNorm, 128 experts
with FFN 768, top-8 renormalised softmax routing (qwen3moe), vocabulary 151936. Weights are
random but valid blocks of the chosen types, written tensor by tensor (a pool of random blocks
is generated once and cut at random offsets), so a 12-layer model of several GB is written in
about a minute without holding it in memory. Routers, norms and embeddings-as-floats are real
random floats, so routing varies from token to token as in a real model.

Types: q8_0 (every matrix Q8_0); q4_0; q4_k_m (llama.cpp's recipe: Q4_K for most matrices,
Q6_K for attn_v, ffn_down(_exps) and the output).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_hf import bytes_to_unicode  # noqa: E402

ARCH = "qwen3moe"
SHAPE = dict(n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128, n_used=8,
             n_ff_exp=768, n_vocab=151936, n_ctx=40960)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def random_blocks(qtype: QT, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks valid blocks of qtype (uint8 [n_blocks, block_bytes]) with random values and
    scales that give weights of about 0.02 in magnitude (the scale of real weights)."""
    bs, nb = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, nb), dtype=np.uint8)
    if qtype in (QT.Q8_0, QT.Q4_0):
        d = rng.uniform(0.5, 1.5, n_blocks) * (0.02 / (64 if qtype == QT.Q8_0 else 4))
        b[:, 0:2] = _f16(d)
    elif qtype == QT.Q4_K:
        # v = d*sc*q - dmin*m with 6-bit sc, m (mean ~32) and 4-bit q (mean 7.5): dmin = 7.5 d
        # centres the weights on zero, as a real Q4_K tensor is; a larger dmin would give every
        # row the same negative offset, and hidden states (and routing) that ignore the token
        d = rng.uniform(0.5, 1.5, n_blocks) * 0.02 / 32 / 8
        b[:, 0:2] = _f16(d)
        b[:, 2:4] = _f16(d * 7.5)
    elif qtype == QT.Q6_K:
        b[:, 192:208] = rng.integers(-32, 32, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = _f16(rng.uniform(0.5, 1.5, n_blocks) * 0.02 / 32 / 16)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return b


class Pool:
    """A few MB of random blocks per type; tensors are cut from it at random block offsets."""

    def __init__(self, rng: np.random.Generator, mb: int = 16):
        self.rng = rng
        self.mb = mb
        self.pools: dict[QT, np.ndarray] = {}

    def data(self, qtype: QT, shape: tuple[int, ...]) -> np.ndarray:
        """Raw bytes of a tensor of numpy shape `shape` (rows last)."""
        bs, nb = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = int(np.prod(shape)) // bs
        if qtype not in self.pools:
            self.pools[qtype] = random_blocks(qtype, (self.mb << 20) // nb, self.rng).reshape(-1)
        pool = self.pools[qtype]
        pool_blocks = pool.size // nb
        out = np.empty(n_blocks * nb, dtype=np.uint8)
        done = 0
        while done < n_blocks:
            take = min(n_blocks - done, pool_blocks)
            start = int(self.rng.integers(0, pool_blocks - take + 1))
            out[done * nb : (done + take) * nb] = pool[start * nb : (start + take) * nb]
            done += take
        return out.reshape(*shape[:-1], shape[-1] // bs * nb)


def plan(n_layers: int, kind: str) -> list[tuple[str, tuple[int, ...], QT | None]]:
    """(name, numpy shape, type or None for float32) of every tensor, in file order."""
    s = SHAPE
    E, H, KV, D, X, F, V = (s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"],
                            s["n_expert"], s["n_ff_exp"], s["n_vocab"])
    if kind == "q8_0":
        main = attn_v = down = out = QT.Q8_0
    elif kind == "q4_0":
        main = attn_v = down = out = QT.Q4_0
    elif kind == "q4_k_m":
        main, attn_v, down, out = QT.Q4_K, QT.Q6_K, QT.Q6_K, QT.Q6_K
    else:
        raise ValueError(f"unknown type {kind!r}: q4_k_m, q8_0 or q4_0")
    t: list[tuple[str, tuple[int, ...], QT | None]] = [("token_embd.weight", (V, E), main)]
    for i in range(n_layers):
        b = f"blk.{i}."
        t += [
            (b + "attn_norm.weight", (E,), None),
            (b + "attn_q.weight", (H * D, E), main),
            (b + "attn_k.weight", (KV * D, E), main),
            (b + "attn_v.weight", (KV * D, E), attn_v),
            (b + "attn_output.weight", (E, H * D), main),
            (b + "attn_q_norm.weight", (D,), None),
            (b + "attn_k_norm.weight", (D,), None),
            (b + "ffn_norm.weight", (E,), None),
            (b + "ffn_gate_inp.weight", (X, E), None),
            (b + "ffn_gate_exps.weight", (X, F, E), main),
            (b + "ffn_up_exps.weight", (X, F, E), main),
            (b + "ffn_down_exps.weight", (X, E, F), down),
        ]
    t += [("output_norm.weight", (E,), None), ("output.weight", (V, E), out)]
    return t


def _float_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape)).astype(np.float32)  # routers


def write(path: str, n_layers: int = 12, kind: str = "q4_k_m", seed: int = 0,
          progress: bool = True) -> str:
    rng = np.random.default_rng(seed)
    s = SHAPE
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, ARCH)
    w.add_name(f"colibri-bench-qwen3-30b-a3b-shape-{n_layers}L-{kind}")
    w.add_file_type({"q8_0": 7, "q4_0": 2, "q4_k_m": 15}[kind])
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(6144)
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["n_used"])
    w.add_expert_feed_forward_length(s["n_ff_exp"])
    # a placeholder byte-level vocabulary of the real size (256 bytes, letter-pair merges, then
    # extra tokens), so that tokenizers load it and the output layer has the real width
    from_bytes = bytes_to_unicode()
    letters = [from_bytes[c] for c in range(ord("a"), ord("z") + 1)]
    tokens = list(from_bytes)
    merges = []
    for a in letters:
        for b in letters:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    tokens += [f"<extra_{i}>" for i in range(len(tokens), s["n_vocab"] - 2)]
    tokens += ["<|endoftext|>", "<|im_start|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    w.add_token_merges(merges)
    w.add_eos_token_id(len(tokens) - 2)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_add_bos_token(False)
    tensors = plan(n_layers, kind)
    for name, shape, qt in tensors:
        if qt is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            bs, nb = gguf.GGML_QUANT_SIZES[qt]
            nbytes = int(np.prod(shape)) // bs * nb
            byte_shape = (*shape[:-1], shape[-1] // bs * nb)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = Pool(rng)
    t0 = time.time()
    total = len(tensors)
    for k, (name, shape, qt) in enumerate(tensors):
        data = _float_tensor(name, shape, rng) if qt is None else pool.data(qt, shape)
        w.write_tensor_data(data)
        if progress and (k % 12 == 0 or k == total - 1):
            print(f"\r{k + 1}/{total} tensors, {time.time() - t0:.0f} s", end="", file=sys.stderr,
                  flush=True)
    w.close()
    if progress:
        print(file=sys.stderr)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--type", default="q4_k_m", choices=["q4_k_m", "q8_0", "q4_0"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    path = write(args.out, args.layers, args.type, args.seed)
    print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
