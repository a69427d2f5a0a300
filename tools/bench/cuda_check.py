#!/usr/bin/env python3
"""One-call check of colibri's CUDA kernels on a lent GPU: build, verify, time.

    python tools/bench/cuda_check.py            # on the GPU machine (device tool), ~3-6 min
    python tools/bench/cuda_check.py --cpu-only # here: the CPU reference path, no GPU needed

Steps on the GPU machine (each timed and printed; a JSON summary goes to $OUT/cuda_check.json
when $OUT is set):
  1. PyCUDA: imported if present, else built from the carried sdist and wheels in
     build/pycuda_wheels (tools/dev/fetch_pycuda.sh; carry=["build/pycuda_wheels"]): the
     dependencies installed offline into build/pycuda_site, the sdist compiled in place in
     build/pycuda_src (parallel build_ext); the build time is reported.
  2. Kernels compiled for the device's own architecture (colibri.cuda, cubin cache).
  3. Routing on fresh random logits vs colibri._cuda_ref (float64): ids exact, weights within
     2e-5 relative, grouping (counts, segments, sorted list, pair positions, tiles) exact;
     up to 2048 tokens the single-block kernel, 5000 tokens the multi-block pair.
  4. Grouped expert FFN vs the float64 reference on the weights as stored (fp16, or int4-g128
     dequantized): relative Frobenius error < 5e-3 for both formats (fp32 accumulation, fp16
     x and h), with every output element written (outputs pre-filled with NaN).
  5. Timing with CUDA events (median of many runs after warm-up) of the grouped FFN (gate/up,
     down, combine) at 1, 16, 128 and 1024 tokens, for two expert shapes: Qwen3-30B-A3B
     (hidden 2048, expert FFN 768, 128 experts, top-8; ~64 rows per expert at 1024 tokens:
     bound by reading the weights) and Mixtral-8x7B (hidden 4096, FFN 14336, 8 experts,
     top-2; ~256 rows per expert: bound by the tensor cores); fp16 with both GEMM pipelines
     (cp.async, register prefetch; compared with each other bit for bit) and int4. Each row is
     checked against the float64 reference first (small token counts). Reported as TFLOP/s of
     useful work (6 * D * F per routed token) against the device's measured fp16 matmul rate
     (PyTorch or CuPy, same run), against the roofline (the larger of flops / matmul rate and
     weight bytes / copy bandwidth), as weight bandwidth against a measured device-to-device
     copy, and against PyTorch's eager per-expert loop on the same routing (the peer).
     Target: at 1024 tokens, fp16, >= 50% of the matmul rate; stated per shape with whether
     the roofline allows it.
  6. The staged expert path (colibri.cuda_moe with a device budget of a few experts) against
     the whole pool, bit for bit, on a synthetic F16 expert file served by a real expert
     store in cache mode whose slot pool is page-locked (cuMemHostRegister): fp16 weights
     copied straight from the pinned slots, int4-g128 converted through the pinned staging
     buffer; batches of 1..40 tokens, with evictions and batch splits; the pool unpinned at
     close. (:func:`staged_check`, also run by tests/cuda/test_cuda_runtime_emulated.py.)

--cpu-only runs steps 3-4 with a NumPy emulation of the kernels' data flow (router output
layout, padded tiles, byte offsets in the pool, fp16 rounding of h, the ordered combine) in
place of the device, so the indexing the kernels rely on is checked on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from colibri import _cuda_ref as ref  # noqa: E402
from colibri._cuda_ref import ExpertLayout  # noqa: E402

FFN_REL_BOUND = 5e-3
ROUTE_W_RTOL = 2e-5
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
RESULTS: dict[str, Any] = {}


def log(msg: str) -> None:
    print(msg, flush=True)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


# ------------------------------------------------------------------------------ inputs
def separated_logits(rng: np.random.Generator, n_tokens: int, n_experts: int) -> np.ndarray:
    """Random router logits without near-ties (a shuffled grid), so float32 device results
    and the float64 reference must choose the same experts."""
    base = np.arange(n_experts) * (8.0 / n_experts) - 4.0
    noise = rng.uniform(0, 2.0 / n_experts, (n_tokens, n_experts))
    return (np.array([rng.permutation(base) for _ in range(n_tokens)]) + noise).astype(np.float32)


def random_pool(rng: np.random.Generator, lay: ExpertLayout, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n expert slots of random weights written straight in the pool layout (no float64
    detour, for the large timing shapes): fp16 ~ N(0, 1/cols), or int4 codes uniform in 0..15
    with fp16 group scales giving the same spread."""
    sb, mb = lay.slot_bytes, lay.matrix_bytes
    pool = np.zeros(n * sb, np.uint8)
    for e in range(n):
        for i, (rows, cols) in enumerate(((lay.ffn, lay.hidden), (lay.ffn, lay.hidden),
                                          (lay.hidden, lay.ffn))):
            b = pool[e * sb + i * mb : e * sb + (i + 1) * mb]
            if lay.fmt == "f16":  # a random block of up to 4M values, repeated (fast to make)
                w = rng.standard_normal(min(rows * cols, 1 << 22), dtype=np.float32)
                w = (w / np.float32(np.sqrt(cols))).astype(np.float16)
                b.view(np.float16)[:] = np.resize(w, rows * cols)
            else:
                nq = rows * cols // 2
                b[:nq] = rng.integers(0, 256, nq, dtype=np.uint8)
                sc = rng.uniform(0.8, 1.2, rows * (cols // 128)) / (4.6 * np.sqrt(cols))
                b[nq:].view(np.float16)[:] = sc.astype(np.float16)
    return pool, np.arange(n, dtype=np.int64) * sb


def make_experts(rng: np.random.Generator, n: int, d: int, f: int) -> list[tuple[np.ndarray, ...]]:
    return [
        (
            rng.standard_normal((f, d), dtype=np.float32) / np.sqrt(d),
            rng.standard_normal((f, d), dtype=np.float32) / np.sqrt(d),
            rng.standard_normal((d, f), dtype=np.float32) / np.sqrt(f),
        )
        for _ in range(n)
    ]


# --------------------------------------------------------------------- CPU emulation
def emulate_route(logits, k, gating, bias, renorm, scale, tile):
    """What cb_route_topk writes, from the float64 reference rounded to float32."""
    ids, w = ref.route_reference(logits, k, gating, bias, renorm, scale)
    w32 = w.astype(np.float32)
    g = ref.group_reference(ids, w32, logits.shape[1], tile)
    g["topk_ids"], g["topk_w"] = ids, w32
    return g


def emulate_moe_ffn(x16, pool, offsets, lay: ExpertLayout, g, k, act):
    """The data flow of cb_moe_gate_up / cb_moe_down / cb_moe_combine in NumPy: tiles named
    by tile_expert, weights found at their byte offsets, h rounded to fp16, z written only
    for real rows, each token's k rows summed in order j = 0..k-1. Unwritten rows stay NaN."""
    tile = len(g["sorted_token"]) // len(g["tile_expert"])
    n_tokens, d = x16.shape
    cap = len(g["sorted_token"])
    h = np.full((cap, lay.ffn), np.nan, np.float16)
    z = np.full((cap, d), np.nan, np.float32)
    cache: dict[int, tuple[np.ndarray, ...]] = {}
    for ti, e in enumerate(g["tile_expert"]):
        if e < 0:
            continue
        rows = slice(ti * tile, (ti + 1) * tile)
        if e not in cache:
            cache[e] = ref.unpack_expert(pool[int(offsets[e]) :], lay)
        gate, up, down = cache[e]
        tok = g["sorted_token"][rows]
        a = np.where(tok[:, None] >= 0, x16[np.maximum(tok, 0)].astype(np.float32), 0.0)
        hg = ref.activation(a @ gate.T, act) * (a @ up.T)
        h[rows] = hg.astype(np.float16)
        zz = (h[rows].astype(np.float32) @ down.T) * g["sorted_weight"][rows][:, None]
        real = tok >= 0
        z[rows][real] = zz[real]  # z[rows] is a view: only real rows are written
    out = np.zeros((n_tokens, d), np.float32)
    pp = g["pair_pos"].reshape(n_tokens, k)
    for j in range(k):
        ok = pp[:, j] >= 0
        out[ok] += z[pp[ok, j]]
    return out


# ------------------------------------------------------------------------- checks
def check_routing(route_fn, rng) -> None:
    cases = [
        (1, 8, 2, "softmax", False, False, 1.0, 16),
        (64, 64, 6, "softmax", False, True, 1.0, 16),
        (1024, 128, 8, "softmax", False, True, 1.0, 64),
        (333, 256, 8, "sigmoid", True, True, 2.5, 16),
        (2048, 128, 8, "sigmoid", True, True, 2.5, 64),
        (5000, 128, 8, "softmax", False, True, 1.0, 64),  # > 2048 tokens: multi-block routing
    ]
    for n_tokens, n_exp, k, gating, use_bias, renorm, scale, tile in cases:
        logits = separated_logits(rng, n_tokens, n_exp)
        bias = (rng.integers(-2, 3, n_exp) * 1.5).astype(np.float32) if use_bias else None
        got = route_fn(logits, k, gating, bias, renorm, scale, tile)
        ids, w = ref.route_reference(logits, k, gating, bias, renorm, scale)
        if not np.array_equal(got["topk_ids"], ids):
            raise AssertionError(f"routing ids differ ({n_tokens}x{n_exp}, k={k}, {gating})")
        werr = float(np.max(np.abs(got["topk_w"] - w) / np.abs(w)))
        if werr > ROUTE_W_RTOL:
            raise AssertionError(f"routing weights off by {werr:.2e} relative")
        g = ref.group_reference(ids, got["topk_w"], n_exp, tile, len(got["sorted_token"]))
        for key in ("counts", "seg_offset", "sorted_token", "pair_pos", "tile_expert"):
            if not np.array_equal(np.ravel(got[key]), np.ravel(g[key])):
                raise AssertionError(f"routing {key} differs ({n_tokens}x{n_exp}, k={k})")
        log(f"  route {n_tokens:5d} tokens x {n_exp:3d} experts, k={k}, {gating:7s}"
            f"{' +bias' if use_bias else '      '}: ids exact, weights max rel {werr:.1e}, grouping exact")


def check_ffn(ffn_fn, rng, cases, label: str = "") -> list[dict[str, Any]]:
    """ffn_fn(x16, pool, offsets, layout, logits, k, act, tile) -> (out, routing dict)."""
    results = []
    for fmt, d, f, n_exp, k, n_tokens, act, tile in cases:
        lay = ExpertLayout(d, f, fmt)
        experts = make_experts(rng, n_exp, d, f)
        pool, offsets = ref.build_pool(experts, lay)
        x16 = rng.standard_normal((n_tokens, d), dtype=np.float32).astype(np.float16)
        logits = separated_logits(rng, n_tokens, n_exp)
        out, routed = ffn_fn(x16, pool, offsets, lay, logits, k, act, tile)
        if not np.isfinite(out).all():
            raise AssertionError(f"{fmt} FFN left {int((~np.isfinite(out)).sum())} outputs unwritten/NaN")
        seen = [ref.unpack_expert(pool[o:], lay) for o in offsets]
        want = ref.moe_ffn_reference(x16, seen, routed["topk_ids"], routed["topk_w"], act)
        err = rel_err(out, want)
        # Quantization error of the format itself (vs the float weights), for information.
        qerr = rel_err(want, ref.moe_ffn_reference(x16, experts, routed["topk_ids"],
                                                   routed["topk_w"], act))
        ok = err < FFN_REL_BOUND
        log(f"  ffn{label} {fmt:9s} D={d} F={f} E={n_exp} k={k} T={n_tokens:4d} {act:9s} tile={tile}: "
            f"rel err {err:.2e} (bound {FFN_REL_BOUND:.0e}) {'ok' if ok else 'FAIL'}; "
            f"format vs float weights {qerr:.2e}")
        results.append({"fmt": fmt, "tokens": n_tokens, "act": act, "tile": tile,
                        "pipeline": label.strip(" []") or None, "rel_err": err, "format_err": qerr})
        if not ok:
            raise AssertionError(f"{fmt} FFN relative error {err:.2e} >= {FFN_REL_BOUND}")
    return results


FFN_CASES = [
    ("f16", 1024, 384, 32, 4, 1, "silu", 16),
    ("f16", 1024, 384, 32, 4, 16, "gelu_tanh", 16),
    ("f16", 1024, 384, 32, 4, 300, "silu", 64),
    ("int4-g128", 1024, 384, 32, 4, 1, "silu", 16),
    ("int4-g128", 1024, 384, 32, 4, 16, "silu", 16),
    ("int4-g128", 1024, 384, 32, 4, 300, "gelu_tanh", 64),
]
FFN_CASES_CPU = [  # smaller: the emulation is NumPy
    ("f16", 256, 128, 8, 2, 1, "silu", 16),
    ("f16", 256, 128, 8, 2, 40, "gelu_tanh", 16),
    ("int4-g128", 256, 256, 8, 3, 70, "silu", 64),
]


def cpu_only() -> int:
    rng = np.random.default_rng(int(time.time()))
    log("== routing (NumPy emulation of cb_route_topk)")

    def route_fn(logits, k, gating, bias, renorm, scale, tile):
        return emulate_route(logits, k, gating, bias, renorm, scale, tile)

    check_routing(route_fn, rng)
    log("== grouped expert FFN (NumPy emulation of the kernels' data flow)")

    def ffn_fn(x16, pool, offsets, lay, logits, k, act, tile):
        g = emulate_route(logits, k, "softmax", None, True, 1.0, tile)
        return emulate_moe_ffn(x16, pool, offsets, lay, g, k, act), g

    RESULTS["ffn"] = check_ffn(ffn_fn, rng, FFN_CASES_CPU)
    log("cpu-only self-check passed (no GPU used)")
    return 0


# ------------------------------------------------------------------ the staged path
def staged_check(rt: Any, rng: np.random.Generator, tmp: Path, small: bool = False) -> dict[str, Any]:
    """Step 6: CudaExperts with a budget of 6 device slots vs the whole pool, bit for bit.

    A synthetic model file holds one MoE layer of E F16 experts (GGUF-like stacked tensors);
    a real ExpertStore in cache mode serves them; its slot pool gets pinned by CudaExperts.
    """
    from types import SimpleNamespace as NS

    import colibri._core._forward as _fw
    from colibri.cuda_moe import CudaExperts

    d, f, n_exp, k = (128, 128, 16, 4) if small else (512, 256, 64, 4)
    mb = f * d * 2
    head = 4096
    w = [(rng.standard_normal((n_exp, f, d), dtype=np.float32) / np.sqrt(d)).astype(np.float16),
         (rng.standard_normal((n_exp, f, d), dtype=np.float32) / np.sqrt(d)).astype(np.float16),
         (rng.standard_normal((n_exp, d, f), dtype=np.float32) / np.sqrt(f)).astype(np.float16)]
    path = tmp / "staged_check_experts.bin"
    blob = np.concatenate([np.zeros(head, np.uint8)] + [a.view(np.uint8).ravel() for a in w])
    blob.tofile(path)
    offs = [head + i * n_exp * mb for i in range(3)]
    mats = [NS(type=1, rows=f, cols=d, row_bytes=2 * d), NS(type=1, rows=f, cols=d, row_bytes=2 * d),
            NS(type=1, rows=d, cols=f, row_bytes=2 * f)]
    X = NS(gate=mats[0], up=mats[1], down=mats[2],
           gate_base=blob[offs[0]:], up_base=blob[offs[1]:], down_base=blob[offs[2]:],
           gate_stride=mb, up_stride=mb, down_stride=mb,
           gate_info=NS(offset=offs[0]), up_info=NS(offset=offs[1]), down_info=NS(offset=offs[2]))
    layer = NS(n_expert=n_exp, n_expert_used=k, n_ff_exp=f, router_bias=None,
               exp_down_scale=None, experts=X)
    desc = NS(n_embd=d, gating=0, act=0, expert_renorm=True, expert_scale=1.0, layers=[layer])
    out: dict[str, Any] = {}
    for fmt in ("f16", "int4-g128"):
        store = _fw.ExpertStore(desc, mode="cache", path=str(path), budget_bytes=1 << 40,
                                min_slots=n_exp)
        whole = CudaExperts(desc, rt, fmt)
        staged = CudaExperts(desc, rt, fmt, store=store, budget=6 * whole.layouts[0].slot_bytes)
        if not (staged.staged and staged.n_slots == 6 and store.pool()["pinned"]):
            raise AssertionError("the staged path did not set up 6 slots over a pinned pool")
        if staged.direct[0] != (fmt == "f16"):
            raise AssertionError(f"{fmt}: direct copies expected only for fp16")
        distinct = 0
        for n_tokens in ((1, 3, 12, 2) if small else (1, 1, 3, 40, 1, 7, 2)):
            logits = separated_logits(rng, n_tokens, n_exp)
            h = rng.standard_normal((n_tokens, d), dtype=np.float32)
            a, b = np.zeros((n_tokens, d), np.float32), np.zeros((n_tokens, d), np.float32)
            staged(0, h, logits, a)
            whole(0, h, logits, b)
            if not np.array_equal(a, b):
                raise AssertionError(f"{fmt} staged T={n_tokens}: differs from the whole pool "
                                     f"(max abs {float(np.max(np.abs(a - b))):.2e})")
            ids, _ = ref.route_reference(logits, k, "softmax", None, True, 1.0)
            distinct += len(np.unique(ids))
        st = staged.stats()
        if st["splits"] < 1 or st["evictions"] < 1 or st["hits"] + st["misses"] < distinct:
            raise AssertionError(f"{fmt}: staged statistics do not add up: {st}")
        staged.close()
        if store.pool()["pinned"]:
            raise AssertionError("the store's pool is still pinned after close")
        whole.close()
        out[fmt] = st
        log(f"  staged {fmt:9s}: 6 device slots of {n_exp} experts, bit-identical to the whole "
            f"pool; {st['hits']:.0f} hits, {st['misses']:.0f} misses, {st['evictions']:.0f} "
            f"evictions, {st['splits']:.0f} split batch(es), {st['bytes_staged'] / 2**20:.2f} "
            f"MiB staged")
    path.unlink()
    return out


# ------------------------------------------------------------------------- GPU path
def find_cuda_root() -> Path | None:
    """The CUDA toolkit folder (with include/cuda.h): $CUDA_HOME, $CUDA_PATH, nvcc's folder
    (through wrapper scripts too), /usr/local/cuda."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
        try:  # a wrapper script such as `exec /usr/local/cuda-13.0/bin/nvcc "$@"`
            out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True,
                                 text=True, timeout=30).stdout
            cands += [str(Path(m).parent.parent) for m in
                      re.findall(r"(/\S+)/bin/nvcc", out)]
        except (OSError, subprocess.SubprocessError):
            pass
    cands.append("/usr/local/cuda")
    for c in cands:
        if c and (Path(c) / "include" / "cuda.h").is_file():
            return Path(c)
    return None


def ensure_pycuda() -> float | None:
    """Import PyCUDA, building it from build/pycuda_wheels when absent: its dependencies are
    installed from the carried wheels into build/pycuda_site, the sdist is unpacked into
    build/pycuda_src with a siteconf.py naming the toolkit found here, and compiled in place
    with `setup.py build_ext --inplace -j <cpus>` (parallel, unlike a pip build). Returns the
    build seconds (None when PyCUDA was already importable)."""
    import tarfile

    site = ROOT / "build" / "pycuda_site"
    src_root = ROOT / "build" / "pycuda_src"
    for p in [site, *sorted(src_root.glob("pycuda-*"))]:
        if p.is_dir():
            sys.path.insert(0, str(p))
    try:
        import pycuda.driver  # noqa: F401

        return None
    except ImportError:
        pass
    wheels = ROOT / "build" / "pycuda_wheels"
    sdists = sorted(wheels.glob("pycuda-*.tar.gz"))
    if not sdists:
        raise SystemExit(f"PyCUDA missing and no sdist in {wheels}: run tools/dev/fetch_pycuda.sh "
                         "and carry build/pycuda_wheels")
    cuda_root = find_cuda_root()
    if cuda_root is None:
        raise SystemExit("PyCUDA missing and no CUDA toolkit (include/cuda.h) found to build it")
    t0 = time.perf_counter()
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")  # installs go to --target dirs
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-index", "--find-links", str(wheels), "--no-deps", "--target"]
    subprocess.run(pip + [str(site), "pytools", "platformdirs", "mako", "markupsafe",
                          "typing-extensions", "siphash24"], check=True, env=env)
    try:
        import setuptools  # noqa: F401
    except ImportError:  # the build backend, from the carried wheels, beside the build
        tools = ROOT / "build" / "pycuda_buildenv"
        subprocess.run(pip + [str(tools), "setuptools", "wheel"], check=True, env=env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tools), env.get("PYTHONPATH")]))
    src_root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdists[-1]) as tf:
        tf.extractall(src_root, filter="data")
    src = src_root / sdists[-1].name.removesuffix(".tar.gz")
    libdirs = [str(d) for d in (cuda_root / "lib64", cuda_root / "lib64" / "stubs",
                                cuda_root / "lib", cuda_root / "lib" / "stubs",
                                cuda_root / "targets" / "x86_64-linux" / "lib",
                                cuda_root / "targets" / "x86_64-linux" / "lib" / "stubs")
               if d.is_dir()]
    # The driver library: linkers look for libcuda.so, which some driver installs ship only
    # as libcuda.so.1; give them a link to it then.
    have_so = any((Path(d) / "libcuda.so").exists() for d in
                  libdirs + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"])
    if not have_so:
        found = re.findall(r"=>\s*(\S*libcuda\.so\.1)\b",
                           subprocess.run(["bash", "-c", "ldconfig -p 2>/dev/null"],
                                          capture_output=True, text=True).stdout)
        if found:
            link_dir = ROOT / "build" / "pycuda_libcuda"
            link_dir.mkdir(parents=True, exist_ok=True)
            link = link_dir / "libcuda.so"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(found[0])
            libdirs.append(str(link_dir))
    curand = (cuda_root / "include" / "curand.h").is_file()
    (src / "siteconf.py").write_text(
        f"CUDA_ROOT = {str(cuda_root)!r}\n"
        f"CUDA_INC_DIR = [{str(cuda_root / 'include')!r}]\n"
        f"CUDA_ENABLE_CURAND = {curand}\n"
        "CUDA_ENABLE_GL = False\n"
        "USE_SHIPPED_BOOST = True\n"
        f"CUDADRV_LIB_DIR = {libdirs!r}\n"
        "CUDADRV_LIBNAME = ['cuda']\n"
        f"CUDART_LIB_DIR = {libdirs!r}\n"
        "CUDART_LIBNAME = ['cudart']\n"
    )
    jobs = str(os.cpu_count() or 4)
    log(f"  building {src.name} with {jobs} jobs (CUDA_ROOT={cuda_root}, curand={curand})")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j", jobs],
                       cwd=src, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"PyCUDA build failed:\n{(r.stdout + r.stderr)[-6000:]}")
    dt = time.perf_counter() - t0
    sys.path.insert(0, str(src))
    sys.path.insert(0, str(site))
    import importlib

    importlib.invalidate_caches()
    import pycuda.driver  # noqa: F401,F811

    return dt


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


def time_shape(rt: Any, drv: Any, shape_name: str, shape: dict[str, int], pipelines: list[str],
               peak: float | None, copy_bw: float, rng: np.random.Generator,
               args: argparse.Namespace) -> list[dict[str, Any]]:
    """Time the grouped FFN (gate/up, down, combine) of one model's expert shape at every
    TIMING_TOKENS count: fp16 with each GEMM pipeline, int4-g128; each run first compared with
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
        seen = [tuple(m.astype(np.float64) for m in ref.unpack_expert(base_pool[o:], lay))
                for o in base_off]
        log(f"     {fmt}: pool of {n_exp * sb / 2**30:.2f} GiB ready in "
            f"{time.perf_counter() - t0:.1f} s")
        for n_tokens in TIMING_TOKENS:
            x16 = rng.standard_normal((n_tokens, d), dtype=np.float32).astype(np.float16)
            logits = rng.standard_normal((n_tokens, n_exp), dtype=np.float32)
            r = rt.route(logits, k, "softmax", None, True, 1.0)
            h = r.to_host()
            ws = rt.workspace(r, lay)
            x_gpu = rt.to_gpu(x16)
            flops = 6.0 * d * f * n_tokens * k
            wbytes = int((h["counts"] > 0).sum()) * 3 * lay.matrix_bytes
            t_bound = max(flops / (peak * 1e12) if peak else 0.0, wbytes / (copy_bw * 1e9))
            want = None
            if n_tokens <= shape["check"]:
                want = ref.moe_ffn_reference(x16, [seen[e % n_distinct] for e in range(n_exp)],
                                             h["topk_ids"], h["topk_w"], "silu")
            first = None
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
                same = None
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
                row = {"shape": shape_name, "fmt": fmt, "pipeline": pipe, "tokens": n_tokens,
                       "tile": r.tile, "ms": t * 1e3, "tflops": tf,
                       "frac_matmul": tf / peak if peak else None,
                       "frac_roofline": t_bound / t, "roofline_tflops": flops / t_bound / 1e12,
                       "weight_gbs": wbytes / t / 1e9, "frac_copy_bw": wbytes / t / 1e9 / copy_bw,
                       "rel_err": err, "bit_identical_to_cp": same}
                if fmt == "f16" and pipe == pipelines[0]:
                    # the same logits: re-routing rewrites r with what it already holds
                    lg_gpu = rt.to_gpu(logits)
                    row["route_ms"] = 1e3 * cuda_event_median(
                        drv, lambda lg=lg_gpu, r=r: rt.route_launch(lg, r, 0, None, True, 1.0,
                                                                    None), min(20, runs))
                    tp = torch_loop_peer(h, d, f, n_exp, max(5, runs // 4))
                    row["torch_loop_ms"] = tp * 1e3 if tp else None
                    row["vs_torch_loop"] = tp / t if tp else None
                rows.append(row)
                frac = f"{row['frac_matmul']:.0%} of matmul, " if peak else ""
                peer = (f", torch loop {row['torch_loop_ms']:.3f} ms ({row['vs_torch_loop']:.1f}x)"
                        if row.get("vs_torch_loop") else "")
                route = f" (route {row['route_ms']:.3f} ms)" if row.get("route_ms") else ""
                log(f"     {fmt:9s} [{pipe:4s}] T={n_tokens:5d} tile={r.tile:2d}: "
                    f"{row['ms']:.3f} ms{route}, {tf:.1f} TFLOP/s = {frac}"
                    f"{row['frac_roofline']:.0%} of roofline ({row['roofline_tflops']:.0f}), "
                    f"weights {row['weight_gbs']:.0f} GB/s = {row['frac_copy_bw']:.0%} of copy bw"
                    f"{peer}; err {err:.1e}{'' if same is None else f', same as cp: {same}'}")
        pool_dev.free()
    return rows


def report_target(timings: list[dict[str, Any]], peak: float | None) -> dict[str, Any]:
    """The issue's target: fp16 at TARGET_TOKENS tokens >= TARGET_FRAC of the fp16 matmul
    rate, for each timed shape with the best pipeline; and whether the roofline allows it (a
    shape whose weight reads alone take longer than TARGET_FRAC of the matmul rate allows
    cannot reach it, whatever the kernel)."""
    out: dict[str, Any] = {}
    if not peak:
        log("== target: no fp16 matmul peer measured, the fraction cannot be stated")
        return out
    for shape_name in TIMING_SHAPES:
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


def gpu_main(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    log("== PyCUDA")
    build_s = ensure_pycuda()
    RESULTS["pycuda_build_s"] = build_s
    log(f"  {'already importable' if build_s is None else f'built in {build_s:.1f} s'}")
    import pycuda.driver as drv

    import colibri.cuda as cuda

    reason = cuda.unavailable_reason()
    if reason:
        raise SystemExit(f"CUDA unusable: {reason}")
    log("== compile")
    t0 = time.perf_counter()
    cache = ROOT / "build" / "cuda_cache"
    os.environ["COLIBRI_CUDA_CACHE"] = str(cache)
    rt = cuda.CudaRuntime(0, cache_dir=cache)
    RESULTS.update(device=rt.name, arch=rt.arch, compile_s=time.perf_counter() - t0)
    log(f"  {rt.name} ({rt.arch}): kernels compiled and loaded in {RESULTS['compile_s']:.1f} s")
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))

    log("== routing vs reference")

    def route_fn(logits, k, gating, bias, renorm, scale, tile):
        n_exp = logits.shape[1]
        slot = np.arange(n_exp, dtype=np.int64) * 1024
        r = rt.route(logits, k, gating, bias, renorm, scale, tile, slot_offset=slot)
        h = r.to_host()
        if not np.array_equal(h["sel_offset"], h["topk_ids"].astype(np.int64) * 1024):
            raise AssertionError("sel_offset differs from the slot table")
        return h

    check_routing(route_fn, rng)

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
    RESULTS.update(gemm_pipeline=rt.gemm_pipeline, pipelines=pipelines)
    log(f"  fp16 GEMM pipelines: {pipelines} (default {rt.gemm_pipeline}); int4: regs")
    RESULTS["ffn"] = check_ffn(ffn_for(pipelines[0]), rng, FFN_CASES, f" [{pipelines[0]}]")
    for pipe in pipelines[1:]:
        RESULTS["ffn"] += check_ffn(ffn_for(pipe), rng, [c for c in FFN_CASES if c[0] == "f16"],
                                    f" [{pipe}]")

    log("== peers")
    peak, peer = measure_matmul_peer()
    RESULTS.update(matmul_tflops=peak, matmul_peer=peer)
    log(f"  fp16 matmul: {f'{peak:.1f} TFLOP/s' if peak else 'n/a'} ({peer})")
    nbytes = 1 << (26 if args.small else 30)
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
    copy_bw = 2 * nbytes / float(np.median(copies)) / 1e9  # read + write
    src.free()
    dst.free()
    RESULTS["copy_gbs"] = copy_bw
    log(f"  device copy: {copy_bw:.0f} GB/s (read + write)")

    log("== timing (median of CUDA-event runs after warm-up)")
    timings = []
    for shape_name, shape in TIMING_SHAPES.items():
        timings += time_shape(rt, drv, shape_name, shape, pipelines, peak, copy_bw, rng, args)
    RESULTS["timings"] = timings

    log("== staged expert path vs the whole pool (pinned expert store slots)")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        RESULTS["staged"] = staged_check(rt, rng, Path(tmp), args.small)
    RESULTS["small_shapes"] = args.small
    RESULTS["target"] = report_target(timings, peak)
    RESULTS["total_s"] = time.perf_counter() - t_start
    log(f"== all checks passed in {RESULTS['total_s']:.0f} s")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-only", action="store_true", help="self-check the CPU reference path, no GPU")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per size (after warm-up)")
    ap.add_argument("--small", action="store_true",
                    help="small shapes everywhere (a quick smoke run; not the reported figures)")
    args = ap.parse_args()
    if args.small:
        global TIMING_SHAPES, TIMING_TOKENS, FFN_CASES
        TIMING_SHAPES = {"small": {"hidden": 256, "ffn": 128, "experts": 16, "k": 4,
                                   "check": 64, "distinct": 4}}
        TIMING_TOKENS = (1, 16, 64)
        FFN_CASES = FFN_CASES_CPU
    try:
        rc = cpu_only() if args.cpu_only else gpu_main(args)
    finally:
        out = os.environ.get("OUT")
        if out:
            Path(out, "cuda_check.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
