"""`colibri.Engine`: many requests at once on one Model (continuous batching).

One background thread runs steps. A step is one forward batch (one `Model.eval`) holding one
decode token of every running sequence (decode tokens go first) and, with what is left of
`max_batch`, at most `prefill_chunk` tokens of waiting prompts (chunked prefill). Requests join
and leave between steps.

Memory: every sequence's KV is reserved before the step runs (`KVCache.reserve`); a
`MemoryError` there means the arena is full, and the youngest admitted request is preempted:
its KV is freed and it goes back to the waiting queue, to recompute its prompt and the tokens it
generated so far when memory allows (its caller sees only latency; its sampler keeps its random
state). Older requests are never failed for memory and the oldest always progresses, so the
engine cannot deadlock: a sequence alone always fits (prompts longer than the context fail at
submission, and a sequence stops at the context).

Prefix reuse: the KV of running and finished requests is indexed by chained hashes of
PREFIX_BLOCK-token blocks of their tokens; finished requests' KV stays in the arena as a cache
(least recently used first out) while nothing else needs the room. A new request whose tokens
start with a cached or running sequence's copies those K/V rows (`KVCache.copy_prefix`) and
prefills only the rest; a request whose prompt shares more with a request still prefilling waits
for that prefill (so n submissions of one prompt, `submit_n`, prefill it once). The cache never
fails a request: a reserve or an admission that does not fit evicts cached sequences before
anything is preempted.

Threads: callers submit from any thread or event loop; only the engine thread touches the
model's sequences. A Request is a thread-safe queue of Deltas, read with `for` (blocking) or
`async for` (woken through `loop.call_soon_threadsafe`, never blocking the event loop).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.errors import ColibriError
from colibri.generate import _StopMatcher, render_chat, stop_token_ids
from colibri.sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from colibri.model import Model

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

FINISHED_KEEP = 1024  # per-request statistics kept for finished requests

PREFIX_BLOCK = 16      # tokens per hashed block of the prefix index
PREFIX_CACHE_MAX = 256  # most finished sequences kept as prefix cache


def _block_hashes(tokens: Sequence[int], n_blocks: int, start: int = 0,
                  prev: int = 0) -> list[int]:
    """Chained hashes of blocks [start, n_blocks) of tokens (prev: the hash of block
    start - 1, 0 for none): block i's hash covers tokens [0, (i + 1) * PREFIX_BLOCK)."""
    out: list[int] = []
    h = prev
    for i in range(start, n_blocks):
        h = hash((h, tuple(tokens[i * PREFIX_BLOCK:(i + 1) * PREFIX_BLOCK])))
        out.append(h)
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most limit."""
    n = min(len(a), len(b), limit)
    i = 0
    while i + 64 <= n and a[i:i + 64] == b[i:i + 64]:
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)
class _Cached:
    """A finished request's KV kept as prefix cache: tokens[:n_kv] are in sequence seq."""

    seq: int
    tokens: list[int]
    n_kv: int
    hashes: list[int] = field(default_factory=list)

    def kv_tokens(self) -> list[int]:
        return self.tokens


@dataclass
class TokenLogprob:
    """A generated token's log-probability under the model (log-softmax of its logits, before
    any sampling transform) and the `top` most likely tokens as (token id, logprob)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Delta:
    """A piece of a request's output. `text` is always whole UTF-8 characters (it may be empty
    while a character or a possible stop string is held back); `token_ids` are the tokens this
    delta adds; `logprobs` (when asked) one entry per token id. The last delta has
    `finish_reason`: "stop" (an end-of-generation token, a stop token id or a stop string),
    "length" (max_tokens or the context), "cancelled" or "error" (with `error`)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    error: str | None = None


