"""colibri/cuda.py end to end without a GPU: a stand-in `pycuda` package (driver, gpuarray,
compiler) backed by host memory launches the real kernels compiled for the CPU with
tests/cuda_emu (emu_lib.cpp + cuda_emu.h). This exercises the runtime's argument packing
(against the kernels' C signatures, through ctypes), buffer sizes, grids, tile choice, the
cubin cache and the device error records; results are compared with the NumPy references."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from cuda_util import cuda_include

from colibri import ColibriError
from colibri._cuda_ref import (
    ExpertLayout,
    build_pool,
    group_reference,
    moe_ffn_reference,
    route_reference,
    unpack_expert,
)

ROOT = Path(__file__).resolve().parents[2]


def separated_logits(rng, n_tokens, n_experts):
    """Random logits on a shuffled grid: no near-ties between experts."""
    base = np.arange(n_experts) * (8.0 / n_experts) - 4.0
    noise = rng.uniform(0, 2.0 / n_experts, (n_tokens, n_experts))
    return (np.array([rng.permutation(base) for _ in range(n_tokens)]) + noise).astype(np.float32)


INC = cuda_include()
pytestmark = [
    pytest.mark.slow,  # ~20 s to compile the kernels for the CPU
    pytest.mark.skipif(INC is None or shutil.which("g++") is None,
                       reason="CUDA toolkit headers (cuda_fp16.h) or g++ not installed"),
]


@pytest.fixture(scope="module")
def emu_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    so = tmp_path_factory.mktemp("cuda_emu_lib") / "libemu.so"
    subprocess.run(
        ["g++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
         "-shared", "-fPIC", "-pthread", f"-I{INC}", "-o", str(so),
         str(ROOT / "tests" / "cuda_emu" / "emu_lib.cpp")],
        check=True, timeout=600,
    )
    return ctypes.CDLL(str(so))


class Ptr:
    """A 'device pointer': the address of host memory kept alive by `owner`."""

    def __init__(self, owner: np.ndarray) -> None:
        self.owner = owner

    def __int__(self) -> int:
        return int(self.owner.ctypes.data)

    __index__ = __int__

    def free(self) -> None:
        pass


def poisoned(n: int, dtype) -> np.ndarray:
    a = np.empty(n, dtype)
    a.view(np.uint8)[:] = 0xFF if np.dtype(dtype).kind == "f" else 0x7F
    return a


class HostRegistry:
    """What the emulated driver knows about memory, checked the way the real one behaves or
    stricter: device allocations (every copy's device range must lie inside one), page-locked
    host ranges (cuMemHostRegister refuses a range overlapping a registered one; unregistering
    twice fails; an asynchronous host->device copy must come from a registered range, which is
    what colibri relies on for real asynchrony)."""

    def __init__(self) -> None:
        import weakref

        self.device: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self.pinned: dict[int, int] = {}  # start -> end of registered host ranges
        self.log: list[tuple[str, int, int]] = []  # ("register"/"unregister", start, bytes)
        self.async_bytes = 0

    def add_device(self, a: np.ndarray) -> None:
        self.device[int(a.ctypes.data)] = a

    def check_device(self, ptr: int, n: int, what: str) -> None:
        for start, a in list(self.device.items()):
            if start <= ptr and ptr + n <= start + a.nbytes:
                return
        raise AssertionError(f"{what}: device range [{ptr:#x}, +{n}) is in no allocation")

    def is_pinned(self, ptr: int, n: int) -> bool:
        return any(a <= ptr and ptr + n <= b for a, b in self.pinned.items())


def make_fake_pycuda(lib: ctypes.CDLL, calls: dict[str, int],
                     reg: HostRegistry | None = None, cc: tuple[int, int] = (9, 0),
                     smem_optin: int = 232448) -> dict[str, types.ModuleType]:
    """The stand-in pycuda package: a device of compute capability ``cc`` (sm_90 by default)
    with ``smem_optin`` bytes of opt-in shared memory per block (an H100/H200's 227 KiB). A
    launch with more dynamic shared memory than 48 KiB, or than the kernel's attribute allows,
    fails as the driver's would."""
    reg = reg if reg is not None else HostRegistry()
    drv = types.ModuleType("pycuda.driver")
    drv.registry = reg  # type: ignore[attr-defined]
    ga = types.ModuleType("pycuda.gpuarray")
    comp = types.ModuleType("pycuda.compiler")
    pkg = types.ModuleType("pycuda")

    class Error(Exception):
        pass

    class Ctx:
        def push(self):
            pass

        def pop(self):
            pass

        def synchronize(self):
            pass

    class Device:
        def __init__(self, i):
            assert i == 0

        @staticmethod
        def count():
            return 1

        def name(self):
            return f"emulated sm_{cc[0]}{cc[1]}"

        def compute_capability(self):
            return cc

        def get_attribute(self, attr):
            assert attr == "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", attr
            return smem_optin

        def retain_primary_context(self):
            return Ctx()

    class Function:
        def __init__(self, name):
            self.name = name
            self.fmt: str | None = None
            self.max_dynamic_smem = 48 * 1024

        def prepare(self, fmt):
            self.fmt = fmt

        def set_attribute(self, attr, value):
            assert attr == "MAX_DYNAMIC_SHARED_SIZE_BYTES", attr
            if value > smem_optin:
                raise Error("cuFuncSetAttribute failed: invalid value")
            self.max_dynamic_smem = value

        def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
            assert self.fmt is not None and len(args) == len(self.fmt), (self.name, args)
            if shared_size > self.max_dynamic_smem:
                raise Error(f"cuLaunchKernel failed: invalid argument ({shared_size} bytes of "
                            f"shared memory, {self.max_dynamic_smem} allowed)")
            conv = []
            for c, a in zip(self.fmt, args, strict=True):
                if c == "P":
                    assert isinstance(a, int), (self.name, a)
                    conv.append(ctypes.c_void_p(a or None))
                elif c == "i":
                    assert isinstance(a, int) and -(2**31) <= a < 2**31, (self.name, a)
                    conv.append(ctypes.c_int(a))
                else:
                    assert c == "f" and isinstance(a, float), (self.name, a)
                    conv.append(ctypes.c_float(a))
            assert len(grid) == 3 and grid[2] == 1 and block[1:] == (1, 1)
            calls[self.name] = calls.get(self.name, 0) + 1
            getattr(lib, f"emu_{self.name}")(ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]),
                                              ctypes.c_uint(block[0]),
                                              ctypes.c_size_t(shared_size), *conv)

    class Module:
        def get_function(self, name):
            return Function(name)

    def mem_alloc(n):
        a = poisoned(n, np.uint8)
        reg.add_device(a)
        return Ptr(a)

    def memcpy_htod(dest, src):
        src = np.ascontiguousarray(src)
        reg.check_device(int(dest), src.nbytes, "memcpy_htod")
        ctypes.memmove(int(dest), src.ctypes.data, src.nbytes)

    def memcpy_htod_async(dest, src, stream=None):
        assert isinstance(src, np.ndarray) and src.flags.c_contiguous, "a contiguous buffer"
        assert stream is None or isinstance(stream, Stream), stream
        if not reg.is_pinned(int(src.ctypes.data), src.nbytes):
            raise AssertionError(f"memcpy_htod_async from {src.nbytes} bytes of pageable memory")
        reg.async_bytes += src.nbytes
        calls["memcpy_htod_async"] = calls.get("memcpy_htod_async", 0) + 1
        memcpy_htod(dest, src)

    def memcpy_dtod(dest, src, n):
        reg.check_device(int(dest), n, "memcpy_dtod")
        reg.check_device(int(src), n, "memcpy_dtod")
        ctypes.memmove(int(dest), int(src), n)

    class Stream:
        def __init__(self, flags=0):
            calls["streams"] = calls.get("streams", 0) + 1

        def synchronize(self):
            calls["stream_sync"] = calls.get("stream_sync", 0) + 1

    class RegisteredHostMemory:
        """pycuda.driver.RegisteredHostMemory: the base of the array register_host_memory
        returns; unregister() ends the registration (a second call fails)."""

        def __init__(self, ary):
            self.ary, self.start, self.valid = ary, int(ary.ctypes.data), True
            self.__array_interface__ = ary.__array_interface__

        def unregister(self):
            if not self.valid:
                raise Error("registered_host_memory::free failed: invalid resource handle")
            self.valid = False
            del reg.pinned[self.start]
            reg.log.append(("unregister", self.start, self.ary.nbytes))

    def register_host_memory(ary, flags=0):
        if not isinstance(ary, np.ndarray) or not ary.flags.c_contiguous:
            raise Error("register_host_memory failed: ary argument is not contiguous")
        a, n = int(ary.ctypes.data), ary.nbytes
        if any(s < a + n and a < e for s, e in reg.pinned.items()):
            raise Error("cuMemHostRegister failed: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED")
        reg.pinned[a] = a + n
        reg.log.append(("register", a, n))
        return np.asarray(RegisteredHostMemory(ary))

    class Event:
        def record(self, stream=None):
            import time

            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def time_since(self, other):
            return (self.t - other.t) * 1e3

    def memset(ptr, value, count, ctype):
        np.ctypeslib.as_array((ctype * count).from_address(int(ptr)))[:] = value

    drv.memset_d16 = lambda ptr, v, n: memset(ptr, v, n, ctypes.c_uint16)
    drv.memset_d32 = lambda ptr, v, n: memset(ptr, v, n, ctypes.c_uint32)
    drv.Error = Error
    drv.Event = Event
    drv.init = lambda: None
    drv.Device = Device
    drv.device_attribute = types.SimpleNamespace(
        MAX_SHARED_MEMORY_PER_BLOCK_OPTIN="MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    drv.function_attribute = types.SimpleNamespace(
        MAX_DYNAMIC_SHARED_SIZE_BYTES="MAX_DYNAMIC_SHARED_SIZE_BYTES")
    drv.module_from_buffer = lambda cubin: Module()
    drv.mem_alloc = mem_alloc
    drv.memcpy_htod = memcpy_htod
    drv.memcpy_dtod = memcpy_dtod
    drv.memcpy_htod_async = memcpy_htod_async
    drv.register_host_memory = register_host_memory
    drv.Stream = Stream

    class GPUArray:
        def __init__(self, a):
            self.a = a
            self.gpudata = Ptr(a)

        def get(self):
            return self.a.copy()

        @property
        def dtype(self):
            return self.a.dtype

        @property
        def size(self):
            return self.a.size

    def gpu(a):
        reg.add_device(a)
        return GPUArray(a)

    ga.GPUArray = GPUArray
    ga.to_gpu = lambda a: gpu(np.array(a, copy=True))
    ga.empty = lambda n, dtype: gpu(poisoned(n, dtype))

    def compile_(source, **kw):
        calls["nvcc"] = calls.get("nvcc", 0) + 1
        assert kw["arch"] == f"sm_{cc[0]}{cc[1]}" and kw["no_extern_c"] is True
        return b"emulated cubin"

    comp.compile = compile_
    pkg.driver, pkg.gpuarray, pkg.compiler = drv, ga, comp
    return {"pycuda": pkg, "pycuda.driver": drv, "pycuda.gpuarray": ga, "pycuda.compiler": comp}


