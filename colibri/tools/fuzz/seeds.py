"""Tiny runnable model files for the fuzzers and the converter tests (numpy + gguf only).

    from colibri.tools.fuzz.seeds import write_seeds
    paths = write_seeds(directory)   # {"qwen3moe-spm": "...gguf", "llama-bpe": ..., ...}

Each seed is a valid GGUF that `colibri.model.Model` loads and generates from: random weights
(seeded), a real tokenizer vocabulary (SentencePiece-style "llama" or byte-level BPE "gpt2"),
several tensor types (F32, F16, Q8_0, Q4_0, Q4_K) and families (a qwen3moe MoE, a dense llama
with biases and rope scaling keys, a gemma3 with sliding-window layers and post norms). They are
small (tens of KiB) so that a fuzz case costs milliseconds.
"""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T


def _spm_vocab() -> dict[str, Any]:
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581", "\u2581a", "\u2581the", "he", "ll", "o", "\u2581w", "or", "ld"]
    pieces += [chr(c) for c in range(ord("a"), ord("z") + 1) if chr(c) not in ("o",)]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 259)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces) - 259)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
            "tokenizer.ggml.scores": np.array(scores, np.float32),
            "tokenizer.ggml.token_type": np.array(types, np.int32),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}


def _bpe_vocab() -> dict[str, Any]:
    # GPT-2 byte-to-unicode: printable bytes map to themselves, others to U+0100 + k
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    k = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    byte_chars = [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]
    merges = ["\u0120 t", "h e", "\u0120t he", "l l", "\u0120 w", "o r", "l d"]
    tokens = byte_chars + ["\u0120t", "he", "\u0120the", "ll", "\u0120w", "or", "ld", "<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": np.array(types, np.int32),
            "tokenizer.ggml.bos_token_id": len(tokens) - 1,
            "tokenizer.ggml.eos_token_id": len(tokens) - 1}


def _add(w: gguf.GGUFWriter, key: str, val: Any) -> None:
    if isinstance(val, bool):
        w.add_bool(key, val)
    elif isinstance(val, int):
        w.add_uint32(key, val)
    elif isinstance(val, float):
        w.add_float32(key, val)
    elif isinstance(val, str):
        w.add_string(key, val)
    elif isinstance(val, np.ndarray):
        sub = {np.dtype(np.float32): gguf.GGUFValueType.FLOAT32,
               np.dtype(np.int32): gguf.GGUFValueType.INT32}[val.dtype]
        w.add_key_value(key, val.tolist(), gguf.GGUFValueType.ARRAY, sub_type=sub)
    else:
        w.add_array(key, list(val))


