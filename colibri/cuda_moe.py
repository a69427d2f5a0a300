"""The MoE layers of a Model on an NVIDIA GPU (``Model(..., device="cuda")``).

What runs where. The C forward pass keeps everything but the routed experts on the CPU:
embeddings, attention, norms, dense FFNs, shared experts, the router matmul. For every MoE
layer it hands the router logits and the normed FFN input to :class:`CudaExperts` through the
forward's MoE hook (``cb_forward_set_moe_hook``); this runs the fused routing kernel
(routing.cu: the same gating, selection bias, top-k, renormalisation and scale as the CPU
router, through the shared routing_logic.h) and the grouped WMMA expert FFN (moe_gemm.cu) on
the device and returns the weighted expert sum, which the forward adds like its own.

Expert weights on the device, in the kernels' layout (``cuda_weights=``: fp16 or int4-g128).
An expert's weights are dequantized on the CPU from the model's own format, multiplied by the
per-expert output scale where the family has one, zero-padded to the kernels' multiples
(extra FFN rows of gate/up are zero, so act(0)*0 = 0 and the padded down columns add nothing;
extra hidden columns meet zero inputs: exact) and packed (``_cuda_ref.pack_expert``). Two ways:

* Whole pool (no budget, or one that holds every expert): at load every expert of every MoE
  layer is converted and uploaded, one device pool per layer.
* Staged (``budget`` smaller than all experts: models larger than device memory): N device
  slots (budget / slot size) and an O(1) LRU map (layer, expert) -> slot. Per MoE call:
  route on the device; read back the per-expert counts (ONE small copy, n_expert int32, which
  the route statistics need anyway); the experts with a count are hits (resident) or misses;
  misses are acquired from the C expert store (in cache mode its pointers lie inside the slot
  pool, which is page-locked with cuMemHostRegister through :meth:`ExpertStore.pin_pool`: the
  store owns the pool and unpins it before freeing it), converted into a page-locked staging
  buffer and copied asynchronously on the runtime's stream into free or evicted device slots;
  experts whose file format already is the kernels' (fp16 weights, F16 tensors, no padding,
  no scale) are copied straight from the store's pinned slot, no CPU conversion. The layer's
  slot-offset table (n_expert int64, only when it changed) goes up, the expert kernels run on
  the same stream, the stream is synchronised, and the store's experts are released. A batch
  whose distinct experts exceed the device slots is split into token chunks that fit (routing
  is per token, and the GEMM rows are independent, so results do not change; the tile is
  chosen for the whole batch). Statistics per layer: device hits, misses, bytes staged,
  evictions (:meth:`CudaExperts.stats`).

Precision: the kernels compute in fp16 with fp32 accumulation, so logits differ from the CPU
path by fp16 rounding (stated in tests/cuda/test_cuda_runtime_emulated.py). Routing is computed on
the device from the same float32 logits as the CPU router. The staged path gives the same
logits as the whole pool, bit for bit (same packed weights, same kernels and tile).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np

import colibri._core._quant as _q
from colibri import _cuda_ref as ref
from colibri.arch import (
    ACT_GELU_TANH,
    ACT_SILU,
    GATING_SIGMOID,
    GATING_SOFTMAX,
    ModelDesc,
    UnsupportedModel,
)
from colibri.errors import ColibriError

__all__ = ["CudaExperts"]

_ACT = {ACT_GELU_TANH: "gelu_tanh"}
GGML_F16 = _q.TYPES["F16"]
STAGE_BYTES = 64 << 20  # the staging buffer holds at least k experts, else about this much


def _pad_to(v: int, m: int) -> int:
    return -(-v // m) * m


class CudaExperts:
    """Device experts of one model and the MoE hook that runs them.

    ``runtime``: a colibri.cuda.CudaRuntime (default: the one of device 0).
    ``weights``: "f16" or "int4-g128" (4-bit, one fp16 scale per 128 inputs).
    ``store``: the model's expert store (colibri._core._forward.ExpertStore); the staged path
    acquires its misses from it. ``budget``: device bytes for experts (an int, "2GB", or a
    fraction in (0, 1] of every expert in the device format); None or a budget that holds
    every expert: the whole pool is uploaded at load.
    """

    def __init__(self, desc: ModelDesc, runtime: Any = None, weights: str = "f16",
                 store: Any = None, budget: str | float | int | None = None) -> None:
        if weights not in ref.WEIGHT_FORMATS:
            raise ValueError(f"cuda_weights must be one of {ref.WEIGHT_FORMATS}, got {weights!r}")
        if any(L.gdn_v_heads for L in desc.layers):  # not checked on a GPU yet
            raise UnsupportedModel(f"device='cuda': {desc.arch}'s model (gated DeltaNet linear "
                                   "attention with a recurrent state) does not run on the GPU "
                                   "yet; run it on the CPU")
        biased = any(L.exp_gate_b is not None or L.router_b is not None for L in desc.layers)
        if desc.gating not in (GATING_SOFTMAX, GATING_SIGMOID) or desc.expert_groups > 1 \
                or biased or desc.act not in (ACT_SILU, ACT_GELU_TANH) or desc.expert_weight_in:
            kind = ("group-limited" if desc.expert_groups > 1 else "biased experts and "
                    "clamped SwiGLU" if biased or desc.act not in (ACT_SILU, ACT_GELU_TANH)
                    else "sparsemixer")
            raise UnsupportedModel(f"device='cuda': {desc.arch}'s expert routing ({kind}) does "
                                   "not run on the GPU yet; run it on the CPU")
        if runtime is None:
            from colibri import cuda

            runtime = cuda.get_runtime()
        self.rt = runtime
        self.desc = desc
        self.weights = weights
        self.store = store
        self.gating = "sigmoid" if desc.gating == GATING_SIGMOID else "softmax"
        self.activation = _ACT.get(desc.act, "silu")
        mult = ref.INT4_GROUP if weights == "int4-g128" else 64
        self.layers = [li for li, L in enumerate(desc.layers) if L.n_expert > 0]
        self.layouts: dict[int, ref.ExpertLayout] = {}
        self.padded: dict[int, tuple[int, int]] = {}
        self.counts: dict[int, np.ndarray] = {}
        self.direct: dict[int, bool] = {}
        for li in self.layers:
            L = desc.layers[li]
            X = L.experts
            if X is None:
                raise ValueError(f"layer {li}: an MoE layer without expert tensors")
            D, F = desc.n_embd, L.n_ff_exp
            Dp, Fp = _pad_to(D, mult), _pad_to(F, mult)
            self.layouts[li] = ref.ExpertLayout(Dp, Fp, weights)
            self.padded[li] = (Dp, Fp)
            self.counts[li] = np.zeros(L.n_expert, dtype=np.uint64)
            # the file's bytes are the kernels' layout: copy them as they are
            self.direct[li] = (weights == "f16" and (Dp, Fp) == (D, F)
                               and L.exp_down_scale is None
                               and X.gate.type == X.up.type == X.down.type == GGML_F16)
        self.total_bytes = sum(desc.layers[li].n_expert * self.layouts[li].slot_bytes
                               for li in self.layers)
        self.budget_bytes: int | None = None
        if budget is not None:
            from colibri.model import parse_budget

            self.budget_bytes = parse_budget(budget, self.total_bytes)
        self.staged = self.budget_bytes is not None and self.budget_bytes < self.total_bytes
        self.upload_seconds = 0.0
        self.device_bytes = 0
        self.pools: dict[int, Any] = {}
        self.offsets: dict[int, np.ndarray] = {}
        self._closed = False
        self._pinned_store = False
        self._staging_pinned: np.ndarray | None = None
        self._dev_buffer: Any = None
        t0 = time.perf_counter()
        if self.staged:
            self._init_staged()
        else:
            self._init_whole()
        self.upload_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ conversion
    def _pack(self, li: int, e: int, raw: tuple[np.ndarray, np.ndarray, np.ndarray],
              out: np.ndarray) -> None:
        """Expert e of layer li from its raw file bytes (gate, up, down) into ``out`` (uint8
        [slot_bytes]) in the kernels' layout: dequantized, scaled, padded, packed."""
        L = self.desc.layers[li]
        X = L.experts
        assert X is not None
        D, F = self.desc.n_embd, L.n_ff_exp
        Dp, Fp = self.padded[li]
        lay = self.layouts[li]
        mats = []
        for (r, typ), (rows, cols), (prow, pcol) in zip(
                zip(raw, (X.gate.type, X.up.type, X.down.type), strict=True),
                ((F, D), (F, D), (D, F)), ((Fp, Dp), (Fp, Dp), (Dp, Fp)), strict=True):
            m = np.zeros((prow, pcol), np.float32)
            m[:rows, :cols] = _q.dequantize(typ, r, (rows, cols))
            mats.append(m)
        if L.exp_down_scale is not None:
            mats[2] *= np.float32(np.asarray(L.exp_down_scale, dtype=np.float32).reshape(-1)[e])
        out[: lay.slot_bytes] = ref.pack_expert(mats[0], mats[1], mats[2], lay)

    def _raw_bytes(self, li: int) -> tuple[int, int, int]:
        L = self.desc.layers[li]
        X = L.experts
        assert X is not None
        D, F = self.desc.n_embd, L.n_ff_exp
        return (F * _q.row_bytes(X.gate.type, D), F * _q.row_bytes(X.up.type, D),
                D * _q.row_bytes(X.down.type, F))

    def _init_whole(self) -> None:
        for li in self.layers:
            L = self.desc.layers[li]
            X = L.experts
            assert X is not None
            lay = self.layouts[li]
            sb = lay.slot_bytes
            nb = self._raw_bytes(li)
            strides = (X.gate_stride, X.up_stride, X.down_stride)
            bases = (X.gate_base, X.up_base, X.down_base)
            pool = np.zeros(L.n_expert * sb, dtype=np.uint8)
            for e in range(L.n_expert):
                raw = tuple(b[e * s : e * s + n] for b, s, n in zip(bases, strides, nb, strict=True))
                self._pack(li, e, raw, pool[e * sb : (e + 1) * sb])  # type: ignore[arg-type]
            offsets = np.arange(L.n_expert, dtype=np.int64) * sb
            self.pools[li] = self.rt.upload_pool(pool, offsets, lay)
            self.offsets[li] = offsets
            self.device_bytes += pool.nbytes

    # ------------------------------------------------------------------ staged path
    def _init_staged(self) -> None:
        from colibri.cuda import DevicePool

        if self.store is None:
            raise ValueError("a cuda expert budget smaller than the experts needs the model's "
                             "expert store to stage from")
        assert self.budget_bytes is not None
        sb = -(-max(lay.slot_bytes for lay in self.layouts.values()) // ref.SLOT_ALIGN) \
            * ref.SLOT_ALIGN
        k_max = max(self.desc.layers[li].n_expert_used for li in self.layers)
        n_slots = min(self.budget_bytes // sb, sum(self.desc.layers[li].n_expert
                                                    for li in self.layers))
        if n_slots < k_max:
            raise ValueError(
                f"cuda expert budget of {self.budget_bytes} bytes holds {n_slots} experts of "
                f"{sb} bytes ({self.weights}), but one token needs {k_max} at once: give at "
                f"least {k_max * sb} bytes")
        self.slot_bytes = sb
        self.n_slots = int(n_slots)
        self.lru: OrderedDict[tuple[int, int], int] = OrderedDict()
        self.free_slots = list(range(self.n_slots - 1, -1, -1))
        self.dirty: set[int] = set()
        n_layers = len(self.desc.layers)
        self.st = {name: np.zeros(n_layers, np.uint64)
                   for name in ("calls", "uses", "hits", "misses", "bytes_staged", "evictions",
                                "splits")}
        # the host store's slot pool, page-locked for the direct copies (cache mode)
        self.pool_view: np.ndarray | None = None
        if self.store.mode == "cache":
            self.pool_view = self.store.pool_view()
            if not self.store.pool()["pinned"]:
                self.store.pin_pool(self.rt.pin_host_memory, self.rt.unpin_host_memory)
                self._pinned_store = True
        # the staging buffer for converted experts, page-locked, owned here
        self.stage_n = max(k_max, min(self.n_slots, STAGE_BYTES // sb))
        self._staging = np.zeros(self.stage_n * sb, np.uint8)
        self._staging_pinned = self.rt.pin_host_memory(self._staging)
        self._dev_buffer = self.rt.alloc(self.n_slots * sb)
        self.device_bytes = self.n_slots * sb
        for li in self.layers:
            n = self.desc.layers[li].n_expert
            self.offsets[li] = np.full(n, -1, np.int64)
            self.pools[li] = DevicePool(self.layouts[li], n, self.n_slots * sb,
                                        self._dev_buffer, self.rt.to_gpu(self.offsets[li]))

    def _host_view(self, li: int, addr: int, n: int) -> tuple[np.ndarray, bool]:
        """The host bytes [addr, addr + n) that the store handed out, as a view into memory
        this object knows (the store's pool or the layer's file mapping), and whether they are
        page-locked."""
        X = self.desc.layers[li].experts
        assert X is not None
        cands: list[tuple[np.ndarray, bool]] = []
        if self.pool_view is not None:
            cands.append((self.pool_view, bool(self.store.pool()["pinned"])))
        cands += [(X.gate_base, False), (X.up_base, False), (X.down_base, False)]
        for arr, pinned in cands:
            start = int(arr.ctypes.data)
            if start <= addr and addr + n <= start + arr.nbytes:
                return arr[addr - start : addr - start + n], pinned
        raise ColibriError(f"layer {li}: the expert store handed out {n} bytes at {addr:#x}, "
                           "outside its pool and the model's expert tensors")

    def _stage(self, li: int, need: np.ndarray, uses: np.ndarray) -> list[int]:
        """Make experts ``need`` of layer li resident in device slots; returns the experts
        acquired from the store (to release once the kernels are done)."""
        st = self.st
        miss = []
        for e in need.tolist():
            key = (li, e)
            if key in self.lru:
                self.lru.move_to_end(key)
            else:
                miss.append(e)
        st["hits"][li] += len(need) - len(miss)
        st["misses"][li] += len(miss)
        if not miss:
            return []
        miss_a = np.asarray(miss, np.int32)
        addrs = self.store.acquire(li, miss_a, uses[np.searchsorted(need, miss_a)])
        slots: list[int] = []
        try:
            for e in miss:  # free slots first, then the least recently used (never one of need)
                if self.free_slots:
                    s = self.free_slots.pop()
                else:
                    (vl, ve), s = self.lru.popitem(last=False)
                    assert vl != li or ve not in need, "a victim of this very call"
                    self.offsets[vl][ve] = -1
                    self.dirty.add(vl)
                    st["evictions"][vl] += 1
                self.lru[(li, e)] = s
                slots.append(s)
            self._copy_experts(li, miss, addrs, slots)
        except BaseException:
            for e, s in zip(miss, slots, strict=False):
                self.lru.pop((li, e), None)
                self.free_slots.append(s)
            self.store.release(li, miss_a)
            raise
        self.offsets[li][miss_a] = np.asarray(slots, np.int64) * self.slot_bytes
        self.dirty.add(li)
        return miss

    def _copy_experts(self, li: int, miss: list[int], addrs: np.ndarray, slots: list[int]) -> None:
        """Converted (or raw) experts into their device slots, asynchronously on the stream."""
        stream = self.rt.stream
        base = int(self._dev_buffer)
        lay = self.layouts[li]
        nb = self._raw_bytes(li)
        staged = 0
        for i, (e, s) in enumerate(zip(miss, slots, strict=True)):
            dest = base + s * self.slot_bytes
            views = [self._host_view(li, int(addrs[i, j]), nb[j]) for j in range(3)]
            if self.direct[li]:  # fp16 in the file: the bytes as they are
                for j, (v, pinned) in enumerate(views):
                    self.rt.copy_htod(dest + j * lay.matrix_bytes, v, stream if pinned else None)
                self.st["bytes_staged"][li] += sum(nb)
                continue
            if staged == self.stage_n:  # the staging buffer is full: wait for its copies
                stream.synchronize()
                staged = 0
            buf = self._staging_pinned
            assert buf is not None
            part = buf[staged * self.slot_bytes : staged * self.slot_bytes + lay.slot_bytes]
            self._pack(li, e, (views[0][0], views[1][0], views[2][0]), part)
            self.rt.copy_htod(dest, part, stream)
            staged += 1
            self.st["bytes_staged"][li] += lay.slot_bytes

    def _run_staged(self, li: int, h: np.ndarray, logits: np.ndarray, out: np.ndarray,
                    tile: int) -> None:
        L = self.desc.layers[li]
        r = self.rt.route(logits, L.n_expert_used, self.gating, bias=L.router_bias,
                          renorm=bool(self.desc.expert_renorm),
                          scale=float(self.desc.expert_scale), tile=tile)
        counts = r.arrays["counts"].get()  # the one read-back: which experts this batch uses
        need = np.flatnonzero(counts).astype(np.int32)
        if need.size > self.n_slots:  # more experts than device slots: token chunks that fit
            self.st["splits"][li] += 1
            ids = r.arrays["topk_ids"].get().reshape(r.n_tokens, r.k)
            a, cur = 0, set[int]()
            for t in range(r.n_tokens):
                row = set(ids[t].tolist())
                if len(cur | row) > self.n_slots:
                    self._run_staged(li, h[a:t], logits[a:t], out[a:t], tile)
                    a, cur = t, set()
                cur |= row
            self._run_staged(li, h[a:], logits[a:], out[a:], tile)
            return
        self.st["calls"][li] += 1
        self.st["uses"][li] += int(counts.sum())
        self.counts[li] += counts.astype(np.uint64)
        acquired = self._stage(li, need, counts[need])
        try:
            pool = self.pools[li]
            if li in self.dirty:
                self.rt.copy_htod(int(pool.offsets.gpudata), self.offsets[li])
                self.dirty.discard(li)
            D = self.desc.n_embd
            Dp, _ = self.padded[li]
            x = h if Dp == D else np.pad(h, ((0, 0), (0, Dp - D)))
            y = self.rt.moe_ffn(x, pool, r, self.activation, stream=self.rt.stream)
            out[:] = y[:, :D]
        finally:  # the stream was synchronised: the copies from the store's slots are done
            if acquired:
                self.store.release(li, np.asarray(acquired, np.int32))

    # ------------------------------------------------------------------ the hook
    def __call__(self, layer: int, h: np.ndarray, logits: np.ndarray, out: np.ndarray) -> None:
        """The forward's MoE hook: route ``logits`` and run the experts on ``h`` into ``out``."""
        if self._closed:
            raise ColibriError("the CUDA experts were closed")
        L = self.desc.layers[layer]
        if self.staged:
            n, k, E = h.shape[0], L.n_expert_used, L.n_expert
            self._run_staged(layer, h, logits, out, 64 if n * k >= 32 * E else 16)
            return
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

    def stats(self, layer: int = -1) -> dict[str, float]:
        """Device expert statistics of one layer or all (-1): calls, uses, hits, misses,
        bytes_staged, evictions, splits (batches split to fit the slots), plus the device
        slots, their bytes and how many hold an expert. The whole pool: every expert resident,
        nothing staged."""
        base: dict[str, float] = {"staged": float(self.staged),
                                  "device_bytes": float(self.device_bytes)}
        if not self.staged:
            return base
        sel = slice(None) if layer == -1 else slice(layer, layer + 1)
        if layer != -1 and layer not in self.counts:
            raise ValueError(f"layer {layer} has no experts")
        out = {name: float(v[sel].sum()) for name, v in self.st.items()}
        out.update(base, device_slots=float(self.n_slots), slot_bytes=float(self.slot_bytes),
                   resident=float(len(self.lru) if layer == -1
                                  else sum(1 for (li, _) in self.lru if li == layer)))
        return out

    def reset_stats(self) -> None:
        if self.staged:
            for v in self.st.values():
                v[:] = 0

    def close(self) -> None:
        """Unpin the store's pool and the staging buffer, free the device slots (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pinned_store:
            self._pinned_store = False
            self.store.unpin_pool()
        if self._staging_pinned is not None:
            pinned, self._staging_pinned = self._staging_pinned, None
            self.rt.unpin_host_memory(pinned)
        if self._dev_buffer is not None:
            buf, self._dev_buffer = self._dev_buffer, None
            buf.free()
        self.pools.clear()
