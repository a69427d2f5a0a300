"""The engine's output side: a sampled token becomes a Delta on its Request (stop tokens and
strings, max_tokens, the context, a grammar's end), logprobs, and a finished or preempted
sequence's KV freed or handed to the prefix cache."""

from __future__ import annotations

import bisect
import logging

import numpy as np

from colibri.engine.prefix import PREFIX_BLOCK, _PrefixCache
from colibri.engine.request import Delta, TokenLogprob, _Seq, _Stream

log = logging.getLogger("colibri")


class _Output(_PrefixCache):
    """Finishing, preempting and streaming sequences (engine thread; the attributes are set by
    Engine.__init__)."""

    _waiting: list[_Seq]
    _n_running: int
    _queued: list[_Stream]
    _preemptions: int

    def _publish(self) -> None:
        with self._cv:
            self._n_running = len(self._running)
            self._queued = [s.req for s in self._waiting]  # stats() counts the unfinished

    def _release(self, s: _Seq, keep: bool = False) -> None:
        """Free s's KV (if any; keep: move it to the prefix cache instead) and take it out of
        the running list."""
        self._unindex(s)
        if s.seq is not None and keep and self.prefix_cache and s.n_kv >= PREFIX_BLOCK \
                and not self.model.closed:
            self._to_cache(s)
        if s.seq is not None:
            try:
                if not self.model.closed:
                    self.model.free_sequence(s.seq)
            except Exception:  # the KV is gone with its model; nothing to return
                log.exception("engine: freeing a sequence failed")
            s.seq = None
        s.n_kv = 0
        s.snaps = {}
        if s in self._running:
            self._running.remove(s)

    def _finish(self, s: _Seq, delta: Delta) -> None:
        self._release(s, keep=delta.finish_reason in ("stop", "length"))
        if s in self._waiting:
            self._waiting.remove(s)
        self._publish()  # counts right before the caller sees its last delta
        s.req._push(delta)

    def _preempt(self, s: _Seq) -> None:
        self._release(s)
        s.req._unadmit()  # queued again: a cancel now ends it at once
        s.req.preemptions += 1
        with self._cv:
            self._preemptions += 1
        bisect.insort(self._waiting, s, key=lambda x: x.order)

    def _advance(self, s: _Seq, logits: np.ndarray, now: float) -> None:
        """Sample s's next token from logits and stream it."""
        req = s.req
        c = s.constraint
        # a constraint (a grammar) masks the tokens it does not allow (to -inf) before the
        # sampler; logprobs stay those of the model's own logits
        tid = s.sampler.sample(logits if c is None else c.mask(logits), s.tokens())
        if req.ttft_s is None:
            req.ttft_s = now - req.t_submit
        else:
            req.itl_s.append(now - s.t_last)
        s.t_last = now
        if tid in s.stops:
            self._finish(s, self._final(s, Delta(finish_reason="stop")))
            return
        if c is not None:
            c.advance(tid)
        s.out.append(tid)
        req.generated_tokens = len(s.out)
        lps = [self._logprob(logits, tid, s.logprobs)] if s.logprobs is not None else None
        text, stopped = s.matcher.push(s.decoder.feed(tid))
        d = Delta(text=text, token_ids=[tid], logprobs=lps)
        if c is not None and not stopped and c.finished():  # the grammar is complete
            d.finish_reason = "stop"
            self._finish(s, self._final(s, d))
        elif stopped:
            d.finish_reason = "stop"
            self._finish(s, d)
        elif len(s.out) >= s.max_tokens or s.n_tokens() > self.model.ctx:
            d.finish_reason = "length"
            self._finish(s, self._final(s, d))
        else:
            req._push(d)

    @staticmethod
    def _final(s: _Seq, d: Delta) -> Delta:
        """d with the text held back (an unfinished character, a partial stop string) added,
        unless that completes a stop string."""
        tail, stopped = s.matcher.push(s.decoder.flush())
        if stopped:
            d.finish_reason = "stop"
            d.text += tail
        else:
            d.text += tail + s.matcher.flush()
        return d

    @staticmethod
    def _logprob(logits: np.ndarray, tid: int, n: int) -> TokenLogprob:
        x = np.asarray(logits, dtype=np.float64)
        m = x.max()
        lse = m + np.log(np.exp(x - m).sum())
        top: list[tuple[int, float]] = []
        if n > 0:
            k = min(n, x.shape[0])
            cand = np.argpartition(-x, k - 1)[:k]
            cand = cand[np.argsort(-x[cand], kind="stable")]
            top = [(int(i), float(x[i] - lse)) for i in cand]
        return TokenLogprob(token_id=tid, logprob=float(x[tid] - lse), top=top)