def _tensor(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: T) -> None:
    """arr: float32 in numpy order (the GGUF shape reversed)."""
    if qtype == T.F32:
        w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
    elif qtype == T.F16:
        w.add_tensor(name, np.ascontiguousarray(arr, np.float16))
    elif qtype == T.Q4_K:
        # gguf has no Q4_K quantizer: random blocks {f16 d, f16 dmin, 12 scale bytes, 128
        # nibble bytes} with small finite d / dmin, seeded from the values
        rows = arr.reshape(-1, arr.shape[-1])
        rng = np.random.default_rng(int(abs(rows[0, 0]) * 1e6))
        nb = rows.shape[1] // 256
        q = rng.integers(0, 256, size=(rows.shape[0], nb, 144), dtype=np.uint8)
        q[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        q[:, :, 2:4] = np.frombuffer(np.float16(0.005).tobytes(), np.uint8)
        q = q.reshape(*arr.shape[:-1], nb * 144)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
    else:
        q = gguf.quants.quantize(np.ascontiguousarray(arr, np.float32), qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def _write(path: str, arch: str, meta: dict[str, Any], tensors: list[tuple[str, np.ndarray, T]]) -> str:
    w = gguf.GGUFWriter(path, arch)
    for k, v in meta.items():
        _add(w, k, v)
    for name, arr, qt in tensors:
        _tensor(w, name, arr, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def qwen3moe(path: str, seed: int = 0, n_embd: int = 64, expert_type: T = T.Q8_0) -> str:
    """A 2-layer qwen3moe (4 experts, top-2, q/k head norms) with the SentencePiece vocab."""
    rng = np.random.default_rng(seed)
    voc = _spm_vocab()
    n_vocab = len(voc["tokenizer.ggml.tokens"])
    n_head, n_kv, hd, n_ff, n_exp, n_layer = 4, 2, 16, 32 if n_embd < 256 else 256, 4, 2
    arch = "qwen3moe"
    meta = {f"{arch}.embedding_length": n_embd, f"{arch}.block_count": n_layer,
            f"{arch}.attention.head_count": n_head, f"{arch}.attention.head_count_kv": n_kv,
            f"{arch}.attention.key_length": hd, f"{arch}.attention.value_length": hd,
            f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.context_length": 256,
            f"{arch}.rope.freq_base": 10000.0, f"{arch}.expert_count": n_exp,
            f"{arch}.expert_used_count": 2, f"{arch}.expert_feed_forward_length": n_ff, **voc}

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    ts: list[tuple[str, np.ndarray, T]] = [("token_embd.weight", r(n_vocab, n_embd), T.Q8_0),
                                           ("output_norm.weight", 1 + r(n_embd), T.F32),
                                           ("output.weight", r(n_vocab, n_embd), T.F16)]
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", 1 + r(n_embd), T.F32),
               (b + "ffn_norm.weight", 1 + r(n_embd), T.F32),
               (b + "attn_q.weight", r(n_head * hd, n_embd), T.Q8_0),
               (b + "attn_k.weight", r(n_kv * hd, n_embd), T.F32),
               (b + "attn_v.weight", r(n_kv * hd, n_embd), T.Q4_0),
               (b + "attn_output.weight", r(n_embd, n_head * hd), T.Q8_0),
               (b + "attn_q_norm.weight", 1 + r(hd), T.F32),
               (b + "attn_k_norm.weight", 1 + r(hd), T.F32),
               (b + "ffn_gate_inp.weight", r(n_exp, n_embd), T.F32),
               (b + "ffn_gate_exps.weight", r(n_exp, n_ff, n_embd), expert_type),
               (b + "ffn_up_exps.weight", r(n_exp, n_ff, n_embd), expert_type),
               (b + "ffn_down_exps.weight", r(n_exp, n_embd, n_ff),
                expert_type if n_ff % 256 == 0 or expert_type != T.Q4_K else T.Q8_0)]
    return _write(path, arch, meta, ts)


def llama(path: str, seed: int = 1) -> str:
    """A 2-layer dense llama with q/k/v biases, linear rope scaling, the byte-level BPE vocab."""
    rng = np.random.default_rng(seed)
    voc = _bpe_vocab()
    n_vocab = len(voc["tokenizer.ggml.tokens"])
    n_embd, n_head, n_kv, n_ff, n_layer = 64, 4, 4, 96, 2
    hd = n_embd // n_head
    arch = "llama"
    meta = {f"{arch}.embedding_length": n_embd, f"{arch}.block_count": n_layer,
            f"{arch}.attention.head_count": n_head, f"{arch}.attention.head_count_kv": n_kv,
            f"{arch}.attention.layer_norm_rms_epsilon": 1e-5, f"{arch}.context_length": 128,
            f"{arch}.rope.freq_base": 500000.0, f"{arch}.rope.dimension_count": hd,
            f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": 2.0,
            f"{arch}.feed_forward_length": n_ff, **voc}

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    ts: list[tuple[str, np.ndarray, T]] = [("token_embd.weight", r(n_vocab, n_embd), T.F16),
                                           ("output_norm.weight", 1 + r(n_embd), T.F32)]
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", 1 + r(n_embd), T.F32),
               (b + "ffn_norm.weight", 1 + r(n_embd), T.F32),
               (b + "attn_q.weight", r(n_head * hd, n_embd), T.Q4_0),
               (b + "attn_q.bias", r(n_head * hd), T.F32),
               (b + "attn_k.weight", r(n_kv * hd, n_embd), T.Q8_0),
               (b + "attn_k.bias", r(n_kv * hd), T.F32),
               (b + "attn_v.weight", r(n_kv * hd, n_embd), T.F16),
               (b + "attn_v.bias", r(n_kv * hd), T.F32),
               (b + "attn_output.weight", r(n_embd, n_head * hd), T.F32),
               (b + "ffn_gate.weight", r(n_ff, n_embd), T.Q8_0),
               (b + "ffn_up.weight", r(n_ff, n_embd), T.Q8_0),
               (b + "ffn_down.weight", r(n_embd, n_ff), T.F32)]
    return _write(path, arch, meta, ts)


def gemma3(path: str, seed: int = 2) -> str:
    """A 2-layer gemma3 (sliding window on layer 0, post norms, softcaps) with the SPM vocab
    and K-quant (Q4_K) matrices of 256-wide rows."""
    rng = np.random.default_rng(seed)
    voc = _spm_vocab()
    n_vocab = len(voc["tokenizer.ggml.tokens"])
    n_embd, n_head, n_kv, hd, n_ff, n_layer = 256, 2, 1, 32, 256, 2
    arch = "gemma3"
    meta = {f"{arch}.embedding_length": n_embd, f"{arch}.block_count": n_layer,
            f"{arch}.attention.head_count": n_head, f"{arch}.attention.head_count_kv": n_kv,
            f"{arch}.attention.key_length": hd, f"{arch}.attention.value_length": hd,
            f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.context_length": 512,
            f"{arch}.attention.sliding_window": 8, f"{arch}.rope.freq_base": 1000000.0,
            f"{arch}.final_logit_softcapping": 30.0, f"{arch}.attn_logit_softcapping": 50.0,
            f"{arch}.feed_forward_length": n_ff, **voc}

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    ts: list[tuple[str, np.ndarray, T]] = [("token_embd.weight", r(n_vocab, n_embd), T.Q4_K),
                                           ("output_norm.weight", r(n_embd), T.F32)]
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", r(n_embd), T.F32),
               (b + "ffn_norm.weight", r(n_embd), T.F32),
               (b + "post_attention_norm.weight", r(n_embd), T.F32),
               (b + "post_ffw_norm.weight", r(n_embd), T.F32),
               (b + "attn_q.weight", r(n_head * hd, n_embd), T.Q4_K),
               (b + "attn_k.weight", r(n_kv * hd, n_embd), T.Q8_0),
               (b + "attn_v.weight", r(n_kv * hd, n_embd), T.Q8_0),
               (b + "attn_output.weight", r(n_embd, n_head * hd), T.Q8_0),
               (b + "attn_q_norm.weight", r(hd), T.F32),
               (b + "attn_k_norm.weight", r(hd), T.F32),
               (b + "ffn_gate.weight", r(n_ff, n_embd), T.Q4_K),
               (b + "ffn_up.weight", r(n_ff, n_embd), T.Q4_K),
               (b + "ffn_down.weight", r(n_embd, n_ff), T.Q4_K)]
    return _write(path, arch, meta, ts)


def write_seeds(directory: str | os.PathLike[str], containers: bool = True) -> dict[str, str]:
    """Write every seed GGUF (and, with containers, its colibri container) into directory;
    returns {name: path}."""
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    out = {"qwen3moe-spm": qwen3moe(os.path.join(d, "qwen3moe-spm.gguf")),
           "llama-bpe": llama(os.path.join(d, "llama-bpe.gguf")),
           "gemma3-spm": gemma3(os.path.join(d, "gemma3-spm.gguf"))}
    if containers:
        from colibri.container import convert

        dst = os.path.join(d, "qwen3moe-spm.colibri")
        if not os.path.exists(dst):
            convert(out["qwen3moe-spm"], dst, progress=False)
        out["qwen3moe-spm.colibri"] = dst
    return out
