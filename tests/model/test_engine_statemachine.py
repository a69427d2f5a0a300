"""A hypothesis state machine over colibri.Engine on the tiny MoE model with a small cache.

Rules submit (random prompt lengths, some longer than the context, some sharing a prefix so the
prefix cache hits; random max_tokens; greedy or seeded sampling; stop strings; n completions
through submit_n), cancel a live request and read a few deltas of one; the engine steps on its
own thread. Only the public API is used: requests' deltas, engine.stats(), the arena's check().
A ballast sequence held outside the engine shrinks its room to as little as a context and 32
tokens, so requests get preempted and the prefix cache evicted.

After every rule: the arena's own consistency check passes (it runs under the arena's mutex,
so it may run while the engine steps), running <= max_seqs, running + waiting <= the requests
not yet finished, no request is missing from stats(); when every request has finished, nothing
runs or waits and the KV in use is at least the prefix cache's.

At teardown every request is read to its end: one final delta, a finish_reason that fits it
("error" exactly for prompts longer than the context, "cancelled" only when cancelled), every
greedy request that ended with "stop" or "length" equals Model.generate(prompt, temperature=0,
same max_tokens and stop) exactly (batch invariance), a cancelled greedy one is a prefix of it;
and after engine.close() (which releases the prefix cache) the arena's free bytes are back to
the baseline (the ballast's, then without it).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import colibri
from colibri.engine import KV_GROW_AHEAD, KV_GROW_FRACTION, Delta, Engine, Request

CTX = 128  # the arena holds 640 tokens of this model (ctx + 1 MiB), less a ballast
READ_TIMEOUT_S = 60.0  # a read that takes longer means the engine stalled

_refs: dict[tuple, str] = {}  # Model.generate's greedy text by (ids, max_tokens, stop)
# what the examples went through (printed with -s; measured: 10 preemptions, 50 cache evictions,
# 16 prefix hits, every finish reason; ~4 s on the quiet 2-core machine)
_seen: collections.Counter[str] = collections.Counter()


@dataclass(eq=False)
class Rec:
    req: Request
    ids: list[int]
    max_tokens: int
    greedy: bool
    stop: str | None
    deltas: list[Delta] = field(default_factory=list)
    cancelled: bool = False  # cancel() was called

    @property
    def done(self) -> bool:  # the final delta was read
        return bool(self.deltas) and self.deltas[-1].finish_reason is not None

    @property
    def too_long(self) -> bool:
        return len(self.ids) + (1 if self.max_tokens else 0) > CTX


def read(recs: list[Rec], k: int | None) -> None:
    """Read up to k deltas (None: all) of each of recs, on a helper thread so that a stalled
    engine fails the test instead of hanging it."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for r in recs:
                n = 0
                while not r.done and (k is None or n < k):
                    r.deltas.append(next(r.req))
                    n += 1
        except BaseException as e:  # reported by the caller
            errors.append(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(READ_TIMEOUT_S)
    assert not t.is_alive(), "the engine stalled: no delta within the timeout"
    assert not errors, errors[0]


class EngineMachine(RuleBasedStateMachine):
    model: colibri.Model  # set by the test before running

    def __init__(self) -> None:
        super().__init__()
        m = self.model
        self.base_free = int(m.arena.stats()["free"])
        self.stride = int(m.kv.token_stride)
        self.recs: list[Rec] = []
        self.engine: Engine | None = None
        self.ballast: int | None = None  # a sequence held outside the engine
        self.engine_free = self.base_free  # the arena's free bytes without the engine
        self.max_seqs = 0
        self.sys = [int(x) for x in np.random.default_rng(7).integers(3, m.n_vocab, 2 * CTX)]

    @initialize(max_seqs=st.sampled_from([2, 4, 8]), chunk=st.sampled_from([8, 24, 64]),
                prefix_cache=st.sampled_from([True, True, False]),
                ballast=st.sampled_from([0, 384, 480, 480]))
    def start(self, max_seqs: int, chunk: int, prefix_cache: bool, ballast: int) -> None:
        """An engine; `ballast` tokens of KV held outside it (another user of the Model) leave
        it 640 - ballast tokens of the arena (at least a context and 32 tokens), for preemption and
        cache eviction."""
        m = self.model
        m.arena.check()
        assert int(m.arena.stats()["free"]) == self.base_free
        if ballast:
            self.ballast = m.new_sequence()
            m.kv.reserve(self.ballast, ballast)
            self.engine_free = int(m.arena.stats()["free"])
        self.engine = Engine(m, max_seqs=max_seqs, prefill_chunk=chunk,
                             prefix_cache=prefix_cache)
        self.max_seqs = max_seqs

    def live(self) -> list[Rec]:
        return [r for r in self.recs if not r.done]

    # ---- rules ----

    @rule(shared=st.sampled_from([0, 0, 16, 37, 100]),
          length=st.one_of(st.integers(1, 30), st.integers(60, CTX + 8)),
          content=st.integers(0, 2**32 - 1), greedy=st.booleans(),
          max_tokens=st.one_of(st.integers(0, 12), st.integers(40, 90)),
          stop=st.sampled_from([None, None, None, None, None, "a", "<extra_1"]),
          seed=st.integers(0, 2**31), n=st.sampled_from([1, 1, 1, 2, 3]))
    def submit(self, shared: int, length: int, content: int, max_tokens: int, greedy: bool,
               stop: str | None, seed: int, n: int) -> None:
        """A prompt of `length` tokens (longer than the context from CTX on) whose first
        `shared` tokens are common to all the machine's prompts (prefix cache hits)."""
        assert self.engine is not None
        shared = min(shared, length - 1)
        rng = np.random.default_rng(content)
        ids = self.sys[:shared] + [int(x) for x in rng.integers(3, self.model.n_vocab,
                                                                 length - shared)]
        kw = dict(max_tokens=max_tokens, stop=stop)
        if greedy:
            kw["temperature"] = 0
        else:
            kw.update(temperature=0.9, seed=seed)
        reqs = [self.engine.submit(ids, **kw)] if n == 1 else self.engine.submit_n(ids, n, **kw)
        assert len(reqs) == n
        self.recs += [Rec(r, ids, max_tokens, greedy, stop) for r in reqs]

    # Targets are drawn among all requests, finished or not: which are finished depends on the
    # engine thread's timing, and hypothesis needs the same draws when it replays an example.

    @precondition(lambda self: bool(self.recs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Cancel a request (harmless when it has finished)."""
        r = self.recs[data.draw(st.integers(0, len(self.recs) - 1))]
        r.cancelled = True
        r.req.cancel()

    @precondition(lambda self: bool(self.recs))
    @rule(data=st.data(), k=st.integers(1, 8))
    def consume(self, data: st.DataObject, k: int) -> None:
        """Read up to k deltas of a request (none when it was read to its end)."""
        read([self.recs[data.draw(st.integers(0, len(self.recs) - 1))]], k)

    @precondition(lambda self: bool(self.recs))
    @rule()
    def drain_all(self) -> None:
        read(self.recs, None)

    # ---- invariants ----

    @invariant()
    def arena_consistent(self) -> None:
        self.model.arena.check()  # under the arena's mutex: safe while the engine steps

    @precondition(lambda self: self.engine is not None)
    @invariant()
    def counts(self) -> None:
        assert self.engine is not None
        finished = {r.req.id: r.req.finish_reason for r in self.recs if r.req.finished}
        unfinished = len(self.recs) - len(finished)
        st_ = self.engine.stats()  # read after the finished flags: counts can only be lower
        assert st_["running"] <= self.max_seqs
        assert st_["running"] + st_["waiting"] <= unfinished
        for r in self.recs:  # no request lost
            got = st_["requests"].get(r.req.id)
            assert got is not None, f"request {r.req.id} is missing from stats()"
            if r.req.id in finished:
                assert got["finish_reason"] == finished[r.req.id]
        if unfinished == 0:  # idle: the engine holds only the prefix cache's KV
            assert st_["running"] == 0 and st_["waiting"] == 0
            pc = st_["prefix_cache"]
            held = self.engine_free - st_["kv"]["free"]
            # a cached sequence holds its tokens rounded up to the KV's 16-token growth steps,
            # plus what the engine reserved ahead and it did not use (the scheduler's
            # KV_GROW_*: one token per running sequence and KV_GROW_AHEAD, or an eighth of it)
            ahead = 16 + self.max_seqs + KV_GROW_AHEAD
            most = pc["cached_tokens"] + pc["cached_tokens"] // KV_GROW_FRACTION \
                + (16 + ahead) * pc["cached_sequences"]
            assert pc["cached_tokens"] * self.stride <= held <= most * self.stride, (held, pc)

    # ---- the end ----

    def teardown(self) -> None:
        try:
            self.finish()
        finally:
            if self.engine is not None:
                self.engine.close()
            if self.ballast is not None:
                self.model.free_sequence(self.ballast)
        assert int(self.model.arena.stats()["free"]) == self.base_free

    def finish(self) -> None:
        eng = self.engine
        if eng is None:
            return
        read(self.recs, None)
        st_ = eng.stats()
        assert st_["running"] == 0 and st_["waiting"] == 0
        _seen["preemptions"] += st_["preemptions"]
        _seen["evictions"] += st_["prefix_cache"]["evictions"]
        _seen["hits"] += st_["prefix_cache"]["hits"]
        for r in self.recs:
            _seen[r.req.finish_reason or ""] += 1
        eng.close()  # cancels nothing (all finished); frees the prefix cache
        m = self.model
        m.arena.check()
        assert int(m.arena.stats()["free"]) == self.engine_free  # the prefix cache released
        for r in self.recs:
            self.check_request(r)

    def check_request(self, r: Rec) -> None:
        ds = r.deltas
        assert ds and ds[-1].finish_reason is not None
        assert all(d.finish_reason is None for d in ds[:-1])
        reason = ds[-1].finish_reason
        assert reason in ("stop", "length", "cancelled", "error")
        assert reason == r.req.finish_reason
        if r.too_long:
            assert reason == "error" and len(ds) == 1 and not ds[0].token_ids
            return
        assert reason != "error", ds[-1].error
        if reason == "cancelled":
            assert r.cancelled
        toks = [t for d in ds for t in d.token_ids]
        text = "".join(d.text for d in ds)
        assert len(toks) <= r.max_tokens and r.req.generated_tokens == len(toks)
        if reason == "length":
            assert len(toks) == r.max_tokens or len(r.ids) + len(toks) == CTX + 1
        if not r.greedy or not toks and (reason == "cancelled" or r.max_tokens == 0):
            return
        key = (tuple(r.ids), r.max_tokens, r.stop)
        if key not in _refs:
            _refs[key] = self.model.generate(r.ids, max_tokens=r.max_tokens, temperature=0,
                                             stop=r.stop, on_context_full="stop")
        ref = _refs[key]
        if reason == "cancelled":
            assert ref.startswith(text), (text, ref)
        else:
            assert text == ref, (r.req.id, text, ref)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory):
    from colibri.tools.make_bench_model import write

    path = write(str(tmp_path_factory.mktemp("engine_sm") / "tiny.gguf"), n_layers=2,
                 shape="tiny")
    with colibri.Model(str(path), ctx=CTX, verbose=False) as m:
        yield m


def test_engine_state_machine(small_model: colibri.Model) -> None:
    _refs.clear()
    _seen.clear()
    EngineMachine.model = small_model
    run_state_machine_as_test(EngineMachine, settings=settings(
        max_examples=25, stateful_step_count=20, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
    print(dict(_seen))
