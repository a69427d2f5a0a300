"""colibri.cuda: the MoE routing and expert kernels on an NVIDIA GPU, through PyCUDA.

Importing this module never fails for lack of a GPU: :func:`available` says whether PyCUDA
and a CUDA device are usable (and :func:`unavailable_reason` why not); everything that needs
the device raises :class:`colibri.ColibriError` with that reason otherwise.

* :class:`CudaRuntime` (one per device, :func:`get_runtime` keeps a default one): compiles
  ``cuda/routing.cu`` and ``cuda/moe_gemm.cu`` with ``pycuda.compiler`` for the device's own
  architecture (``-arch=sm_XY`` from its compute capability) once, caching the cubins in
  ``~/.cache/colibri/cuda/<hash>_<file>_sm_XY.cubin`` (``COLIBRI_CUDA_CACHE`` overrides the
  folder; the hash covers every source, the options and the architecture).
* :meth:`CudaRuntime.route`: the fused routing kernel -> :class:`Routing` (device buffers).
* :meth:`CudaRuntime.upload_pool` -> :class:`DevicePool`: the expert pool (layout in
  ``colibri._cuda_ref`` and docs/ARCHITECTURE.md) copied to the device; the host bytes stay
  owned by the caller (the expert store), which can pin them with
  :meth:`CudaRuntime.pin_host_memory` (``cuMemHostRegister``) for fast asynchronous copies.
* :meth:`CudaRuntime.moe_ffn`: the grouped expert FFN for a routed batch. fp16 experts use the
  cp.async-pipelined GEMM kernels on sm_80+ (:attr:`CudaRuntime.gemm_pipeline` "cp"), the
  register-prefetch ones elsewhere and for int4 ("regs"; ``COLIBRI_CUDA_GEMM_PIPELINE=regs``
  forces them).

Every launch goes through :meth:`CudaRuntime._launch`, which turns a driver error into a
ColibriError naming the kernel and its grid; every kernel also reports bad input in a small
device error record (cuda/common.cuh) that is read back after the batch and raised with the
source file, line and statement.

Threading: the runtime pushes the device's primary context on the thread that creates it;
use it from that thread.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from colibri import _cuda_ref as ref
from colibri._core import _forward
from colibri._core._forward import ROUTE_MAX_EXPERTS, ROUTE_MAX_K, ROUTE_WARP_MAX_EXPERTS
from colibri._cuda_ref import (
    ExpertLayout,
    build_pool,
    dequantize_int4_g128,
    moe_ffn_reference,
    quantize_int4_g128,
    route_reference,
    routing_capacity,
)
from colibri._dist import install_hint
from colibri.errors import ColibriError

__all__ = [
    "CudaRuntime",
    "DevicePool",
    "ExpertLayout",
    "Routing",
    "available",
    "build_pool",
    "dequantize_int4_g128",
    "gemm_cp_smem_bytes",
    "get_runtime",
    "kernel_dir",
    "moe_ffn_reference",
    "quantize_int4_g128",
    "route_plan",
    "route_reference",
    "routing_capacity",
    "unavailable_reason",
]

NVCC_OPTIONS = ["-std=c++17", "-O3"]
MODULES = ("routing", "moe_gemm")
ROUTE_THREADS = 1024
ROUTE_MB_THREADS = 256  # the multi-block routing kernels' blocks
# route_plan()'s switch-overs: multi-block above these tokens, or these logits from 32
# experts; in the single block a warp per token up to ROUTE_WARP_TOKENS or from 32 experts
MULTI_BLOCK_TOKENS, MULTI_BLOCK_LOGITS, ROUTE_WARP_TOKENS = 2048, 2048, 32
MAX_EXPERTS = ROUTE_MAX_EXPERTS  # CB_ROUTE_MAX_EXPERTS in cuda/routing_logic.h
MAX_K = ROUTE_MAX_K  # CB_ROUTE_MAX_K
TILES = (16, 64)  # the GEMM row tiles (m16 and m64 kernels)
# tile -> (columns per block, threads per block) of the GEMM kernels in cuda/moe_gemm.cu
GEMM_CONFIG = {16: (64, 128), 64: (128, 256)}
COMBINE_THREADS = 256
# The fp16 "_cp" GEMM kernels (cuda/moe_gemm.cu, moe_gemm_cp_body): a multi-stage cp.async
# pipeline in dynamic shared memory, used on sm_80+ unless COLIBRI_CUDA_GEMM_PIPELINE=regs.
# tile -> (columns per block, slice depth BK, threads per block, stages)
GEMM_CP_CONFIG = {16: (64, 64, 128, 4), 64: (128, 32, 256, 3)}
GEMM_PIPELINES = ("cp", "regs")

# PyCUDA "prepared" argument types of every kernel: P pointer, i int32, f float32. They must
# follow the C parameter lists; tests/cuda/test_cuda_sources.py checks them against the .cu files.
_GEMM_SIG = "PPPPPP" + "iiii" + "PPP"
KERNELS: dict[str, tuple[str, str]] = {
    "cb_route_topk": ("routing", "P" + "iiii" + "P" + "if" + "iii" + "P" * 11),
    "cb_route_count": ("routing", "P" + "iiii" + "P" + "if" + "i" + "P" * 7),
    "cb_route_place": ("routing", "iiiii" + "P" * 9),
    "cb_moe_combine": ("moe_gemm", "PP" + "iii" + "PP"),
    **{
        f"cb_moe_{part}_{w}_m{t}": ("moe_gemm", _GEMM_SIG)
        for part in ("gate_up", "down")
        for w in ("f16", "i4")
        for t in TILES
    },
    **{
        f"cb_moe_{part}_f16_m{t}_cp": ("moe_gemm", _GEMM_SIG)
        for part in ("gate_up", "down")
        for t in TILES
    },
}


def gemm_cp_smem_bytes(tile: int, gate_up: bool) -> int:
    """Dynamic shared memory of a "_cp" GEMM kernel: its stages of (tile + NW * BN) rows of
    BK + 8 halves (NW = 2 weight tiles for gate/up, 1 for down), or the fp32 epilogue tile if
    larger. The kernel checks it was given at least this (CB_KERR_SMEM)."""
    bn, bk, _, stages = GEMM_CP_CONFIG[tile]
    nw = 2 if gate_up else 1
    return max(stages * (tile + nw * bn) * (bk + 8) * 2, tile * (bn + 4) * 4)

# The device error record (cuda/common.cuh): err[0] code, err[1] line, err[2] file id, err[3] value.
# The codes and file ids are cuda/kernel_abi.h's enums, read from the header at build time.
_KERR = _forward.cb_kerr
_KERR_NAMES: dict[int, str] = {
    _KERR.CB_KERR_ROUTE_ARG: "routing arguments out of range",
    _KERR.CB_KERR_ROUTE_NONFINITE: "a router logit or bias is NaN or infinite",
    _KERR.CB_KERR_CAPACITY: "the sorted token list does not fit its capacity",
    _KERR.CB_KERR_NOT_RESIDENT: "a routed expert is not resident in the expert pool",
    _KERR.CB_KERR_SHAPE: "a GEMM dimension is not supported",
    _KERR.CB_KERR_SMEM: "a GEMM kernel was launched with less dynamic shared memory than it needs",
}
_FILE_IDS: dict[int, str] = {_forward.cb_kfile.CB_KFILE_ROUTING: "routing.cu",
             _forward.cb_kfile.CB_KFILE_MOE_GEMM: "moe_gemm.cu"}


def kernel_dir() -> Path:
    """The folder holding the .cu sources: ``COLIBRI_CUDA_DIR``, else the copy shipped in the
    installed package (colibri/_cuda_src, made by setup.py), else ``cuda/`` of the source
    checkout the package runs from (an editable install)."""
    env = os.environ.get("COLIBRI_CUDA_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    shipped = here / "_cuda_src"
    if (shipped / "routing.cu").is_file():
        return shipped
    return here.parent / "cuda"


def _import_pycuda() -> Any:
    """pycuda.driver, initialised, or ColibriError saying what is missing."""
    try:
        import pycuda.driver as drv
    except ImportError as e:
        raise ColibriError(
            "PyCUDA not installed (or its CUDA driver library is missing): "
            f"{install_hint('cuda')} on a machine with the CUDA toolkit ({e})"
        ) from e
    try:
        drv.init()
        n = drv.Device.count()
    except Exception as e:  # pycuda.driver.Error and friends
        raise ColibriError(f"no CUDA device: the CUDA driver failed to initialise ({e})") from e
    if n == 0:
        raise ColibriError("no CUDA device present")
    return drv


def unavailable_reason() -> str | None:
    """None when PyCUDA and a CUDA device are usable, else why not. Never raises."""
    try:
        _import_pycuda()
    except ColibriError as e:
        return str(e)
    except Exception as e:  # anything odd in a half-installed PyCUDA
        return f"PyCUDA unusable: {e!r}"
    return None


def available() -> bool:
    """True when PyCUDA and a CUDA device are usable. Never raises."""
    return unavailable_reason() is None


def _cache_dir() -> Path:
    env = os.environ.get("COLIBRI_CUDA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "colibri" / "cuda"


def _sources_digest(arch: str) -> str:
    h = hashlib.sha256()
    for p in sorted(kernel_dir().glob("*")):
        if p.suffix in (".cu", ".cuh", ".h"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(NVCC_OPTIONS + [arch]).encode())
    return h.hexdigest()[:20]


def compile_cubin(module: str, arch: str, cache_dir: Path | None = None) -> bytes:
    """The cubin of cuda/<module>.cu for ``arch`` (e.g. "sm_90"): from the disk cache, or
    compiled with pycuda.compiler (nvcc) and cached (written atomically)."""
    if module not in MODULES:
        raise ValueError(f"unknown CUDA module {module!r}; known: {MODULES}")
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch must look like sm_90, got {arch!r}")
    src = kernel_dir() / f"{module}.cu"
    if not src.is_file():
        raise ColibriError(f"CUDA source {src} not found (set COLIBRI_CUDA_DIR)")
    folder = cache_dir if cache_dir is not None else _cache_dir()
    path = folder / f"{_sources_digest(arch)}_{module}_{arch}.cubin"
    if path.is_file():
        return path.read_bytes()
    from pycuda import compiler

    try:
        cubin: bytes = compiler.compile(
            src.read_text(),
            options=list(NVCC_OPTIONS),
            no_extern_c=True,
            arch=arch,
            cache_dir=False,
            include_dirs=[str(kernel_dir())],
        )
    except Exception as e:
        raise ColibriError(f"nvcc failed on cuda/{module}.cu for {arch}: {e}") from e
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(cubin)
    os.replace(tmp, path)
    return cubin


def route_plan(n_tokens: int, n_experts: int, multi_block: bool | None = None
               ) -> tuple[bool, bool]:
    """(multi_block, per_warp): the fastest routing variant for the batch on an H200 (the
    sweep in docs/benchmarks.md "CUDA"): the multi-block pair from a few dozen tokens of
    128-256 experts; the single block for few tokens, or few experts (8: up to 2048 tokens,
    a thread per token). ``multi_block`` given: kept."""
    if multi_block is None:
        multi_block = n_tokens > MULTI_BLOCK_TOKENS or (
            n_experts >= 32 and n_tokens * n_experts > MULTI_BLOCK_LOGITS)
    warp = n_experts <= ROUTE_WARP_MAX_EXPERTS
    return multi_block, warp and (multi_block or n_tokens <= ROUTE_WARP_TOKENS or n_experts >= 32)


def _ptr(a: Any) -> int:
    """A device pointer as an int for a "P" argument: GPUArray, DeviceAllocation or None."""
    if a is None:
        return 0
    return int(a.gpudata) if hasattr(a, "gpudata") else int(a)


def _source_line(file_id: int, line: int) -> str:
    name = _FILE_IDS.get(file_id, "?")
    try:
        text = (kernel_dir() / name).read_text().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        text = "?"
    return f"cuda/{name}:{line}: {text}"


@dataclass
class Routing:
    """The routing of a batch, in device memory (pycuda GPUArrays), as cb_route_topk wrote it.

    ``arrays``: topk_ids [T*k] int32, topk_w [T*k] float32, sel_offset [T*k] int64, counts [E],
    seg_offset [E+1], sorted_token [cap], sorted_weight [cap], pair_pos [T*k], tile_expert
    [cap/tile] (int32 unless said), err [4] int32.
    """

    n_tokens: int
    k: int
    n_experts: int
    tile: int
    cap: int
    arrays: dict[str, Any] = field(repr=False)
    inputs: list[Any] = field(default_factory=list, repr=False)  # logits, bias, slots (device)

    def to_host(self) -> dict[str, np.ndarray]:
        """Every array copied back (synchronously), ids/weights reshaped to [T, k]."""
        out = {name: a.get() for name, a in self.arrays.items()}
        for name in ("topk_ids", "topk_w", "sel_offset", "pair_pos"):
            out[name] = out[name].reshape(self.n_tokens, self.k)
        return out


@dataclass
class DevicePool:
    """An expert pool in device memory: ``buffer`` (pycuda DeviceAllocation, owned),
    ``offsets`` (GPUArray int64 [n_experts], byte offset of each expert's slot, -1 = absent)."""

    layout: ExpertLayout
    n_experts: int
    nbytes: int
    buffer: Any = field(repr=False)
    offsets: Any = field(repr=False)


@dataclass
class Workspace:
    """Scratch and output buffers of one moe_ffn launch sequence: h [cap, F] fp16, z [cap, D]
    float32, out [T, D] float32, err [4] int32 (GPUArrays)."""

    h: Any
    z: Any
    out: Any
    err: Any


class CudaRuntime:
    """One CUDA device with colibri's kernels loaded (see the module docstring)."""

    def __init__(self, device: int = 0, cache_dir: Path | None = None) -> None:
        drv = _import_pycuda()
        from pycuda import gpuarray

        self._drv = drv
        self._gpuarray = gpuarray
        if not 0 <= device < drv.Device.count():
            raise ValueError(f"CUDA device {device} does not exist ({drv.Device.count()} present)")
        self.device = drv.Device(device)
        self.name: str = self.device.name()
        cc = self.device.compute_capability()
        if tuple(cc) < (7, 0):
            raise ColibriError(f"{self.name} (sm_{cc[0]}{cc[1]}) has no tensor cores (WMMA needs sm_70+)")
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self._context = self.device.retain_primary_context()
        self._context.push()
        self._pushed = True
        atexit.register(self.close)
        modules = {m: drv.module_from_buffer(compile_cubin(m, self.arch, cache_dir)) for m in MODULES}
        self._fn: dict[str, Any] = {}
        for name, (module, sig) in KERNELS.items():
            fn = modules[module].get_function(name)
            fn.prepare(sig)
            self._fn[name] = fn
        self._modules = modules
        self.cp_supported, self.gemm_pipeline = self._setup_gemm_pipeline(drv, cc)

    def _setup_gemm_pipeline(self, drv: Any, cc: tuple[int, int]) -> tuple[bool, str]:
        """Whether the cp.async GEMM kernels can run here (sm_80+ with enough opt-in shared
        memory; their limits raised with cuFuncSetAttribute), and the pipeline moe_ffn uses by
        default: "cp" where they can, else "regs"; COLIBRI_CUDA_GEMM_PIPELINE overrides."""
        need = max(gemm_cp_smem_bytes(t, gu) for t in TILES for gu in (True, False))
        optin = self.device.get_attribute(drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        ok = tuple(cc) >= (8, 0) and optin >= need
        if ok:
            for t in TILES:
                for part in ("gate_up", "down"):
                    self._fn[f"cb_moe_{part}_f16_m{t}_cp"].set_attribute(
                        drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        gemm_cp_smem_bytes(t, part == "gate_up"))
        want = os.environ.get("COLIBRI_CUDA_GEMM_PIPELINE", "").strip().lower()
        if want and want not in GEMM_PIPELINES:
            raise ColibriError(f"COLIBRI_CUDA_GEMM_PIPELINE must be one of {GEMM_PIPELINES}, "
                               f"got {want!r}")
        if want == "cp" and not ok:
            raise ColibriError(f"COLIBRI_CUDA_GEMM_PIPELINE=cp needs sm_80+ and {need} bytes of "
                               f"shared memory per block; {self.name} is {self.arch} with {optin}")
        return ok, want or ("cp" if ok else "regs")

    def close(self) -> None:
        """Pop the context this runtime pushed (idempotent)."""
        if getattr(self, "_pushed", False):
            self._pushed = False
            try:
                self._context.pop()
            except Exception:  # interpreter shutdown: nothing left to release
                pass

    # ---------------------------------------------------------------- helpers
    def _launch(self, name: str, grid: tuple[int, int], block: int, args: list[Any],
                stream: Any = None, shared: int = 0) -> None:
        """Launch a prepared kernel (``shared`` bytes of dynamic shared memory); a driver error
        becomes a ColibriError naming it."""
        try:
            self._fn[name].prepared_async_call(grid + (1,), (block, 1, 1), stream, *args,
                                               shared_size=shared)
        except Exception as e:
            caller = sys._getframe(1)
            raise ColibriError(
                f"{name}<<<{grid}, {block}>>> failed at {caller.f_code.co_filename}:"
                f"{caller.f_lineno}: {e}"
            ) from e

    def _check_err(self, err: Any, what: str) -> None:
        rec = err.get()
        if rec[0] != 0:
            raise ColibriError(
                f"{what}: {_KERR_NAMES.get(int(rec[0]), f'kernel error {rec[0]}')} "
                f"(value {int(rec[3])}) at {_source_line(int(rec[2]), int(rec[1]))}"
            )

    def to_gpu(self, a: np.ndarray) -> Any:
        return self._gpuarray.to_gpu(np.ascontiguousarray(a))

    def zeros_i32(self, n: int) -> Any:
        """An int32 GPUArray of zeros, set with cuMemsetD32 (no kernel compiled at run time)."""
        a = self._gpuarray.empty(n, np.int32)
        self._drv.memset_d32(_ptr(a), 0, n)
        return a

    def poison(self, a: Any) -> None:
        """Fill a float32 or float16 GPUArray with NaN bit patterns (cuMemsetD32 / D16), so
        that elements a kernel fails to write show up."""
        if a.dtype == np.float16:
            self._drv.memset_d16(_ptr(a), 0xFFFF, a.size)
        elif a.dtype == np.float32:
            self._drv.memset_d32(_ptr(a), 0xFFFFFFFF, a.size)
        else:
            raise ValueError(f"poison: float16 or float32 arrays only, got {a.dtype}")

    def synchronize(self) -> None:
        self._context.synchronize()

    def pin_host_memory(self, array: np.ndarray) -> np.ndarray:
        """Page-lock host memory owned elsewhere (e.g. the expert store's slots) with
        cuMemHostRegister (colibri.cuda_host: the driver itself, PyCUDA's wrapper fails with
        NumPy 2); returns a view of it whose ``.base.unregister()`` undoes that
        (:meth:`unpin_host_memory`; call it before the owner frees the memory). ``array`` must
        be C-contiguous. Registering a range that overlaps a registered one fails."""
        from colibri import cuda_host

        return cuda_host.pin(array)

    def unpin_host_memory(self, pinned: np.ndarray) -> None:
        """Undo :meth:`pin_host_memory` (cuMemHostUnregister) for the view it returned."""
        reg: Any = pinned.base
        if not hasattr(reg, "unregister"):
            raise ColibriError("unpin_host_memory: not a view returned by pin_host_memory")
        reg.unregister()

    @property
    def stream(self) -> Any:
        """The runtime's copy-and-compute stream (created on first use); the staged expert
        path issues its host->device copies and the expert kernels on it."""
        if getattr(self, "_stream", None) is None:
            self._stream = self._drv.Stream()
        return self._stream

    def alloc(self, nbytes: int) -> Any:
        """A device allocation of nbytes (pycuda DeviceAllocation, freed with .free())."""
        try:
            return self._drv.mem_alloc(max(int(nbytes), 1))
        except Exception as e:
            raise ColibriError(f"cuMemAlloc of {nbytes} bytes failed: {e}") from e

    def copy_htod(self, dest: int, src: np.ndarray, stream: Any = None) -> None:
        """Copy host bytes to device address ``dest``: asynchronously on ``stream`` (``src``
        must then be pinned and stay untouched until the stream passes the copy), else
        synchronously."""
        buf = np.ascontiguousarray(src).view(np.uint8).ravel()
        if stream is None:
            self._drv.memcpy_htod(int(dest), buf)
        else:
            self._drv.memcpy_htod_async(int(dest), buf, stream)

    # ---------------------------------------------------------------- routing
    def route(
        self,
        logits: np.ndarray,
        k: int,
        gating: str = "softmax",
        bias: np.ndarray | None = None,
        renorm: bool = False,
        scale: float = 1.0,
        tile: int | None = None,
        slot_offset: np.ndarray | None = None,
        check: bool = True,
        multi_block: bool | None = None,
        per_warp: bool | None = None,
    ) -> Routing:
        """Route ``logits`` [n_tokens, n_experts] (float32) with the fused kernel.

        ``tile`` (16 or 64) is the GEMM row tile the segments are padded to; None picks 64
        when the batch averages at least 32 rows per expert, else 16. ``slot_offset`` (int64
        [n_experts], pool byte offsets, -1 = absent) fills ``sel_offset`` and checks that every
        routed expert is resident. With ``check`` the device error record is read (one sync).
        ``multi_block``: the two-kernel routing (cb_route_count over the tokens, then
        cb_route_place, a warp per expert over the grid) instead of the single block.
        ``per_warp``: route each token with a whole warp (up to ROUTE_WARP_MAX_EXPERTS experts)
        rather than one thread. None: as route_plan() says. All write the same outputs.
        """
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        if lg.ndim != 2 or lg.shape[0] < 1:
            raise ValueError(f"logits must be [n_tokens >= 1, n_experts], got shape {lg.shape}")
        n_tokens, n_experts = lg.shape
        if not 1 <= n_experts <= MAX_EXPERTS:
            raise ValueError(f"n_experts={n_experts} must be in [1, {MAX_EXPERTS}]")
        if not 1 <= k <= min(n_experts, MAX_K):
            raise ValueError(f"k={k} must be in [1, {min(n_experts, MAX_K)}]")
        if gating not in ref.GATINGS:
            raise ValueError(f"gating must be one of {sorted(ref.GATINGS)}, got {gating!r}")
        if not np.isfinite(lg).all():
            raise ValueError("router logits contain NaN or infinite values")
        if not np.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
        if per_warp and n_experts > ROUTE_WARP_MAX_EXPERTS:
            raise ValueError(f"per_warp routing takes at most {ROUTE_WARP_MAX_EXPERTS} experts")
        if tile is None:
            tile = 64 if n_tokens * k >= 32 * n_experts else 16
        if tile not in TILES:
            raise ValueError(f"tile must be one of {TILES}, got {tile}")
        if n_tokens * k + n_experts * tile >= 2**31:
            raise ValueError(f"batch of {n_tokens} tokens is too large for int32 row indices")
        cap = routing_capacity(n_tokens, k, n_experts, tile)
        ga = self._gpuarray
        bias_gpu = None
        if bias is not None:
            b = np.ascontiguousarray(bias, dtype=np.float32)
            if b.shape != (n_experts,) or not np.isfinite(b).all():
                raise ValueError(f"bias must be {n_experts} finite floats, got shape {b.shape}")
            bias_gpu = self.to_gpu(b)
        slot_gpu = None
        if slot_offset is not None:
            so = np.ascontiguousarray(slot_offset, dtype=np.int64)
            if so.shape != (n_experts,):
                raise ValueError(f"slot_offset must have shape ({n_experts},), got {so.shape}")
            slot_gpu = self.to_gpu(so)
        pairs = n_tokens * k
        arrays = {
            "topk_ids": ga.empty(pairs, np.int32),
            "topk_w": ga.empty(pairs, np.float32),
            "sel_offset": ga.empty(pairs, np.int64),
            "counts": ga.empty(n_experts, np.int32),
            "seg_offset": ga.empty(n_experts + 1, np.int32),
            "sorted_token": ga.empty(cap, np.int32),
            "sorted_weight": ga.empty(cap, np.float32),
            "pair_pos": ga.empty(pairs, np.int32),
            "tile_expert": ga.empty(cap // tile, np.int32),
            "err": self.zeros_i32(4),
        }
        lg_gpu = self.to_gpu(lg)
        r = Routing(n_tokens, k, n_experts, tile, cap, arrays, [lg_gpu, bias_gpu, slot_gpu])
        multi_block, planned = route_plan(n_tokens, n_experts, multi_block)
        per_warp = planned if per_warp is None else per_warp
        self.route_launch(lg_gpu, r, ref.GATINGS[gating], bias_gpu, renorm, scale, slot_gpu,
                          multi_block=multi_block, per_warp=per_warp)
        if check:
            self._check_err(arrays["err"], "cb_route_topk")
        return r

    def route_launch(self, logits_gpu: Any, r: Routing, gating: int, bias_gpu: Any,
                     renorm: bool, scale: float, slot_gpu: Any, stream: Any = None,
                     multi_block: bool = False, per_warp: bool = True) -> None:
        """Launch cb_route_topk (or the multi-block pair) into the buffers of ``r`` (no checks,
        no sync); ``per_warp`` where the expert count allows it."""
        a = r.arrays
        pw = int(per_warp and r.n_experts <= ROUTE_WARP_MAX_EXPERTS)
        if multi_block:
            self._drv.memset_d32(_ptr(a["counts"]), 0, r.n_experts)  # summed into by blocks
            self._launch(
                "cb_route_count", (-(-r.n_tokens // (ROUTE_MB_THREADS // (32 if pw else 1))), 1),
                ROUTE_MB_THREADS,
                [_ptr(logits_gpu), r.n_tokens, r.n_experts, r.k, gating, _ptr(bias_gpu),
                 int(bool(renorm)), float(scale), pw, _ptr(slot_gpu), _ptr(a["topk_ids"]),
                 _ptr(a["topk_w"]), _ptr(a["sel_offset"]), _ptr(a["pair_pos"]),
                 _ptr(a["counts"]), _ptr(a["err"])],
                stream,
            )
            self._launch(
                "cb_route_place", (-(-r.n_experts // (ROUTE_MB_THREADS // 32)), 1),
                ROUTE_MB_THREADS,
                [r.n_tokens, r.n_experts, r.k, r.tile, r.cap, _ptr(a["topk_ids"]),
                 _ptr(a["topk_w"]), _ptr(a["counts"]), _ptr(a["seg_offset"]),
                 _ptr(a["sorted_token"]), _ptr(a["sorted_weight"]), _ptr(a["pair_pos"]),
                 _ptr(a["tile_expert"]), _ptr(a["err"])],
                stream,
            )
            return
        self._launch(
            "cb_route_topk", (1, 1), ROUTE_THREADS,
            [_ptr(logits_gpu), r.n_tokens, r.n_experts, r.k, gating,
             _ptr(bias_gpu), int(bool(renorm)), float(scale),
             r.tile, r.cap, pw, _ptr(slot_gpu),
             _ptr(a["topk_ids"]), _ptr(a["topk_w"]), _ptr(a["sel_offset"]),
             _ptr(a["counts"]), _ptr(a["seg_offset"]), _ptr(a["sorted_token"]),
             _ptr(a["sorted_weight"]), _ptr(a["pair_pos"]), _ptr(a["tile_expert"]),
             _ptr(a["err"])],
            stream,
        )

    # ---------------------------------------------------------------- experts
    def upload_pool(self, pool: np.ndarray, offsets: np.ndarray, layout: ExpertLayout) -> DevicePool:
        """Copy an expert pool (uint8 host bytes, pinned or not; still owned by the caller) to
        the device. ``offsets[e]``: byte offset of expert e's slot, or -1 if absent."""
        buf = np.ascontiguousarray(pool).view(np.uint8).ravel()
        off = np.ascontiguousarray(offsets, dtype=np.int64)
        if off.ndim != 1 or off.size < 1:
            raise ValueError(f"offsets must be a non-empty 1-D array, got shape {off.shape}")
        need = 3 * layout.matrix_bytes
        present = off[off >= 0]
        if (off < -1).any() or (present % 16).any() or (present + need > buf.size).any():
            raise ValueError(
                f"expert offsets must be -1 or 16-byte aligned slots of {need} bytes inside the "
                f"{buf.size}-byte pool"
            )
        dev = self._drv.mem_alloc(max(buf.size, 1))
        self._drv.memcpy_htod(dev, buf)
        return DevicePool(layout, off.size, buf.size, dev, self.to_gpu(off))

    def write_slot(self, pool: DevicePool, byte_offset: int, data: np.ndarray,
                   stream: Any = None) -> None:
        """Copy host bytes (e.g. one expert slot the expert store just filled) into the device
        pool at ``byte_offset``; asynchronous on ``stream`` when given (the host memory must
        then be pinned and stay untouched until the stream reaches the copy)."""
        buf = np.ascontiguousarray(data).view(np.uint8).ravel()
        if byte_offset < 0 or byte_offset + buf.size > pool.nbytes:
            raise ValueError(
                f"write of {buf.size} bytes at {byte_offset} is outside the {pool.nbytes}-byte pool"
            )
        dest = int(pool.buffer) + byte_offset
        if stream is None:
            self._drv.memcpy_htod(dest, buf)
        else:
            self._drv.memcpy_htod_async(dest, buf, stream)

    def upload_experts(self, experts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                       layout: ExpertLayout) -> DevicePool:
        """Pack (gate, up, down) float weights per expert into a pool and upload it."""
        pool, offsets = build_pool(experts, layout)
        return self.upload_pool(pool, offsets, layout)

    def workspace(self, routing: Routing, layout: ExpertLayout) -> Workspace:
        ga = self._gpuarray
        return Workspace(
            h=ga.empty(routing.cap * layout.ffn, np.float16),
            z=ga.empty(routing.cap * layout.hidden, np.float32),
            out=ga.empty(routing.n_tokens * layout.hidden, np.float32),
            err=self.zeros_i32(4),
        )

    def moe_ffn_launch(self, x_gpu: Any, pool: DevicePool, routing: Routing, act: int,
                       ws: Workspace, stream: Any = None, pipeline: str | None = None) -> None:
        """Launch gate/up, down and combine for a routed batch (no checks, no sync):
        ws.out [T, D] float32 receives the weighted sum of each token's experts.
        ``pipeline`` ("cp" or "regs", default :attr:`gemm_pipeline`) picks the fp16 GEMM
        kernels; int4 weights always use the register-prefetch kernels."""
        lay, r, a = pool.layout, routing, routing.arrays
        pipe = pipeline or self.gemm_pipeline
        if pipe not in GEMM_PIPELINES or (pipe == "cp" and not self.cp_supported):
            raise ColibriError(f"GEMM pipeline {pipe!r} is not available on {self.name} "
                               f"({self.arch}); use one of {GEMM_PIPELINES} (cp needs sm_80+)")
        w = "i4" if lay.fmt == "int4-g128" else "f16"
        cp = pipe == "cp" and w == "f16"
        bn, threads = GEMM_CONFIG[r.tile]
        tiles = r.cap // r.tile
        common = [_ptr(a["sorted_token"]), _ptr(a["sorted_weight"]), _ptr(a["tile_expert"]),
                  _ptr(pool.buffer), _ptr(pool.offsets), pool.n_experts]
        sfx = "_cp" if cp else ""
        self._launch(f"cb_moe_gate_up_{w}_m{r.tile}{sfx}", (tiles, -(-lay.ffn // bn)), threads,
                     [_ptr(x_gpu), *common, lay.hidden, lay.ffn, act, _ptr(ws.h), 0,
                      _ptr(ws.err)], stream, gemm_cp_smem_bytes(r.tile, True) if cp else 0)
        self._launch(f"cb_moe_down_{w}_m{r.tile}{sfx}", (tiles, -(-lay.hidden // bn)), threads,
                     [_ptr(ws.h), *common, lay.ffn, lay.hidden, act, 0, _ptr(ws.z),
                      _ptr(ws.err)], stream, gemm_cp_smem_bytes(r.tile, False) if cp else 0)
        self._launch("cb_moe_combine", (r.n_tokens, 1), COMBINE_THREADS,
                     [_ptr(ws.z), _ptr(a["pair_pos"]), r.n_tokens, r.k, lay.hidden,
                      _ptr(ws.out), _ptr(ws.err)], stream)

    def moe_ffn(self, x: np.ndarray, pool: DevicePool, routing: Routing,
                activation: str = "silu", stream: Any = None,
                pipeline: str | None = None) -> np.ndarray:
        """The grouped expert FFN: out [T, D] float32 = sum_j w[t, j] * expert_{id[t, j]}(x[t])
        for x [T, D] (converted to fp16), the experts in ``pool``, routed by ``routing``.
        With ``stream`` the kernels run on it after whatever it holds (staged expert copies)
        and the stream is synchronised before the result is read."""
        xh = np.ascontiguousarray(x, dtype=np.float16)
        lay = pool.layout
        if xh.shape != (routing.n_tokens, lay.hidden):
            raise ValueError(f"x must have shape ({routing.n_tokens}, {lay.hidden}), got {xh.shape}")
        if routing.n_experts != pool.n_experts:
            raise ValueError(f"routing has {routing.n_experts} experts, the pool {pool.n_experts}")
        if activation not in ref.ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ref.ACTIVATIONS)}, got {activation!r}")
        ws = self.workspace(routing, lay)
        self.moe_ffn_launch(self.to_gpu(xh), pool, routing, ref.ACTIVATIONS[activation], ws,
                            stream, pipeline)
        if stream is not None:
            stream.synchronize()
        out: np.ndarray = ws.out.get().reshape(routing.n_tokens, lay.hidden)
        self._check_err(ws.err, "moe_ffn")
        return out


_runtimes: dict[int, CudaRuntime] = {}


def get_runtime(device: int = 0) -> CudaRuntime:
    """The process's runtime for ``device`` (created on first use)."""
    if device not in _runtimes:
        _runtimes[device] = CudaRuntime(device)
    return _runtimes[device]
