"""Engine.submit(constraint=...): a per-request grammar hook (mask before the sampler, advance
after each token, finished() ends the request), as colibri serve's structured output uses it.
The toy constraints here force token sequences chosen by the test; the real one (llguidance)
is tested in tests/serve/test_serve.py (structured output, tool calls)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_util import greedy_alone

import colibri
from colibri.engine import Engine


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from colibri.tools.make_bench_model import write

    path = str(write(str(tmp_path_factory.mktemp("constraint") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))
    with colibri.Model(path, ctx=1024, verbose=False) as m:
        yield m


class Forced:
    """Allows exactly one token at each position (the next of `seq`); finished after all."""

    def __init__(self, seq: list[int], fail_at: int | None = None) -> None:
        self.seq = seq
        self.i = 0
        self.fail_at = fail_at
        self.masks = 0
        self.seen: list[int] = []

    def mask(self, logits: np.ndarray) -> np.ndarray:
        self.masks += 1
        out = np.full_like(logits, -np.inf)
        out[self.seq[self.i]] = logits[self.seq[self.i]]
        return out

    def advance(self, tid: int) -> None:
        if self.fail_at is not None and self.i == self.fail_at:
            raise ValueError("token rejected by the grammar")
        assert tid == self.seq[self.i]
        self.seen.append(tid)
        self.i += 1

    def finished(self) -> bool:
        return self.i == len(self.seq)


def test_constraint_mask_is_honoured_and_ends_the_request(tiny):
    p = "the roman empire had many roads"
    ids = tiny.tokenize(p)
    ref = greedy_alone(tiny, ids, 12)
    # tokens greedy decoding would not pick: the mask, not the model, chose them
    forced = [t for t in range(300, 400) if t not in ref][:6]
    with Engine(tiny) as eng:
        c = Forced(forced)
        r = eng.submit(p, max_tokens=50, temperature=0, logprobs=2, constraint=c)
        free = eng.submit(p, max_tokens=12, temperature=0)  # unconstrained, in the same batches
        seeded = eng.submit(p, max_tokens=50, temperature=1.0, seed=7, top_k=0, top_p=1.0,
                            min_p=0.0, constraint=Forced(forced))
        deltas = list(r)
        got = [t for d in deltas for t in d.token_ids]
        assert got == forced == c.seen
        assert deltas[-1].finish_reason == "stop"  # finished() ended it, not max_tokens
        assert c.masks == len(forced)
        # logprobs are the model's (unmasked): the forced tokens are not the top choice
        lps = [lp for d in deltas for lp in (d.logprobs or [])]
        assert [lp.token_id for lp in lps] == forced
        assert all(lp.top[0][0] != lp.token_id and lp.logprob < lp.top[0][1] for lp in lps)
        assert [t for d in free for t in d.token_ids] == ref
        assert [t for d in seeded for t in d.token_ids] == forced
    with Engine(tiny, prefix_cache=False) as eng:
        base = eng.stats()["kv"]["used"]
        list(eng.submit(p, max_tokens=50, temperature=0, constraint=Forced(forced)))
        assert eng.stats()["kv"]["used"] == base


def test_constraint_failure_fails_only_its_request(tiny):
    p = "aqueducts and laws"
    with Engine(tiny) as eng:
        bad = eng.submit(p, max_tokens=20, temperature=0, constraint=Forced([300, 301, 302],
                                                                            fail_at=1))
        ok = eng.submit(p, max_tokens=5, temperature=0)
        deltas = list(bad)
        assert deltas[-1].finish_reason == "error" and "rejected" in (deltas[-1].error or "")
        assert list(ok)[-1].finish_reason in ("stop", "length")


def test_constraint_arguments_are_checked(tiny):
    with Engine(tiny) as eng:
        with pytest.raises(ValueError, match="constraint"):
            eng.submit("x", constraint=object())
        with pytest.raises(ValueError, match="constraint"):
            eng.submit_n("x", 2, constraint=Forced([300]))
