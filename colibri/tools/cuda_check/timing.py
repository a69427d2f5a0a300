"""Step 5 of the CUDA check: the grouped expert FFN timed with CUDA events against the device's
fp16 matmul rate (PyTorch or CuPy), its copy bandwidth, the roofline and PyTorch's eager
per-expert loop, and the issue's target stated per shape."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from colibri import _cuda_ref as ref
from colibri._cuda_ref import ExpertLayout
from colibri.tools.cuda_check.reference import FFN_REL_BOUND, log, random_pool, rel_err

# The timed shapes: Qwen3-30B-A3B's experts (small experts, many of them: at 1024 tokens each
# expert gets ~64 rows and the GEMM is bound by reading the weights) and Mixtral-8x7B's (few,
# large experts: ~256 rows each at 1024 tokens, bound by the tensor cores). "check" = the
# largest token count compared with the float64 reference; "distinct" = how many different
# experts are generated on the host (the rest of the slots are device copies of them, so the
# memory traffic is that of all the experts).
TIMING_SHAPES: dict[str, dict[str, int]] = {
    "qwen3-30b-a3b": {"hidden": 2048, "ffn": 768, "experts": 128, "k": 8, "check": 128,
                      "distinct": 8},
    "mixtral-8x7b": {"hidden": 4096, "ffn": 14336, "experts": 8, "k": 2, "check": 16,
                     "distinct": 2},
}
TIMING_TOKENS = (1, 16, 128, 1024)
TARGET_TOKENS, TARGET_FRAC = 1024, 0.5
# --small: one small shape and token counts (a quick smoke run; not the reported figures)
SMALL_TIMING_SHAPES: dict[str, dict[str, int]] = {
    "small": {"hidden": 256, "ffn": 128, "experts": 16, "k": 4, "check": 64, "distinct": 4}}
SMALL_TIMING_TOKENS = (1, 16, 64)


def measure_matmul_peer(n: int = 8192) -> tuple[float | None, str]:
    """fp16 matmul TFLOP/s of the device through PyTorch (or CuPy), median of 20."""
    try:
        import torch

        if torch.cuda.is_available():
            a = torch.randn(n, n, device="cuda", dtype=torch.float16)
            b = torch.randn(n, n, device="cuda", dtype=torch.float16)
            for _ in range(5):
                torch.matmul(a, b)
            times = []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                torch.matmul(a, b)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 1e3)
            return 2 * n**3 / float(np.median(times)) / 1e12, f"torch {torch.__version__} matmul fp16 {n}^3"
    except Exception as ex:  # no torch, or no CUDA torch
        torch_note = f"torch unusable ({ex!r})"
    else:
        torch_note = "torch without CUDA"
    try:
        import cupy as cp

        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        for _ in range(5):
            a @ b
        times = []
        for _ in range(20):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            a @ b
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
        return 2 * n**3 / float(np.median(times)) / 1e12, f"cupy {cp.__version__} matmul fp16 {n}^3"
    except Exception as ex:
        return None, f"no fp16 matmul peer: {torch_note}; cupy unusable ({ex!r})"


def cuda_event_median(drv: Any, fn: Any, runs: int) -> float:
    """Median seconds of fn() between two CUDA events, after min(10, runs) warm-up runs."""
    warmup = min(10, runs)
    s_ev, e_ev = drv.Event(), drv.Event()
    ts = []
    for i in range(runs + warmup):
        s_ev.record()
        fn()
        e_ev.record()
        e_ev.synchronize()
        if i >= warmup:
            ts.append(e_ev.time_since(s_ev) / 1e3)
    return float(np.median(ts))


def torch_loop_peer(h: dict[str, np.ndarray], d: int, f: int, n_exp: int,
                    runs: int) -> float | None:
    """The same routed fp16 FFN as PyTorch runs it eagerly (a loop over the experts with
    tokens: gather, two matmuls, SiLU * up, matmul, scale, index_add - the Hugging Face MoE
    loop), on n_exp distinct random experts; median seconds, None without CUDA torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except Exception:
        return None
    dev = "cuda"
    wg = torch.randn(n_exp, f, d, device=dev, dtype=torch.float16) / d**0.5
    wu = torch.randn(n_exp, f, d, device=dev, dtype=torch.float16) / d**0.5
    wd = torch.randn(n_exp, d, f, device=dev, dtype=torch.float16) / f**0.5
    n_tokens, k = h["topk_ids"].shape
    x = torch.randn(n_tokens, d, device=dev, dtype=torch.float16)
    groups = []
    for e in range(n_exp):
        tok, j = np.nonzero(h["topk_ids"] == e)
        if tok.size:
            groups.append((e, torch.as_tensor(tok, device=dev),
                           torch.as_tensor(h["topk_w"][tok, j], device=dev, dtype=torch.float16)))

    def run() -> None:
        out = torch.zeros(n_tokens, d, device=dev, dtype=torch.float16)
        for e, tok, w in groups:
            xe = x.index_select(0, tok)
            y = (torch.nn.functional.silu(xe @ wg[e].T) * (xe @ wu[e].T)) @ wd[e].T
            out.index_add_(0, tok, y * w[:, None])

    s, e_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for i in range(runs + min(5, runs)):
        s.record()
        run()
        e_.record()
        e_.synchronize()
        if i >= min(5, runs):
            ts.append(s.elapsed_time(e_) / 1e3)
    return float(np.median(ts))


