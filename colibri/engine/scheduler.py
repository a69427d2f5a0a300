"""The engine's step loop: admission (KV reserved before a step, preempting the youngest when the
arena is full), the plan of a step (decode tokens first, then prompt chunks, the chunk sized
adaptively from measured step times), one forward batch, and sampling its rows."""

from __future__ import annotations

import bisect
import logging
import time

import numpy as np

from colibri.engine.output import _Output
from colibri.engine.prefix import _Cached
from colibri.engine.request import Delta, _Seq
from colibri.errors import ColibriError

log = logging.getLogger("colibri")

# Prompt tokens per step (prefill_chunk=None: adaptive). While sequences decode, the chunk is
# sized from the engine's own step timings (_StepTime: a least-squares fit of step seconds =
# a + b_d * decode tokens + b_p * prompt tokens over recent steps) so that a step with a chunk
# costs at most CHUNK_STEP_RATIO times a decode-only step of as many decode tokens (the running
# requests' inter-token latency grows by at most that factor while a prompt is read), the ratio
# multiplied by 1 + waiting / decoding requests. On Gemma 3 270M (2 threads, a loaded machine)
# a step of 16 decode tokens took 88 ms and each prompt token added 1.5 ms (4 decode tokens:
# 54 ms; linear to 256 prompt tokens); small chunks cost ~15% more a token than the big steps
# of a burst the fit may have seen first, and a chunk step at the ratio 1.6 (1.7 with one
# arrival) measured 1.9-2x a decode step on a quiet machine: 1.4 leaves room for that and for
# noise under the target p99 <= 2x p50 while prompts arrive. DEFAULT_PREFILL_CHUNK is the chunk
# before the first measurements of prompt tokens; MIN_PREFILL_CHUNK the least (a prompt always
# progresses). A burst - nothing decoding, or more requests waiting for their prompt than
# decoding since before the oldest of them arrived (those that arrived with it do not count) -
# is read in whole steps of up to SOLO_PREFILL_CHUNK tokens (what llama.cpp's server does with
# a burst; the decode tokens still ride in every step): the waiting requests' time to first
# token is then the prefill's time and a few decode tokens, not that of many small chunks
# behind the decoding ones. A prompt whose rest exceeds the chunk by at most an eighth of it is
# read whole.
DEFAULT_PREFILL_CHUNK = 64
MIN_PREFILL_CHUNK = 16
SOLO_PREFILL_CHUNK = 512
CHUNK_STEP_RATIO = 1.4
STEP_FIT_DECAY = 0.9  # _StepTime: each step's weight in the fit, per later step

# KV growth. A sequence's KV is one arena block; growing it past its capacity usually moves it
# (a copy of the whole sequence), and sequences that decode in step (the same prompt length,
# or lengths equal modulo the KV's 16-token growth step) all outgrow their blocks in the same
# step: on Gemma 3 270M, 16 sequences of ~200 tokens added 40-165 ms to a step whose forward
# takes 30 ms, mostly first-touch faults of the arena pages they moved into (Engine's
# prefault_kv removes those; the copies themselves run at ~20 GB/s, 1.7 ms for a 1000-token
# sequence). So the engine grows blocks ahead of need, at most one per step: the decoding
# sequence with the least room left, once that room is under one token per decoding sequence
# plus KV_GROW_AHEAD, gets that much room or 1/KV_GROW_FRACTION of its length, whichever is
# more (moves spread over the steps, their bytes growing geometrically rather than a copy
# every 16 tokens); an admitted prompt's block is reserved whole (not chunk by chunk). Only
# while a quarter of the arena is free (KV_GROW_FREE) and its largest free run holds
# KV_GROW_SPARE times the grown block: a fuller arena grows on demand as before, so the room
# held ahead is consumed by its sequences within a few dozen steps and a reserve ahead never
# preempts or evicts anything.
KV_GROW_AHEAD = 16
KV_GROW_FRACTION = 8
KV_GROW_FREE = 0.25
KV_GROW_SPARE = 2


