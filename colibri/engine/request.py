"""The engine's request side: `Request` (a thread-safe queue of `Delta`s, read with `for` or
`async for`; the caller's handle on a `_Stream`, the state the engine holds), `Delta`,
`TokenLogprob`, and `_Seq`, the engine thread's state of one request."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from colibri.errors import ColibriError
from colibri.generate import _StopMatcher
from colibri.sampling import Sampler


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


class _Stream:
    """The shared state of one request: its queue of Deltas, its statistics and its
    cancellation. The engine (its _Seq, its statistics by id) holds this, never the Request
    its caller holds, so that a Request the caller dropped is collected and its finalizer
    cancels the generation."""

    def __init__(self, rid: int, engine_cv: threading.Condition) -> None:
        self.id = rid
        self._engine_cv = engine_cv  # to wake the engine thread (not the Engine: no cycle)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._items: collections.deque[Delta] = collections.deque()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._ended = False      # the final delta was pushed
        self._consumed = False   # the final delta was read
        self._admitted = False   # holds a KV sequence (set by the engine thread, under _lock)
        self.cancel_requested = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.t_submit = time.perf_counter()
        self.ttft_s: float | None = None
        self.itl_s: list[float] = []
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.preemptions = 0
        # prompt tokens whose KV was copied from the prefix cache (or a running request) when
        # it was admitted, not prefilled (its latest admission, after a preemption)
        self.cached_tokens = 0

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

    def _try_admit(self) -> bool:
        """The engine thread is about to give this request a KV sequence: False (and nothing
        changes) when it was cancelled meanwhile."""
        with self._lock:
            if self.cancel_requested or self._ended:
                return False
            self._admitted = True
            return True

    def _unadmit(self) -> None:
        """Back in the queue without KV (preempted, or its admission undone)."""
        with self._lock:
            self._admitted = False

    @property
    def finished(self) -> bool:
        return self._ended

    # ---- cancellation ----

    def cancel(self) -> None:
        with self._lock:
            self.cancel_requested = True
            queued = not self._admitted
        if queued:  # no KV, not in any step: it ends now, and the engine never admits it
            self._push(Delta(finish_reason="cancelled"))
        self._wake_engine()

    def _abandon(self) -> None:
        """The Request was collected unfinished (its caller dropped it): cancel. A finalizer
        may run inside a garbage collection on any thread, the engine's included, so it takes
        no lock of this stream; the engine ends the request within one step."""
        if not self._ended:
            self.cancel_requested = True
            self._wake_engine()

    def _wake_engine(self) -> None:
        with self._engine_cv:
            self._engine_cv.notify_all()

    # ---- consumer side ----

    def _next(self) -> Delta:
        with self._cond:
            while not self._items:
                if self._consumed:
                    raise StopIteration
                self._cond.wait()
            d = self._items.popleft()
            if d.finish_reason is not None:
                self._consumed = True
            return d

    async def _anext(self) -> Delta:
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


class Request:
    """One submitted generation: an iterator (and async iterator) of Deltas, the last one
    carrying finish_reason. Thread-safe; read it from one consumer.

    Abandoning a request cancels it: a Request its caller no longer references (a `for` loop
    left with break and nothing else holding it) is collected and its generation cancelled
    within one engine step, and so is one whose `async for` is interrupted by the cancellation
    of its asyncio task. Keep a reference to a request that should run on unread."""

    def __init__(self, stream: _Stream) -> None:
        self._s = stream
        fin = weakref.finalize(self, stream._abandon)
        fin.atexit = False  # at interpreter exit the engine thread is gone or going

    @property
    def id(self) -> int:
        return self._s.id

    @property
    def finished(self) -> bool:
        """The final delta was pushed (it may not have been read yet)."""
        return self._s.finished

    @property
    def finish_reason(self) -> str | None:
        return self._s.finish_reason

    @property
    def error(self) -> str | None:
        return self._s.error

    @property
    def cancel_requested(self) -> bool:
        return self._s.cancel_requested

    @property
    def t_submit(self) -> float:
        return self._s.t_submit

    @property
    def ttft_s(self) -> float | None:
        return self._s.ttft_s

    @property
    def itl_s(self) -> list[float]:
        return self._s.itl_s

    @property
    def prompt_tokens(self) -> int:
        return self._s.prompt_tokens

    @property
    def generated_tokens(self) -> int:
        return self._s.generated_tokens

    @property
    def preemptions(self) -> int:
        return self._s.preemptions

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV the engine copied from its prefix cache (a finished or
        running request's) instead of prefilling them (0 until the request is admitted; a
        preempted request counts its latest admission). OpenAI's
        usage.prompt_tokens_details.cached_tokens."""
        return self._s.cached_tokens

    def cancel(self) -> None:
        """Stop this request (unless it had already finished): its stream ends with
        finish_reason "cancelled" - at once when it is still queued (it never takes a place
        or KV), else within one engine step, which frees its KV."""
        self._s.cancel()

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        return self._s._next()

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        try:
            return await self._s._anext()
        except asyncio.CancelledError:  # the task reading this request was cancelled
            self._s.cancel()
            raise

    def text(self) -> str:
        """Read the rest of the stream and return its text; ColibriError if it ended in an
        error."""
        parts = [d.text for d in self]
        if self.finish_reason == "error":
            raise ColibriError(f"request {self.id} failed: {self.error}")
        return "".join(parts)

    def stats(self) -> dict[str, Any]:
        return self._s.stats()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(eq=False)  # identity: compared and removed from lists as objects
class _Seq:
    """Engine-thread state of one request."""

    req: _Stream                  # the request's state (never the Request: see _Stream)
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
    copied: int = 0               # tokens of KV copied from the prefix cache at admission
    # recurrent-state models: the state after n tokens of the prompt, taken at the prefill
    # chunks' ends (block boundaries), for the prefix cache (engine.prefix.STATE_SNAPS_MAX)
    snaps: dict[int, bytes] = field(default_factory=dict)

    def kv_tokens(self) -> list[int]:
        return self.tokens()

    def tokens(self) -> list[int]:
        return self.prompt + self.out

    def n_tokens(self) -> int:
        return len(self.prompt) + len(self.out)

    def decoding(self) -> bool:
        return bool(self.out) and self.n_kv == self.n_tokens() - 1

