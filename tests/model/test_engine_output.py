"""The engine's output side with tokens chosen by the test (a constraint that allows one token
at each position, as colibri serve's grammars use the hook): usage figures on answers ended by
an end-of-generation token, a stop token id, a stop string, max_tokens and the context; stop
strings split across tokens at every character; the finish delta always last; logprobs from the
model's own logits (a single-sequence log-softmax as the reference); KV returned."""

from __future__ import annotations

import numpy as np
import pytest

import colibri
from colibri.engine import Engine
from colibri.generate import stop_token_ids

PROMPT = "the roman empire had many roads"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from colibri.tools.make_bench_model import write

    path = str(write(str(tmp_path_factory.mktemp("output") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))
    with colibri.Model(path, ctx=256, verbose=False) as m:
        yield m


@pytest.fixture(scope="module")
def eng(tiny):
    with Engine(tiny, prefix_cache=False) as e:
        yield e


class Script:
    """Allows exactly the next token of `seq` (never finished: the script's end is the
    request's business)."""

    def __init__(self, seq: list[int]) -> None:
        self.seq, self.i = seq, 0

    def mask(self, logits: np.ndarray) -> np.ndarray:
        out = np.full_like(logits, -np.inf)
        t = self.seq[min(self.i, len(self.seq) - 1)]
        out[t] = logits[t]
        return out

    def advance(self, tid: int) -> None:
        self.i += 1

    def finished(self) -> bool:
        return False


def words(m: colibri.Model, text: str) -> list[int]:
    """Token ids of text without special tokens, each decoding to whole characters."""
    ids = m.tokenize(text, add_special=False)
    assert m.detokenize(ids) == text
    return ids


def run(eng: Engine, seq: list[int], **kw):
    r = eng.submit(PROMPT, temperature=0, constraint=Script(seq), **kw)
    deltas = list(r)
    return r, deltas


def check_shape(deltas) -> None:
    """One finish delta, the last; every other delta adds exactly one token."""
    assert [d.finish_reason is not None for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert all(len(d.token_ids) == 1 for d in deltas[:-1])


def test_usage_of_an_answer_ended_by_an_end_of_generation_token(tiny, eng):
    eog = min(stop_token_ids(tiny))
    body = words(tiny, " aqueducts and laws")
    r, deltas = run(eng, [*body, eog, *body], max_tokens=50)
    check_shape(deltas)
    assert deltas[-1].finish_reason == "stop" and deltas[-1].token_ids == []
    assert [t for d in deltas for t in d.token_ids] == body  # the EOG id is not output
    assert "".join(d.text for d in deltas) == " aqueducts and laws"
    st = r.stats()
    assert (st["prompt_tokens"], st["generated_tokens"]) == (len(tiny.tokenize(PROMPT)),
                                                             len(body))
    assert r.finish_reason == "stop" and len(st["itl_s"]) == len(body)


def test_usage_of_an_answer_ended_by_a_stop_token_id(tiny, eng):
    body = words(tiny, " roads and wars")
    r, deltas = run(eng, body, max_tokens=50, stop_token_ids=[body[2]])
    check_shape(deltas)
    assert [t for d in deltas for t in d.token_ids] == body[:2]
    assert r.stats()["generated_tokens"] == 2 and r.finish_reason == "stop"


@pytest.mark.parametrize("n", [1, 2, 5])
def test_usage_of_an_answer_cut_by_max_tokens(tiny, eng, n):
    body = words(tiny, " the long decline of the western provinces")
    r, deltas = run(eng, body, max_tokens=n)
    check_shape(deltas)
    assert deltas[-1].finish_reason == "length" and len(deltas[-1].token_ids) == 1
    assert [t for d in deltas for t in d.token_ids] == body[:n]
    assert r.stats()["generated_tokens"] == n


def test_an_answer_cut_by_the_context(tiny, eng):
    body = words(tiny, " roads")
    n_prompt = len(tiny.tokenize(PROMPT))
    r, deltas = run(eng, body * 300, max_tokens=1000)
    check_shape(deltas)
    assert deltas[-1].finish_reason == "length"
    # the context holds the prompt and every token but the last sampled one
    assert r.stats()["generated_tokens"] == tiny.ctx - n_prompt + 1


def test_stop_strings_split_across_tokens_at_every_character(tiny, eng):
    text = " aqueducts and laws"
    body = words(tiny, text)
    for k in range(1, len(text)):
        for stop in (text[k:k + 3], text[k - 1:k + 1]):
            r, deltas = run(eng, [*body, *body], max_tokens=2 * len(body), stop=[stop, "zzz"])
            check_shape(deltas)
            out = "".join(d.text for d in deltas)
            assert out == text[:text.index(stop)], (k, stop)
            assert r.finish_reason == "stop"
            # the tokens counted are those sampled up to the one completing the stop string
            n = next(i for i in range(1, len(body) + 1)
                     if stop in tiny.detokenize(body[:i]))
            assert r.stats()["generated_tokens"] == n
            assert [t for d in deltas for t in d.token_ids] == body[:n]


def test_a_stop_string_that_only_starts_at_the_end_is_released(tiny, eng):
    text = " aqueducts and laws"
    body = words(tiny, text)
    r, deltas = run(eng, body, max_tokens=len(body), stop=["laws and", "s!"])
    assert "".join(d.text for d in deltas) == text and r.finish_reason == "length"


def test_logprobs_are_the_model_log_softmax(tiny, eng):
    body = words(tiny, " aqueducts and laws")
    r, deltas = run(eng, body, max_tokens=len(body), logprobs=3)
    lps = [lp for d in deltas for lp in d.logprobs or []]
    assert [lp.token_id for lp in lps] == body
    ids = tiny.tokenize(PROMPT)
    s = tiny.new_sequence()
    try:
        rows = [tiny.eval([s], ids, logits=[False] * (len(ids) - 1) + [True])[-1]]
        for t in body[:-1]:
            rows.append(tiny.eval([s], [t])[-1])
    finally:
        tiny.free_sequence(s)
    for lp, row in zip(lps, rows, strict=True):
        x = np.asarray(row, np.float64)
        ls = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        assert lp.logprob == pytest.approx(ls[lp.token_id], abs=1e-9)
        top = sorted(range(x.size), key=lambda i: (-x[i], i))[:3]
        assert [t for t, _ in lp.top] == top
        assert [v for _, v in lp.top] == pytest.approx([ls[t] for t in top], abs=1e-9)
    r0, d0 = run(eng, body, max_tokens=2, logprobs=0)
    assert [lp.top for d in d0 for lp in d.logprobs or []] == [[], []]
    r1, d1 = run(eng, body, max_tokens=2)
    assert all(d.logprobs is None for d in d1)


def test_every_answer_returns_its_kv(tiny):
    body = words(tiny, " aqueducts and laws")
    with Engine(tiny, prefix_cache=False) as e:
        base = e.stats()["kv"]["used"]
        for kw in (dict(max_tokens=2), dict(max_tokens=50, stop=["and"]),
                   dict(max_tokens=50, stop_token_ids=[body[1]])):
            run(e, body, **kw)
            assert e.stats()["kv"]["used"] == base
        st = e.stats()
        assert (st["running"], st["waiting"]) == (0, 0)