@pytest.fixture()
def rt(emu_lib, monkeypatch, tmp_path):
    calls: dict[str, int] = {}
    for name, mod in make_fake_pycuda(emu_lib, calls).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("COLIBRI_CUDA_CACHE", str(tmp_path / "cache"))
    import colibri.cuda as cuda

    assert cuda.available()
    r = cuda.CudaRuntime(0)
    r.calls = calls  # type: ignore[attr-defined]
    yield r
    r.close()


def test_compile_once_and_cache(rt, tmp_path):
    import colibri.cuda as cuda

    assert rt.arch == "sm_90" and rt.calls["nvcc"] == 2
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(cached) == 2 and all(n.endswith("_sm_90.cubin") for n in cached)
    cuda.CudaRuntime(0).close()
    assert rt.calls["nvcc"] == 2  # second runtime: both cubins from the cache


@pytest.mark.parametrize("n_tokens,n_experts,k,gating,bias_on,tile,multi", [
    (3, 16, 2, "softmax", False, None, None), (200, 32, 4, "sigmoid", True, None, None),
    (200, 32, 4, "sigmoid", True, None, True), (2100, 16, 2, "softmax", False, None, None),
])
def test_route(rt, n_tokens, n_experts, k, gating, bias_on, tile, multi):
    rng = np.random.default_rng(n_tokens)
    logits = separated_logits(rng, n_tokens, n_experts)
    bias = (rng.integers(-2, 3, n_experts) * 1.5).astype(np.float32) if bias_on else None
    slot = np.arange(n_experts, dtype=np.int64)[::-1] * 512
    r = rt.route(logits, k, gating, bias, renorm=True, scale=2.0, tile=tile, slot_offset=slot,
                 multi_block=multi)
    assert r.tile == (64 if n_tokens * k >= 32 * n_experts else 16)
    # the multi-block pair when asked for, or above MULTI_BLOCK_TOKENS tokens
    assert ("cb_route_place" in rt.calls) == (multi or n_tokens > 2048)
    assert ("cb_route_topk" in rt.calls) != ("cb_route_place" in rt.calls)
    h = r.to_host()
    ids, w = route_reference(logits, k, gating, bias, True, 2.0)
    np.testing.assert_array_equal(h["topk_ids"], ids)
    np.testing.assert_allclose(h["topk_w"], w, rtol=2e-6)
    np.testing.assert_array_equal(h["sel_offset"], slot[ids])
    g = group_reference(ids, h["topk_w"], n_experts, r.tile, r.cap)
    for key in ("counts", "seg_offset", "sorted_token", "pair_pos", "tile_expert"):
        np.testing.assert_array_equal(h[key].ravel(), g[key].ravel(), err_msg=key)


