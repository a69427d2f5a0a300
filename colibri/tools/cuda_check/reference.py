"""The CUDA check's reference side: random inputs (router logits without near-ties, expert
pools), a NumPy emulation of the kernels' data flow (router output layout, padded tiles, byte
offsets in the pool, fp16 rounding of h, the ordered combine), and the routing and grouped-FFN
checks against the float64 references of colibri._cuda_ref, which the GPU run applies to the
device and `cpu_only` to the emulation."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from colibri import _cuda_ref as ref
from colibri._cuda_ref import ExpertLayout

FFN_REL_BOUND = 5e-3
ROUTE_W_RTOL = 2e-5


def log(msg: str) -> None:
    print(msg, flush=True)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(float(np.linalg.norm(b)), 1e-30))


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


def make_experts(rng: np.random.Generator, n: int, d: int,
                 f: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
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


def check_batch_invariance(rt: Any, fmt: str, n_tokens: int = 70) -> None:
    """The grouped expert GEMM on runtime rt: the 16- and 64-row tiles, and a token alone against
    the same token among n_tokens, must give the same bits (an output row is one token's experts,
    multiplied in the same slice order and combined in a fixed order: batch invariance).
    Raises AssertionError naming what differs."""
    rng = np.random.default_rng(5)
    d, f, n_exp, k = 128, 256, 6, 2
    lay = ExpertLayout(d, f, fmt)
    experts = [(rng.normal(0, d**-0.5, (f, d)), rng.normal(0, d**-0.5, (f, d)),
                rng.normal(0, f**-0.5, (d, f))) for _ in range(n_exp)]
    pool, offsets = ref.build_pool(experts, lay)
    dp = rt.upload_pool(pool, offsets, lay)
    x = rng.normal(size=(n_tokens, d)).astype(np.float16)
    lg = separated_logits(rng, n_tokens, n_exp)
    outs = {tile: rt.moe_ffn(x, dp, rt.route(lg, k, tile=tile), "silu") for tile in (16, 64)}
    assert np.isfinite(outs[16]).all(), "non-finite expert outputs"
    assert np.array_equal(outs[16].view(np.uint32), outs[64].view(np.uint32)), \
        f"{fmt}: the 16- and 64-row tiles differ"
    for i in (0, n_tokens // 2, n_tokens - 1):
        alone = rt.moe_ffn(x[i:i + 1], dp, rt.route(lg[i:i + 1], k, tile=16), "silu")
        assert np.array_equal(alone[0].view(np.uint32), outs[64][i].view(np.uint32)), \
            f"{fmt}: token {i} alone differs from the same token in a batch of {n_tokens}"


def cpu_only(results: dict[str, Any]) -> int:
    """Steps 3-4 on the NumPy emulation of the kernels (no GPU); fills results["ffn"]."""
    rng = np.random.default_rng(int(time.time()))
    log("== routing (NumPy emulation of cb_route_topk)")

    def route_fn(logits, k, gating, bias, renorm, scale, tile):
        return emulate_route(logits, k, gating, bias, renorm, scale, tile)

    check_routing(route_fn, rng)
    log("== grouped expert FFN (NumPy emulation of the kernels' data flow)")

    def ffn_fn(x16, pool, offsets, lay, logits, k, act, tile):
        g = emulate_route(logits, k, "softmax", None, True, 1.0, tile)
        return emulate_moe_ffn(x16, pool, offsets, lay, g, k, act), g

    results["ffn"] = check_ffn(ffn_fn, rng, FFN_CASES_CPU)
    log("cpu-only self-check passed (no GPU used)")
    return 0

