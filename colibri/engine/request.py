"""The engine's request side: `Request` (a thread-safe queue of `Delta`s, read with `for` or
`async for`), `Delta`, `TokenLogprob`, and `_Seq`, the engine thread's state of one request."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from colibri.errors import ColibriError
from colibri.generate import _StopMatcher
from colibri.sampling import Sampler

if TYPE_CHECKING:
    from colibri.engine.core import Engine


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

