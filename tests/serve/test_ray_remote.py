"""colibri.ray without a cluster: the remote engine (what the ingress submits to) on a fake
deployment handle (a replica that answers, one that dies before answering: retried on
another, one that dies mid-stream: an error naming it, a refusal, a cancel), the metrics
relabelling, the prefix router's choice and the autoscaling arithmetic."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from ray.exceptions import RayActorError  # the ray extra: a test dependency

from colibri.engine import Delta
from colibri.engine.prefix import PREFIX_BLOCK, _block_hashes
from colibri.ray import Final, Job, Refused, remote
from colibri.ray.hub import relabel
from colibri.ray.routing import PrefixRouter, desired_replicas


class FakeGen:
    def __init__(self, items: list, die_after: int | None) -> None:
        self.items, self.die_after, self.cancelled = items, die_after, False

    def __aiter__(self):
        return self._run()

    async def _run(self):
        for k, it in enumerate(self.items):
            if self.die_after is not None and k == self.die_after:
                raise RayActorError()
            await asyncio.sleep(0)
            yield it
        if self.die_after is not None and self.die_after >= len(self.items):
            raise RayActorError()

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """A deployment handle whose k-th call streams plans[k] (items, die_after)."""

    def __init__(self, plans: list[tuple[list, int | None]]) -> None:
        self.plans, self.calls, self.gens = plans, [], []

    def options(self, stream: bool) -> FakeHandle:
        assert stream
        return self

    @property
    def generate(self) -> SimpleNamespace:
        def call(job: Job) -> FakeGen:
            self.calls.append(job)
            g = FakeGen(*self.plans[len(self.calls) - 1])
            self.gens.append(g)
            return g
        return SimpleNamespace(remote=call)


def answer(i: int, text: str, cached: int = 0) -> list:
    return [(i, Delta(text=text, token_ids=[5]), None),
            (i, Delta(finish_reason="stop"), Final(cached, "replica-a"))]


async def read(reqs) -> list[list[Delta]]:
    async def one(r) -> list[Delta]:
        return [d async for d in r]
    return list(await asyncio.gather(*(one(r) for r in reqs)))


SAMPLING = dict(max_tokens=4, temperature=0.0, top_k=40, top_p=0.95, min_p=0.05,
                repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=None,
                stop=None, logit_bias=None)


def test_a_call_streams_its_n_completions_with_their_cached_tokens():
    h = FakeHandle([(answer(0, "a", 16) + answer(1, "b", 16), None)])
    eng = remote.RemoteEngine(h, n_vocab=100, max_seqs=4)
    ids = list(range(40))
    reqs = eng.submit_n(ids, 2, logprobs=None, **SAMPLING)
    out = asyncio.run(read(reqs))
    assert [[d.text for d in o] for o in out] == [["a", ""], ["b", ""]]
    assert [r.finish_reason for r in reqs] == ["stop", "stop"]
    assert [r.cached_tokens for r in reqs] == [16, 16] and reqs[0].replica == "replica-a"
    job = h.calls[0]  # routed on the engine's own block hashes of the prompt
    assert job.n == 2 and job.prefix == _block_hashes(ids, 40 // PREFIX_BLOCK)


def test_a_replica_that_dies_before_answering_is_retried_elsewhere(monkeypatch):
    monkeypatch.setattr(remote, "RETRY_WAIT_S", 0.0)
    h = FakeHandle([([], 0), (answer(0, "fine"), None)])
    r = remote.RemoteEngine(h, 100, 4).submit([1, 2, 3], **SAMPLING)
    out = asyncio.run(read([r]))[0]
    assert [d.text for d in out] == ["fine", ""] and r.finish_reason == "stop"
    assert len(h.calls) == 2


def test_a_replica_that_dies_mid_stream_ends_its_requests_with_an_error(monkeypatch):
    monkeypatch.setattr(remote, "RETRY_WAIT_S", 0.0)
    h = FakeHandle([(answer(0, "half")[:1] + answer(1, "other")[:1], 2)])
    reqs = remote.RemoteEngine(h, 100, 4).submit_n([1, 2, 3], 2, **SAMPLING)
    out = asyncio.run(read(reqs))
    assert [d.text for d in out[0]][0] == "half"
    assert all(o[-1].finish_reason == "error" and "replica" in o[-1].error and
               "died" in o[-1].error for o in out)
    assert len(h.calls) == 1  # something was streamed: no retry (it would repeat tokens)


def test_every_try_failing_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(remote, "RETRY_WAIT_S", 0.0)
    h = FakeHandle([([], 0)] * (remote.RETRIES + 1))
    r = remote.RemoteEngine(h, 100, 4).submit([1, 2], **SAMPLING)
    out = asyncio.run(asyncio.wait_for(read([r]), 10))[0]
    assert out[-1].finish_reason == "error" and len(h.calls) == remote.RETRIES + 1


def test_a_refusal_is_the_requests_error():
    body = {"error": {"message": "the server is at capacity", "type": "rate_limit_error",
                      "param": None, "code": "queue_full"}}
    h = FakeHandle([([Refused(429, body, {})], None)])
    r = remote.RemoteEngine(h, 100, 4).submit([1, 2], **SAMPLING)
    out = asyncio.run(read([r]))[0]
    assert out[-1].finish_reason == "error" and "capacity" in out[-1].error


def test_cancel_ends_every_request_of_the_call_and_cancels_it_remotely():
    h = FakeHandle([(answer(0, "x") * 50, None)])
    reqs = remote.RemoteEngine(h, 100, 4).submit_n([1, 2], 2, **SAMPLING)

    async def go() -> list[list[Delta]]:
        it = reqs[0].__aiter__()
        await it.__anext__()
        reqs[0].cancel()
        return await read(reqs)

    asyncio.run(go())
    assert [r.finish_reason for r in reqs] == ["cancelled", "cancelled"]
    assert h.gens[0].cancelled


@pytest.mark.parametrize("bad,match", [
    (dict(temperature=-1.0), "temperature"), (dict(top_p=2.0), "top_p"),
])
def test_bad_arguments_are_refused_before_any_call(bad, match):
    h = FakeHandle([])
    with pytest.raises(ValueError, match=match):
        remote.RemoteEngine(h, 100, 4).submit([1, 2], **{**SAMPLING, **bad})
    with pytest.raises(ValueError, match="vocabulary|prompt"):
        remote.RemoteEngine(h, 100, 4).submit([1, 200], **SAMPLING)
    assert h.calls == []


def test_relabel_keeps_each_family_once_with_a_replica_label():
    a = b"# TYPE colibri_requests_running gauge\ncolibri_requests_running 2.0\n"
    b = b"# TYPE colibri_requests_running gauge\ncolibri_requests_running 3.0\n"
    own = b"# TYPE colibri_http_requests_total counter\ncolibri_http_requests_total 7.0\n"
    text = relabel({"r1": (a, {}), "r2": (b, {})}, own=own).decode()
    assert text.count("# TYPE colibri_requests_running gauge") == 1
    assert 'colibri_requests_running{replica="r1"} 2.0' in text
    assert 'colibri_requests_running{replica="r2"} 3.0' in text
    assert "colibri_http_requests_total 7.0" in text


def test_the_router_prefers_the_replica_that_holds_the_prefix():
    r = PrefixRouter.__new__(PrefixRouter)  # its state alone: no Serve controller behind it
    r.initialize_state()
    r.select_available_replicas = lambda c: list(c)  # type: ignore[method-assign]
    reps = [SimpleNamespace(replica_id=k) for k in ("A", "B")]
    pending = lambda h: SimpleNamespace(args=[Job(ids=[], n=1, kw={}, prefix=h)])  # noqa: E731
    r.on_request_routed(pending([11, 12, 13]), "B", None)
    ranks = asyncio.run(r.choose_replicas(reps, pending([11, 12, 99])))
    assert [x.replica_id for x in ranks[0]] == ["B"]  # the longest prefix it holds: 2 blocks
    assert [x.replica_id for x in asyncio.run(r.choose_replicas(reps, pending([5])))[0]] == \
        ["A", "B"]  # nobody holds it: all, the least loaded chosen among them
    r.select_available_replicas = lambda c: [x for x in c if x.replica_id != "B"]
    assert [x.replica_id for x in asyncio.run(r.choose_replicas(reps, pending([11])))[0]] == \
        ["A", "B"]  # B is full: not preferred


def test_autoscaling_wants_one_batch_per_replica_and_room_in_the_kv():
    assert desired_replicas([0.5, 0.25], [0.1, 0.1], 2) == 1
    assert desired_replicas([1.5, 1.5], [0.1, 0.1], 2) == 3
    assert desired_replicas([0.1], [0.95], 1) == 2
    assert desired_replicas([], [], 3) == 3
    assert desired_replicas([0.0, 0.0], [0.0, 0.0], 2) == 1


def test_without_ray_the_message_names_the_extra(monkeypatch):
    import sys

    import colibri.ray

    monkeypatch.setitem(sys.modules, "ray.serve", None)  # import ray.serve fails
    msg = colibri.ray.missing_extra()
    assert msg is not None and "ray[serve]" in msg and 'colibri-moe[ray]' in msg
    with pytest.raises(ImportError, match="colibri-moe"):
        colibri.ray.app("gemma3-270m")