def test_route_errors(rt):
    with pytest.raises(ColibriError, match=r"not resident.*cuda/routing\.cu:\d+"):
        rt.route(np.array([[0.0, 5.0, 1.0]], np.float32), 1, slot_offset=np.array([0, -1, 0]))
    with pytest.raises(ValueError, match="NaN"):
        rt.route(np.array([[np.nan, 1.0]], np.float32), 1)
    with pytest.raises(ValueError, match="k="):
        rt.route(np.zeros((1, 4), np.float32), 5)
    with pytest.raises(ValueError, match="tile"):
        rt.route(np.zeros((1, 4), np.float32), 1, tile=32)


@pytest.mark.parametrize("fmt,tile,act,pipeline", [
    ("f16", 16, "silu", None), ("f16", 64, "gelu_tanh", None), ("f16", 16, "silu", "regs"),
    ("f16", 64, "silu", "regs"), ("int4-g128", 64, "gelu_tanh", None),
])
def test_moe_ffn(rt, fmt, tile, act, pipeline):
    """Both GEMM pipelines against the float64 reference; on the emulated sm_90 the default is
    the cp.async one for fp16 (int4 always uses the register-prefetch kernels)."""
    rng = np.random.default_rng(11)
    d, f, n_exp, k, n_tokens = 128, 128, 4, 2, 21
    lay = ExpertLayout(d, f, fmt)
    experts = [(rng.normal(0, d**-0.5, (f, d)), rng.normal(0, d**-0.5, (f, d)),
                rng.normal(0, f**-0.5, (d, f))) for _ in range(n_exp)]
    pool, offsets = build_pool(experts, lay)
    dp = rt.upload_pool(pool, offsets, lay)
    x = rng.normal(size=(n_tokens, d)).astype(np.float16)
    r = rt.route(rng.normal(size=(n_tokens, n_exp)).astype(np.float32), k, renorm=True, tile=tile)
    assert rt.gemm_pipeline == "cp" and rt.cp_supported
    out = rt.moe_ffn(x, dp, r, act, pipeline=pipeline)
    h = r.to_host()
    seen = [unpack_expert(pool[o:], lay) for o in offsets]
    ref = moe_ffn_reference(x, seen, h["topk_ids"], h["topk_w"], act)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
    w = "i4" if fmt == "int4-g128" else "f16"
    sfx = "_cp" if fmt == "f16" and pipeline is None else ""
    assert rt.calls[f"cb_moe_gate_up_{w}_m{tile}{sfx}"] == 1
    assert rt.calls[f"cb_moe_down_{w}_m{tile}{sfx}"] == 1 and rt.calls["cb_moe_combine"] == 1


