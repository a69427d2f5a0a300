"""colibri.Engine on the tiny oracle model of each architecture whose attention or MoE has a
kind of its own (issues 46-48): MLA (deepseek_v3), sinks and biased experts (gpt_oss), chunked
attention and input-weighted experts (llama4), sigmoid routing with a bias (glm4moe), granite's
multipliers, a dense first layer (ernie4_5_moe). Requests batched together (chunked prefill
mixed with decode) give each one's single-run greedy tokens, as test_engine.py shows on the
tiny MoE and Gemma."""

from __future__ import annotations

import pytest
from engine_util import greedy_alone
from oracle_models import build
from oracle_models import prompt as ids_prompt

import colibri
from colibri.engine import Engine

FAMILIES = ["deepseek_v3", "gpt_oss", "llama4", "glm4moe", "granitemoe", "ernie4_5_moe"]


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
            assert ids == greedy_alone(m, p, 12), family
