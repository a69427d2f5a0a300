"""colibri.Engine on the tiny oracle model of each architecture whose attention or MoE has a
kind of its own (issues 46-48): MLA (deepseek_v3), sinks and biased experts (gpt_oss), chunked
attention and input-weighted experts (llama4), sigmoid routing with a bias (glm4moe), granite's
multipliers, a dense first layer (ernie4_5_moe), linear attention with a recurrent state
(qwen3next, whose prefix reuse restores the state as of the end of the prefix). Requests batched together (chunked prefill
mixed with decode) give each one's single-run greedy tokens, as test_engine.py shows on the
tiny MoE and Gemma."""

from __future__ import annotations

import pytest
from engine_util import greedy_alone
from oracle_models import build
from oracle_models import prompt as ids_prompt

import colibri
from colibri.engine import Engine

FAMILIES = ["deepseek_v3", "gpt_oss", "llama4", "glm4moe", "granitemoe", "ernie4_5_moe",
            "qwen3next"]


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


def run_logprobs(eng: Engine, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    deltas = list(eng.submit(ids, max_tokens=n, temperature=0, logprobs=0))
    return ([t for d in deltas for t in d.token_ids],
            [lp.logprob for d in deltas for lp in (d.logprobs or [])])


@pytest.fixture(scope="module")
def q3n_path(tmp_path_factory):
    return str(build("qwen3next", tmp_path_factory.mktemp("q3n"), ("f32",))[1]["f32"])


def test_qwen3next_prefix_reuse_restores_the_state(q3n_path):
    """The state is kept where A's prefill chunks end (16 tokens each here; they end on
    16-token blocks, and none passes the last block before the prompt's last token): request B
    sharing 45 tokens with A starts from A's state after 32 tokens and gives B's cold run's
    tokens and logprobs bit for bit; C, A's whole run and more, starts from the state A ended
    with; D, sharing 50 with A in an engine of the default (whole-prompt) chunks, from A's
    state after 48 (the last block before A's last prompt token)."""
    p = ids_prompt(50, seed=70)
    ia, ib = p + ids_prompt(3, seed=71), p[:45] + ids_prompt(9, seed=72)
    idd = p + ids_prompt(4, seed=74)
    with colibri.Model(q3n_path, ctx=512) as m:
        with Engine(m, prefix_cache=False) as eng:
            cold_b, cold_d = run_logprobs(eng, ib, 10), run_logprobs(eng, idd, 10)
        with Engine(m, prefill_chunk=16) as eng:
            out_a = run_logprobs(eng, ia, 10)[0]
            assert run_logprobs(eng, ib, 10) == cold_b
            pc = eng.stats()["prefix_cache"]
            assert (pc["hits"], pc["tokens_saved"]) == (1, 32)
            ic = ia + out_a + ids_prompt(5, seed=73)
            warm_c = run_logprobs(eng, ic, 6)
            assert eng.stats()["prefix_cache"]["tokens_saved"] == 32 + len(ia) + len(out_a) - 1
        with Engine(m, prefix_cache=False) as eng:
            assert run_logprobs(eng, ic, 6) == warm_c
        with Engine(m) as eng:
            run_logprobs(eng, ia, 10)
            assert run_logprobs(eng, idd, 10) == cold_d
            assert eng.stats()["prefix_cache"]["tokens_saved"] == 48