@pytest.mark.parametrize("tile", [16, 64])
def test_gemm_pipelines_agree_bit_for_bit(rt, tile):
    """The cp.async kernels multiply the same slices in the same order as the register-prefetch
    ones: in the emulation their outputs are bit-identical (copies landing early or late at
    random, CB_EMU_SEED; a stage read before it is complete, or overwritten while in use,
    shows here as a difference), over K spanning fewer slices than the pipeline has stages
    and many more, N not a multiple of the block's columns, and padding rows."""
    rng = np.random.default_rng(tile)
    for d, f, n_exp, k, n_tokens in ((64, 192, 3, 2, 5), (256, 320, 6, 3, 70)):
        lay = ExpertLayout(d, f, "f16")
        experts = [(rng.normal(0, d**-0.5, (f, d)), rng.normal(0, d**-0.5, (f, d)),
                    rng.normal(0, f**-0.5, (d, f))) for _ in range(n_exp)]
        pool, offsets = build_pool(experts, lay)
        dp = rt.upload_pool(pool, offsets, lay)
        x = rng.normal(size=(n_tokens, d)).astype(np.float16)
        r = rt.route(separated_logits(rng, n_tokens, n_exp), k, tile=tile)
        a = rt.moe_ffn(x, dp, r, "silu", pipeline="cp")
        b = rt.moe_ffn(x, dp, r, "silu", pipeline="regs")
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("cc,optin,env,want", [
    ((9, 0), 232448, None, "cp"), ((8, 0), 166912, None, "cp"), ((8, 6), 101376, None, "cp"),
    ((7, 5), 65536, None, "regs"), ((8, 9), 65536, None, "regs"), ((9, 0), 232448, "regs", "regs"),
    ((7, 5), 65536, "cp", "error"), ((9, 0), 232448, "fast", "error"),
])
def test_gemm_pipeline_choice(emu_lib, monkeypatch, tmp_path, cc, optin, env, want):
    """cp.async kernels on sm_80+ when the device gives a block enough shared memory (their
    limits raised to exactly what they launch with), else the register-prefetch kernels;
    COLIBRI_CUDA_GEMM_PIPELINE overrides, and asking for what the device cannot do fails
    clearly, at construction or at the call."""
    calls: dict[str, int] = {}
    fake = make_fake_pycuda(emu_lib, calls, cc=cc, smem_optin=optin)
    for name, mod in fake.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("COLIBRI_CUDA_CACHE", str(tmp_path / "cache"))
    if env is None:
        monkeypatch.delenv("COLIBRI_CUDA_GEMM_PIPELINE", raising=False)
    else:
        monkeypatch.setenv("COLIBRI_CUDA_GEMM_PIPELINE", env)
    import colibri.cuda as cuda

    if want == "error":
        with pytest.raises(ColibriError, match="COLIBRI_CUDA_GEMM_PIPELINE"):
            cuda.CudaRuntime(0)
        return
    rt = cuda.CudaRuntime(0)
    try:
        assert rt.gemm_pipeline == want and rt.cp_supported == (optin >= 82944 and cc >= (8, 0))
        for t in cuda.TILES:
            for part in ("gate_up", "down"):
                fn = rt._fn[f"cb_moe_{part}_f16_m{t}_cp"]
                assert fn.max_dynamic_smem == (cuda.gemm_cp_smem_bytes(t, part == "gate_up")
                                               if rt.cp_supported else 48 * 1024)
        rng = np.random.default_rng(0)
        lay = ExpertLayout(64, 64, "f16")
        pool, offsets = build_pool([tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3))
                                    for _ in range(2)], lay)
        dp = rt.upload_pool(pool, offsets, lay)
        r = rt.route(np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), 1)
        x = rng.normal(size=(2, 64)).astype(np.float16)
        out = rt.moe_ffn(x, dp, r)
        assert np.isfinite(out).all()
        assert calls.get("cb_moe_gate_up_f16_m16_cp", 0) == (want == "cp")
        if not rt.cp_supported:
            with pytest.raises(ColibriError, match="pipeline 'cp' is not available"):
                rt.moe_ffn(x, dp, r, pipeline="cp")
    finally:
        rt.close()


def test_bad_pools_and_inputs(rt):
    lay = ExpertLayout(128, 128, "f16")
    pool = np.zeros(3 * lay.matrix_bytes, np.uint8)
    with pytest.raises(ValueError, match="offsets"):
        rt.upload_pool(pool, np.array([8]), lay)  # runs past the end
    with pytest.raises(ValueError, match="offsets"):
        rt.upload_pool(pool, np.array([-2]), lay)
    dp = rt.upload_pool(pool, np.array([0, -1]), lay)
    r = rt.route(np.array([[0.0, 1.0]], np.float32), 1)
    with pytest.raises(ValueError, match="x must have shape"):
        rt.moe_ffn(np.zeros((1, 64), np.float16), dp, r)
    with pytest.raises(ColibriError, match=r"not resident.*moe_gemm\.cu"):
        rt.moe_ffn(np.zeros((1, 128), np.float16), dp, r)


