"""The CUDA sources compile with nvcc for sm_80 and sm_90 (tools/build_cuda.sh, -Werror),
the kernel parameter lists in the compiled PTX match the argument types colibri.cuda
launches them with, and colibri.cuda degrades cleanly without a GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import colibri.cuda as cuda
from colibri import ColibriError

ROOT = Path(__file__).resolve().parents[2]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.mark.slow  # ~10-30 s: eight cubins
@needs_nvcc
def test_build_cuda_script():
    r = subprocess.run(["bash", str(ROOT / "tools" / "build_cuda.sh")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for stem in ("routing", "moe_gemm"):
        for arch in ("sm_80", "sm_90"):
            assert (ROOT / "build" / "cubin" / f"{stem}.{arch}.cubin").stat().st_size > 0


def ptx_signatures(ptx: str) -> dict[str, str]:
    """.entry name(.param .u64 a, .param .u32 b, .param .f32 c) -> {"name": "Pif"}."""
    codes = {"u64": "P", "b64": "P", "s64": "P", "u32": "i", "s32": "i", "b32": "i", "f32": "f"}
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx):
        types = re.findall(r"\.param\s+\.(\w+)", m.group(2))
        out[m.group(1)] = "".join(codes[t] for t in types)
    return out


@needs_nvcc
def test_kernel_signatures_match_launches(tmp_path):
    found: dict[str, str] = {}
    for stem in cuda.MODULES:
        ptx = tmp_path / f"{stem}.ptx"
        subprocess.run(["nvcc", "-ptx", "-arch=sm_80", "-std=c++17", f"-I{ROOT / 'cuda'}",
                        "-o", str(ptx), str(ROOT / "cuda" / f"{stem}.cu")], check=True, timeout=300)
        found.update(ptx_signatures(ptx.read_text()))
    expected = {name: sig for name, (_, sig) in cuda.KERNELS.items()}
    assert found == expected


def test_sources_are_where_the_runtime_looks():
    for stem in cuda.MODULES:
        assert (cuda.kernel_dir() / f"{stem}.cu").is_file()
    assert (cuda.kernel_dir() / "common.cuh").is_file()
    assert (cuda.kernel_dir() / "routing_logic.h").is_file()


def test_unavailable_is_clean():
    reason = cuda.unavailable_reason()
    assert cuda.available() == (reason is None)
    if reason is not None:
        with pytest.raises(ColibriError):
            cuda.CudaRuntime()
        with pytest.raises(ColibriError):
            cuda.get_runtime()


def test_cache_key_changes_with_arch():
    assert cuda._sources_digest("sm_80") != cuda._sources_digest("sm_90")
    with pytest.raises(ValueError):
        cuda.compile_cubin("routing", "compute_90; rm -rf /")
    with pytest.raises(ValueError):
        cuda.compile_cubin("nope", "sm_90")
