"""colibri.Engine on the tiny oracle model of each architecture whose attention or MoE has a
kind of its own (issues 46-48): MLA (deepseek_v3), sinks and biased experts (gpt_oss), chunked
attention and input-weighted experts (llama4), sigmoid routing with a bias (glm4moe), granite's
multipliers, a dense first layer (ernie4_5_moe). Requests batched together (chunked prefill
mixed with decode) give each one's single-run greedy tokens, as test_engine.py shows on the
tiny MoE and Gemma."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_models import build
from oracle_models import prompt as ids_prompt

import colibri
from colibri.engine import Engine
from colibri.generate import stop_token_ids

FAMILIES = ["deepseek_v3", "gpt_oss", "llama4", "glm4moe", "granitemoe", "ernie4_5_moe"]


def single_run(m: colibri.Model, ids: list[int], n: int) -> list[int]:
    """Model.generate's greedy path on one sequence, up to an end-of-generation id."""
    stops = stop_token_ids(m)
    s = m.new_sequence()
    try:
        lg = m.eval([s], ids, logits=[False] * (len(ids) - 1) + [True])[-1]
        out: list[int] = []
        for _ in range(n):
            t = int(np.argmax(lg))
            if t in stops:
                break
            out.append(t)
            lg = m.eval([s], [t])[-1]
        return out
    finally:
        m.free_sequence(s)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_concurrent_greedy_equals_single_runs(family, tmp_path):
    _, paths = build(family, tmp_path, ("f32",))
    with colibri.Model(str(paths["f32"]), ctx=512) as m:
        prompts = [ids_prompt(3 + 5 * i, seed=50 + i) for i in range(8)]
        with Engine(m, max_seqs=8, prefill_chunk=8) as eng:
            reqs = [eng.submit(p, max_tokens=12, temperature=0) for p in prompts]
            results = [[t for d in r for t in d.token_ids] for r in reqs]
            assert eng.stats()["tokens_per_step"] > 2  # really batched
        for p, ids in zip(prompts, results, strict=True):
            assert ids == single_run(m, p, 12), family