def test_pin_host_memory(rt):
    """Pinning registers the range once (a second registration of it fails, as
    cuMemHostRegister does), unpinning ends it (twice fails); async copies need pinned
    memory and stay inside the device allocation."""
    reg = sys.modules["pycuda.driver"].registry
    host = np.arange(4096, dtype=np.uint8)
    pinned = rt.pin_host_memory(host)
    assert np.shares_memory(pinned, host) and reg.log == [("register", host.ctypes.data, 4096)]
    with pytest.raises(ColibriError, match="ALREADY_REGISTERED"):
        rt.pin_host_memory(host[100:200])
    dev = rt.alloc(4096)
    rt.copy_htod(int(dev) + 96, host[:4000], rt.stream)  # from a slice of the pinned range
    assert np.array_equal(dev.owner[96:], host[:4000])
    with pytest.raises(AssertionError, match="no allocation"):
        rt.copy_htod(int(dev) + 97, host[:4000], rt.stream)
    rt.unpin_host_memory(pinned)
    with pytest.raises(ColibriError, match="cuMemHostUnregister"):
        rt.unpin_host_memory(pinned)
    with pytest.raises(AssertionError, match="pageable"):
        rt.copy_htod(int(dev), host[:16], rt.stream)
    rt.copy_htod(int(dev), host[:16])  # synchronous copies take any host memory


def test_every_output_written(rt):
    rng = np.random.default_rng(12)
    lay = ExpertLayout(64, 64, "f16")
    experts = [tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3)) for _ in range(3)]
    dp = rt.upload_experts(experts, lay)
    r = rt.route(rng.normal(size=(5, 3)).astype(np.float32), 2, tile=16)
    ws = rt.workspace(r, lay)
    for buf in (ws.out, ws.z, ws.h):
        rt.poison(buf)
    assert np.isnan(ws.out.get()).all() and np.isnan(ws.h.get()).all()
    rt.moe_ffn_launch(rt.to_gpu(rng.normal(size=(5, 64)).astype(np.float16)), dp, r, 0, ws)
    rt._check_err(ws.err, "moe_ffn")
    assert np.isfinite(ws.out.get()).all()
    real = r.to_host()["sorted_token"] >= 0
    z = ws.z.get().reshape(r.cap, 64)
    assert np.isfinite(z[real]).all() and np.isnan(z[~real]).all()


def test_write_slot_replaces_an_expert(rt):
    """The expert store refills slot 1 with another expert: results follow the new weights."""
    rng = np.random.default_rng(13)
    lay = ExpertLayout(64, 64, "f16")
    experts = [tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3)) for _ in range(3)]
    pool, offsets = build_pool(experts, lay)
    dp = rt.upload_pool(pool, offsets, lay)
    new = tuple(rng.normal(0, 0.1, (64, 64)) for _ in range(3))
    pool2, _ = build_pool([experts[0], new, experts[2]], lay)
    sb = lay.slot_bytes
    pinned = rt.pin_host_memory(pool2)
    rt.write_slot(dp, int(offsets[1]), pinned[sb : 2 * sb], stream=rt.stream)
    rt.unpin_host_memory(pinned)
    x = rng.normal(size=(4, 64)).astype(np.float16)
    r = rt.route(np.tile(np.array([[0.0, 3.0, 1.0]], np.float32), (4, 1)), 2, tile=16)
    out = rt.moe_ffn(x, dp, r)
    h = r.to_host()
    seen = [unpack_expert(pool2[o:], lay) for o in offsets]
    ref = moe_ffn_reference(x, seen, h["topk_ids"], h["topk_w"], "silu")
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
    with pytest.raises(ValueError, match="outside"):
        rt.write_slot(dp, dp.nbytes - 1, pool2[:2])


# ------------------------------------------------ Model(device="cuda") through the MoE hook

@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    from oracle_models import build

    out = tmp_path_factory.mktemp("cuda_models")
    # mixtral: softmax top-2 renormalised; qwen2_moe: no renormalisation plus a gated shared
    # expert that stays on the CPU. Expert FFN widths 48 / 32 are padded to the kernels' 64.
    # gemma4: GELU experts on their own normed input, per-expert output scales, beside a dense MLP
    return {fam: build(fam, out)[1]["f32"] for fam in ("mixtral", "qwen2_moe", "gemma4")}


@pytest.mark.parametrize("family,weights", [("mixtral", "f16"), ("qwen2_moe", "f16"),
                                            ("gemma4", "f16"), ("mixtral", "int4-g128")])
