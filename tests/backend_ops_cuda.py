"""The rows of cuda/*.cu in the op x backend table (backend_ops.py): routing (single block and
the multi-block pair) and the grouped expert FFN (gate/up GEMM, down GEMM, combine) in each
weight format and GEMM pipeline, against colibri._cuda_ref's float64 references.

Columns: "cuda-emu" runs the kernels compiled with g++ against tests/cuda_emu/cuda_emu.h
(emu_main.cpp: inputs and outputs as raw files; ASan/UBSan; outputs start poisoned so unwritten
elements show); "cuda" runs them on a device through colibri.cuda.CudaRuntime (PyCUDA); "cpu"
is the CPU router where there is one (cuda/routing_logic.h, which colibri/_core/forward.c
includes), compiled here with the C compiler.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from backend_ops import ROOT, Case, Missing, Op

from colibri._cuda_ref import (
    ACTIVATIONS,
    GATINGS,
    ExpertLayout,
    build_pool,
    group_reference,
    moe_ffn_reference,
    route_reference,
    routing_capacity,
    unpack_expert,
)

# ---------------------------------------------------------------- the emulator (cuda-emu)


def build_emu(folder: Path, include: Path, sanitize: str) -> Path:
    """tests/cuda_emu/emu_main.cpp built with -fsanitize=`sanitize` (about 7 s here)."""
    exe = folder / "emu"
    subprocess.run(
        ["g++", "-std=c++20", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
         f"-fsanitize={sanitize}", "-fno-sanitize-recover=all", "-pthread",
         f"-I{include}", "-o", str(exe), str(ROOT / "tests" / "cuda_emu" / "emu_main.cpp")],
        check=True, timeout=600,
    )
    return exe


def run(exe: Path, *args: object) -> None:
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
           "TSAN_OPTIONS": "halt_on_error=1:exitcode=66"}
    r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-4000:]


def emu_route(exe, d: Path, logits, k, gating, bias, renorm, scale, tile, slot=None, blocks=0,
              per_warp=True):
    """emu route: cb_route_topk (blocks 0) or cb_route_count + cb_route_place over `blocks`
    blocks, phase 1 by a warp per token (where the expert count allows) or a thread per
    token; every output array, read back."""
    n_tokens, n_experts = logits.shape
    logits.astype(np.float32).tofile(d / "logits.bin")
    if bias is not None:
        bias.astype(np.float32).tofile(d / "bias.bin")
    if slot is not None:
        slot.astype(np.int64).tofile(d / "slot.bin")
    run(exe, "route", d, n_tokens, n_experts, k, GATINGS[gating], int(renorm), repr(float(scale)),
        tile, int(bias is not None), int(slot is not None), blocks, int(per_warp))
    cap = routing_capacity(n_tokens, k, n_experts, tile)
    rd = lambda name, dt: np.fromfile(d / f"{name}.bin", dtype=dt)  # noqa: E731
    return {
        "topk_ids": rd("topk_ids", np.int32).reshape(n_tokens, k),
        "topk_w": rd("topk_w", np.float32).reshape(n_tokens, k),
        "sel_offset": rd("sel_offset", np.int64).reshape(n_tokens, k),
        "counts": rd("counts", np.int32),
        "seg_offset": rd("seg_offset", np.int32),
        "sorted_token": rd("sorted_token", np.int32),
        "sorted_weight": rd("sorted_weight", np.float32),
        "pair_pos": rd("pair_pos", np.int32),
        "tile_expert": rd("tile_expert", np.int32),
        "err": rd("err", np.int32),
        "cap": cap,
    }


def separated_logits(rng, n_tokens, n_experts):
    """Random logits on a shuffled grid: no near-ties between experts (float32 and float64
    agree on the order)."""
    base = np.arange(n_experts) * (8.0 / n_experts) - 4.0
    noise = rng.uniform(0, 2.0 / n_experts, (n_tokens, n_experts))
    return (np.array([rng.permutation(base) for _ in range(n_tokens)]) + noise).astype(np.float32)


class EmuContext:
    """The cuda-emu column's fixture value: the emulator and a folder for its files."""

    def __init__(self, exe: Path, folder: Path) -> None:
        self.exe, self.folder = exe, folder

    def workdir(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.folder))


# ---------------------------------------------------------------- routing


