"""The CUDA check's driver: the GPU run (steps 1-6 on a lent device) and the command line
(--cpu-only: steps 3-4 on the NumPy emulation). See colibri.tools.cuda_check."""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from colibri import _cuda_ref as ref
from colibri.tools.cuda_check.pycuda_build import ensure_pycuda
from colibri.tools.cuda_check.reference import (
    FFN_CASES,
    FFN_CASES_CPU,
    check_ffn,
    check_routing,
    cpu_only,
    log,
)
from colibri.tools.cuda_check.staged import staged_check
from colibri.tools.cuda_check.timing import (
    ROUTE_SWEEP_TOKENS,
    SMALL_ROUTE_SWEEP_TOKENS,
    SMALL_TIMING_SHAPES,
    SMALL_TIMING_TOKENS,
    TIMING_SHAPES,
    TIMING_TOKENS,
    measure_matmul_peer,
    report_target,
    route_sweep,
    time_shape,
)


def gpu_main(args: argparse.Namespace, results: dict[str, Any], root: Path) -> int:
    """Steps 1-6 on the device (results: the JSON summary; root: the checkout, for build/)."""
    t_start = time.perf_counter()
    log("== PyCUDA")
    build_s = ensure_pycuda(root)
    results["pycuda_build_s"] = build_s
    log(f"  {'already importable' if build_s is None else f'built in {build_s:.1f} s'}")
    import pycuda.driver as drv

    import colibri.cuda as cuda

    reason = cuda.unavailable_reason()
    if reason:
        raise SystemExit(f"CUDA unusable: {reason}")
    log("== compile")
    t0 = time.perf_counter()
    cache = root / "build" / "cuda_cache"
    os.environ["COLIBRI_CUDA_CACHE"] = str(cache)
    rt = cuda.CudaRuntime(0, cache_dir=cache)
    results.update(device=rt.name, arch=rt.arch, compile_s=time.perf_counter() - t0)
    log(f"  {rt.name} ({rt.arch}): kernels compiled and loaded in {results['compile_s']:.1f} s")
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    failed: list[str] = results.setdefault("failed", [])

    def step(name: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
        """One check: its failure is logged with the traceback and recorded (results["failed"],
        exit status 1), and the later checks still run (None is returned)."""
        try:
            return fn(*fn_args)
        except Exception:  # noqa: BLE001 - a failed check must not hide the others
            log(f"  FAILED: {name}\n{traceback.format_exc()}")
            failed.append(name)
            return None

    log("== routing vs reference")

    def route_fn(logits, k, gating, bias, renorm, scale, tile):
        n_exp = logits.shape[1]
        slot = np.arange(n_exp, dtype=np.int64) * 1024
        r = rt.route(logits, k, gating, bias, renorm, scale, tile, slot_offset=slot)
        h = r.to_host()
        if not np.array_equal(h["sel_offset"], h["topk_ids"].astype(np.int64) * 1024):
            raise AssertionError("sel_offset differs from the slot table")
        return h

    step("routing", check_routing, route_fn, rng)

    log("== grouped expert FFN vs reference (outputs pre-filled with NaN)")

    def ffn_for(pipeline: str):
        def ffn_fn(x16, pool, offsets, lay, logits, k, act, tile):
            dp = rt.upload_pool(pool, offsets, lay)
            r = rt.route(logits, k, "softmax", None, True, 1.0, tile)
            ws = rt.workspace(r, lay)
            for buf in (ws.out, ws.z, ws.h):
                rt.poison(buf)
            rt.moe_ffn_launch(rt.to_gpu(x16), dp, r, ref.ACTIVATIONS[act], ws, pipeline=pipeline)
            out = ws.out.get().reshape(x16.shape[0], lay.hidden)
            rt._check_err(ws.err, "moe_ffn")
            h = r.to_host()
            total = int(h["seg_offset"][-1])
            hh = ws.h.get().reshape(r.cap, lay.ffn)[:total]
            if not np.isfinite(hh).all():
                raise AssertionError("gate/up left rows of h unwritten")
            return out, h

        return ffn_fn

    pipelines = ["cp", "regs"] if rt.cp_supported else ["regs"]
    results.update(gemm_pipeline=rt.gemm_pipeline, pipelines=pipelines)
    log(f"  fp16 GEMM pipelines: {pipelines} (default {rt.gemm_pipeline}); int4: regs")
    ffn_cases = FFN_CASES_CPU if args.small else FFN_CASES
    results["ffn"] = []
    for i, pipe in enumerate(pipelines):
        cases = ffn_cases if i == 0 else [c for c in ffn_cases if c[0] == "f16"]
        rows = step(f"ffn [{pipe}]", check_ffn, ffn_for(pipe), rng, cases, f" [{pipe}]")
        results["ffn"] += rows or []

    log("== peers")
    peak, peer = measure_matmul_peer()
    results.update(matmul_tflops=peak, matmul_peer=peer)
    log(f"  fp16 matmul: {f'{peak:.1f} TFLOP/s' if peak else 'n/a'} ({peer})")
    copy_bw = copy_bandwidth(drv, 1 << (26 if args.small else 30))
    results["copy_gbs"] = copy_bw
    log(f"  device copy: {copy_bw:.0f} GB/s (read + write)")

    log("== timing (median of CUDA-event runs after warm-up)")
    timings: list[dict[str, Any]] = []
    shapes = SMALL_TIMING_SHAPES if args.small else TIMING_SHAPES
    tokens = SMALL_TIMING_TOKENS if args.small else TIMING_TOKENS
    for shape_name, shape in shapes.items():
        timings += step(f"timing {shape_name}", time_shape, rt, drv, shape_name, shape,
                        pipelines, peak, copy_bw, rng, args, tokens) or []
    results["timings"] = timings
    log("== routing variants (ms, median of CUDA-event runs)")
    results["route_sweep"] = step("routing sweep", route_sweep, rt, drv, rng,
                                  SMALL_ROUTE_SWEEP_TOKENS if args.small else ROUTE_SWEEP_TOKENS,
                                  min(20, args.runs))

    log("== staged expert path vs the whole pool (pinned expert store slots)")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results["staged"] = step("staged", staged_check, rt, rng, Path(tmp), args.small)
    results["small_shapes"] = args.small
    results["target"] = report_target(timings, peak, shapes)
    results["total_s"] = time.perf_counter() - t_start
    if failed:
        log(f"== FAILED after {results['total_s']:.0f} s: {', '.join(failed)}")
        return 1
    log(f"== all checks passed in {results['total_s']:.0f} s")
    return 0


def copy_bandwidth(drv: Any, nbytes: int) -> float:
    """Device-to-device copy bandwidth, GB/s counting bytes read and written (median of 10
    CUDA-event-timed copies after 2 warm-ups)."""
    src, dst = drv.mem_alloc(nbytes), drv.mem_alloc(nbytes)
    s_ev, e_ev = drv.Event(), drv.Event()
    copies = []
    for i in range(12):
        s_ev.record()
        drv.memcpy_dtod(dst, src, nbytes)
        e_ev.record()
        e_ev.synchronize()
        if i >= 2:
            copies.append(e_ev.time_since(s_ev) / 1e3)
    src.free()
    dst.free()
    return 2 * nbytes / float(np.median(copies)) / 1e9



def main(argv: list[str] | None = None, root: Path | None = None) -> int:
    """The command line (tools/bench/cuda_check.py); root: the checkout whose build/ holds the
    carried PyCUDA wheels and the cubin cache (default: the current directory)."""
    import colibri.tools.cuda_check as pkg

    ap = argparse.ArgumentParser(description=pkg.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-only", action="store_true", help="self-check the CPU reference path, no GPU")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per size (after warm-up)")
    ap.add_argument("--small", action="store_true",
                    help="small shapes everywhere (a quick smoke run; not the reported figures)")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    try:
        rc = cpu_only(results) if args.cpu_only else gpu_main(args, results,
                                                              root or Path.cwd())
    finally:
        out = os.environ.get("OUT")
        if out:
            Path(out, "cuda_check.json").write_text(json.dumps(results, indent=2, default=str))
    return rc