def test_model_on_the_device_matches_the_cpu(rt, moe_models, monkeypatch, family, weights):
    """Model(device="cuda") runs routing and the routed experts through the kernels (here on
    the CPU emulation); its logits must match the CPU forward within the fp16 / int4 rounding
    of the experts, layer 0's routing (same logits in both) exactly."""
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    ids = prompt(12, seed=7)
    cpu = Model(moe_models[family], threads=2, ctx=64, tokenizer=False)
    dev = Model(moe_models[family], threads=2, ctx=64, tokenizer=False, device="cuda",
                cuda_weights=weights)
    ref_l = cpu.logits(ids)
    got = dev.logits(ids)
    rel = np.linalg.norm(got - ref_l) / np.linalg.norm(ref_l)
    print(f"{family} {weights}: relative logit error {rel:.2e}")
    assert 0 < rel < (5e-3 if weights == "f16" else 0.15), rel
    np.testing.assert_array_equal(dev.route_counts(0), cpu.route_counts(0))
    down = "cb_moe_down_i4_m16" if weights == "int4-g128" else "cb_moe_down_f16_m16_cp"
    n_moe = sum(1 for L in dev.desc.layers if L.n_expert > 0)
    assert rt.calls["cb_route_topk"] == n_moe and rt.calls[down] == n_moe
    # decode through the KV cache uses the device too, and agrees with the batch
    s = dev.new_sequence()
    steps = np.concatenate([dev.eval([s], tokens=[t]) for t in ids])
    np.testing.assert_allclose(steps, got, rtol=0, atol=1e-3 * np.abs(got).max())


def test_device_errors(rt, moe_models, monkeypatch, tmp_path):
    import colibri.cuda as cuda
    from colibri.model import Model

    path = moe_models["mixtral"]
    with pytest.raises(ValueError, match="device must be"):
        Model(path, tokenizer=False, device="gpu")
    with pytest.raises(ValueError, match="cuda_weights"):
        monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
        Model(path, tokenizer=False, device="cuda", cuda_weights="int8")

    def broken(layer, h, logits, out):
        raise RuntimeError("device lost")

    m = Model(path, threads=2, ctx=64, tokenizer=False)
    m._fw.set_moe_hook(broken)
    with pytest.raises(RuntimeError, match="device lost"):
        m.logits([1, 2, 3])
    m._fw.set_moe_hook(None)  # the expert store again
    assert np.isfinite(m.logits([1, 2, 3])).all()


def test_model_device_without_pycuda(monkeypatch, tmp_path):
    """Without PyCUDA (or a device) Model(device="cuda") fails saying what is missing."""
    from oracle_models import build

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(cuda, "_runtimes", {})
    path = build("olmoe", tmp_path)[1]["f32"]
    with pytest.raises(ColibriError, match="PyCUDA not installed"):
        Model(path, tokenizer=False, device="cuda")


def test_cli_run_on_the_device(rt, moe_models, monkeypatch, capsys):
    """`colibri run --device cuda` generates the same greedy tokens through the kernels as on
    the CPU (a margin-rich oracle model: the bigram path), and fails clearly without PyCUDA."""
    import colibri.cuda as cuda
    from colibri.cli import main

    path = str(moe_models["mixtral"])
    args = ["run", "-m", path, "-p", "hello", "-n", "8", "--temp", "0", "--ctx", "64"]
    assert main(args) == 0
    cpu_text = capsys.readouterr().out
    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    assert main(args + ["--device", "cuda"]) == 0
    assert capsys.readouterr().out == cpu_text
    assert rt.calls["cb_moe_combine"] >= 8
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.setattr(cuda, "_runtimes", {})
    assert main(args + ["--device", "cuda"]) == 1
    assert "PyCUDA not installed" in capsys.readouterr().err


# ------------------------------------------------ the staged path: a device expert cache