class _StepTime:
    """Step seconds ~ a + b_d * decode tokens + b_p * prompt tokens: a least-squares fit over
    the engine's steps, each step's weight multiplied by STEP_FIT_DECAY at every later step
    (the fit follows the machine's load and the contexts' growth). Where the steps seen do not
    separate two terms (e.g. every step had 16 decode tokens), the minimum-norm fit still
    predicts the steps like those seen."""

    def __init__(self) -> None:
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._coef: np.ndarray | None = None
        self.seen_decode = False  # a step with decode tokens
        self.seen_prompt = False  # a step with prompt tokens

    def add(self, n_decode: int, n_prompt: int, seconds: float) -> None:
        x = np.array([1.0, n_decode / 64.0, n_prompt / 64.0])  # columns of like scale
        self._xtx = STEP_FIT_DECAY * self._xtx + np.outer(x, x)
        self._xty = STEP_FIT_DECAY * self._xty + seconds * x
        self._coef = np.linalg.lstsq(self._xtx, self._xty, rcond=1e-9)[0]
        self.seen_decode = self.seen_decode or n_decode > 0
        self.seen_prompt = self.seen_prompt or n_prompt > 0

    def decode_s(self, n_decode: int) -> float:
        """Seconds of a decode-only step of n_decode tokens (at least 1 us)."""
        assert self._coef is not None
        return max(float(self._coef[0] + self._coef[1] * n_decode / 64.0), 1e-6)

    def prompt_token_s(self) -> float:
        """Seconds a prompt token adds to a step (not fitted: 0)."""
        return 0.0 if self._coef is None else float(self._coef[2]) / 64.0


