"""The engine's step loop: admission (KV reserved before a step, preempting the youngest when the
arena is full), the plan of a step (decode tokens first, then prompt chunks, the chunk sized
adaptively from measured step times), one forward batch, and sampling its rows."""

from __future__ import annotations

import bisect
import logging
import time

from colibri.engine.output import _Output
from colibri.engine.prefix import _Cached
from colibri.engine.request import Delta, _Seq
from colibri.errors import ColibriError

log = logging.getLogger("colibri")

# Prompt tokens per step (prefill_chunk=None: adaptive). While sequences decode, the chunk is
# sized from the engine's own step timings so that a step with a chunk costs at most
# CHUNK_STEP_RATIO times a decode-only step (the running requests' inter-token latency grows
# by at most that factor while a prompt is read): on Gemma 3 270M (2 threads) a step of 16
# decode tokens took 145 ms; with a 32-token chunk 1.6x that, 64: 2.0x, 128: 3.0x (medians of
# 9 interleaved runs; docs/ARCHITECTURE.md, "Engine"). DEFAULT_PREFILL_CHUNK is the chunk
# before the first measurements; MIN_PREFILL_CHUNK the least (a prompt always progresses);
# with nothing decoding, prompts take up to SOLO_PREFILL_CHUNK tokens a step (nobody waits).
# The ratio is multiplied by 1 + waiting / decoding requests (a burst of arrivals is not read
# in many small chunks behind a few running requests).
DEFAULT_PREFILL_CHUNK = 64
MIN_PREFILL_CHUNK = 16
SOLO_PREFILL_CHUNK = 512
CHUNK_STEP_RATIO = 1.6

# KV growth. A sequence's KV is one arena block; growing it past its capacity usually moves it
# (a copy of the whole sequence), and sequences that decode in step (the same prompt length,
# or lengths equal modulo the KV's 16-token growth step) all outgrow their blocks in the same
# step: on Gemma 3 270M, 16 sequences of ~200 tokens added 40-165 ms to a step whose forward
# takes 30 ms, mostly first-touch faults of the arena pages they moved into (Engine's
# prefault_kv removes those; the copies themselves run at ~20 GB/s, 1.7 ms for a 1000-token
# sequence). So the engine grows blocks ahead of need, at most one per step: the decoding
# sequence with the least room left, once that room is under one token per decoding sequence
# plus KV_GROW_AHEAD, gets that much room or 1/KV_GROW_FRACTION of its length, whichever is
# more (moves spread over the steps, their bytes growing geometrically rather than a copy every 16 tokens); an
# admitted prompt's block is reserved whole (not chunk by chunk). Only while a quarter of the
# arena is free (KV_GROW_FREE) and its largest free run holds KV_GROW_SPARE times the grown
# block: a fuller arena grows on demand as before, so the room held ahead is consumed by its
# sequences within a few dozen steps and a reserve ahead never preempts or evicts anything.
KV_GROW_AHEAD = 16
KV_GROW_FRACTION = 8
KV_GROW_FREE = 0.25
KV_GROW_SPARE = 2


class _Scheduler(_Output):
    """The engine thread's loop and steps (the attributes are set by Engine.__init__)."""

    max_batch: int
    max_seqs: int
    adaptive_chunk: bool
    prefill_chunk: int
    _stride: int
    _incoming: list[_Seq]
    _closing: bool
    _n_steps: int
    _n_step_tokens: int
    _last_step_tokens: int
    _last_step_s: float
    _t_decode: float | None
    _t_prompt_tok: float | None
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
        self._running.append(s)
        self._running.sort(key=lambda x: x.order)
        while src is not None and n_copy > 0:
            assert src.seq is not None  # a running source holds its sequence
            try:
                self.model.kv.copy_prefix(src.seq, s.seq, n_copy)
            except MemoryError:
                if self._evict_one(keep):
                    continue
                break  # no room for the copy now: a cold prefill instead
            s.n_kv = n_copy
            s.req.cached_tokens = n_copy
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
        self._grow_ahead([s for s in self._running if s.order in plan])
        n_pending = len(self._waiting) + sum(1 for s in self._running if s.order not in plan)
        chunk = min(self._chunk(n_decode, n_pending), budget)
        self._last_chunk = chunk
        for s in list(self._running):   # admitted, still prefilling
            if chunk == 0:
                break
            if s.seq is None or s.decoding() or s.order in plan:
                continue
            n = min(chunk, s.n_tokens() - s.n_kv)
            if self._reserve(s, n, plan):
                plan[s.order] = n
                chunk -= n
        for s in list(self._waiting):
            if chunk == 0 or len(self._running) >= self.max_seqs:
                break
            if self._shares_pending(s):
                continue  # its prefix is being prefilled: copy it when done
            if not self._admit(s):
                break
            self._waiting.remove(s)
            self._reserve_ahead(s, s.n_tokens() + KV_GROW_AHEAD)
            n = min(chunk, s.n_tokens() - s.n_kv)
            if not self._reserve(s, n, plan):  # the youngest, and it does not fit: not yet
                if s.req.cached_tokens:  # its copied prefix is freed with it: no hit
                    with self._cv:
                        self._pc_hits -= 1
                        self._pc_tokens_saved -= s.req.cached_tokens
                    s.req.cached_tokens = 0
                self._release(s)
                bisect.insort(self._waiting, s, key=lambda x: x.order)
                break
            plan[s.order] = n
            chunk -= n
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
            if s.n_kv < s.n_tokens():
                continue  # more prompt to go
            try:
                self._advance(s, logits[row], now)
            except Exception as e:
                log.exception("engine: sampling failed")
                self._finish(s, Delta(finish_reason="error", error=f"{type(e).__name__}: {e}"))
            row += 1

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

    def _chunk(self, n_decode: int, n_pending: int) -> int:
        """Prompt tokens this step may take (before max_batch's limit), with n_decode
        sequences decoding and n_pending waiting for their prompt to be read."""
        if not self.adaptive_chunk:
            return self.prefill_chunk
        if n_decode == 0:
            return max(DEFAULT_PREFILL_CHUNK, SOLO_PREFILL_CHUNK)
        if self._t_decode is None or self._t_prompt_tok is None:
            return DEFAULT_PREFILL_CHUNK
        # the extra step time is paid by the n_decode running requests, the prefill is for
        # the n_pending waiting ones: the allowed ratio grows with waiting / decoding, so a
        # burst's last request does not wait for many small chunks behind a few running
        # ones (one arrival among 16 decoding: 1.7 decode steps)
        ratio = CHUNK_STEP_RATIO * (1.0 + n_pending / n_decode)
        c = int((ratio - 1.0) * self._t_decode / self._t_prompt_tok)
        return max(MIN_PREFILL_CHUNK, min(c, self.max_batch))

    def _observe(self, dt: float, n_decode: int, n_tokens: int) -> None:
        """Fold a step's time into the adaptive chunk's model: a decode-only step updates the
        decode-step time; a step with n_decode > 0 decode tokens and prompt tokens updates the
        marginal time per prompt token (its time beyond a decode-only step)."""
        a = 0.3
        n_prompt = n_tokens - n_decode
        if n_decode == 0:
            return
        if n_prompt == 0:
            self._t_decode = dt if self._t_decode is None else (1 - a) * self._t_decode + a * dt
        elif self._t_decode is not None:
            per = max(dt - self._t_decode, 0.05 * self._t_decode) / n_prompt
            self._t_prompt_tok = per if self._t_prompt_tok is None else \
                (1 - a) * self._t_prompt_tok + a * per