def route_case(n_tokens, n_experts, k, gating, use_bias, renorm, scale, tile, slot_step,
               blocks=0, *, seed):
    rng = np.random.default_rng(seed)
    return {"label": f"{n_tokens} tokens, {n_experts} experts, top-{k}, {gating}, bias "
                     f"{use_bias}, renorm {renorm}, scale {scale}, tile {tile}"
                     + (f", {blocks} place blocks" if blocks else ""),
            "logits": separated_logits(rng, n_tokens, n_experts), "k": k, "gating": gating,
            "bias": (rng.integers(-2, 3, n_experts) * 1.5).astype(np.float32) if use_bias
            else None, "renorm": renorm, "scale": scale, "tile": tile, "blocks": blocks,
            "slot": np.arange(n_experts, dtype=np.int64) * slot_step + 256}


def route_topk_cases(rng):
    return [route_case(1, 8, 2, "softmax", False, False, 1.0, 16, 4096, seed=1),
            route_case(70, 64, 6, "softmax", False, True, 1.0, 16, 4096, seed=2),
            route_case(1100, 128, 8, "sigmoid", True, True, 2.5, 64, 4096, seed=3),
            route_case(3, 256, 8, "sigmoid", True, False, 1.0, 64, 4096, seed=4),
            # 4096 logits: the most cb_route_topk stages in shared memory (70 x 64 above: not)
            route_case(32, 128, 8, "softmax", True, True, 1.0, 16, 4096, seed=8)]


def route_multi_cases(rng):
    return [route_case(1, 8, 2, "softmax", True, True, 1.5, 16, 512, 1, seed=5),
            route_case(600, 64, 6, "sigmoid", True, True, 1.5, 16, 512, 3, seed=6),
            route_case(1100, 128, 8, "softmax", True, True, 1.5, 64, 512, 5, seed=7)]


def route_ref(c: Case):
    return route_reference(c["logits"], c["k"], c["gating"], c["bias"], c["renorm"], c["scale"])


def check_route(got: dict, want, c: Case) -> None:
    ids, w = want
    if "err" in got:
        assert np.asarray(got["err"]).tolist() == [0, 0, 0, 0], got["err"]
    np.testing.assert_array_equal(got["topk_ids"], ids)
    np.testing.assert_allclose(got["topk_w"], w, rtol=2e-5)
    if "counts" not in got:  # the CPU router chooses and weights; it groups nothing
        return
    np.testing.assert_array_equal(got["sel_offset"], c["slot"][ids])
    g = group_reference(ids, got["topk_w"], c["logits"].shape[1], c["tile"], got["cap"])
    for key in ("counts", "seg_offset", "sorted_token", "pair_pos", "tile_expert"):
        np.testing.assert_array_equal(np.ravel(got[key]), g[key].ravel(), err_msg=key)
    np.testing.assert_array_equal(got["sorted_weight"], g["sorted_weight"].astype(np.float32))


ROUTE_TOL = ("ids and the grouping (counts, segments, sorted tokens, positions, tiles) exact; "
             "weights rtol 2e-5: float32 exp/sum against float64 (a device's expf is a few ulp)")


def emu_route_run(ctx: EmuContext, c: Case) -> dict:
    return emu_route(ctx.exe, ctx.workdir(), c["logits"], c["k"], c["gating"], c["bias"],
                     c["renorm"], c["scale"], c["tile"], c["slot"], c["blocks"])


def gpu_route(rt: Any, c: Case, multi_block: bool):
    r = rt.route(c["logits"], c["k"], c["gating"], c["bias"], renorm=c["renorm"],
                 scale=c["scale"], tile=c["tile"], slot_offset=c["slot"], multi_block=multi_block)
    h = r.to_host()
    assert r.tile == c["tile"]
    return {**h, "cap": r.cap}


ROUTE_WRAPPER = r"""
#include "routing_logic.h"
int route_rows(const float *logits, int n_tokens, int n_experts, int k, int gating,
               const float *bias, int renorm, float scale, int *ids, float *weights) {
    int bad = 0;
    for (int t = 0; t < n_tokens; t++)
        if (cb_route_token(logits + (long)t * n_experts, n_experts, k, gating, bias, renorm,
                           scale, ids + (long)t * k, weights + (long)t * k) != CB_ROUTE_OK)
            bad++;
    return bad;
}
"""


