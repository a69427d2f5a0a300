"""Requests their callers abandon end: a Request dropped unfinished (a `for` loop left with
break), the asyncio task reading one cancelled, an async generator over one closed; and a
request cancelled while it still waits for a place ends at once, never prefilled.

Every wait polls a condition under a generous deadline (no sleep that must be long enough)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import pytest

import colibri
from colibri.engine import Engine
from colibri.generate import stop_token_ids

LONG = 1500  # max_tokens of a request that would run for seconds if nothing stopped it


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from colibri.tools.make_bench_model import write

    path = write(str(tmp_path_factory.mktemp("cancel") / "tiny.gguf"), n_layers=2, shape="tiny")
    with colibri.Model(str(path), ctx=2048, verbose=False) as m:
        yield m


def no_eog(m: colibri.Model) -> dict[int, float]:
    """A logit bias that keeps a request from ending on an end-of-generation token."""
    return {int(t): float("-inf") for t in stop_token_ids(m)}


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def idle(eng: Engine) -> bool:
    """Nothing running or waiting, and every request has ended."""
    st = eng.stats()
    return st["running"] == 0 and st["waiting"] == 0 and all(
        r["finish_reason"] is not None for r in st["requests"].values())


def only_request(eng: Engine) -> dict:
    reqs = eng.stats()["requests"]
    assert len(reqs) == 1
    return next(iter(reqs.values()))


def test_a_request_dropped_by_its_caller_is_cancelled(tiny):
    with Engine(tiny, max_seqs=1, prefix_cache=False) as eng:
        for d in eng.submit("The history of Rome", max_tokens=LONG, temperature=0,
                            logit_bias=no_eog(tiny)):
            assert d.token_ids
            break  # the Request is unreachable now
        wait_until(lambda: idle(eng), "the dropped request to stop")
        st = only_request(eng)
        assert st["finish_reason"] == "cancelled"
        assert 1 <= st["generated_tokens"] < LONG // 10
        # its place is free: the next request runs (max_seqs=1)
        nxt = eng.submit("Another one", max_tokens=3, temperature=0, logit_bias=no_eog(tiny))
        assert len(nxt.text()) > 0 and nxt.finish_reason == "length"


def test_a_request_dropped_while_it_waits_never_runs(tiny):
    with Engine(tiny, max_seqs=1, prefix_cache=False) as eng:
        a = eng.submit("The history of Rome", max_tokens=LONG, temperature=0,
                       logit_bias=no_eog(tiny))
        next(a)  # a holds the only place
        eng.submit("never read " * 5, max_tokens=LONG)  # dropped at once: queued, unread
        gc.collect()
        rid = max(eng.stats()["requests"])
        wait_until(lambda: eng.stats()["requests"][rid]["finish_reason"] is not None,
                   "the dropped queued request to end")
        st = eng.stats()["requests"][rid]
        assert st["finish_reason"] == "cancelled" and st["generated_tokens"] == 0
        assert st["ttft_s"] is None
        assert not a.finished  # it ended while a still ran
        a.cancel()
        assert list(a)[-1].finish_reason == "cancelled"


def test_cancelling_the_task_that_reads_a_request_cancels_it(tiny):
    async def main(eng: Engine) -> None:
        # the test keeps its own reference: the cancellation must come from the task's
        req = eng.submit_async("The history of Rome", max_tokens=LONG, temperature=0,
                               logit_bias=no_eog(tiny))
        first = asyncio.Event()

        async def reader() -> None:
            async for _ in req:
                first.set()

        task = asyncio.create_task(reader())
        await asyncio.wait_for(first.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 60
        while not req.finished:
            assert time.monotonic() < deadline, "the request went on after its task ended"
            await asyncio.sleep(0.005)
        assert req.finish_reason == "cancelled"
        assert req.generated_tokens < LONG // 10

    with Engine(tiny, max_seqs=1, prefix_cache=False) as eng:
        asyncio.run(main(eng))
        wait_until(lambda: idle(eng), "the engine to go idle")


def test_closing_an_async_generator_over_a_request_cancels_it(tiny):
    async def main(eng: Engine) -> None:
        async def pieces():
            async for d in eng.submit_async("The history of Rome", max_tokens=LONG,
                                            temperature=0, logit_bias=no_eog(tiny)):
                yield d.text

        gen = pieces()
        await gen.__anext__()
        await gen.aclose()

    with Engine(tiny, max_seqs=1, prefix_cache=False) as eng:
        asyncio.run(main(eng))
        wait_until(lambda: idle(eng), "the abandoned request to stop")
        st = only_request(eng)
        assert st["finish_reason"] == "cancelled" and st["generated_tokens"] < LONG // 10


def test_a_queued_request_cancelled_ends_at_once_and_is_never_prefilled(tiny):
    with Engine(tiny, max_seqs=1, prefix_cache=False) as eng:
        a = eng.submit("The history of Rome", max_tokens=LONG, temperature=0,
                       logit_bias=no_eog(tiny))
        next(a)  # a is decoding and holds the only place
        b = eng.submit("a queued prompt " * 9, max_tokens=50, temperature=0)
        b.cancel()
        # at once: no engine step in between (a is still running)
        assert b.finished and b.finish_reason == "cancelled"
        deltas = list(b)
        assert len(deltas) == 1 and deltas[0].token_ids == []
        assert not a.finished
        a.cancel()
        assert list(a)[-1].finish_reason == "cancelled"
        c = eng.submit("Another one", max_tokens=4, temperature=0, logit_bias=no_eog(tiny))
        assert c.text() and c.finish_reason == "length"
        wait_until(lambda: idle(eng), "the engine to go idle")
        st = eng.stats()
        # every token the engine evaluated was a's or c's: b's prompt never ran
        evaluated = round(st["steps"] * st["tokens_per_step"])
        assert evaluated == sum(r.prompt_tokens + r.generated_tokens - 1 for r in (a, c))
        assert b.stats()["generated_tokens"] == 0 and b.stats()["ttft_s"] is None
        assert b.prompt_tokens > 20  # (a prompt whose prefill would show in the count)
