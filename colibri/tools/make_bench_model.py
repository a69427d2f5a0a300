#!/usr/bin/env python3
"""Write a benchmark GGUF with random weights in the shape of Qwen3-30B-A3B, ERNIE-4.5-21B-A3B,
GLM-4.5-Air, DeepSeek-V3 or gpt-oss-20b (or a tiny MoE).

    python -m colibri.tools.make_bench_model OUT.gguf [--layers 12] [--type q4_k_m|q5_k_m|q8_0|q4_0]
                                             [--routing spread|raw] [--force]
                                             [--shape qwen3-30b-a3b|tiny|ernie-4.5-21b-a3b|
                                                      glm-4.5-air|deepseek-v3|gpt-oss-20b|
                                                      tiny-ernie4_5-moe|tiny-glm4moe|
                                                      tiny-deepseek2|tiny-gpt-oss|tiny-lowbit]

(also `colibri make-bench-model OUT.gguf ...` and, from a checkout, tools/make_bench_model.py)

The output follows the rules of every colibri writer (colibri.output_file, as `colibri
convert`): an existing file or symbolic link is replaced only with --force (force=True; a link
itself, never its target), a device, FIFO, socket or directory never; the model is written to a
temporary in the output's folder and renamed into place when complete, the temporary removed on
an error or SIGTERM (and, after a SIGKILL, by the next run for the same output). The size of the
file and the free disk space are printed before writing (the default shape is ~5 GiB for 12
layers), and a disk without room for it is refused before anything is written.

`--shape tiny` writes the same architecture at a small size (hidden 256, 32 experts of FFN 256,
top-4, vocabulary 2048: ~1 MB a layer), written and calibrated in seconds: the model of the
README's expert-budget example and of quick tests. `tiny-lowbit` is smaller still (4 experts,
top-2, vocabulary 512): the source of the low-bit files llama-quantize makes for the tests
(tools/quantize_lowbit_refs.py).

Other shapes (colibri/tools/bench_shapes.py, which lists each one's sizes and keys):
`ernie-4.5-21b-a3b` (ernie4_5-moe), `glm-4.5-air` (glm4moe), `deepseek-v3` (deepseek2) and
`gpt-oss-20b` (gpt-oss, MXFP4 experts), each
with the real model's layer shapes, GGUF keys and tensor names as llama.cpp's converter writes
them, leading dense layers scaled down with --layers (1 for ERNIE and GLM, round(3 * layers /
61) for DeepSeek-V3, at least 1, at most layers - 1), and `tiny-*` versions for tests.
ERNIE-4.5 12 layers q4_k_m is 5.5 GiB, GLM-4.5-Air 4 layers 5.7 GiB, DeepSeek-V3 3 layers
q2_k 7.8 GiB (a DeepSeek-V3 MoE layer is 7 GiB at q4_k_m), gpt-oss-20b 12 layers q8_0 6.2 GiB.
DeepSeek-V3 and gpt-oss files have `raw` routing (the default there; `spread`, which calibrates
with plain SwiGLU experts and ungrouped selection, is refused).

Shape (per layer, qwen3-30b-a3b): hidden 2048, 32 query heads and 4 KV heads of 128, q/k RMSNorm, 128 experts
with FFN 768, top-8 renormalised softmax routing (qwen3moe), vocabulary 151936. Weights are
random but valid blocks of the chosen types, written tensor by tensor (a pool of random blocks
is generated once and cut at random offsets), so a 12-layer model of several GB is written in
about a minute without holding it in memory. Routers, norms and embeddings-as-floats are real
random floats, so routing varies from token to token.

Routing (--routing). A random router on random weights does not route like a trained one: the
hidden states of a random model share a token-independent direction, and a random router's
projection of it favours the same few experts for every token (300 decode steps of a 4-layer
model touch about half of the 512 (layer, expert) pairs). A trained MoE is balanced by its
auxiliary loss: over a long generation nearly every expert of every layer is used. `spread`
(the default) first scales attention's output projection down 10x: random attention sends
every query to the same few keys, so its output is nearly the same vector at every position and
would dominate the residual stream (|mean h| / |h| 0.9 from layer 1 on); scaled down, the hidden
state stays specific to the token (0.14), as a trained model's is. It then calibrates each
router after the weights are written, layer by layer in order: it
runs the model on random tokens, takes the routed layer's input h (through the forward's MoE
hook, which computes the layer's experts with colibri's own kernels while calibrating), removes
the mean direction, and replaces the router by a random Gaussian mixture of the leading
whitened principal directions of h, so every expert's logit has zero mean and the same spread
over tokens, and the experts' logits are nearly uncorrelated. Routing is then close to uniform
over the experts, token by token, with no temporal locality (random tokens): a harder case for
a cache than real text, where consecutive tokens share experts. `raw` keeps the random routers.

Types: q8_0 (every matrix Q8_0); q4_0; q4_k_m (llama.cpp's recipe: Q4_K for most matrices,
Q6_K for attn_v, ffn_down(_exps) and the output); q5_k_m (the same with Q5_K); q3_k_m (Q3_K,
Q4_K attn_v and ffn_down, Q6_K output); and every low-bit type by its name (q2_k, iq2_xxs,
iq4_xs, tq2_0, ...: every matrix of that type, random valid blocks; not llama.cpp's
quantization of some weights, which tools/ does not run).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from colibri.tokenizer import bytes_to_unicode
from colibri.tools import bench_shapes
from colibri.tools.bench_shapes import SHAPES

log = logging.getLogger("colibri")

ARCH = "qwen3moe"
SHAPE = SHAPES["qwen3-30b-a3b"]
# progress(done, total, what)
Progress = Callable[[int, int, str], None]


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
    elif qtype in (QT.Q5_0, QT.Q5_1):
        # 5-bit q (mean 15.5): Q5_0 is d*(q-16); Q5_1 d*q + m with m = -15.5 d centres it
        d = rng.uniform(0.5, 1.5, n_blocks) * 0.02 / 8
        b[:, 0:2] = _f16(d)
        if qtype == QT.Q5_1:
            b[:, 2:4] = _f16(-15.5 * d)
    elif qtype == QT.Q4_K:
        # v = d*sc*q - dmin*m with 6-bit sc, m (mean ~32) and 4-bit q (mean 7.5): dmin = 7.5 d
        # centres the weights on zero, as a real Q4_K tensor is; a larger dmin would give every
        # row the same negative offset, and hidden states (and routing) that ignore the token
        d = rng.uniform(0.5, 1.5, n_blocks) * 0.02 / 32 / 8
        b[:, 0:2] = _f16(d)
        b[:, 2:4] = _f16(d * 7.5)
    elif qtype == QT.Q5_K:
        # as Q4_K with 5-bit q (mean 15.5): dmin = 15.5 d centres the weights on zero
        d = rng.uniform(0.5, 1.5, n_blocks) * 0.02 / 32 / 16
        b[:, 0:2] = _f16(d)
        b[:, 2:4] = _f16(d * 15.5)
    elif qtype == QT.Q6_K:
        b[:, 192:208] = rng.integers(-32, 32, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
        b[:, 208:210] = _f16(rng.uniform(0.5, 1.5, n_blocks) * 0.02 / 32 / 16)
    elif qtype == QT.MXFP4:
        # e8m0 exponent byte, then 32 4-bit e2m1 codes (doubled values 0..12, mean |q| ~4.1
        # in halves): 2^(e-128) * 4.1 ~ 0.02 at e = 120 +- 1
        b[:, 0] = rng.integers(119, 122, size=n_blocks, dtype=np.uint8)
    elif qtype in _LOWBIT_D:
        # the low-bit types: random indices, signs and sub-block scales; d sized so that the
        # values are about 0.02 (Q2_K: dmin = 1.5 d centres 2-bit q of mean 1.5)
        per_d = _LOWBIT_D[qtype]
        d = rng.uniform(0.5, 1.5, n_blocks) * 0.02 / per_d
        if qtype == QT.Q8_K:
            b[:, 0:4] = d.astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
        elif qtype == QT.IQ1_M:
            _set_iq1m_d(b, d)
        else:
            off = _SCALE_FIELDS[qtype][0]
            b[:, off:off + 2] = _f16(d)
            if qtype == QT.Q2_K:
                b[:, 82:84] = _f16(d * 1.5)
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return b


# the low-bit types' typical |value| per unit of d (random payload bits)
_LOWBIT_D = {QT.Q2_K: 11.0, QT.Q3_K: 32.0, QT.Q8_K: 64.0, QT.TQ1_0: 1.0, QT.TQ2_0: 1.0,
             QT.IQ1_S: 6.0, QT.IQ1_M: 6.0, QT.IQ2_XXS: 50.0, QT.IQ2_XS: 50.0, QT.IQ2_S: 50.0,
             QT.IQ3_XXS: 120.0, QT.IQ3_S: 128.0, QT.IQ4_NL: 60.0, QT.IQ4_XS: 1000.0}


def _set_iq1m_d(b: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M's f16 d lives in the top nibbles of its 4 scale words (bytes 48..55)."""
    dh = d.astype(np.float16).view(np.uint16)
    sc = np.ascontiguousarray(b[:, 48:56]).view(np.uint16) & np.uint16(0x0FFF)
    for k in range(4):
        sc[:, k] |= ((dh >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
    b[:, 48:56] = sc.view(np.uint8)


def _iq1m_d(b: np.ndarray) -> np.ndarray:
    sc = np.ascontiguousarray(b[:, 48:56]).view(np.uint16)
    dh = np.zeros(b.shape[0], np.uint16)
    for k in range(4):
        dh |= ((sc[:, k] >> np.uint16(12)) & np.uint16(0xF)) << np.uint16(4 * k)
    return dh.view(np.float16).astype(np.float32)


class Pool:
    """A few MB of random blocks per type; tensors are cut from it at random block offsets."""

    def __init__(self, rng: np.random.Generator, mb: int = 16):
        self.rng = rng
        self.mb = mb
        self.pools: dict[QT, np.ndarray] = {}

    def data(self, qtype: QT, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
        """Raw bytes of a tensor of numpy shape `shape` (rows last), its values times `scale`
        (the blocks' fp16 scale fields are multiplied)."""
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
        if scale != 1.0:
            blocks = out.reshape(n_blocks, nb)
            if qtype == QT.IQ1_M:
                _set_iq1m_d(blocks, _iq1m_d(blocks) * np.float32(scale))
            elif qtype == QT.Q8_K:
                f = np.ascontiguousarray(blocks[:, 0:4]).view(np.float32) * np.float32(scale)
                blocks[:, 0:4] = f.view(np.uint8)
            else:
                lo, hi = _SCALE_FIELDS[qtype]
                f = np.ascontiguousarray(blocks[:, lo:hi]).view(np.float16) * np.float16(scale)
                blocks[:, lo:hi] = f.view(np.uint8)
        return out.reshape(*shape[:-1], shape[-1] // bs * nb)


# bytes of a block holding its fp16 scale(s): every value of the block is linear in them
_SCALE_FIELDS = {QT.Q8_0: (0, 2), QT.Q4_0: (0, 2), QT.Q5_0: (0, 2), QT.Q5_1: (0, 4), QT.Q4_K: (0, 4), QT.Q5_K: (0, 4),
                 QT.Q6_K: (208, 210), QT.Q2_K: (80, 84), QT.Q3_K: (108, 110),
                 QT.TQ1_0: (52, 54), QT.TQ2_0: (64, 66),
                 **{t: (0, 2) for t in (QT.IQ1_S, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS,
                                        QT.IQ3_S, QT.IQ4_NL, QT.IQ4_XS)}}
# the low-bit kinds: a type's lower-case name puts every matrix in that type; q3_k_m is
# llama.cpp's mix (Q3_K, Q4_K attn_v and ffn_down, Q6_K output)
LOWBIT_KINDS = {t.name.lower(): (t, t, t, t) for t in _LOWBIT_D}
LOWBIT_KINDS["q3_k_m"] = (QT.Q3_K, QT.Q4_K, QT.Q4_K, QT.Q6_K)
KINDS = ["q4_k_m", "q5_k_m", "q8_0", "q4_0", *LOWBIT_KINDS]
# with `spread` routing: attention's output projection, scaled down (see the module docstring)
ATTN_OUT_SCALE = 0.1
# architectures whose routing the calibration does not emulate (deepseek2's group-limited
# selection): raw routing only (both engines still run the same file)
NOT_RUN = {"deepseek2", "gpt-oss"}


def default_routing(shape: str) -> str:
    """spread where the calibration emulates the shape's routing, raw where it does not
    (deepseek2's expert groups, gpt-oss's biased, clamped experts)."""
    return "raw" if SHAPES[shape]["arch"] in NOT_RUN else "spread"


def types(kind: str) -> tuple[QT, QT, QT, QT]:
    """(main, attn_v, ffn_down, output) types of a --type kind."""
    if kind == "q8_0":
        return QT.Q8_0, QT.Q8_0, QT.Q8_0, QT.Q8_0
    if kind == "q4_0":
        return QT.Q4_0, QT.Q4_0, QT.Q4_0, QT.Q4_0
    if kind == "q4_k_m":
        return QT.Q4_K, QT.Q6_K, QT.Q6_K, QT.Q6_K
    if kind == "q5_k_m":
        return QT.Q5_K, QT.Q6_K, QT.Q6_K, QT.Q6_K
    if kind in LOWBIT_KINDS:
        return LOWBIT_KINDS[kind]
    raise ValueError(f"unknown type {kind!r}: {', '.join(KINDS)}")


def plan(n_layers: int, kind: str, shape: str = "qwen3-30b-a3b"
         ) -> list[tuple[str, tuple[int, ...], QT | None]]:
    """(name, numpy shape, type or None for float32) of every tensor, in file order
    (colibri.tools.bench_shapes.plan)."""
    return bench_shapes.plan(n_layers, types(kind), shape)


def _float_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("exp_probs_b.bias"):  # the selection bias: small against the scores' spread
        return (0.001 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".ssm_a"):  # -exp(A_log): a decay below 1
        return -(0.5 + rng.random(shape)).astype(np.float32)
    if name.endswith("ssm_conv1d.weight"):
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape)).astype(np.float32)  # routers, attention biases


def _vocab(n_vocab: int) -> tuple[list[str], list[str]]:
    """A placeholder byte-level vocabulary of the real size (256 bytes, letter-pair merges, then
    extra tokens), so that tokenizers load it and the output layer has the real width:
    (tokens, merges)."""
    from_bytes = bytes_to_unicode()
    letters = [from_bytes[c] for c in range(ord("a"), ord("z") + 1)]
    tokens = list(from_bytes)
    merges = []
    for a in letters:
        for b in letters:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    if len(tokens) > n_vocab - 2:  # a vocabulary below 934 tokens keeps the first merges
        tokens, merges = tokens[: n_vocab - 2], merges[: n_vocab - 2 - len(from_bytes)]
    tokens += [f"<extra_{i}>" for i in range(len(tokens), n_vocab - 2)]
    tokens += ["<|endoftext|>", "<|im_start|>"]
    return tokens, merges


def file_size(n_layers: int = 12, kind: str = "q4_k_m", shape: str = "qwen3-30b-a3b") -> int:
    """The size in bytes of the file write() makes (the tensor data exactly, the header within
    a few KiB)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: {', '.join(SHAPES)}")
    tokens, merges = _vocab(SHAPES[shape]["n_vocab"])
    header = 4096 + sum(8 + len(t.encode()) + 4 for t in tokens) + sum(8 + len(m.encode())
                                                                     for m in merges)
    data = 0
    for name, tshape, qt in plan(n_layers, kind, shape):
        header += 8 + len(name) + 4 + 8 * len(tshape) + 4 + 8
        if qt is None:
            nbytes = int(np.prod(tshape)) * 4
        else:
            bs, nb = gguf.GGML_QUANT_SIZES[qt]
            nbytes = int(np.prod(tshape)) // bs * nb
        data += -(-nbytes // 32) * 32
    return -(-header // 32) * 32 + data


def preflight(path: str | os.PathLike[str], n_layers: int = 12, kind: str = "q4_k_m",
              shape: str = "qwen3-30b-a3b", force: bool = False) -> tuple[int, int]:
    """Check that the model can be written to path, before anything is written: the output
    rules (colibri.output_file.check_output), the folder exists, and its disk has room for the
    file. Returns (the file's size, the free bytes of the disk)."""
    from colibri.output_file import check_output

    path = os.fspath(path)
    if n_layers < 1:
        raise ValueError(f"n_layers must be at least 1, got {n_layers}")
    size = file_size(n_layers, kind, shape)
    dirname = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(dirname):
        raise FileNotFoundError(f"output directory {dirname} does not exist")
    check_output(path, force)
    free = shutil.disk_usage(dirname).free
    if free < size + (16 << 20):
        raise OSError(f"not enough free disk space for {path}: the model takes "
                      f"{_size(size)}, {dirname} has {_size(free)} free (fewer --layers, or "
                      "--shape tiny, make it smaller)")
    return size, free


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def write(path: str | os.PathLike[str], n_layers: int = 12, kind: str = "q4_k_m", seed: int = 0,
          progress: Progress | None = None, routing: str | None = None,
          shape: str = "qwen3-30b-a3b", force: bool = False) -> str:
    """Write the model to path and return the path. The output rules of every colibri writer
    (colibri.output_file): an existing file or symbolic link is replaced only with force=True
    (a link itself, never its target), a device, FIFO, socket or directory never; a disk
    without room for the file is refused first (preflight). The model is written to a unique
    temporary in the same folder and published when complete (without force, never over a file
    that appeared meanwhile); on any error or interrupt the temporary is removed, and stale
    temporaries of dead writers of the same path (killed with SIGKILL) are removed first.
    progress(done, total, what) is called as tensors are written and routers calibrated."""
    from colibri._tempfiles import chmod_as_new_file, clean_stale_temporaries, mkstemp_for
    from colibri.output_file import publish

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: {', '.join(SHAPES)}")
    routing = default_routing(shape) if routing is None else routing
    if routing not in ("spread", "raw"):
        raise ValueError(f"unknown routing {routing!r}: spread or raw")
    if routing == "spread" and SHAPES[shape]["arch"] in NOT_RUN:
        raise ValueError(f"--routing spread does not emulate {SHAPES[shape]['arch']}'s "
                         f"routing yet: use --routing raw")
    path = os.fspath(path)
    preflight(path, n_layers, kind, shape, force)
    rng = np.random.default_rng(seed)
    s = SHAPES[shape]
    clean_stale_temporaries(path, log.warning, writer="make_bench_model")
    fd, tmp = mkstemp_for(path)
    try:
        chmod_as_new_file(fd)  # mkstemp makes 0600
        os.close(fd)
        _write(tmp, n_layers, kind, rng, progress, routing, shape, s, seed)
        publish(tmp, path, force)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _write(tmp: str, n_layers: int, kind: str, rng: np.random.Generator,
           progress: Progress | None, routing: str, shape: str, s: dict[str, Any],
           seed: int) -> None:
    w = gguf.GGUFWriter(tmp, s["arch"])
    w.add_name(f"colibri-bench-{shape}-shape-{n_layers}L-{kind}")
    ftype = getattr(gguf.LlamaFileType, "MOSTLY_" + kind.upper(), None)
    w.add_file_type({"q8_0": 7, "q4_0": 2, "q4_k_m": 15, "q5_k_m": 17}.get(
        kind, int(ftype) if ftype is not None else 0))
    if s["arch"] == ARCH:  # the keys as they always were: the qwen3moe files stay byte-equal
        w.add_context_length(s["n_ctx"])
        w.add_embedding_length(s["n_embd"])
        w.add_block_count(n_layers)
        w.add_feed_forward_length(s["n_ff"])
        w.add_head_count(s["n_head"])
        w.add_head_count_kv(s["n_head_kv"])
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
        w.add_rope_freq_base(1_000_000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_expert_count(s["n_expert"])
        w.add_expert_used_count(s["n_used"])
        w.add_expert_feed_forward_length(s["n_ff_exp"])
    else:
        bench_shapes.write_keys(w, s, n_layers)
    tokens, merges = _vocab(s["n_vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(s["pre"])
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 2) + [3, 3])
    w.add_token_merges(merges)
    w.add_eos_token_id(len(tokens) - 2)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_add_bos_token(False)
    tensors = plan(n_layers, kind, shape)
    for name, tshape, qt in tensors:
        if qt is None:
            w.add_tensor_info(name, tshape, np.dtype(np.float32), int(np.prod(tshape)) * 4)
        else:
            bs, nb = gguf.GGML_QUANT_SIZES[qt]
            nbytes = int(np.prod(tshape)) // bs * nb
            byte_shape = (*tshape[:-1], tshape[-1] // bs * nb)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = Pool(rng, mb=1 if shape.startswith("tiny") else 16)
    total = len(tensors)
    for k, (name, tshape, qt) in enumerate(tensors):
        scale = ATTN_OUT_SCALE if routing == "spread" and name.endswith("attn_output.weight") else 1.0
        data = _float_tensor(name, tshape, rng) if qt is None else pool.data(qt, tshape, scale)
        w.write_tensor_data(data)
        if progress:
            progress(k + 1, total, "tensors written")
    w.close()
    if routing == "spread":
        spread_routers(tmp, seed=seed, progress=progress, n_vocab=s["n_vocab"])


def _router_from(h: np.ndarray, n_expert: int, rng: np.random.Generator,
                 logit_std: float = 1.5) -> np.ndarray:
    """A router [n_expert, n_embd] whose logits on inputs like h [N, n_embd] have zero mean,
    standard deviation logit_std and nearly no correlation between experts (see the module
    docstring)."""
    h = h.astype(np.float64)
    mu = h.mean(axis=0)
    u = mu / max(float(np.linalg.norm(mu)), 1e-30)
    hp = h - np.outer(h @ u, u)  # without the mean direction
    hp -= hp.mean(axis=0)
    _, sv, vt = np.linalg.svd(hp, full_matrices=False)
    r = max(8, min(len(h) // 4, n_expert * 2, len(sv)))
    whiten = vt[:r] * (np.sqrt(len(h)) / sv[:r])[:, None]  # [r, n_embd]: unit-variance coordinates
    whiten -= np.outer(whiten @ u, u)  # exactly orthogonal to the mean direction
    mix = rng.standard_normal((n_expert, r)) / np.sqrt(r)
    return (logit_std * mix @ whiten).astype(np.float32)


def _route(desc: Any, L: Any, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top-k expert ids, their weights) per token as the model's routing does it: scores
    (softmax or sigmoid), the top k of score + selection bias, weights from the scores,
    renormalised or not, times the routed scale (no expert groups: bench_shapes' colibri-run
    shapes have none)."""
    from colibri.arch import GATING_SIGMOID

    k = L.n_expert_used
    z = logits.astype(np.float64)
    if desc.gating == GATING_SIGMOID:
        p = 1.0 / (1.0 + np.exp(-z))
    else:
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    sel = p if L.router_bias is None else p + np.asarray(L.router_bias, np.float64)
    top = np.argsort(-sel, axis=1)[:, :k]
    w = np.take_along_axis(p, top, axis=1)
    if desc.expert_renorm:
        w /= w.sum(axis=1, keepdims=True)
    return top, (w * desc.expert_scale).astype(np.float32)


def cpu_moe(m: Any, layer: int, h: np.ndarray, logits: np.ndarray, out: np.ndarray) -> None:
    """The routed experts of a layer with colibri's kernels, for the forward's MoE hook:
    out = sum of weight * down(silu(gate(h)) * up(h)) over the routed experts (qwen3moe:
    softmax over the top k logits; the other shapes: _route)."""
    import colibri._core._quant as _q

    L = m.desc.layers[layer]
    X = L.experts
    k, F, D = L.n_expert_used, L.n_ff_exp, m.desc.n_embd
    if m.desc.arch == ARCH:  # as it always was: the qwen3moe files stay byte-equal
        top = np.argsort(-logits, axis=1)[:, :k]
        sel = np.take_along_axis(logits, top, axis=1)
        w = np.exp(sel - sel.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
    else:
        top, w = _route(m.desc, L, logits)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        x = np.ascontiguousarray(h[rows])

        def mat(base: np.ndarray, stride: int, typ: int, r: int, c: int, v: np.ndarray,
                e: int = int(e)) -> np.ndarray:
            raw = base[e * stride : e * stride + r * _q.row_bytes(typ, c)]
            return _q.matmul(typ, raw, r, c, v, pool=m.pool)

        g = mat(X.gate_base, X.gate_stride, X.gate.type, F, D, x)
        up = mat(X.up_base, X.up_stride, X.up.type, F, D, x)
        a = (g / (1.0 + np.exp(-g)) * up).astype(np.float32)
        out[rows] += w[rows, slot][:, None] * mat(X.down_base, X.down_stride, X.down.type, D, F, a)


def spread_routers(path: str, n_tokens: int = 512, seed: int = 0,
                   progress: Progress | None = None,
                   n_vocab: int = SHAPES["qwen3-30b-a3b"]["n_vocab"]) -> None:
    """Recalibrate every router of the model at `path` in place (the `spread` routing), the
    MoE layers in order (a dense layer has none)."""
    from colibri.model import Model

    rng = np.random.default_rng(seed + 1)
    reader = gguf.GGUFReader(path, "r+")
    routers = {int(t.name.split(".")[1]): t for t in reader.tensors
               if t.name.endswith("ffn_gate_inp.weight")}
    tokens = [int(t) for t in rng.integers(0, n_vocab, n_tokens)]
    for done, li in enumerate(sorted(routers)):
        m = Model(path, threads=os.cpu_count() or 1, ctx=n_tokens + 8, max_batch=n_tokens,
                  tokenizer=False, expert_mode="mapped", verbose=False)
        seen: list[np.ndarray] = []

        def hook(layer: int, h: np.ndarray, logits: np.ndarray, out: np.ndarray,
                 m: Model = m, li: int = li, seen: list[np.ndarray] = seen) -> None:
            out[:] = 0.0
            if layer > li:
                return  # calibrating layer li: what comes after it does not matter
            if layer == li:
                seen.append(h.copy())
            cpu_moe(m, layer, h, logits, out)

        m._fw.set_moe_hook(hook)
        m.eval([m.new_sequence()], tokens=tokens, logits=[False] * (n_tokens - 1) + [True])
        n_expert = m.desc.layers[li].n_expert
        m.close()
        t = routers[li]
        t.data[...] = _router_from(np.concatenate(seen), n_expert, rng).reshape(t.data.shape)
        reader.data.flush()
        if progress:
            progress(done + 1, len(routers), "routers calibrated")
    del reader


def _tqdm_progress() -> Progress:
    from colibri.model import tqdm_progress

    return tqdm_progress(unit="")


def add_args(p: argparse.ArgumentParser) -> None:
    """The options of the tool (python -m colibri.tools.make_bench_model and `colibri
    make-bench-model`) on an argparse parser."""
    p.add_argument("out", help="the GGUF file to write (a new file; see --force)")
    p.add_argument("--layers", type=int, default=12,
                   help="transformer layers (default: %(default)s; each ~0.4 GiB at the default "
                        "shape and type)")
    p.add_argument("--type", default="q4_k_m", choices=KINDS,
                   help="weight types: q4_k_m, q5_k_m and q3_k_m as llama.cpp's recipes, the "
                        "others (q8_0, q4_0, q2_k, iq2_xxs, ...) for every matrix "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed of the weights and the router calibration "
                        "(default: %(default)s)")
    p.add_argument("--shape", default="qwen3-30b-a3b", choices=list(SHAPES),
                   help="qwen3-30b-a3b: the real model's layer shapes (default; ~5 GiB for 12 "
                        "layers); tiny: the same architecture at a small size, written in "
                        "seconds; ernie-4.5-21b-a3b (ernie4_5-moe), glm-4.5-air (glm4moe), "
                        "deepseek-v3 (deepseek2): those models' shapes; tiny-ernie4_5-moe, "
                        "tiny-glm4moe, tiny-deepseek2: their architectures at a small size")
    p.add_argument("--routing", default=None, choices=["spread", "raw"],
                   help="spread: routers calibrated so routing covers the experts evenly, as a "
                        "trained MoE's does (the default, where colibri runs the architecture); "
                        "raw: the random routers (the default, and the only one, for deepseek2)")
    p.add_argument("-f", "--force", action="store_true",
                   help="replace an existing output file or symbolic link (the link itself, "
                        "never its target); devices, FIFOs and directories are always refused")


def run(args: argparse.Namespace, prog: str = "make_bench_model") -> int:
    """Write the model the parsed options ask for: the size line (the file's size, the free
    disk space) on stderr first, a progress bar, then a summary line. SIGTERM unwinds the
    write, so the temporary goes. Bad options or output paths raise ValueError / OSError."""
    out = args.out
    if out.startswith("-"):
        raise ValueError(f"the output name {out!r} starts with '-' (a mistyped option?); to "
                         f"write a file of that name, give its folder: ./{out}")
    if args.layers < 1:
        raise ValueError(f"--layers must be at least 1, got {args.layers}")
    size, free = preflight(out, args.layers, args.type, args.shape, args.force)
    print(f"{prog}: writing {out}: {_size(size)} ({args.layers} layers, {args.type}, "
          f"{args.shape} shape); {_size(free)} free on its disk", file=sys.stderr, flush=True)

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through write(): the temporary goes

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, terminated) if main_thread else None
    t0 = time.time()
    try:
        path = write(out, args.layers, args.type, args.seed, routing=args.routing,
                     shape=args.shape, progress=_tqdm_progress(), force=args.force)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB) in {time.time() - t0:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    prog = "python -m colibri.tools.make_bench_model"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_args(ap)
    args = ap.parse_args(argv)
    try:
        return run(args, "make_bench_model")
    except (OSError, ValueError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
