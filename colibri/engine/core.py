"""`Engine`: its construction, the public API (submit, submit_n, submit_async, generate, stats,
close) and the engine thread's start; the scheduling, prefix cache and output halves are its
bases (colibri.engine.scheduler, .prefix, .output)."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.engine.prefix import PREFIX_BLOCK, _Cached
from colibri.engine.request import Delta, Request, _Seq, _Stream
from colibri.engine.scheduler import DEFAULT_PREFILL_CHUNK, _Scheduler, _StepTime
from colibri.errors import ColibriError
from colibri.generate import _StopMatcher, render_chat, stop_token_ids
from colibri.sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from colibri.model import Model

FINISHED_KEEP = 1024  # per-request statistics kept for finished requests
PAGE = 4096  # bytes of the smallest memory page (prefault_arena touches one byte of each)


def prefault_arena(arena: Any) -> int:
    """Touch every page of the arena's free room (allocated in its largest free runs, written
    one byte a page, freed again; the pages stay resident). Returns the bytes touched."""
    blocks: list[int] = []
    total = 0
    try:
        while True:
            n = int(arena.stats()["largest_free"])
            if n < PAGE:
                break
            try:
                off = arena.alloc(n)
            except MemoryError:  # taken meanwhile by another user of the model
                break
            blocks.append(off)
            view = np.frombuffer(arena.view(off, n), dtype=np.uint8)
            view[::PAGE] = 0
            view[-1] = 0  # a block need not end on a page boundary
            del view
            total += n
    finally:
        for off in blocks:
            arena.free(off)
    return total


class Engine(_Scheduler):
    """Continuous batching on one Model: Engine(model, max_seqs=16, max_batch=None,
    prefill_chunk=None, prefix_cache=True).

    - max_seqs: most requests admitted (holding KV) at once, at most max_batch; more wait in
      a queue.
    - max_batch: tokens per step (default: model.max_batch).
    - prefill_chunk: most prompt tokens per step; None (default): adaptive, sized from a fit
      of the measured step times so a step with a chunk costs at most CHUNK_STEP_RATIO
      decode-only steps while requests decode (that ratio times 1 + waiting / decoding
      requests; MIN_PREFILL_CHUNK..max_batch); a burst (nothing decoding, or more requests
      waiting for their prompt than decoding since before they came) is read in whole
      steps of up to SOLO_PREFILL_CHUNK tokens.
    - prefix_cache: reuse the KV of prompt prefixes that running or finished requests hold,
      and keep finished requests' KV while the arena has room (False: free it at once).
    - prefault_kv: touch every free page of the model's KV arena once, here (what llama.cpp
      does when it clears its KV buffer), so that a block growing into fresh pages during a
      step does not pay their first-touch faults (20 ms for a 200-token sequence of Gemma 3
      270M); the process's resident memory then includes the whole KV cache.

    submit(prompt | token ids | messages, **sampling) -> Request; submit_n(prompt, n,
    **sampling) -> [Request] (n completions of one prompt, prefilled once; seeds seed, seed + 1,
    ...); submit_async (the same as submit, to read with `async for`); generate([prompts],
    **sampling) -> [str]; stats(); close() (also
    `with Engine(model) as engine:`). The engine owns its model's sequences while it runs:
    other use of the same Model (generate, eval) still works but shares the KV cache.
    """

    def __init__(self, model: Model, max_seqs: int = 16, max_batch: int | None = None,
                 prefill_chunk: int | None = None, prefix_cache: bool = True,
                 prefault_kv: bool = True) -> None:
        if model.closed:
            raise ColibriError("Engine: the model is closed")
        self.model = model
        self.max_batch = int(model.max_batch if max_batch is None else max_batch)
        self.max_seqs = int(max_seqs)
        self.adaptive_chunk = prefill_chunk is None
        self.prefill_chunk = int(DEFAULT_PREFILL_CHUNK if prefill_chunk is None else prefill_chunk)
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_seqs < 1:
            raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
        # every running sequence decodes in every step: no more of them than tokens in a step
        self.max_seqs = min(self.max_seqs, self.max_batch)
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        self._eog = stop_token_ids(model)
        self._stride = int(model.kv.token_stride)
        # recurrent-state models: prefill chunks end on prefix blocks (state snapshots)
        self._align = PREFIX_BLOCK if model.kv.state_bytes else 1
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._incoming: list[_Seq] = []   # guarded by _cv
        self._closing = False             # guarded by _cv
        self._closed = False
        # engine thread only
        self._running: list[_Seq] = []    # admitted (hold a KV sequence), oldest first
        self._waiting: list[_Seq] = []    # not admitted, oldest first (preempted ones rejoin)
        # statistics (read under _cv by stats())
        self._n_steps = 0
        self._n_step_tokens = 0
        self._last_step_tokens = 0
        self._last_step_s = 0.0
        self._preemptions = 0
        self._n_running = 0
        self._queued: list[_Stream] = []  # the waiting requests, as of the latest step
        # per-request statistics by id: the streams, never the Requests (a Request its caller
        # drops is collected, and cancelled)
        self._requests: collections.OrderedDict[int, _Stream] = collections.OrderedDict()
        # prefix cache (engine thread; counters read under _cv)
        self.prefix_cache = bool(prefix_cache)
        self._index: dict[int, dict[_Seq | _Cached, None]] = {}  # block hash -> owners
        self._cache: collections.OrderedDict[int, _Cached] = collections.OrderedDict()  # LRU
        self._pc_hits = 0
        self._pc_tokens_saved = 0
        self._pc_evictions = 0
        self._pc_tokens = 0  # tokens held by cached sequences
        # step-time model for the adaptive chunk (engine thread)
        self._steptime = _StepTime()
        self._last_chunk = self.prefill_chunk  # the chunk limit of the latest step (stats)
        if prefault_kv:
            prefault_arena(model.arena)
        self._thread = threading.Thread(target=self._loop, name="colibri-engine", daemon=True)
        self._thread.start()

    # ---- public API ----

    def submit(self, prompt: str | bytes | Sequence[int] | Sequence[dict[str, Any]], *,
               max_tokens: int = 128, temperature: float = 0.8, top_k: int = 40,
               top_p: float = 0.95, min_p: float = 0.05, repetition_penalty: float = 1.0,
               repeat_last_n: int = 64, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, seed: int | None = None,
               stop: str | Sequence[str] | None = None,
               stop_token_ids: Sequence[int] | None = None,
               logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
               add_special: bool = True, parse_special: bool = False,
               constraint: Any = None) -> Request:
        """Queue a generation and return its Request (an iterator of Deltas). prompt: text,
        token ids, or chat messages ([{"role": ..., "content": ...}], rendered with the model's
        chat template). Sampling is Model.stream's (temperature=0 is greedy) plus OpenAI-style
        presence/frequency penalties, logit_bias {token id: bias}, extra stop_token_ids, and
        logprobs=n (each token's logprob with the n most likely alternatives). A seed makes a
        request's sampling reproducible whatever else runs (each request owns its generator).
        Bad arguments raise here; a prompt longer than the context ends the request at once
        with finish_reason "error". For several completions of one prompt, see submit_n.

        constraint (structured output; colibri.serve.grammar): an object owned by this request,
        called on the engine thread: mask(logits) -> the logits with every token it does not
        allow at -inf (a copy), before the sampler; advance(token_id) after each sampled token
        (an end-of-generation token ends the request first; raising fails the request);
        finished() -> True once nothing more may follow, which ends the request with
        finish_reason "stop"."""
        return self._submit(
            prompt, 1, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            min_p=min_p, repetition_penalty=repetition_penalty, repeat_last_n=repeat_last_n,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, seed=seed,
            stop=stop, stop_token_ids=stop_token_ids, logit_bias=logit_bias, logprobs=logprobs,
            add_special=add_special, parse_special=parse_special, constraint=constraint)[0]

    def submit_n(self, prompt: str | bytes | Sequence[int] | Sequence[dict[str, Any]], n: int,
                 **sampling: Any) -> list[Request]:
        """n completions of one prompt (OpenAI's `n`): n Requests, in order, each with submit's
        sampling arguments (**sampling). They are queued together and the prompt is prefilled
        once: the first request computes it and the others copy its KV (prefix reuse), each
        then evaluating only the prompt's last token. With a seed, completion i samples with
        seed + i, so completions differ and each equals submit(prompt, seed=seed + i, ...);
        without one each draws fresh entropy. Greedy completions (temperature=0) are all the
        same text. The prompt is tokenized and checked once; a prompt longer than the context
        ends all n with "error"."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        return self._submit(prompt, int(n), **sampling)

    def _submit(self, prompt: str | bytes | Sequence[int] | Sequence[dict[str, Any]], n: int, *,
                max_tokens: int = 128, temperature: float = 0.8, top_k: int = 40,
                top_p: float = 0.95, min_p: float = 0.05, repetition_penalty: float = 1.0,
                repeat_last_n: int = 64, presence_penalty: float = 0.0,
                frequency_penalty: float = 0.0, seed: int | None = None,
                stop: str | Sequence[str] | None = None,
                stop_token_ids: Sequence[int] | None = None,
                logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
                add_special: bool = True, parse_special: bool = False,
                constraint: Any = None) -> list[Request]:
        from colibri.inputs import as_text, token_ids

        if constraint is not None and (n != 1 or not all(
                callable(getattr(constraint, a, None)) for a in ("mask", "advance", "finished"))):
            raise ValueError("constraint: one object with mask(logits), advance(token_id) and "
                             "finished() per request (submit, not submit_n)")

        m = self.model
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repetition_penalty, repeat_last_n=repeat_last_n,
                                seed=seed, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, logit_bias=logit_bias)
        params.validate()
        if params.logit_bias:
            bad = [k for k in params.logit_bias if k >= m.n_vocab]
            if bad:
                raise ValueError(f"logit_bias: token id {bad[0]} is out of the vocabulary "
                                 f"[0, {m.n_vocab})")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | np.integer) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, got {logprobs!r}")
        stops: list[str]
        if stop is None:
            stops = []
        elif isinstance(stop, str):
            stops = [stop]
        else:
            stops = list(stop)
            if not all(isinstance(x, str) for x in stops):
                raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
        extra = token_ids(stop_token_ids or [], m.n_vocab, "stop_token_ids")
        tok = m._tok()
        if isinstance(prompt, str | bytes | bytearray):
            ids = m.tokenize(as_text(prompt), add_special=add_special, parse_special=parse_special)
        elif len(prompt) > 0 and all(isinstance(x, dict) for x in prompt):
            text = render_chat(m, prompt)  # type: ignore[arg-type]
            ids = m.tokenize(text, add_special=False, parse_special=True)
        else:
            ids = token_ids(prompt, m.n_vocab, "prompt")
        if not ids:
            raise ValueError("the prompt has no tokens")
        with self._cv:
            if self._closing:
                raise ColibriError("this Engine is closed")
            reqs: list[Request] = []
            for i in range(n):
                req = _Stream(next(self._ids), self._cv)
                req.prompt_tokens = len(ids)
                self._requests[req.id] = req
                reqs.append(Request(req))
                if len(ids) + (1 if max_tokens else 0) > m.ctx:
                    req._push(Delta(finish_reason="error", error=(
                        f"context full: the prompt has {len(ids)} tokens and the KV cache holds "
                        f"{m.ctx} (Model(ctx=...) or COLIBRI_KV_CACHE_SIZE)")))
                    continue
                if max_tokens == 0:
                    req._push(Delta(finish_reason="length"))
                    continue
                p_i = params if params.seed is None or i == 0 else \
                    dataclasses.replace(params, seed=params.seed + i)
                s = _Seq(req=req, order=req.id, prompt=ids, max_tokens=int(max_tokens),
                         sampler=Sampler(p_i), stops=self._eog | set(extra),
                         matcher=_StopMatcher(stops), decoder=tok.stream(), logprobs=logprobs,
                         constraint=constraint)
                self._incoming.append(s)
            self._trim_requests()
            self._cv.notify_all()
        return reqs

    def submit_async(self, prompt: str | bytes | Sequence[int] | Sequence[dict[str, Any]],
                     **sampling: Any) -> Request:
        """submit() for asyncio: `async for delta in engine.submit_async(...)`. Submitting only
        queues (and tokenizes); the forward passes run on the engine thread."""
        return self.submit(prompt, **sampling)

    def generate(self, prompts: Sequence[str | Sequence[int]], **sampling: Any) -> list[str]:
        """Run every prompt concurrently and return their texts in order (ColibriError naming
        the first request that failed)."""
        reqs = [self.submit(p, **sampling) for p in prompts]
        try:
            return [r.text() for r in reqs]
        finally:
            for r in reqs:
                if not r.finished:
                    r.cancel()

    def stats(self) -> dict[str, Any]:
        """running, waiting, steps, tokens_per_step (mean), last_step_tokens, last_step_s,
        preemptions; prefix_cache: hits (requests that reused a prefix), tokens_saved (prompt
        tokens not prefilled), cached_sequences, cached_tokens, evictions; kv: the arena's
        capacity, used, free and largest_free bytes; and per request (by id): prompt_tokens,
        generated_tokens, ttft_s, itl_s (inter-token latencies), preemptions, cached_tokens,
        finish_reason."""
        kv: dict[str, int] = {}
        try:
            a = self.model.arena.stats()
            kv = {k: int(a[k]) for k in ("capacity", "used", "free", "largest_free")}
        except Exception:  # a closed model: no arena to describe
            pass
        with self._cv:
            return {
                "prefix_cache": {
                    "hits": self._pc_hits,
                    "tokens_saved": self._pc_tokens_saved,
                    "cached_sequences": len(self._cache),
                    "cached_tokens": self._pc_tokens,
                    "evictions": self._pc_evictions,
                },
                "kv": kv,
                "running": self._n_running,
                # a request cancelled while queued has ended though the engine thread has not
                # yet taken it out of its queue
                "waiting": sum(not r.finished for r in self._queued)
                + sum(not s.req.finished for s in self._incoming),
                "steps": self._n_steps,
                "tokens_per_step": self._n_step_tokens / self._n_steps if self._n_steps else 0.0,
                "last_step_tokens": self._last_step_tokens,
                "last_step_s": self._last_step_s,
                "preemptions": self._preemptions,
                "prefill_chunk": self._last_chunk,
                "requests": {rid: r.stats() for rid, r in self._requests.items()},
            }

    def close(self) -> None:
        """Cancel every outstanding request (finish_reason "cancelled"), free their KV and join
        the engine thread. Idempotent."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- engine thread ----

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _trim_requests(self) -> None:
        finished = [rid for rid, r in self._requests.items() if r.finished]
        for rid in finished[: max(0, len(finished) - FINISHED_KEEP)]:
            del self._requests[rid]