# (result key, multi_block, per_warp) of the routing variants timed next to the FFN
ROUTE_VARIANTS = (("route_ms", False, True), ("route_thread_ms", False, False),
                  ("route_mb_ms", True, True), ("route_mb_thread_ms", True, False))


def time_route_variants(rt: Any, drv: Any, r: Any, runs: int) -> dict[str, float]:
    """ms of each ROUTE_VARIANTS launch re-routing the softmax routing ``r`` (route() without
    bias or slots) from its own device logits: it rewrites what r already holds."""
    logits_gpu = r.inputs[0]  # the logits route() uploaded
    return {key: 1e3 * cuda_event_median(
                drv, lambda mb=mb, pw=pw: rt.route_launch(
                    logits_gpu, r, 0, None, True, 1.0, None, multi_block=mb, per_warp=pw), runs)
            for key, mb, pw in ROUTE_VARIANTS}


# the routing sweep: experts -> top-k, and the token counts (small: the --small run's)
ROUTE_SWEEP = {8: 2, 128: 8, 256: 8}
ROUTE_SWEEP_TOKENS = (1, 4, 16, 64, 256, 1024, 4096, 16384)
SMALL_ROUTE_SWEEP_TOKENS = (1, 16, 300)


def route_sweep(rt: Any, drv: Any, rng: np.random.Generator, tokens: Sequence[int],
                runs: int = 20) -> list[dict[str, Any]]:
    """Every routing variant (ROUTE_VARIANTS) on random softmax logits, for each expert count
    of ROUTE_SWEEP and each token count: where a warp per token beats a thread per token
    (colibri.cuda.ROUTE_WARP_TOKENS) and the multi-block pair the single block
    (MULTI_BLOCK_TOKENS). Each launch timed alone (CUDA events), so a time near the launch
    overhead is that overhead."""
    rows: list[dict[str, Any]] = []
    one = rt.zeros_i32(4)
    floor = 1e3 * cuda_event_median(drv, lambda: drv.memset_d32(int(one.gpudata), 0, 1), runs)
    log(f"  the floor: one 4-byte memset timed the same way takes {floor:.3f} ms")
    rows.append({"memset_floor_ms": floor})
    for n_exp, k in ROUTE_SWEEP.items():
        for n_tokens in tokens:
            logits = rng.standard_normal((n_tokens, n_exp), dtype=np.float32)
            r = rt.route(logits, k, "softmax", None, True, 1.0)
            row: dict[str, Any] = {"experts": n_exp, "k": k, "tokens": n_tokens,
                                   **time_route_variants(rt, drv, r, runs)}
            rt._check_err(r.arrays["err"], "routing sweep")
            log(f"  {n_exp:4d} experts top-{k} T={n_tokens:6d}: single block "
                f"{row['route_ms']:.3f} (warp) / {row['route_thread_ms']:.3f} (thread), "
                f"multi-block {row['route_mb_ms']:.3f} / {row['route_mb_thread_ms']:.3f} ms")
            rows.append(row)
    return rows


