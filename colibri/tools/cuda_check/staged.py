"""Step 6 of the CUDA check: the staged expert path (colibri.cuda_moe with a device budget of a
few experts over a real expert store's pinned slot pool) against the whole pool, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from colibri import _cuda_ref as ref
from colibri.tools.cuda_check.reference import log, separated_logits


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
               exp_down_scale=None, experts=X, router_b=None, exp_gate_b=None,
               gdn_v_heads=0)
    desc: Any = NS(n_embd=d, gating=0, act=0, expert_renorm=True, expert_scale=1.0, expert_groups=0,
                   expert_weight_in=0, layers=[layer])
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