def _slot_bytes(model_or_desc, weights):
    """Bytes of one device expert slot of a model in a weights format."""
    from colibri._cuda_ref import SLOT_ALIGN
    from colibri.cuda_moe import _pad_to

    desc = getattr(model_or_desc, "desc", model_or_desc)
    mult = 128 if weights == "int4-g128" else 64
    sb = max(ExpertLayout(_pad_to(desc.n_embd, mult), _pad_to(L.n_ff_exp, mult), weights).slot_bytes
             for L in desc.layers if L.n_expert > 0)
    return -(-sb // SLOT_ALIGN) * SLOT_ALIGN


@pytest.mark.parametrize("family,weights,mode,extra", [
    ("mixtral", "int4-g128", "cache", 1), ("qwen2_moe", "f16", "mapped", 0),
    ("gemma4", "f16", "cache", 2)])
def test_staged_matches_the_whole_pool(rt, moe_models, monkeypatch, family, weights, mode,
                                       extra):
    """A device budget of k (+ extra) experts: the 8-token prompt needs more distinct experts
    per layer than that (split into token chunks), decode evicts all the time; logits equal
    the whole-pool device path bit for bit (same packed weights, kernels and tile)."""
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    ids = prompt(8, seed=7)
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda", cuda_weights=weights)
    whole = Model(moe_models[family], **kw)
    k = max(L.n_expert_used for L in whole.desc.layers)
    budget = (k + extra) * _slot_bytes(whole, weights)
    staged = Model(moe_models[family], expert_mode=mode, cuda_expert_budget=budget, **kw)
    assert not whole.cuda_experts.staged and staged.cuda_experts.staged
    assert staged.cuda_experts.n_slots == k + extra
    want = whole.logits(ids)
    got = staged.logits(ids)
    assert np.array_equal(got, want)
    st = staged.device_expert_stats()
    assert st["splits"] > 0 and st["evictions"] > 0
    assert st["hits"] + st["misses"] > 0 and st["uses"] == 8 * sum(
        L.n_expert_used for L in staged.desc.layers if L.n_expert > 0)
    for layer in range(staged.desc.n_layer):
        if staged.desc.layers[layer].n_expert:
            np.testing.assert_array_equal(staged.route_counts(layer), whole.route_counts(layer))
    s, w = staged.new_sequence(), whole.new_sequence()
    for t in ids[:2]:
        assert np.array_equal(staged.eval([s], tokens=[t]), whole.eval([w], tokens=[t]))
    # the store served exactly the device misses
    assert staged.expert_stats()["acquired"] == staged.device_expert_stats()["misses"]
    staged.close()
    whole.close()


def test_staged_pins_once_and_counts_hits(rt, moe_models, monkeypatch):
    """The cache store's slot pool is registered once (the whole mapping), the staging buffer
    once, both unregistered at close; every expert copy is asynchronous from a registered
    range; hits, misses and evictions follow the LRU for a routing chosen by hand; each call's
    result equals the whole pool's."""
    import colibri.cuda as cuda
    from colibri.cuda_moe import CudaExperts
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    reg = sys.modules["pycuda.driver"].registry
    m = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False, expert_mode="cache")
    whole = CudaExperts(m.desc, rt, "f16")
    sb = _slot_bytes(m, "f16")
    async_before = reg.async_bytes
    dev = CudaExperts(m.desc, rt, "f16", store=m.experts, budget=3 * sb)
    pool = m.experts.pool()
    assert pool["pinned"] and dev.n_slots == 3
    regs = [entry for entry in reg.log if entry[0] == "register"]
    assert ("register", pool["address"], pool["bytes"]) in regs
    assert reg.pinned == {pool["address"]: pool["address"] + pool["bytes"],
                          dev._staging.ctypes.data: dev._staging.ctypes.data + dev._staging.nbytes}
    with pytest.raises(ValueError, match="already pinned"):
        m.experts.pin_pool(rt.pin_host_memory, rt.unpin_host_memory)
    rng = np.random.default_rng(5)
    E, D = m.desc.layers[0].n_expert, m.desc.n_embd

    def call(layer, pair, n=3):
        logits = np.zeros((n, E), np.float32)
        logits[:, pair] = (4.0, 3.0)
        h = rng.normal(size=(n, D)).astype(np.float32)
        out, ref_out = np.zeros((n, D), np.float32), np.zeros((n, D), np.float32)
        dev(layer, h, logits, out)
        whole(layer, h, logits, ref_out)
        assert np.array_equal(out, ref_out)
        return dev.stats(layer)

    seq = [((1, 2), (0, 2, 0)), ((1, 2), (2, 2, 0)), ((3, 4), (2, 4, 1)), ((2, 4), (4, 4, 1)),
           ((1, 4), (5, 5, 2))]  # LRU order after each: 12, 12, 234, 342, 241
    for pair, (hits, misses, evictions) in seq:
        st = call(0, list(pair))
        assert (st["hits"], st["misses"], st["evictions"]) == (hits, misses, evictions), pair
    assert dev.stats(0)["bytes_staged"] == 5 * ExpertLayout(64, 64, "f16").slot_bytes
    st = call(1, [0, 9])  # layer 1 evicts layer 0's two least recent (3: gone; 2, 4)
    assert (st["misses"], dev.stats()["evictions"]) == (2, 4)
    assert reg.async_bytes - async_before == dev.stats()["bytes_staged"]
    dev.close()
    dev.close()
    assert reg.pinned == {} and not m.experts.pool()["pinned"]
    assert [e for e in reg.log if e[0] == "unregister"][-2:] == [
        ("unregister", pool["address"], pool["bytes"]),
        ("unregister", dev._staging.ctypes.data, dev._staging.nbytes)]
    with pytest.raises(ColibriError, match="closed"):
        call(0, [1, 2])


def test_staged_store_freed_unpins(rt, moe_models, monkeypatch):
    """Dropping a Model without close(): the C store unpins its pool before unmapping it."""
    import gc

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    reg = sys.modules["pycuda.driver"].registry
    m = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False, expert_mode="cache",
              device="cuda", cuda_expert_budget=0.3)
    pool = m.experts.pool()
    assert reg.pinned.get(pool["address"]) == pool["address"] + pool["bytes"]
    assert np.isfinite(m.logits([1, 2, 3])).all()
    del m
    gc.collect()
    assert pool["address"] not in reg.pinned
    assert ("unregister", pool["address"], pool["bytes"]) in reg.log


def test_staged_budget_errors(rt, moe_models, monkeypatch):
    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    path = moe_models["qwen2_moe"]  # top-4 routing
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda")
    sb = _slot_bytes(Model(path, tokenizer=False).desc, "f16")
    with pytest.raises(ValueError, match=r"holds 3 experts .* one token needs 4"):
        Model(path, cuda_expert_budget=3 * sb + 100, **kw)
    with pytest.raises(ValueError, match="cuda_expert_budget=.lots.: expected bytes"):
        Model(path, cuda_expert_budget="lots", **kw)
    m = Model(path, cuda_expert_budget=1.0, **kw)  # everything fits: the whole pool
    assert not m.cuda_experts.staged and m.device_expert_stats()["staged"] == 0


@pytest.fixture(scope="module")
def f16_mixtral(tmp_path_factory):
    """A mixtral whose expert tensors are F16 with FFN width 64: their file bytes already are
    the kernels' fp16 layout (no padding, no scale)."""
    import torch
    import transformers as T
    from oracle_models import _convert_module, add_bigram_path, family_configs

    out = tmp_path_factory.mktemp("cuda_f16")
    configs, common = family_configs()
    cfg = T.MixtralConfig(**{**common, **configs["mixtral"][2], "intermediate_size": 64})
    torch.manual_seed(4321)
    model = T.MixtralForCausalLM(cfg).eval()
    add_bigram_path(model, seed=3)
    model.save_pretrained(out / "hf")
    return _convert_module().convert(out / "hf", out / "mixtral64-f16.gguf", "f16")