class Request:
    """One submitted generation: an iterator (and async iterator) of Deltas, the last one
    carrying finish_reason. Thread-safe; read it from one consumer."""

    def __init__(self, engine: Engine, rid: int) -> None:
        self.id = rid
        self._engine = engine
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._items: collections.deque[Delta] = collections.deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._ended = False      # the final delta was pushed
        self._consumed = False   # the final delta was read
        self.cancel_requested = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.t_submit = time.perf_counter()
        self.ttft_s: float | None = None
        self.itl_s: list[float] = []
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.preemptions = 0
        self.cached_tokens = 0  # prompt tokens whose KV was copied from the prefix cache

    # ---- producer side (the engine) ----

    def _push(self, delta: Delta) -> None:
        with self._lock:
            if self._ended:
                return
            if delta.finish_reason is not None:
                self._ended = True
                self.finish_reason = delta.finish_reason
                self.error = delta.error
            self._items.append(delta)
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    @property
    def finished(self) -> bool:
        return self._ended

    # ---- consumer side ----

    def cancel(self) -> None:
        """Stop this request: its KV is freed within one engine step and its stream ends with
        finish_reason "cancelled" (unless it had already finished)."""
        self.cancel_requested = True
        self._engine._wake()

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        with self._cond:
            while not self._items:
                if self._consumed:
                    raise StopIteration
                self._cond.wait()
            d = self._items.popleft()
            if d.finish_reason is not None:
                self._consumed = True
            return d

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._items:
                    d = self._items.popleft()
                    if d.finish_reason is not None:
                        self._consumed = True
                    return d
                if self._consumed:
                    raise StopAsyncIteration
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    def text(self) -> str:
        """Read the rest of the stream and return its text; ColibriError if it ended in an
        error."""
        parts = [d.text for d in self]
        if self.finish_reason == "error":
            raise ColibriError(f"request {self.id} failed: {self.error}")
        return "".join(parts)

    def stats(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_s": self.ttft_s,
            "itl_s": list(self.itl_s),
            "preemptions": self.preemptions,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
        }


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(eq=False)  # identity: compared and removed from lists as objects
class _Seq:
    """Engine-thread state of one request."""

    req: Request
    order: int                    # arrival order: larger = younger
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    stops: set[int]               # end-of-generation and stop token ids
    matcher: _StopMatcher
    decoder: Any
    logprobs: int | None
    constraint: Any = None        # a grammar: Engine.submit(constraint=...)
    out: list[int] = field(default_factory=list)
    seq: int | None = None        # KV sequence id while admitted
    n_kv: int = 0                 # tokens of prompt + out in the KV cache
    t_last: float = 0.0
    hashes: list[int] = field(default_factory=list)  # prefix-index blocks registered

    def kv_tokens(self) -> list[int]:
        return self.tokens()

    def tokens(self) -> list[int]:
        return self.prompt + self.out

    def n_tokens(self) -> int:
        return len(self.prompt) + len(self.out)

    def decoding(self) -> bool:
        return bool(self.out) and self.n_kv == self.n_tokens() - 1


