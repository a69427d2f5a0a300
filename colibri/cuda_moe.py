"""The MoE layers of a Model on an NVIDIA GPU (``Model(..., device="cuda")``).

What runs where. The C forward pass keeps everything but the routed experts on the CPU:
embeddings, attention, norms, dense FFNs, shared experts, the router matmul. For every MoE
layer it hands the router logits and the normed FFN input to :class:`CudaExperts` through the
forward's MoE hook (``cb_forward_set_moe_hook``); this runs the fused routing kernel
(routing.cu: the same gating, selection bias, top-k, renormalisation and scale as the CPU
router, through the shared routing_logic.h) and the grouped WMMA expert FFN (moe_gemm.cu) on
the device and returns the weighted expert sum, which the forward adds like its own.

Expert weights. At load, every expert of every MoE layer is read from the model file (through
the validated tensor directory), dequantized on the CPU, multiplied by the per-expert output
scale where the family has one, converted to fp16 or int4-g128 (``cuda_weights=``), and
uploaded into one device pool per layer: the whole expert set is resident on the GPU (an H200
holds 139 GiB). Shapes that are not multiples of the kernels' tile are zero-padded (extra FFN
rows of gate/up are zero, so silu(0)*0 = 0 and the padded down columns add nothing; extra
hidden columns meet zero inputs), which leaves the result exact.

Precision: the kernels compute in fp16 with fp32 accumulation, so logits differ from the CPU
path by fp16 rounding (stated in tests/test_cuda_model.py). Routing is computed on the device
from the same float32 logits as the CPU router.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import colibri._core._quant as _q
from colibri import _cuda_ref as ref
from colibri.arch import ACT_GELU_TANH, GATING_SIGMOID, ModelDesc

__all__ = ["CudaExperts"]

_ACT = {ACT_GELU_TANH: "gelu_tanh"}


def _pad_to(v: int, m: int) -> int:
    return -(-v // m) * m


def _expert_matrix(base: np.ndarray, stride: int, e: int, typ: int, rows: int, cols: int) -> np.ndarray:
    nbytes = rows * _q.row_bytes(typ, cols)
    raw = base[e * stride : e * stride + nbytes]
    return _q.dequantize(typ, raw, (rows, cols))


class CudaExperts:
    """Device expert pools of one model and the MoE hook that runs them.

    ``runtime``: a colibri.cuda.CudaRuntime (default: the one of device 0).
    ``weights``: "f16" or "int4-g128" (4-bit, one fp16 scale per 128 inputs).
    """

    def __init__(self, desc: ModelDesc, runtime: Any = None, weights: str = "f16") -> None:
        if weights not in ref.WEIGHT_FORMATS:
            raise ValueError(f"cuda_weights must be one of {ref.WEIGHT_FORMATS}, got {weights!r}")
        if runtime is None:
            from colibri import cuda

            runtime = cuda.get_runtime()
        self.rt = runtime
        self.desc = desc
        self.weights = weights
        self.gating = "sigmoid" if desc.gating == GATING_SIGMOID else "softmax"
        self.activation = _ACT.get(desc.act, "silu")
        mult = ref.INT4_GROUP if weights == "int4-g128" else 64
        self.pools: dict[int, Any] = {}
        self.offsets: dict[int, np.ndarray] = {}
        self.padded: dict[int, tuple[int, int]] = {}
        self.counts: dict[int, np.ndarray] = {}
        self.upload_seconds = 0.0
        self.device_bytes = 0
        t0 = time.perf_counter()
        for li, L in enumerate(desc.layers):
            if L.n_expert <= 0:
                continue
            X = L.experts
            if X is None:
                raise ValueError(f"layer {li}: an MoE layer without expert tensors")
            D, F = desc.n_embd, L.n_ff_exp
            Dp, Fp = _pad_to(D, mult), _pad_to(F, mult)
            layout = ref.ExpertLayout(Dp, Fp, weights)
            scale = L.exp_down_scale
            sb = layout.slot_bytes
            pool = np.zeros(L.n_expert * sb, dtype=np.uint8)
            for e in range(L.n_expert):
                g = np.zeros((Fp, Dp), np.float32)
                u = np.zeros((Fp, Dp), np.float32)
                dn = np.zeros((Dp, Fp), np.float32)
                g[:F, :D] = _expert_matrix(X.gate_base, X.gate_stride, e, X.gate.type, F, D)
                u[:F, :D] = _expert_matrix(X.up_base, X.up_stride, e, X.up.type, F, D)
                dn[:D, :F] = _expert_matrix(X.down_base, X.down_stride, e, X.down.type, D, F)
                if scale is not None:
                    dn *= np.float32(np.asarray(scale, dtype=np.float32).reshape(-1)[e])
                pool[e * sb : (e + 1) * sb] = ref.pack_expert(g, u, dn, layout)
            offsets = np.arange(L.n_expert, dtype=np.int64) * sb
            self.pools[li] = runtime.upload_pool(pool, offsets, layout)
            self.offsets[li] = offsets
            self.padded[li] = (Dp, Fp)
            self.counts[li] = np.zeros(L.n_expert, dtype=np.uint64)
            self.device_bytes += pool.nbytes
        self.upload_seconds = time.perf_counter() - t0

    def __call__(self, layer: int, h: np.ndarray, logits: np.ndarray, out: np.ndarray) -> None:
        """The forward's MoE hook: route ``logits`` and run the experts on ``h`` into ``out``."""
        L = self.desc.layers[layer]
        pool = self.pools[layer]
        D = self.desc.n_embd
        Dp, _ = self.padded[layer]
        routing = self.rt.route(
            logits, L.n_expert_used, self.gating, bias=L.router_bias,
            renorm=bool(self.desc.expert_renorm), scale=float(self.desc.expert_scale),
            slot_offset=self.offsets[layer],
        )
        x = h if Dp == D else np.pad(h, ((0, 0), (0, Dp - D)))
        y = self.rt.moe_ffn(x, pool, routing, self.activation)
        out[:] = y[:, :D]
        self.counts[layer] += routing.arrays["counts"].get().astype(np.uint64)

    def route_counts(self, layer: int) -> np.ndarray:
        if layer not in self.counts:
            raise ValueError(f"layer {layer} has no experts")
        return self.counts[layer].copy()
