"""Request.cached_tokens: the prompt tokens of a request whose KV the engine copied from its
prefix cache instead of prefilling them (what colibri serve reports as OpenAI's
usage.prompt_tokens_details.cached_tokens), on the tiny random MoE model."""

from __future__ import annotations

import pytest

import colibri
from colibri.engine import Engine, Request


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("cached") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))


def run(eng: Engine, ids: list[int], **kw) -> Request:
    r = eng.submit(ids, temperature=0, **kw)
    deltas = list(r)
    assert deltas[-1].finish_reason in ("stop", "length"), deltas[-1]
    return r


def test_repeated_prompt_reports_the_reused_prefix(tiny_path):
    with colibri.Model(tiny_path, ctx=1024, verbose=False) as m:
        shared = [(7 * i) % 1500 + 300 for i in range(70)]  # 70 tokens: 4 blocks and 6
        a, b = shared + [11, 12, 13], shared + [21]
        with Engine(m) as eng:
            first = run(eng, a, max_tokens=4)
            assert first.cached_tokens == 0  # nothing to reuse yet
            assert eng.stats()["prefix_cache"]["tokens_saved"] == 0
            again = run(eng, a, max_tokens=4)
            # all but the last prompt token (its logits are needed) came from the cache
            saved = eng.stats()["prefix_cache"]["tokens_saved"]
            assert again.cached_tokens == len(a) - 1 == saved
            assert again.stats()["cached_tokens"] == again.cached_tokens
            other = run(eng, b, max_tokens=4)
            # the prefix it shares with the cached ones, exactly as the engine reused it
            assert other.cached_tokens == len(shared)
            assert eng.stats()["prefix_cache"]["tokens_saved"] - saved == len(shared)
        with Engine(m, prefix_cache=False) as eng:
            run(eng, a, max_tokens=4)
            assert run(eng, a, max_tokens=4).cached_tokens == 0


def test_cached_tokens_never_exceed_the_prompt_after_preemption(tiny_path):
    """Identical greedy requests on a small cache are preempted; one admitted again copies a
    running twin's KV, prompt and output: only its prompt tokens count as cached."""
    with colibri.Model(tiny_path, ctx=256, verbose=False) as m:
        ids = m.tokenize("the roads and aqueducts of the west")
        assert 20 < len(ids) < 60
        with Engine(m, max_seqs=12, prefill_chunk=64) as eng:
            reqs = [eng.submit(ids, max_tokens=180, temperature=0,
                               logit_bias={2046: -100.0, 2047: -100.0}) for _ in range(12)]
            outs = [[t for d in r for t in d.token_ids] for r in reqs]
            st = eng.stats()
        assert st["preemptions"] > 0
        assert all(o == outs[0] for o in outs) and len(outs[0]) == 180
        cached = [r.cached_tokens for r in reqs]
        assert all(0 <= c <= len(ids) for c in cached), cached
        assert max(cached) == len(ids)  # a preempted one reused its twin's prompt and more
