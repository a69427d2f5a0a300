"""A stand-in `pycuda` package (driver, gpuarray, compiler) backed by host memory that launches
the real kernels compiled for the CPU with tests/cuda_emu (emu_lib.cpp + cuda_emu.h): what the
CUDA tests without a GPU run colibri/cuda.py on (the fixtures are in tests/cuda/conftest.py).
The driver checks memory the way the real one does or stricter (HostRegistry)."""

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

ROOT = Path(__file__).resolve().parents[1]
INC = cuda_include()
# the marks of every test module that runs on the emulation
# (a missing toolchain fails the build below: CI must not skip what it is meant to exercise)
EMULATION_MARKS = [
    pytest.mark.slow,  # ~20 s to compile the kernels for the CPU
]


def build_emu_lib(so: Path) -> ctypes.CDLL:
    """Compile tests/cuda_emu/emu_lib.cpp (the kernels for the CPU) into so and load it."""
    assert INC is not None and shutil.which("g++") is not None, (
        "the CUDA emulation needs the CUDA toolkit headers (cuda_fp16.h) and g++")
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


class FakeDriverLibrary:
    """The driver entry points colibri.cuda_host calls through ctypes (cuMemHostRegister_v2,
    cuMemHostUnregister, cuGetErrorName) on the HostRegistry: an overlapping registration
    fails with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712), unregistering a range that is
    not registered with CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (713), as the real driver does."""

    NAMES = {712: b"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
             713: b"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"}

    def __init__(self, reg: HostRegistry) -> None:
        self.reg = reg

    def cuMemHostRegister_v2(self, ptr, nbytes, flags) -> int:  # noqa: N802 - the driver's name
        a, n = int(ptr.value), int(nbytes.value)
        if any(s < a + n and a < e for s, e in self.reg.pinned.items()):
            return 712
        self.reg.pinned[a] = a + n
        self.reg.log.append(("register", a, n))
        return 0

    def cuMemHostUnregister(self, ptr) -> int:  # noqa: N802
        a = int(ptr.value)
        if a not in self.reg.pinned:
            return 713
        n = self.reg.pinned.pop(a) - a
        self.reg.log.append(("unregister", a, n))
        return 0

    def cuGetErrorName(self, rc, out) -> int:  # noqa: N802
        if rc not in self.NAMES:
            return 1
        out._obj.value = self.NAMES[rc]
        return 0


def install_fake_pycuda(monkeypatch, lib: ctypes.CDLL, calls: dict[str, int],
                        **kw) -> dict[str, types.ModuleType]:
    """make_fake_pycuda's modules put in sys.modules, and its driver library in place of
    libcuda.so.1 for colibri.cuda_host (undone by monkeypatch)."""
    import colibri.cuda_host

    fake = make_fake_pycuda(lib, calls, **kw)
    for name, mod in fake.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(colibri.cuda_host, "driver_library", lambda: fake["pycuda.driver"].libcuda)
    return fake


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
    drv.libcuda = FakeDriverLibrary(reg)  # type: ignore[attr-defined]
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

