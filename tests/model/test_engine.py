"""colibri.Engine: continuous batching of many requests on one Model.

Greedy outputs are checked against single-sequence runs (Model.generate's path: the whole prompt
in one eval, then one token per eval). With batch invariance (Model(deterministic=True), the
default; ARCHITECTURE "Batch invariance") a row's logits are bit-identical whatever the batch it
ran in, so batched greedy tokens, seeded samples under load and requests recomputed after a
preemption equal the single runs exactly, on the tiny random MoE model and on Gemma 3 270M
(Q4_K_M, whose 8-bit activations used to lift last-bit differences to near-tie flips).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import colibri
from colibri import ColibriError
from colibri.engine import Delta, Engine, Request
from colibri.generate import stop_token_ids
from colibri.sampling import Sampler, SamplingParams

WORDS = ("The history of the Roman Empire spans many centuries and includes emperors wars "
         "roads aqueducts laws and the long decline of the western provinces").split()


def prompt(i: int, n_words: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n_words)) + f" ({i})"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("engine") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))


@pytest.fixture(scope="module")
def tiny(tiny_path: str):
    with colibri.Model(tiny_path, ctx=2048, verbose=False) as m:
        yield m


@pytest.fixture(scope="module")
def gemma():
    with colibri.Model(ctx=4096, verbose=False) as m:
        yield m


def greedy_ref(m: colibri.Model, ids: list[int], n: int) -> list[int]:
    """Model.generate's greedy path on one sequence, as token ids (those before an
    end-of-generation id)."""
    stops = stop_token_ids(m)
    s = m.new_sequence()
    try:
        lg = m.eval([s], ids, logits=[False] * (len(ids) - 1) + [True])[-1]
        out: list[int] = []
        for i in range(n):
            t = int(np.argmax(lg))
            if t in stops:
                break
            out.append(t)
            if i + 1 == n:
                break
            lg = m.eval([s], [t])[-1]
        return out
    finally:
        m.free_sequence(s)


def teacher_forced(m: colibri.Model, ids: list[int], out: list[int]) -> np.ndarray:
    """Log-softmax of the single-sequence logits before each token of out."""
    s = m.new_sequence()
    try:
        rows = [m.eval([s], ids, logits=[False] * (len(ids) - 1) + [True])[-1]]
        for t in out[:-1]:
            rows.append(m.eval([s], [t])[-1])
    finally:
        m.free_sequence(s)
    x = np.asarray(rows, dtype=np.float64)
    mx = x.max(-1, keepdims=True)
    return np.asarray(x - mx - np.log(np.exp(x - mx).sum(-1, keepdims=True)))


def drain(req: Request) -> tuple[list[int], str, list[Delta]]:
    deltas = list(req)
    ids = [t for d in deltas for t in d.token_ids]
    assert deltas and deltas[-1].finish_reason is not None
    assert all(d.finish_reason is None for d in deltas[:-1])
    return ids, "".join(d.text for d in deltas), deltas


class Gate:
    """Wraps model.eval: the n-th call signals `entered` and waits for `go` (a step held open,
    so a test acts while the engine is inside it); fail_on: that call raises instead."""

    def __init__(self, model: colibri.Model, block_on: int = 0, fail_on: int = 0):
        self.orig = model.eval
        self.block_on, self.fail_on, self.calls = block_on, fail_on, 0
        self.entered, self.go = threading.Event(), threading.Event()

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == self.block_on:
            self.entered.set()
            assert self.go.wait(60)
        if self.calls == self.fail_on:
            raise RuntimeError("injected failure")
        return self.orig(*a, **k)


def free_bytes(m: colibri.Model) -> int:
    return int(m.arena.stats()["free"])


# ---- the sampler's new knobs (defaults unchanged) ----

def test_sampler_new_fields_default_to_todays_behaviour():
    x = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    s = Sampler(SamplingParams())
    assert s.penalise(x, [0, 1, 1]) is x
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0, logit_bias={3: 10.0},
                       repeat_penalty=2.0)
    y = Sampler(p).penalise(x, [0, 1, 1])
    assert y[0] == pytest.approx(1.0 / 2 - 0.5 - 1.0)       # repeat, then freq * 1 + presence
    assert y[1] == pytest.approx(-2.0 * 2 - 0.5 * 2 - 1.0)  # count 2
    assert y[2] == 3.0 and y[3] == pytest.approx(10.5)       # unseen; biased
    assert x[3] == 0.5                                       # input untouched
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"a": 1.0}).validate()     # type: ignore[dict-item]


# ---- tiny MoE model: exact agreement ----

def test_tiny_concurrent_greedy_equals_single_runs(tiny):
    base = free_bytes(tiny)
    prompts = [prompt(i, 1 + (i * 7) % 40) for i in range(16)]
    n_tok = [8 + (i % 5) * 6 for i in range(16)]
    with Engine(tiny, max_seqs=16, prefill_chunk=16) as eng:
        reqs = []
        for i, (p, n) in enumerate(zip(prompts, n_tok, strict=True)):
            if i % 3 == 2:  # mixed sampling in the same batches
                reqs.append(eng.submit(p, max_tokens=n, temperature=0.9, top_k=20, seed=i))
            else:
                reqs.append(eng.submit(p, max_tokens=n, temperature=0))
        results = [drain(r) for r in reqs]
        st = eng.stats()
    assert st["tokens_per_step"] > 4  # really batched
    for i, (p, n, (ids, _, deltas)) in enumerate(zip(prompts, n_tok, results, strict=True)):
        assert deltas[-1].finish_reason == "length" and len(ids) == n
        if i % 3 != 2:
            assert ids == greedy_ref(tiny, tiny.tokenize(p), n), i
    # text equals Model.generate's for the same prompt
    assert results[0][1] == tiny.generate(prompts[0], max_tokens=n_tok[0], temperature=0)
    assert free_bytes(tiny) == base


def test_adaptive_chunk_follows_the_step_time_rule(tiny):
    # the chunk's model, fed synthetic step times (a timed test would be flaky) of a linear
    # law: 10 ms + 5 ms a decode token + 1.25 ms a prompt token; 16 decode tokens: 90 ms, so a
    # chunk costing (CHUNK_STEP_RATIO - 1) of that step is 0.4 * 90 / 1.25 = 28 tokens
    from colibri.engine import (
        CHUNK_STEP_RATIO,
        DEFAULT_PREFILL_CHUNK,
        MIN_PREFILL_CHUNK,
        SOLO_PREFILL_CHUNK,
    )
    from colibri.engine.scheduler import _StepTime

    def law(d: int, p: int) -> float:
        return 0.010 + 0.005 * d + 0.00125 * p

    def want(d: int, p: int) -> int:  # the rule, restated
        return int((CHUNK_STEP_RATIO * (1 + p / d) - 1) * law(d, 0) / 0.00125 + 1e-6)

    with Engine(tiny, max_batch=1024) as eng:
        eng._steptime = _StepTime()
        assert eng._chunk(16, 1) == DEFAULT_PREFILL_CHUNK  # nothing measured yet
        assert eng._chunk(0, 5) == SOLO_PREFILL_CHUNK  # nobody decodes: nobody waits
        # a burst: more waiting for their prompt than decoding: whole steps
        assert eng._chunk(4, 5) == SOLO_PREFILL_CHUNK == eng._chunk(1, 50)
        # ... counting only the decoding requests that had their first token before the
        # waiting ones came (not those that came with them)
        assert eng._chunk(16, 1, 0) == SOLO_PREFILL_CHUNK == eng._chunk(16, 4, 3)
        for d, p in [(16, 0), (16, 48), (8, 0), (8, 100), (0, 512), (12, 30)] * 5:
            eng._observe(law(d, p), n_decode=d, n_tokens=d + p)
        assert CHUNK_STEP_RATIO == 1.4
        assert want(16, 0) == 28 and want(16, 1) == 35  # one arrival: ~1.5 decode steps
        assert want(8, 1) == 23 and want(4, 3) == 34 and want(2, 1) == 17
        for d, p in [(16, 0), (16, 1), (16, 8), (8, 1), (4, 3), (2, 1), (40, 30)]:
            assert abs(eng._chunk(d, p) - want(d, p)) <= 1, (d, p)
            assert eng._chunk(d, p, d) == eng._chunk(d, p)
        assert eng._chunk(300, 299) == 1024  # capped at max_batch
        for _ in range(60):  # prompt tokens turn expensive: the chunk shrinks to its floor
            eng._observe(law(16, 0) + 64 * 0.05, n_decode=16, n_tokens=16 + 64)
            eng._observe(law(16, 0), n_decode=16, n_tokens=16)
        assert eng._chunk(16, 0) == MIN_PREFILL_CHUNK
        for _ in range(200):  # and free: a prompt token is taken to cost at least 5% of the
            eng._observe(law(16, 0), n_decode=16, n_tokens=16 + 64)  # decode step over 64
            eng._observe(law(16, 0), n_decode=16, n_tokens=16)
        assert abs(eng._chunk(16, 0) - int((CHUNK_STEP_RATIO - 1) / 0.05 * 64)) <= 1
    with Engine(tiny, prefill_chunk=24) as eng:  # a fixed chunk stays fixed
        eng._observe(0.1, n_decode=4, n_tokens=4)
        eng._observe(0.1, n_decode=4, n_tokens=68)
        assert eng._chunk(4, 1) == 24 and eng._chunk(0, 1) == 24 and eng._chunk(1, 50) == 24


def test_tiny_adaptive_chunk_outputs_equal_single_runs(tiny):
    # the default (adaptive) chunk changes step shapes from run to run; outputs must not move
    prompts = [prompt(i, 30 + 11 * i) for i in range(6)]
    with Engine(tiny, max_seqs=8) as eng:
        first = [eng.submit(p, max_tokens=12, temperature=0) for p in prompts[:3]]
        head = [next(first[0]) for _ in range(2)]  # decoding while the others' prompts are read
        late = [eng.submit(p, max_tokens=12, temperature=0) for p in prompts[3:]]
        outs = [drain(r)[0] for r in first + late]
        outs[0] = [t for d in head for t in d.token_ids] + outs[0]
    for p, ids in zip(prompts, outs, strict=True):
        assert ids == greedy_ref(tiny, tiny.tokenize(p), 12)


def test_tiny_seeded_sampling_reproducible_under_other_load(tiny):
    kw = dict(max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    with Engine(tiny) as eng:
        alone = drain(eng.submit(prompt(3, 12), **kw))[0]
    with Engine(tiny, prefill_chunk=8) as eng:
        before = [eng.submit(prompt(i, 5 + 3 * i), max_tokens=30, temperature=0.7, seed=i)
                  for i in range(5)]
        loaded = eng.submit(prompt(3, 12), **kw)
        after = [eng.submit(prompt(i, 20), max_tokens=10, temperature=1.2) for i in range(5)]
        under_load = drain(loaded)[0]
        for r in before + after:
            drain(r)
    assert under_load == alone
    # a different seed gives another continuation (the seed is used)
    with Engine(tiny) as eng:
        other = drain(eng.submit(prompt(3, 12), **{**kw, "seed": 99}))[0]
    assert other != alone


def test_tiny_preemption_with_a_small_cache_completes_everything(tiny_path):
    # 256 tokens of context; the arena (256 tokens + 1 MiB of slack) holds 768 tokens of
    # this model; 12 requests of ~30 prompt tokens are admitted, then grow to ~210 each
    with colibri.Model(tiny_path, ctx=256, verbose=False) as m:
        base = free_bytes(m)
        prompts = [prompt(i, 6 + i % 4) for i in range(12)]
        with Engine(m, max_seqs=12, prefill_chunk=64) as eng:
            reqs = [eng.submit(p, max_tokens=180, temperature=0, logprobs=0) for p in prompts]
            results = [drain(r) for r in reqs]
            st = eng.stats()
        assert st["preemptions"] > 0
        for i, (p, (ids, _, deltas)) in enumerate(zip(prompts, results, strict=True)):
            assert deltas[-1].finish_reason == "length" and len(ids) == 180
            # recomputed by prefill after a preemption (prompt + generated tokens in one
            # batch) or not: batch invariance makes it the single run exactly
            assert ids == greedy_ref(m, m.tokenize(p), 180), (i, st["requests"][i])
        assert sum(r["preemptions"] for r in st["requests"].values()) == st["preemptions"]
        assert free_bytes(m) == base
        # a request that reaches the context ends with "length", as Model.generate stops
        ids = m.tokenize(prompt(0, 60))
        assert 150 < len(ids) < m.ctx
        with Engine(m) as eng:
            got, text, deltas = drain(eng.submit(ids, max_tokens=500, temperature=0))
        assert deltas[-1].finish_reason == "length" and len(got) == m.ctx + 1 - len(ids)
        assert got == greedy_ref(m, ids, len(got))
        assert text == m.generate(ids, max_tokens=500, temperature=0, on_context_full="stop")
        assert free_bytes(m) == base


def test_tiny_random_load_with_cancels_and_preemption_ends_clean(tiny_path):
    """Seeded random traffic on a small cache: long and short prompts, too-long ones, greedy
    and sampled, consumers that cancel after a few deltas. Every request ends once, with a
    reason that fits it, and the arena returns to its baseline, consistent."""
    rng = np.random.default_rng(0)
    with colibri.Model(tiny_path, ctx=128, verbose=False) as m:
        base = free_bytes(m)
        with Engine(m, max_seqs=16, prefill_chunk=24) as eng:
            plans = []
            for i in range(24):
                n_ids = m.ctx + 5 if i % 7 == 6 else int(rng.integers(1, 50))
                ids = [int(x) for x in rng.integers(3, m.n_vocab, n_ids)]
                cancel_after = int(rng.integers(1, 6)) if i % 3 == 0 else None
                req = eng.submit(ids, max_tokens=int(rng.integers(20, 200)), logprobs=1,
                                 temperature=float(rng.choice([0.0, 0.9])), seed=i)
                plans.append((n_ids, cancel_after, req))

            def consume(n_ids: int, cancel_after: int | None, req: Request) -> None:
                deltas = []
                for d in req:
                    deltas.append(d)
                    if cancel_after is not None and len(deltas) == cancel_after:
                        req.cancel()
                reason = deltas[-1].finish_reason
                if n_ids >= m.ctx:
                    assert reason == "error" and len(deltas) == 1
                elif cancel_after is None:
                    assert reason in ("length", "stop")
                assert sum(d.finish_reason is not None for d in deltas) == 1
                assert all(len(d.logprobs or []) == len(d.token_ids) for d in deltas)

            errors: list[BaseException] = []

            def run(plan: tuple[int, int | None, Request]) -> None:
                try:
                    consume(*plan)
                except BaseException as e:  # reported by the main thread
                    errors.append(e)

            threads = [threading.Thread(target=run, args=(p,)) for p in plans]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors, errors[0]
            st = eng.stats()
            assert st["running"] == 0 and st["waiting"] == 0
            assert st["preemptions"] > 0
        m.arena.check()
        assert free_bytes(m) == base


def test_tiny_cancel_mid_prefill_and_mid_decode_returns_the_kv(tiny, monkeypatch):
    base = free_bytes(tiny)
    gate = Gate(tiny, block_on=1)
    monkeypatch.setattr(tiny, "eval", gate)
    with Engine(tiny, prefill_chunk=8) as eng:
        req = eng.submit(prompt(0, 50), max_tokens=50, temperature=0)  # ~7 chunks of prefill
        assert gate.entered.wait(60)           # the engine is inside the first chunk
        req.cancel()
        gate.go.set()
        ids, _, deltas = drain(req)
        assert ids == [] and deltas[-1].finish_reason == "cancelled"
        assert free_bytes(tiny) == base
        assert gate.calls == 1                 # freed at the next step, before any other eval
        # mid-decode
        req = eng.submit(prompt(1, 10), max_tokens=2000, temperature=0)
        first = next(req)
        assert first.token_ids and first.finish_reason is None
        req.cancel()
        rest = list(req)
        assert rest[-1].finish_reason == "cancelled"
        assert len([t for d in rest for t in d.token_ids]) < 1999
        assert free_bytes(tiny) == base
        assert eng.stats()["running"] == 0
        req.cancel()  # cancelling a finished request is harmless


async def _take(req: Request, n: int):
    async for d in req:
        yield d
        n -= 1
        if n == 0:
            return


def test_tiny_asyncio_from_several_tasks(tiny):
    prompts = [prompt(i, 3 + 4 * i) for i in range(6)]
    refs = [greedy_ref(tiny, tiny.tokenize(p), 16) for p in prompts]

    async def main(eng: Engine) -> tuple[list[list[int]], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:  # the loop keeps running while requests stream
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        async def one(p: str) -> list[int]:
            ids: list[int] = []
            async for d in eng.submit_async(p, max_tokens=16, temperature=0):
                ids += d.token_ids
            return ids

        async def cancelled_midway() -> None:  # cancel from a task, keep reading to the end
            req = eng.submit_async(prompts[0], max_tokens=1000, temperature=0)
            seen = [d async for d in _take(req, 2)]
            req.cancel()
            rest = [d async for d in req]
            assert len(seen) == 2 and rest[-1].finish_reason == "cancelled"

        t = asyncio.create_task(ticker())
        outs = await asyncio.gather(*(one(p) for p in prompts), cancelled_midway())
        done.set()
        await t
        return list(outs[: len(prompts)]), ticks

    with Engine(tiny, max_batch=4) as eng:  # max_seqs 16 is capped to the batch
        assert eng.max_seqs == 4
        outs, ticks = asyncio.run(main(eng))
    assert outs == refs
    assert ticks >= 3  # a blocking read would starve the ticker until the end


def test_tiny_close_with_requests_in_flight(tiny, monkeypatch):
    base = free_bytes(tiny)
    gate = Gate(tiny, block_on=3)
    monkeypatch.setattr(tiny, "eval", gate)
    eng = Engine(tiny, prefill_chunk=16)
    reqs = [eng.submit(prompt(i, 20 + i), max_tokens=1000, temperature=0) for i in range(6)]
    assert gate.entered.wait(60)
    closer = threading.Thread(target=eng.close)
    closer.start()
    gate.go.set()
    closer.join(60)
    assert not closer.is_alive() and eng.closed
    for r in reqs:
        assert drain(r)[2][-1].finish_reason == "cancelled"
    assert free_bytes(tiny) == base
    with pytest.raises(ColibriError, match="closed"):
        eng.submit("hello")
    eng.close()  # idempotent


def test_tiny_errors_stay_with_their_request(tiny, monkeypatch):
    long_ids = [5] * (tiny.ctx + 1)
    with Engine(tiny, prefill_chunk=16) as eng:
        ok = eng.submit(prompt(1, 10), max_tokens=8, temperature=0)
        bad = eng.submit(long_ids, max_tokens=8)
        _, _, deltas = drain(bad)
        assert deltas[-1].finish_reason == "error" and "context full" in (deltas[-1].error or "")
        assert drain(ok)[2][-1].finish_reason == "length"
        with pytest.raises(ColibriError, match="context full"):
            eng.generate([prompt(2, 5), long_ids], max_tokens=4)
        with pytest.raises(ValueError, match="temperature"):
            eng.submit("x", temperature=-1)
    # an exception inside a step fails that step's requests, not the engine
    base = free_bytes(tiny)
    gate = Gate(tiny, block_on=1, fail_on=2)
    monkeypatch.setattr(tiny, "eval", gate)
    with Engine(tiny, prefill_chunk=64) as eng:
        a = eng.submit(prompt(3, 10), max_tokens=6, temperature=0)
        assert gate.entered.wait(60)        # step 1: a's prompt; b joins for step 2
        b = eng.submit(prompt(4, 10), max_tokens=6, temperature=0)
        gate.go.set()
        for r in (a, b):
            d = drain(r)[2][-1]
            assert d.finish_reason == "error" and "injected failure" in (d.error or "")
        c = eng.submit(prompt(5, 10), max_tokens=6, temperature=0)
        assert drain(c)[0] == greedy_ref(tiny, tiny.tokenize(prompt(5, 10)), 6)
    assert free_bytes(tiny) == base


def test_tiny_model_closed_under_the_engine_fails_its_requests(tiny_path):
    m = colibri.Model(tiny_path, ctx=512, verbose=False)
    gate = Gate(m, block_on=1)
    m.eval = gate  # type: ignore[method-assign]
    with Engine(m, max_seqs=1) as eng:
        a = eng.submit(prompt(0, 10), max_tokens=8)
        b = eng.submit(prompt(1, 10), max_tokens=8)  # waits: max_seqs=1
        assert gate.entered.wait(60)
        m.close()
        gate.go.set()
        for r in (a, b):
            d = drain(r)[2][-1]
            assert d.finish_reason == "error" and "closed" in (d.error or "")


def test_tiny_stops_logprobs_bias_and_stats(tiny):
    p = prompt(2, 12)
    ids = tiny.tokenize(p)
    ref = greedy_ref(tiny, ids, 20)
    with Engine(tiny) as eng:
        # a stop token id: the output ends before it
        k = next(i for i in range(3, 20) if ref[i] not in ref[:i])
        got, _, deltas = drain(eng.submit(p, max_tokens=20, temperature=0,
                                          stop_token_ids=[ref[k]]))
        assert got == ref[:k] and deltas[-1].finish_reason == "stop"
        # a stop string: the text before it, never the stop itself
        full = tiny.detokenize(ref)
        stop = full[len(full) // 2: len(full) // 2 + 3]
        _, text, deltas = drain(eng.submit(p, max_tokens=20, temperature=0, stop=[stop]))
        assert text == full[: full.index(stop)] and deltas[-1].finish_reason == "stop"
        # logprobs with alternatives, sorted; greedy picks the top one
        got, _, deltas = drain(eng.submit(p, max_tokens=5, temperature=0, logprobs=3))
        lps = [lp for d in deltas for lp in (d.logprobs or [])]
        assert [lp.token_id for lp in lps] == got == ref[:5]
        for lp in lps:
            assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id
            assert lp.top[0][1] == pytest.approx(lp.logprob)
            assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1] and lp.logprob <= 0
        # logit bias bans the greedy choice; a presence penalty forbids repeats
        got = drain(eng.submit(p, max_tokens=3, temperature=0,
                               logit_bias={ref[0]: float("-inf")}))[0]
        assert got[0] != ref[0]
        got = drain(eng.submit(p, max_tokens=30, temperature=0, presence_penalty=1e4,
                               repeat_last_n=1000))[0]
        assert len(set(got)) == len(got) and not set(got) & set(ids)
        # chat messages are accepted
        chat = drain(eng.submit([{"role": "user", "content": "hi"}], max_tokens=3))
        assert chat[2][-1].finish_reason in ("length", "stop")
        assert eng.generate([p, p], max_tokens=6, temperature=0) == [tiny.detokenize(ref[:6])] * 2
        st = eng.stats()
    assert st["running"] == 0 and st["waiting"] == 0 and st["steps"] > 0
    one = st["requests"][0]
    assert one["ttft_s"] > 0 and one["finish_reason"] == "stop"
    assert all(x >= 0 for x in one["itl_s"]) and len(one["itl_s"]) == one["generated_tokens"]


# ---- Gemma 3 270M ----

def test_gemma_lone_request_equals_generate(gemma):
    p = prompt(0, 9)
    with Engine(gemma) as eng:
        ids, text, _ = drain(eng.submit(p, max_tokens=12, temperature=0))
    assert ids == greedy_ref(gemma, gemma.tokenize(p), 12)
    assert text == gemma.generate(p, max_tokens=12, temperature=0)


def test_gemma_concurrent_greedy_equals_single_runs(gemma):
    """16 requests batched together (mixed with sampled ones, prompts prefilled in chunks
    beside decoding sequences): every greedy request gives exactly the single run's tokens
    and logprobs (batch invariance; before it, 4% of tokens flipped at near-ties)."""
    base = free_bytes(gemma)
    prompts = [prompt(i, 2 + (i * 5) % 30) for i in range(16)]
    with Engine(gemma, max_seqs=16, prefill_chunk=32) as eng:
        reqs = [eng.submit(p, max_tokens=16, temperature=0 if i % 4 else 0.8, seed=i,
                           logprobs=1) for i, p in enumerate(prompts)]
        results = [drain(r) for r in reqs]
        assert eng.stats()["tokens_per_step"] > 6
    for i, (p, (ids, _, deltas)) in enumerate(zip(prompts, results, strict=True)):
        assert ids and deltas[-1].finish_reason in ("length", "stop")
        if i % 4 == 0:
            continue
        assert ids == greedy_ref(gemma, gemma.tokenize(p), 16), i
        ref = teacher_forced(gemma, gemma.tokenize(p), ids)
        lps = [lp.logprob for d in deltas for lp in (d.logprobs or [])]
        # the same logits; the two log-softmax computations may differ in rounding only
        assert np.allclose([ref[j, t] for j, t in enumerate(ids)], lps, rtol=0, atol=1e-5), i
    assert free_bytes(gemma) == base


def test_gemma_seeded_sampling_reproducible_under_other_load(gemma):
    kw = dict(max_tokens=16, temperature=0.8, seed=5)
    with Engine(gemma) as eng:
        alone = [drain(eng.submit(prompt(j, 8), **{**kw, "seed": j}))[0] for j in range(3)]
    with Engine(gemma, prefill_chunk=16) as eng:
        others = [eng.submit(prompt(i, 4 + 3 * i), max_tokens=20, temperature=0.7, seed=i)
                  for i in range(8)]
        loaded = [eng.submit(prompt(j, 8), **{**kw, "seed": j}) for j in range(3)]
        under_load = [drain(r)[0] for r in loaded]
        for r in others:
            drain(r)
    assert under_load == alone


def test_gemma_seeded_request_alone_is_reproducible(gemma):
    kw = dict(max_tokens=10, temperature=0.9, seed=5)
    with Engine(gemma) as eng:
        a = drain(eng.submit(prompt(1, 8), **kw))[0]
        b = drain(eng.submit(prompt(1, 8), **kw))[0]
    assert a == b


# ---- prefix reuse ----

SYSTEM = " ".join(prompt(i, 12) for i in range(10))  # ~570 tokens (tiny), ~165 (Gemma)


def evaluated(st: dict) -> int:
    """Tokens the engine ran through the model."""
    return round(st["steps"] * st["tokens_per_step"])


def run_logprobs(eng: Engine, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    got, _, deltas = drain(eng.submit(ids, max_tokens=n, temperature=0, logprobs=0))
    return got, [lp.logprob for d in deltas for lp in (d.logprobs or [])]


def test_tiny_prefix_reuse_matches_a_cold_run(tiny):
    base = free_bytes(tiny)
    ia = tiny.tokenize(SYSTEM + " Question one: roads?")
    ib = tiny.tokenize(SYSTEM + " Question two: the decline of laws?")
    common = next(i for i in range(len(ia)) if ia[i] != ib[i])
    assert common > 300
    with Engine(tiny, prefix_cache=False) as eng:
        cold = run_logprobs(eng, ib, 16)
        st = eng.stats()
    assert st["prefix_cache"]["hits"] == 0 and free_bytes(tiny) == base
    with Engine(tiny) as eng:
        run_logprobs(eng, ia, 16)
        n0 = evaluated(eng.stats())
        warm = run_logprobs(eng, ib, 16)
        st = eng.stats()
        assert st["prefix_cache"]["cached_sequences"] == 2
        assert st["kv"]["used"] >= st["prefix_cache"]["cached_tokens"] * tiny.kv.token_stride
    assert st["prefix_cache"]["hits"] == 1 and st["prefix_cache"]["tokens_saved"] == common
    assert st["requests"][1]["cached_tokens"] == common
    # only the suffix was prefilled, then 15 decode tokens
    assert evaluated(st) - n0 == len(ib) - common + 15
    assert warm[0] == cold[0]
    # measured: equal (prefill_chunk 64), 5e-8 with a 1024-token chunk (summation order)
    assert max(abs(a - b) for a, b in zip(warm[1], cold[1], strict=True)) < 1e-6
    assert free_bytes(tiny) == base  # close freed the cache


def test_tiny_same_prompt_submitted_together_prefills_once(tiny):
    ids = tiny.tokenize(" ".join(prompt(i, 12) for i in range(4)))  # 4 of them fit the cache
    ref = greedy_ref(tiny, ids, 8)
    with Engine(tiny, prefill_chunk=32) as eng:  # the prompt takes ~8 steps
        reqs = [eng.submit(ids, max_tokens=8, temperature=0) for _ in range(4)]
        outs = [drain(r)[0] for r in reqs]
        st = eng.stats()
    assert outs == [ref] * 4
    pc = st["prefix_cache"]
    assert pc["hits"] == 3 and pc["tokens_saved"] == 3 * (len(ids) - 1)
    # one prefill of the prompt, a token each for the other three, then decode
    assert evaluated(st) == len(ids) + 3 + 4 * 7


def test_tiny_submit_n_prefills_once_and_follows_the_seeds(tiny):
    """n completions (OpenAI's n): one prefill of the prompt, completion i sampled with seed
    + i, so each equals the single request with that seed, and the whole is reproducible."""
    ids = tiny.tokenize(" ".join(prompt(i, 12) for i in range(4)))
    # sampled from the whole distribution; end-of-generation banned so all run max_tokens
    kw = dict(max_tokens=8, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
              logit_bias={t: float("-inf") for t in stop_token_ids(tiny)})

    def run_n() -> tuple[list[list[int]], dict]:
        with Engine(tiny, prefill_chunk=32) as eng:  # the prompt takes ~8 steps
            reqs = eng.submit_n(ids, 4, seed=100, **kw)
            assert len(reqs) == 4 and all(isinstance(r, Request) for r in reqs)
            outs = [drain(r)[0] for r in reqs]
            return outs, eng.stats()

    outs, st = run_n()
    assert all(len(o) == 8 for o in outs)
    assert len({tuple(o) for o in outs}) == 4  # the seeds differ, so do the completions
    pc = st["prefix_cache"]
    assert pc["hits"] == 3 and pc["tokens_saved"] == 3 * (len(ids) - 1)
    # one prefill of the prompt, a token each for the other three, then decode
    assert evaluated(st) == len(ids) + 3 + 4 * 7
    assert run_n()[0] == outs  # reproducible run to run
    with Engine(tiny) as eng:
        singles = [drain(eng.submit(ids, seed=100 + i, **kw))[0] for i in range(4)]
    assert singles == outs
    with Engine(tiny) as eng:
        with pytest.raises(ValueError, match="n must be"):
            eng.submit_n(ids, 0)
        with pytest.raises(ValueError, match="n must be"):
            eng.submit_n(ids, True)
        one = eng.submit_n(ids, 1, max_tokens=2, temperature=0)
        assert len(one) == 1 and drain(one[0])[0] == greedy_ref(tiny, ids, 2)
        long_ids = [5] * (tiny.ctx + 1)
        assert [drain(r)[2][-1].finish_reason for r in eng.submit_n(long_ids, 2)] == ["error"] * 2
        # without a seed, each completion draws its own entropy
        free = eng.submit_n(ids, 2, seed=None, **kw)
        a, b = (drain(r)[0] for r in free)
        assert a != b


def test_tiny_prefix_cache_gives_way_to_running_requests(tiny_path):
    """The cache only takes free KV: on a small cache, one request at a time, each finished
    request's KV is kept until the next needs the room; nothing is ever preempted for it."""
    with colibri.Model(tiny_path, ctx=128, verbose=False) as m:
        base = free_bytes(m)
        got_all = []
        with Engine(m) as eng:
            for i in range(12):
                ids = m.tokenize(prompt(i, 6))
                got, _, deltas = drain(eng.submit(ids, max_tokens=128 - len(ids) - 1,
                                                  temperature=0))
                assert deltas[-1].finish_reason == "length"
                got_all.append((ids, got))
            st = eng.stats()
            assert st["preemptions"] == 0
            assert st["prefix_cache"]["evictions"] > 0
            assert 0 < st["prefix_cache"]["cached_sequences"] < 12
            # a hit after evictions: the last prompt again
            again = drain(eng.submit(ids, max_tokens=4, temperature=0))[0]
            assert eng.stats()["prefix_cache"]["hits"] == 1
        # (the cache held the arena's free KV while the engine ran: references after close)
        for ids, got in got_all:
            assert got == greedy_ref(m, ids, len(got))
        assert again == got_all[-1][1][:4]
        m.arena.check()
        assert free_bytes(m) == base


def test_gemma_prefix_reuse_matches_a_cold_run(gemma):
    ia = gemma.tokenize(SYSTEM + " Question one: roads?")
    ib = gemma.tokenize(SYSTEM + " Question two: the decline of laws?")
    with Engine(gemma) as eng:
        run_logprobs(eng, ia, 4)
        got, _, deltas = drain(eng.submit(ib, max_tokens=16, temperature=0, logprobs=0))
        st = eng.stats()
    assert st["prefix_cache"]["hits"] == 1 and st["requests"][1]["cached_tokens"] > 150
    # batch invariance: the 7-token suffix prefilled on the copied KV gives exactly the cold
    # run's tokens and logits (before invariance: logprobs within 0.084, tokens equal by luck)
    assert got == greedy_ref(gemma, ib, 16)
    ref = teacher_forced(gemma, ib, got)
    lps = [lp.logprob for d in deltas for lp in (d.logprobs or [])]
    assert np.allclose([ref[j, t] for j, t in enumerate(got)], lps, rtol=0, atol=1e-5)

