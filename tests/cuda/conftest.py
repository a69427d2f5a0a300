"""Fixtures of the CUDA tests that run without a GPU: the kernels compiled for the CPU (once per
session), a CudaRuntime on the stand-in pycuda (tests/fake_pycuda.py), and small MoE models."""

from __future__ import annotations

import ctypes

import pytest
from fake_pycuda import build_emu_lib, install_fake_pycuda


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return build_emu_lib(tmp_path_factory.mktemp("cuda_emu_lib") / "libemu.so")


@pytest.fixture()
def rt(emu_lib, monkeypatch, tmp_path):
    calls: dict[str, int] = {}
    install_fake_pycuda(monkeypatch, emu_lib, calls)
    monkeypatch.setenv("COLIBRI_CUDA_CACHE", str(tmp_path / "cache"))
    import colibri.cuda as cuda

    assert cuda.available()
    r = cuda.CudaRuntime(0)
    r.calls = calls  # type: ignore[attr-defined]
    yield r
    r.close()


@pytest.fixture(scope="session")
def moe_models(tmp_path_factory):
    from oracle_models import build

    out = tmp_path_factory.mktemp("cuda_models")
    # mixtral: softmax top-2 renormalised; qwen2_moe: no renormalisation plus a gated shared
    # expert that stays on the CPU. Expert FFN widths 48 / 32 are padded to the kernels' 64.
    # gemma4: GELU experts on their own normed input, per-expert output scales, beside a dense MLP
    return {fam: build(fam, out)[1]["f32"] for fam in ("mixtral", "qwen2_moe", "gemma4")}