class Engine:
    """Continuous batching on one Model: Engine(model, max_seqs=16, max_batch=None,
    prefill_chunk=None, prefix_cache=True).

    - max_seqs: most requests admitted (holding KV) at once, at most max_batch; more wait in
      a queue.
    - max_batch: tokens per step (default: model.max_batch).
    - prefill_chunk: most prompt tokens per step; None (default): adaptive, sized from the
      measured step times so a step with a chunk costs at most CHUNK_STEP_RATIO decode-only
      steps while requests decode (that ratio times 1 + waiting / decoding requests;
      MIN_PREFILL_CHUNK..max_batch), SOLO_PREFILL_CHUNK when nothing decodes.
    - prefix_cache: reuse the KV of prompt prefixes that running or finished requests hold,
      and keep finished requests' KV while the arena has room (False: free it at once).

    submit(prompt | token ids | messages, **sampling) -> Request; submit_n(prompt, n,
    **sampling) -> [Request] (n completions of one prompt, prefilled once; seeds seed, seed + 1,
    ...); submit_async (the same as submit, to read with `async for`); generate([prompts],
    **sampling) -> [str]; stats(); close() (also
    `with Engine(model) as engine:`). The engine owns its model's sequences while it runs:
    other use of the same Model (generate, eval) still works but shares the KV cache.
    """

    def __init__(self, model: Model, max_seqs: int = 16, max_batch: int | None = None,
                 prefill_chunk: int | None = None, prefix_cache: bool = True) -> None:
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
        self._n_waiting = 0
        self._requests: collections.OrderedDict[int, Request] = collections.OrderedDict()
        # prefix cache (engine thread; counters read under _cv)
        self.prefix_cache = bool(prefix_cache)
        self._index: dict[int, dict[_Seq | _Cached, None]] = {}  # block hash -> owners
        self._cache: collections.OrderedDict[int, _Cached] = collections.OrderedDict()  # LRU
        self._pc_hits = 0
        self._pc_tokens_saved = 0
        self._pc_evictions = 0
        self._pc_tokens = 0  # tokens held by cached sequences
        # step-time model for the adaptive chunk (engine thread): decode-only step seconds and
        # the marginal seconds per prompt token, exponential moving averages (None: unmeasured)
        self._t_decode: float | None = None
        self._t_prompt_tok: float | None = None
        self._last_chunk = self.prefill_chunk  # the chunk limit of the latest step (stats)
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
        from colibri.model import as_text, token_ids

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
                req = Request(self, next(self._ids))
                req.prompt_tokens = len(ids)
                self._requests[req.id] = req
                reqs.append(req)
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
                "waiting": self._n_waiting + len(self._incoming),
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

    def _publish(self) -> None:
        with self._cv:
            self._n_running = len(self._running)
            self._n_waiting = len(self._waiting)

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
        s.req.preemptions += 1
        with self._cv:
            self._preemptions += 1
        bisect.insort(self._waiting, s, key=lambda x: x.order)

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

    # ---- prefix cache (engine thread) ----

    def _lookup(self, s: _Seq) -> tuple[_Seq | _Cached | None, int]:
        """The running or cached sequence holding the longest prefix of s's tokens (but its
        last: that one's logits are needed) and how many tokens of it to copy."""
        if not self.prefix_cache or not self._index:
            return None, 0
        toks = s.tokens()
        limit = len(toks) - 1
        best: _Seq | _Cached | None = None
        h = 0
        for i in range(limit // PREFIX_BLOCK):
            h = _block_hashes(toks, i + 1, i, h)[0]
            owners = self._index.get(h)
            if not owners:
                break
            best = next(iter(owners))
        if best is None:
            return None, 0
        n = _common_prefix(toks, best.kv_tokens(), min(limit, best.n_kv))  # hashes may collide
        return (best, n) if n >= PREFIX_BLOCK else (None, 0)

    def _shares_pending(self, s: _Seq) -> bool:
        """Whether a running request still prefilling will hold at least a block more of s's
        prompt than the index holds now (s then waits for it rather than recompute it)."""
        if not self.prefix_cache:
            return False
        toks = s.tokens()
        have = -1
        for x in self._running:
            if x.decoding() or x.n_kv >= len(x.prompt):
                continue
            c = _common_prefix(toks, x.prompt, len(toks) - 1)
            if c >= PREFIX_BLOCK and x.n_kv + PREFIX_BLOCK <= c:
                if have < 0:
                    have = self._lookup(s)[1]
                if c >= have + PREFIX_BLOCK:
                    return True
        return False

    def _index_add(self, owner: _Seq | _Cached, hashes: list[int]) -> None:
        for h in hashes:
            self._index.setdefault(h, {})[owner] = None
        owner.hashes.extend(hashes)

    def _unindex(self, owner: _Seq | _Cached) -> None:
        for h in owner.hashes:
            owners = self._index.get(h)
            if owners is not None:
                owners.pop(owner, None)
                if not owners:
                    del self._index[h]
        owner.hashes = []

    def _index_running(self, s: _Seq) -> None:
        """Index the blocks of s whose KV is now complete."""
        if not self.prefix_cache:
            return
        n = s.n_kv // PREFIX_BLOCK
        k = len(s.hashes)
        if n > k:
            self._index_add(s, _block_hashes(s.tokens(), n, k, s.hashes[-1] if k else 0))

    def _to_cache(self, s: _Seq) -> None:
        """Move finished s's sequence into the cache (s.seq becomes None)."""
        assert s.seq is not None
        c = _Cached(seq=s.seq, tokens=s.tokens()[: s.n_kv], n_kv=s.n_kv)
        self._index_add(c, _block_hashes(c.tokens, c.n_kv // PREFIX_BLOCK))
        self._cache[c.seq] = c
        s.seq = None
        with self._cv:
            self._pc_tokens += c.n_kv
        while len(self._cache) > PREFIX_CACHE_MAX:
            self._evict_one()

    def _evict(self, c: _Cached) -> None:
        self._unindex(c)
        del self._cache[c.seq]
        try:
            if not self.model.closed:
                self.model.free_sequence(c.seq)
        except Exception:  # the KV is gone with its model
            log.exception("engine: freeing a cached sequence failed")
        with self._cv:
            self._pc_tokens -= c.n_kv
            self._pc_evictions += 1

    def _evict_one(self, keep: _Cached | None = None) -> bool:
        """Evict the least recently used cached sequence other than keep; False if none."""
        for c in self._cache.values():
            if c is not keep:
                self._evict(c)
                return True
        return False

    def _clear_cache(self) -> None:
        while self._cache:
            self._evict(next(iter(self._cache.values())))
        self._index.clear()

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


__all__ = ["DEFAULT_PREFILL_CHUNK", "Delta", "Engine", "Request", "TokenLogprob"]