@functools.cache
def routing_lib() -> ctypes.CDLL:
    """cuda/routing_logic.h (the CPU router's code) in a shared object, built once."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed to build the routing logic"
    d = Path(tempfile.mkdtemp(prefix="colibri_routing_"))
    (d / "wrap.c").write_text(ROUTE_WRAPPER)
    so = d / "librouting.so"
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    f"-I{ROOT / 'cuda'}", "-o", str(so), str(d / "wrap.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(so))
    fp = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    ip = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
    lib.route_rows.argtypes = [fp, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ip, fp]
    lib.route_rows.restype = ctypes.c_int
    return lib


def cpu_route(ctx: Any, c: Case) -> dict:
    logits = np.ascontiguousarray(c["logits"], dtype=np.float32)
    t, e = logits.shape
    ids = np.empty((t, c["k"]), np.int32)
    w = np.empty((t, c["k"]), np.float32)
    b = None if c["bias"] is None else np.ascontiguousarray(c["bias"], dtype=np.float32)
    bad = routing_lib().route_rows(logits, t, e, c["k"], GATINGS[c["gating"]],
                                   None if b is None else b.ctypes.data, int(c["renorm"]),
                                   c["scale"], ids, w)
    assert bad == 0, f"{bad} tokens failed routing"
    return {"topk_ids": ids, "topk_w": w}


# ---------------------------------------------------------------- the grouped expert FFN

MOE_CASES = {  # fmt, D, F, experts, k, tokens, activation, tile: both tiles in every row
    "moe_ffn.f16.regs": [("f16", 64, 192, 6, 2, 1, "silu", 16),
                         ("f16", 128, 64, 5, 2, 23, "gelu_tanh", 16),
                         ("f16", 64, 320, 4, 2, 40, "silu", 64)],
    # K from 1 slice (fewer than the pipeline's stages) to 10
    "moe_ffn.f16.cp": [("f16", 64, 192, 6, 2, 1, "silu", 16),
                       ("f16", 320, 128, 5, 2, 23, "gelu_tanh", 16),
                       ("f16", 64, 320, 4, 2, 40, "silu", 64),
                       ("f16", 192, 256, 3, 2, 70, "silu", 64)],
    "moe_ffn.int4.regs": [("int4-g128", 128, 256, 4, 2, 9, "silu", 16),
                          ("int4-g128", 256, 128, 3, 2, 35, "gelu_tanh", 64)],
}


def moe_case(fmt, d, f, n_exp, k, n_tokens, act, tile, pipeline):
    """Random experts in a pool whose slots are in reverse order plus one absent (-1) expert
    that the logits never choose; separated logits, so every backend routes as the float64
    reference."""
    rng = np.random.default_rng(d + f + n_tokens)
    lay = ExpertLayout(d, f, fmt)
    experts = [(rng.normal(0, d**-0.5, (f, d)), rng.normal(0, d**-0.5, (f, d)),
                rng.normal(0, f**-0.5, (d, f))) for _ in range(n_exp)]
    pool, offsets = build_pool(experts, lay)
    offsets = np.append(offsets[::-1].copy(), -1)
    logits = separated_logits(rng, n_tokens, n_exp + 1)
    logits[:, -1] = -30.0
    return {"label": f"{fmt} D={d} F={f}, {n_exp} experts top-{k}, {n_tokens} tokens, {act}, "
                     f"tile {tile}, {pipeline}",
            "lay": lay, "pool": pool, "offsets": offsets, "logits": logits, "k": k,
            "x16": rng.normal(size=(n_tokens, d)).astype(np.float16), "act": act, "tile": tile,
            "pipeline": pipeline}


def moe_cases(name: str):
    pipeline = name.rsplit(".", 1)[1]
    return lambda rng: [moe_case(*args, pipeline) for args in MOE_CASES[name]]


def moe_ref(c: Case) -> np.ndarray:
    ids, w = route_reference(c["logits"], c["k"], "softmax", None, True, 1.0)
    seen = [unpack_expert(c["pool"][o:], c["lay"]) if o >= 0 else None for o in c["offsets"]]
    return moe_ffn_reference(c["x16"], seen, ids, w, c["act"])


def check_moe(got, want, c: Case) -> None:
    assert got.shape == want.shape and np.isfinite(got).all(), "an output element is not finite"
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 2e-3, f"relative error {rel:.3g}"


MOE_TOL = ("relative Frobenius error < 2e-3: fp16 inputs and hidden activations (2^-11 each), "
           "fp32 WMMA accumulation; the weights as the device holds them (fp16, or int4 "
           "rounded to fp16)")


def emu_moe(exe: Path, d: Path, c: Case) -> np.ndarray:
    """Route (cb_route_topk) then gate/up, down and combine on the emulator; asserts the
    device error records are clear, every output and every real row of h and z written, and
    padding rows untouched (still the NaN poison)."""
    from colibri.cuda import gemm_cp_smem_bytes

    n_tokens = c["x16"].shape[0]
    n_exp = c["offsets"].size
    lay, tile, k = c["lay"], c["tile"], c["k"]
    r = emu_route(exe, d, c["logits"], k, "softmax", None, True, 1.0, tile, c["offsets"])
    assert r["err"].tolist() == [0, 0, 0, 0]
    c["x16"].tofile(d / "x.bin")
    c["pool"].tofile(d / "pool.bin")
    c["offsets"].astype(np.int64).tofile(d / "offsets.bin")
    cap = r["cap"]
    smem = ([gemm_cp_smem_bytes(tile, True), gemm_cp_smem_bytes(tile, False)]
            if c["pipeline"] == "cp" else [])
    run(exe, "moe", d, n_tokens, n_exp, k, lay.hidden, lay.ffn, int(lay.fmt == "int4-g128"),
        ACTIVATIONS[c["act"]], tile, cap, c["pool"].size, *smem)
    err = np.fromfile(d / "err.bin", np.int32)
    assert err.tolist() == [0, 0, 0, 0]
    out = np.fromfile(d / "out.bin", np.float32).reshape(n_tokens, lay.hidden)
    total = int(r["seg_offset"][-1])
    h = np.fromfile(d / "h.bin", np.float16).reshape(cap, lay.ffn)
    assert np.isfinite(h[:total]).all() and np.isnan(h[total:]).all()
    z = np.fromfile(d / "z.bin", np.float32).reshape(cap, lay.hidden)
    real = r["sorted_token"] >= 0
    assert np.isfinite(z[real]).all() and np.isnan(z[~real]).all()
    return out


def gpu_moe(rt: Any, c: Case) -> np.ndarray:
    import pytest

    if c["pipeline"] == "cp" and not rt.cp_supported:
        pytest.skip(f"no CUDA device with cp.async (sm_80+): {rt.name} is {rt.arch}")
    dp = rt.upload_pool(c["pool"], c["offsets"], c["lay"])
    r = rt.route(c["logits"], c["k"], "softmax", None, renorm=True, tile=c["tile"],
                 slot_offset=c["offsets"])
    out: np.ndarray = rt.moe_ffn(c["x16"], dp, r, c["act"], pipeline=c["pipeline"])
    return out


def moe_kernels(name: str) -> tuple[str, ...]:
    w = "i4" if ".int4." in name else "f16"
    sfx = "_cp" if name.endswith(".cp") else ""
    return (*(f"cb_moe_{p}_{w}_m{t}{sfx}" for p in ("gate_up", "down") for t in (16, 64)),
            "cb_moe_combine")


CPU_MOE = Missing("the CPU's MoE block (forward.c) is matmul + glu + matmul per expert: the "
                  "matmul.* and glu.* rows")

ROWS = [
    Op("route_topk", route_topk_cases, route_ref, check_route, ROUTE_TOL,
       {"cpu": cpu_route, "cuda-emu": emu_route_run,
        "cuda": lambda rt, c: gpu_route(rt, c, False)},
       api=("cb_route_token",), kernels=("cb_route_topk",)),
    Op("route_multi_block", route_multi_cases, route_ref, check_route, ROUTE_TOL,
       {"cpu": Missing("the CPU routes token by token (route_topk's cb_route_token) and "
                       "groups nothing"),
        "cuda-emu": emu_route_run, "cuda": lambda rt, c: gpu_route(rt, c, True)},
       kernels=("cb_route_count", "cb_route_place")),
    *[Op(name, moe_cases(name), moe_ref, check_moe, MOE_TOL,
         {"cpu": CPU_MOE, "cuda-emu": lambda ctx, c: emu_moe(ctx.exe, ctx.workdir(), c),
          "cuda": gpu_moe}, kernels=moe_kernels(name)) for name in MOE_CASES],
]