@pytest.mark.parametrize("mode", ["cache", "mapped"])
def test_staged_copies_fp16_experts_from_the_store_as_they_are(rt, f16_mixtral, monkeypatch,
                                                               mode):
    """F16 experts that need no padding go from the store to the device without conversion:
    three copies per expert straight from the store's bytes (asynchronous from the pinned
    slot pool in cache mode, synchronous from the file mapping otherwise), and the logits
    equal the whole pool's."""
    from oracle_models import prompt

    import colibri.cuda as cuda
    from colibri.model import Model

    monkeypatch.setattr(cuda, "get_runtime", lambda device=0: rt)
    reg = sys.modules["pycuda.driver"].registry
    kw = dict(threads=2, ctx=64, tokenizer=False, device="cuda")
    whole = Model(f16_mixtral, **kw)
    staged = Model(f16_mixtral, expert_mode=mode, cuda_expert_budget=3 * 3 * 64 * 64 * 2, **kw)
    ce = staged.cuda_experts
    assert all(ce.direct.values()) and ce.n_slots == 3
    before = reg.async_bytes
    ids = prompt(10, seed=2)
    assert np.array_equal(staged.logits(ids), whole.logits(ids))
    st = staged.device_expert_stats()
    assert st["bytes_staged"] == st["misses"] * 3 * 64 * 64 * 2 and st["misses"] > 0
    # cache mode: every staged byte came asynchronously from the pinned pool, nothing went
    # through the staging buffer; mapped: synchronous copies from the mapping
    assert reg.async_bytes - before == (st["bytes_staged"] if mode == "cache" else 0)
    staged.close()


def test_cuda_check_staged_step(rt, tmp_path):
    """tools/bench/cuda_check.py's staged-path step (run on a lent GPU) on the emulation."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuda_check", ROOT / "tools" / "bench" / "cuda_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    reg = sys.modules["pycuda.driver"].registry
    st = mod.staged_check(rt, np.random.default_rng(3), tmp_path, small=True)
    assert st["f16"]["misses"] > 0 and st["int4-g128"]["splits"] >= 1
    assert reg.pinned == {}


def test_cuda_check_gpu_main_small(rt, tmp_path, monkeypatch, capsys):
    """The whole GPU check (tools/bench/cuda_check.py, what runs on a lent device) end to end
    on the emulation with --small shapes and one timed run: routing and FFN checks with both
    GEMM pipelines, timing rows for every format / pipeline / token count with the pipelines
    compared bit for bit, the target report, the staged step, the JSON summary."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("cuda_check_main", ROOT / "tools" / "bench" / "cuda_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "measure_matmul_peer", lambda: (100.0, "stand-in peer"))
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["cuda_check.py", "--small", "--runs", "1"])
    assert mod.main() == 0
    res = json.loads((tmp_path / "cuda_check.json").read_text())
    assert res["pipelines"] == ["cp", "regs"] and res["gemm_pipeline"] == "cp"
    assert {(r["fmt"], r["pipeline"]) for r in res["ffn"]} == {
        ("f16", "cp"), ("int4-g128", "cp"), ("f16", "regs")}
    rows = res["timings"]
    assert len(rows) == 3 * len(mod.TIMING_TOKENS)
    for r in rows:
        assert r["ms"] > 0 and 0 < r["frac_roofline"] and r["frac_matmul"] > 0
        if r["pipeline"] == "regs" and r["fmt"] == "f16":
            assert r["bit_identical_to_cp"] is True
    assert set(res["target"]) == set() and res["staged"]["f16"]["misses"] > 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "of roofline" in out


def test_store_pin_pool_callbacks(moe_models):
    """ExpertStore.pin_pool: pin's exception propagates and nothing stays pinned; unpin is
    called once with pin's handle, by unpin_pool or by the store's own free; an exception in
    unpin is raised by unpin_pool; the mapped store has no pool."""
    import gc

    from colibri.model import Model

    m = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False, expert_mode="cache")
    store = m.experts

    def bad_pin(view):
        raise OSError("cannot lock")

    with pytest.raises(OSError, match="cannot lock"):
        store.pin_pool(bad_pin, lambda h: None)
    assert not store.pool()["pinned"]
    seen: list = []
    store.pin_pool(lambda view: ("handle", view.nbytes), seen.append)
    assert store.pool()["pinned"] and seen == []
    store.unpin_pool()
    store.unpin_pool()
    assert seen == [("handle", store.pool()["bytes"])]

    def bad_unpin(handle):
        raise RuntimeError("driver gone")

    store.pin_pool(lambda view: 1, bad_unpin)
    with pytest.raises(RuntimeError, match="driver gone"):
        store.unpin_pool()
    store.pin_pool(lambda view: 2, seen.append)
    del m, store
    gc.collect()
    assert seen[-1] == 2  # the freed store unpinned itself
    mapped = Model(moe_models["mixtral"], threads=2, ctx=64, tokenizer=False)
    with pytest.raises(ValueError, match="only the cache store"):  # INVALID_ARGUMENT
        mapped.experts.pool()