class _Scheduler(_Output):
    """The engine thread's loop and steps (the attributes are set by Engine.__init__)."""

    max_batch: int
    max_seqs: int
    adaptive_chunk: bool
    prefill_chunk: int
    _stride: int
    _align: int
    _incoming: list[_Seq]
    _closing: bool
    _n_steps: int
    _n_step_tokens: int
    _last_step_tokens: int
    _last_step_s: float
    _steptime: _StepTime
    _last_chunk: int

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self._closing or self._incoming or self._running or self._waiting):
                        self._cv.wait()
                    if self._closing:
                        break
                    for s in self._incoming:
                        bisect.insort(self._waiting, s, key=lambda x: x.order)
                    self._incoming.clear()
                try:
                    if self.model.closed:
                        raise ColibriError("the model was closed under the engine")
                    self._step()
                except Exception as e:
                    # outside the forward (a closed model, a bug in scheduling): fail every
                    # request the engine holds rather than retry the same failure forever;
                    # the engine keeps serving new requests
                    log.exception("engine step failed")
                    for s in self._running + self._waiting:
                        self._finish(s, Delta(finish_reason="error", error=f"engine: {e}"))
                    self._clear_cache()
                self._publish()
        finally:
            with self._cv:
                self._closing = True
                pending = self._incoming + self._waiting + self._running
                self._incoming.clear()
            for s in pending:
                self._finish(s, Delta(finish_reason="cancelled"))
            self._clear_cache()
            self._publish()

    def _reserve(self, s: _Seq, n: int, plan: dict[int, int]) -> bool:
        """Reserve KV for n more tokens of s, preempting younger admitted sequences when the
        arena is full. False when s itself is the youngest and cannot fit (it waits)."""
        assert s.seq is not None
        while True:
            try:
                self.model.kv.reserve(s.seq, s.n_kv + n)
                return True
            except MemoryError:
                if self._evict_one():
                    continue
                youngest = max(self._running, key=lambda x: x.order)
                if youngest is s:
                    return False
                plan.pop(youngest.order, None)
                self._preempt(youngest)

    def _admit(self, s: _Seq) -> bool:
        """Give s a KV sequence if the arena can hold its prompt (and room to grow), evicting
        cached prefixes as needed; copy the longest cached or running prefix of its tokens."""
        need = (s.n_tokens() + 1) * self._stride
        headroom = sum(1 for x in self._running if x.decoding()) * 16 * self._stride
        src, n_copy = self._lookup(s)
        keep = src if isinstance(src, _Cached) else None
        while self._running and self.model.arena.stats()["largest_free"] < need + headroom:
            if self._evict_one(keep):
                continue
            if keep is None:
                return False
            self._evict(keep)  # the room matters more than the reuse
            keep = src = None
            n_copy = 0
        while True:
            try:
                s.seq = self.model.new_sequence()
                break
            except MemoryError:  # every sequence id is live
                if not self._evict_one(keep):
                    raise
        s.n_kv = 0
        s.copied = 0
        s.req.cached_tokens = 0  # this admission's reuse (a preempted request is read again)
        self._running.append(s)
        self._running.sort(key=lambda x: x.order)
        while src is not None and n_copy > 0:
            assert src.seq is not None  # a running source holds its sequence
            try:  # a recurrent state: the source's own at its end, else its snapshot
                self.model.kv.copy_prefix(src.seq, s.seq, n_copy, None if n_copy == src.n_kv
                                          or not self.model.kv.state_bytes
                                          else src.snaps[n_copy])
            except MemoryError:
                if self._evict_one(keep):
                    continue
                break  # no room for the copy now: a cold prefill instead
            s.n_kv = s.copied = n_copy
            # prompt tokens only (a preempted request's copy may reach into its output)
            s.req.cached_tokens = min(n_copy, len(s.prompt))
            if isinstance(src, _Cached):
                self._cache.move_to_end(src.seq)
            with self._cv:
                self._pc_hits += 1
                self._pc_tokens_saved += n_copy
            break
        return True

    def _step(self) -> None:
        # 1. cancellations (their KV back now)
        for s in [x for x in self._running + self._waiting if x.req.cancel_requested]:
            self._finish(s, Delta(finish_reason="cancelled"))
        # 2. plan: decode tokens first, oldest first; then prompt chunks
        plan: dict[int, int] = {}  # order -> tokens this step
        budget = self.max_batch
        for s in list(self._running):
            if budget == 0:
                break
            if s.seq is None or not s.decoding():
                continue
            if self._reserve(s, 1, plan):
                plan[s.order] = 1
                budget -= 1
            else:
                self._preempt(s)
        n_decode = len(plan)
        decoding = [s for s in self._running if s.order in plan]
        self._grow_ahead(decoding)
        # waiting for their prompt: the admitted ones still prefilling, and as many of the
        # waiting ones as there are free places; the decoding ones that already had their
        # first token when the oldest of those arrived are the settled ones (the others came
        # with it, in the same burst)
        pending = [s for s in self._running if s.order not in plan] + \
            self._waiting[:max(0, self.max_seqs - len(self._running))]
        n_pending = len(pending)
        t_oldest = min((s.req.t_submit for s in pending), default=0.0)
        n_settled = sum(1 for s in decoding if s.req.ttft_s is not None
                        and s.req.t_submit + s.req.ttft_s < t_oldest)
        chunk = limit = min(self._chunk(n_decode, n_pending, n_settled), budget)
        room = budget  # tokens left in the step
        self._last_chunk = chunk
        for s in list(self._running):   # admitted, still prefilling
            if chunk == 0:
                break
            if s.seq is None or s.decoding() or s.order in plan:
                continue
            n = self._take(s, chunk, limit, room, self._align)
            if self._reserve(s, n, plan):
                plan[s.order] = n
                chunk = max(0, chunk - n)
                room -= n
        for s in list(self._waiting):
            if chunk == 0 or len(self._running) >= self.max_seqs:
                break
            if self._shares_pending(s):
                continue  # its prefix is being prefilled: copy it when done
            if not s.req._try_admit():  # cancelled while it waited (its stream has ended)
                self._finish(s, Delta(finish_reason="cancelled"))
                continue
            if not self._admit(s):
                s.req._unadmit()
                break
            self._waiting.remove(s)
            self._reserve_ahead(s, s.n_tokens() + KV_GROW_AHEAD)
            n = self._take(s, chunk, limit, room, self._align)
            if not self._reserve(s, n, plan):  # the youngest, and it does not fit: not yet
                if s.copied:  # its copied prefix is freed with it: no hit
                    with self._cv:
                        self._pc_hits -= 1
                        self._pc_tokens_saved -= s.copied
                    s.copied = s.req.cached_tokens = 0
                self._release(s)
                s.req._unadmit()
                bisect.insort(self._waiting, s, key=lambda x: x.order)
                break
            plan[s.order] = n
            chunk = max(0, chunk - n)
            room -= n
        batch = [s for s in self._running if s.order in plan]
        if not batch:
            # work, but none runnable now: only when KV held outside the engine (another user
            # of the same Model) leaves no room for even the oldest request; look again soon
            with self._cv:
                self._cv.wait(0.01)
            return
        # 3. one forward batch
        seqs: list[int] = []
        toks: list[int] = []
        want: list[bool] = []
        for s in batch:
            n = plan[s.order]
            assert s.seq is not None
            all_toks = s.tokens()
            seqs += [s.seq] * n
            toks += all_toks[s.n_kv : s.n_kv + n]
            want += [False] * (n - 1) + [s.n_kv + n == len(all_toks)]
        t0 = time.perf_counter()
        try:
            logits = self.model.eval(seqs, tokens=toks, logits=want)
        except Exception as e:
            log.warning("engine: a step of %d tokens failed: %s", len(toks), e)
            for s in batch:
                self._finish(s, Delta(finish_reason="error", error=f"{type(e).__name__}: {e}"))
            return
        dt = time.perf_counter() - t0
        self._observe(dt, n_decode=n_decode, n_tokens=len(toks))
        with self._cv:
            self._n_steps += 1
            self._n_step_tokens += len(toks)
            self._last_step_tokens = len(toks)
            self._last_step_s = dt
        # 4. sample, stream, finish
        row = 0
        now = time.perf_counter()
        for s in batch:
            s.n_kv += plan[s.order]
            self._index_running(s)
            self._snapshot(s)
            if s.n_kv < s.n_tokens():
                continue  # more prompt to go
            try:
                self._advance(s, logits[row], now)
            except Exception as e:
                log.exception("engine: sampling failed")
                self._finish(s, Delta(finish_reason="error", error=f"{type(e).__name__}: {e}"))
            row += 1

    @staticmethod
    def _take(s: _Seq, chunk: int, limit: int, room: int, align: int = 1) -> int:
        """Prompt tokens of s to read this step: at most chunk (what is left of the step's
        limit), or all the rest when that exceeds chunk by at most an eighth of limit and the
        step has room (no small last chunk a step later). align > 1 (recurrent-state models:
        a snapshot for the prefix cache is taken where a chunk ends): no chunk runs past the
        last multiple of align before the last token (a later request sharing the prompt
        resumes there), and one short of the rest ends on a multiple where one lies in it."""
        rest = s.n_tokens() - s.n_kv
        n = rest if rest <= chunk or (rest - chunk <= limit // 8 and rest <= room) else chunk
        if align == 1:
            return n
        end, last = s.n_kv + n, (s.n_tokens() - 1) // align * align
        if s.n_kv < last < end:
            return last - s.n_kv
        if n < rest and end % align and end - end % align > s.n_kv:
            return end - end % align - s.n_kv
        return n

    def _reserve_ahead(self, s: _Seq, n_tokens: int) -> bool:
        """Reserve room for n_tokens tokens in s's block ahead of need, while KV_GROW_FREE of
        the arena is free and its largest free run holds KV_GROW_SPARE times that block (else
        nothing: the reserve on demand preempts or evicts as needed). True when it did."""
        assert s.seq is not None
        kv = self.model.kv
        if kv.capacity(s.seq) >= n_tokens:
            return False
        a = self.model.arena.stats()
        if a["free"] < KV_GROW_FREE * a["capacity"] or \
                a["largest_free"] < KV_GROW_SPARE * n_tokens * self._stride:
            return False
        try:
            kv.reserve(s.seq, n_tokens)
        except MemoryError:
            return False
        return True

    def _grow_ahead(self, decoding: list[_Seq]) -> None:
        """Grow the block of at most one of the decoding sequences ahead of need (KV_GROW_*):
        the one with the least room, when that is under len(decoding) + KV_GROW_AHEAD tokens
        (each step adds one; staggered this way every block has grown before it is full)."""
        if not decoding:
            return
        kv = self.model.kv
        ahead = len(decoding) + KV_GROW_AHEAD
        best: _Seq | None = None
        room = ahead
        for s in decoding:
            assert s.seq is not None
            r = kv.capacity(s.seq) - (s.n_kv + 1)
            if r < room:
                best, room = s, r
        if best is not None:
            self._reserve_ahead(best, best.n_kv + 1 + max(ahead, best.n_kv // KV_GROW_FRACTION))

    def _chunk(self, n_decode: int, n_pending: int, n_settled: int | None = None) -> int:
        """Prompt tokens this step may take (before max_batch's limit), with n_decode
        sequences decoding, n_settled of them (default: all) decoding since before the oldest
        of the n_pending admissible requests waiting for their prompt arrived."""
        if not self.adaptive_chunk:
            return self.prefill_chunk
        settled = n_decode if n_settled is None else n_settled
        if n_decode == 0 or n_pending > settled:  # a burst: whole steps
            return min(SOLO_PREFILL_CHUNK, self.max_batch)
        st = self._steptime
        if not (st.seen_decode and st.seen_prompt):
            return DEFAULT_PREFILL_CHUNK
        # the extra step time is paid by the n_decode running requests, the prefill is for
        # the n_pending waiting ones: the allowed ratio grows with waiting / decoding (one
        # arrival among 16 decoding: 1.5 decode steps); a prompt token is taken to cost at
        # least 5% of the decode step over 64 (a noisy fit never asks for unbounded chunks)
        t_dec = st.decode_s(n_decode)
        per = max(st.prompt_token_s(), 0.05 * t_dec / 64)
        ratio = CHUNK_STEP_RATIO * (1.0 + n_pending / n_decode)
        c = int((ratio - 1.0) * t_dec / per)
        return max(MIN_PREFILL_CHUNK, min(c, self.max_batch))

    def _observe(self, dt: float, n_decode: int, n_tokens: int) -> None:
        """Fold a step's time into the adaptive chunk's step-time fit."""
        self._steptime.add(n_decode, n_tokens - n_decode, dt)
