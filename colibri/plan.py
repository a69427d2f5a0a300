"""`colibri plan`: how a model would be laid out in this machine's memory.

Dense weights and the KV cache stay resident; routed experts are staged by the expert store
(colibri.model, experts.h). The plan reads the (validated) GGUF, sizes both parts, and picks an
expert budget: everything when dense + KV + experts fit in 85% of the memory available now,
else what is left of that after dense + KV, never less than the experts one layer can need in
one batch (min_expert_slots). The projected peak is dense + KV + the expert budget + the
scratch of one batch (a rough bound, stated as such).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from colibri.arch import ModelDesc, open_model
from colibri.meminfo import mem_available
from colibri.model import min_expert_slots

HEADROOM = 0.85


def _size(n: int) -> str:
    return f"{n / 2**30:8.2f} GiB" if n >= 2**30 else f"{n / 2**20:8.1f} MiB"


@dataclass
class Plan:
    path: str
    dense_bytes: int
    expert_bytes: int
    kv_bytes: int
    scratch_bytes: int
    available_bytes: int
    mode: str
    budget_bytes: int
    min_budget_bytes: int
    per_expert_bytes: int = 0
    usage: Any = None  # the expert usage record (colibri.usage), when there is one
    state_bytes: int = 0  # recurrent state of one sequence (linear attention layers)

    def usage_hit_share(self) -> float | None:
        """The share of the recorded routings that the hottest experts fitting the budget
        carried (None without a record or experts)."""
        if self.usage is None or not self.per_expert_bytes:
            return None
        from colibri.usage import hit_share

        return hit_share(self.usage, self.budget_bytes // self.per_expert_bytes)

    @property
    def peak_bytes(self) -> int:
        return (self.dense_bytes + self.kv_bytes + self.state_bytes + self.budget_bytes
                + self.scratch_bytes)

    def lines(self) -> list[str]:
        share = self.budget_bytes / self.expert_bytes if self.expert_bytes else 1.0
        out = [
            f"model           {os.path.basename(self.path)}",
            f"dense weights   {_size(self.dense_bytes)} (resident)",
            f"routed experts  {_size(self.expert_bytes)}",
            f"KV cache        {_size(self.kv_bytes)}",
        ]
        if self.state_bytes:
            out.append(f"recurrent state {_size(self.state_bytes)} per sequence (linear attention)")
        out.append(f"available now   {_size(self.available_bytes)}")
        if self.expert_bytes:
            out += [
                f"expert mode     {self.mode}",
                f"expert budget   {_size(self.budget_bytes)} ({share * 100:.0f}% of the "
                f"experts; at least {_size(self.min_budget_bytes).strip()} for one batch)",
            ]
            hs = self.usage_hit_share()
            if hs is None:
                out.append("usage record    none yet (written when a run of this model closes)")
            else:
                out.append(f"usage record    {int(self.usage.sum())} routings; the hottest experts "
                           f"that fit the budget carried {hs * 100:.1f}% of them (the hit rate "
                           "of a cache holding those)")
        out.append(f"projected peak  {_size(self.peak_bytes)} (dense + KV + state + experts "
                   f"+ ~{self.scratch_bytes / 2**20:.0f} MiB scratch)")
        if self.available_bytes and self.peak_bytes > self.available_bytes:
            out.append("warning: the projected peak exceeds the memory available now")
        return out


def make_plan(path: str, ctx: int = 4096, max_batch: int = 512, kv_dtype: str = "f32",
              available: int | None = None, expert_budget: str | float | int | None = None
              ) -> Plan:
    """The plan for this machine's memory, or for expert_budget when given (a size, a
    fraction of the experts or "auto", as Model's)."""
    from colibri.model import parse_budget
    from colibri.usage import load_usage

    if expert_budget is not None and str(expert_budget).strip().lower() != "auto":
        parse_budget(expert_budget, 1)  # its syntax, checked for every model before opening one
    gf, d = open_model(path)
    try:
        pl = plan_for(path, d, ctx, max_batch, kv_dtype,
                      mem_available() if available is None else available)
    finally:
        gf.close()
    if pl.expert_bytes and expert_budget is not None and str(expert_budget).strip().lower() != "auto":
        nbytes = parse_budget(expert_budget, pl.expert_bytes)
        if nbytes is not None:
            pl.budget_bytes = max(pl.min_budget_bytes, min(nbytes, pl.expert_bytes))
            pl.mode = "mapped" if pl.budget_bytes >= pl.expert_bytes else "cache"
    if pl.expert_bytes:
        try:
            pl.usage = load_usage(path, (d.n_layer, max(L.n_expert for L in d.layers)))
        except OSError:
            pl.usage = None
    return pl


def plan_for(path: str, d: ModelDesc, ctx: int, max_batch: int, kv_dtype: str,
             available: int) -> Plan:
    dense, experts = d.dense_bytes(), d.expert_bytes()
    kv = max(ctx, 1) * d.kv_bytes_per_token(kv_dtype)
    state = d.state_bytes()
    ff = max([L.n_ff_exp for L in d.layers] + [L.ffn_gate.rows for L in d.layers
                                                 if L.ffn_gate is not None] + [1])
    scratch = max_batch * 4 * (4 * d.n_embd + 3 * ff + d.n_vocab) + (64 << 20)
    # the fused MoE layer's workspace (moe.c): per (token, expert) entry the gate/up rows in
    # float and the quantized activation rows
    k_ff = max([L.n_expert_used * L.n_ff_exp for L in d.layers if L.n_expert] + [0])
    k_e = max([L.n_expert_used for L in d.layers if L.n_expert] + [0]) * d.n_embd
    scratch += max_batch * (10 * k_ff + 2 * k_e)
    # MLA (forward_mla.c): the absorbed queries and the heads' latent outputs, n_head rows of
    # kv_lora + rope, and its three per-head buffers
    scratch += max([max_batch * 4 * d.n_head * (2 * (L.mla_kv_lora + L.rope_n_dims)
                                                + 3 * max(L.head_dim, L.mla_v_dim))
                    for L in d.layers if L.mla_kv_lora] + [0])
    # gated DeltaNet (forward_gdn.c): four rows of its conv channels a token
    scratch += max([max_batch * 16 * (2 * L.gdn_k_heads * L.gdn_head_k + L.gdn_v_heads * L.gdn_head_v)
                    for L in d.layers if L.gdn_v_heads] + [0])
    per_expert = experts // max(1, sum(L.n_expert for L in d.layers))
    min_budget = min_expert_slots(d, max_batch) * per_expert if experts else 0
    room = int(available * HEADROOM) - dense - kv - state - scratch if available else experts
    if not experts:
        mode, budget = "mapped", 0
    elif room >= experts:
        mode, budget = "mapped", experts
    else:
        mode, budget = "cache", max(min_budget, room)
    return Plan(path, dense, experts, kv, scratch, available, mode, budget, min_budget,
                per_expert, state_bytes=state)