def time_shape(rt: Any, drv: Any, shape_name: str, shape: dict[str, int], pipelines: list[str],
               peak: float | None, copy_bw: float, rng: np.random.Generator,
               args: argparse.Namespace, tokens: Sequence[int] = TIMING_TOKENS
               ) -> list[dict[str, Any]]:
    """Time the grouped FFN (gate/up, down, combine) of one model's expert shape at every
    count of tokens (TIMING_TOKENS): fp16 with each GEMM pipeline, int4-g128; each run first compared with
    the float64 reference up to shape["check"] tokens and the pipelines with each other.
    Reported: TFLOP/s of useful work (6 D F per routed token), against the fp16 matmul rate,
    against the roofline (the time the larger of flops / matmul rate and weight bytes / copy
    bandwidth takes), weight GB/s, and the PyTorch per-expert loop on the same routing."""
    import colibri.cuda as cuda

    d, f, n_exp, k = (shape[x] for x in ("hidden", "ffn", "experts", "k"))
    n_distinct = min(shape["distinct"], n_exp)
    log(f"  -- {shape_name}: hidden {d}, expert FFN {f}, {n_exp} experts, top-{k}")
    rows: list[dict[str, Any]] = []
    for fmt in ("f16", "int4-g128"):
        lay = ExpertLayout(d, f, fmt)
        t0 = time.perf_counter()
        base_pool, base_off = random_pool(rng, lay, n_distinct)
        sb = lay.slot_bytes
        pool_dev = drv.mem_alloc(n_exp * sb)
        drv.memcpy_htod(pool_dev, base_pool)
        for e in range(n_distinct, n_exp):
            drv.memcpy_dtod(int(pool_dev) + e * sb, int(pool_dev) + (e % n_distinct) * sb, sb)
        offsets = np.arange(n_exp, dtype=np.int64) * sb
        dp = cuda.DevicePool(lay, n_exp, n_exp * sb, pool_dev, rt.to_gpu(offsets))
        # float64 once per distinct expert (the reference would convert each routed one)
        seen: list[Any] = [tuple(m.astype(np.float64) for m in ref.unpack_expert(base_pool[o:], lay))
                for o in base_off]
        log(f"     {fmt}: pool of {n_exp * sb / 2**30:.2f} GiB ready in "
            f"{time.perf_counter() - t0:.1f} s")
        for n_tokens in tokens:
            x16 = rng.standard_normal((n_tokens, d), dtype=np.float32).astype(np.float16)
            logits = rng.standard_normal((n_tokens, n_exp), dtype=np.float32)
            r = rt.route(logits, k, "softmax", None, True, 1.0)
            h = r.to_host()
            ws = rt.workspace(r, lay)
            x_gpu = rt.to_gpu(x16)
            flops = 6.0 * d * f * n_tokens * k
            wbytes = int((h["counts"] > 0).sum()) * 3 * lay.matrix_bytes
            t_bound = max(flops / (peak * 1e12) if peak else 0.0, wbytes / (copy_bw * 1e9))
            want: np.ndarray | None = None
            if n_tokens <= shape["check"]:
                want = ref.moe_ffn_reference(x16, [seen[e % n_distinct] for e in range(n_exp)],
                                             h["topk_ids"], h["topk_w"], "silu")
            first: np.ndarray | None = None
            runs = args.runs if n_tokens < 1024 else max(min(20, args.runs), args.runs // 4)
            for pipe in (pipelines if fmt == "f16" else ["regs"]):
                rt.poison(ws.out)
                rt.moe_ffn_launch(x_gpu, dp, r, 0, ws, pipeline=pipe)
                out = ws.out.get().reshape(n_tokens, d)
                rt._check_err(ws.err, "moe_ffn")
                if not np.isfinite(out).all():
                    raise AssertionError(f"{shape_name} {fmt} [{pipe}] T={n_tokens}: "
                                         "outputs unwritten or not finite")
                err = rel_err(out, want) if want is not None else float("nan")
                if want is not None and err >= FFN_REL_BOUND:
                    raise AssertionError(f"{shape_name} {fmt} [{pipe}] T={n_tokens}: "
                                         f"rel err {err:.2e}")
                same: bool | None = None
                if first is None:
                    first = out
                else:
                    same = bool(np.array_equal(out.view(np.uint32), first.view(np.uint32)))
                    if not same and rel_err(out, first) >= FFN_REL_BOUND:
                        raise AssertionError(f"{shape_name} {fmt} T={n_tokens}: the pipelines "
                                             f"differ by {rel_err(out, first):.2e}")
                def launch(x_gpu=x_gpu, dp=dp, r=r, ws=ws, pipe=pipe) -> None:
                    rt.moe_ffn_launch(x_gpu, dp, r, 0, ws, pipeline=pipe)

                t = cuda_event_median(drv, launch, runs)
                tf = flops / t / 1e12
                row: dict[str, Any] = {"shape": shape_name, "fmt": fmt, "pipeline": pipe, "tokens": n_tokens,
                       "tile": r.tile, "ms": t * 1e3, "tflops": tf,
                       "frac_matmul": tf / peak if peak else None,
                       "frac_roofline": t_bound / t, "roofline_tflops": flops / t_bound / 1e12,
                       "weight_gbs": wbytes / t / 1e9, "frac_copy_bw": wbytes / t / 1e9 / copy_bw,
                       "rel_err": err, "bit_identical_to_cp": same}
                if fmt == "f16" and pipe == pipelines[0]:
                    row.update(time_route_variants(rt, drv, r, min(20, runs)))
                    tp = torch_loop_peer(h, d, f, n_exp, max(5, runs // 4))
                    row["torch_loop_ms"] = tp * 1e3 if tp else None
                    row["vs_torch_loop"] = tp / t if tp else None
                rows.append(row)
                frac = f"{row['frac_matmul']:.0%} of matmul, " if peak else ""
                peer = (f", torch loop {row['torch_loop_ms']:.3f} ms ({row['vs_torch_loop']:.1f}x)"
                        if row.get("vs_torch_loop") else "")
                route = (" (route ms, warp/thread per token: single block "
                         f"{row['route_ms']:.3f}/{row['route_thread_ms']:.3f}, multi-block "
                         f"{row['route_mb_ms']:.3f}/{row['route_mb_thread_ms']:.3f})"
                         if row.get("route_ms") else "")
                log(f"     {fmt:9s} [{pipe:4s}] T={n_tokens:5d} tile={r.tile:2d}: "
                    f"{row['ms']:.3f} ms{route}, {tf:.1f} TFLOP/s = {frac}"
                    f"{row['frac_roofline']:.0%} of roofline ({row['roofline_tflops']:.0f}), "
                    f"weights {row['weight_gbs']:.0f} GB/s = {row['frac_copy_bw']:.0%} of copy bw"
                    f"{peer}; err {f'{err:.1e}' if want is not None else 'not checked (large T)'}"
                    f"{'' if same is None else f', same as cp: {same}'}")
        pool_dev.free()
    return rows


def report_target(timings: list[dict[str, Any]], peak: float | None,
                  shapes: dict[str, dict[str, int]] = TIMING_SHAPES) -> dict[str, Any]:
    """The issue's target: fp16 at TARGET_TOKENS tokens >= TARGET_FRAC of the fp16 matmul
    rate, for each timed shape with the best pipeline; and whether the roofline allows it (a
    shape whose weight reads alone take longer than TARGET_FRAC of the matmul rate allows
    cannot reach it, whatever the kernel)."""
    out: dict[str, Any] = {}
    if not peak:
        log("== target: no fp16 matmul peer measured, the fraction cannot be stated")
        return out
    for shape_name in shapes:
        cands = [r for r in timings if r["shape"] == shape_name and r["fmt"] == "f16"
                 and r["tokens"] == TARGET_TOKENS]
        if not cands:
            continue
        best = max(cands, key=lambda r: r["tflops"])
        reachable = best["roofline_tflops"] >= TARGET_FRAC * peak
        met = best["frac_matmul"] >= TARGET_FRAC
        out[shape_name] = {"pipeline": best["pipeline"], "frac_matmul": best["frac_matmul"],
                           "frac_roofline": best["frac_roofline"],
                           "roofline_frac_matmul": best["roofline_tflops"] / peak,
                           "reachable": reachable, "met": met}
        log(f"== target {shape_name}: fp16 at {TARGET_TOKENS} tokens [{best['pipeline']}] "
            f"reaches {best['frac_matmul']:.0%} of the fp16 matmul rate (goal >= "
            f"{TARGET_FRAC:.0%}): {'MET' if met else 'NOT MET'}; the roofline allows "
            f"{best['roofline_tflops'] / peak:.0%} ({'reachable' if reachable else 'bound by weight reads'}), "
            f"the kernel reaches {best['frac_roofline']:.0%} of it")
    return out

