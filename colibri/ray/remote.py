"""The ingress's engine: what colibri.serve's handlers submit to (submit, submit_n) when the
engines are Ray Serve replicas. A submission is one call to the replica deployment (routed by
routing.PrefixRouter), its deltas streamed back; `RemoteRequest` reads like an engine Request
(async iteration of Deltas, finished, cancel, cached_tokens), so the request parsing,
checking, grammar and SSE assembly of colibri.serve run unchanged in the ingress.

A replica that dies before it streamed anything is retried on another (RETRIES times); one
that dies mid-stream ends its requests with finish_reason "error" and a message naming the
replica, which the serve code turns into its error event (a stream) or a 500."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from colibri.engine import Delta
from colibri.engine.prefix import PREFIX_BLOCK, _block_hashes
from colibri.ray.replica import Final, Job, Refused

log = logging.getLogger("colibri")

RETRIES = 2  # new replicas tried for a call whose replica died before its first delta
RETRY_WAIT_S = 0.5
ROUTE_BLOCKS = 64  # prefix blocks hashed for routing (64 x 16 tokens)


class _Call:
    """One job on one replica (with its retries), demultiplexed into n RemoteRequests."""

    def __init__(self, handle: Any, job: Job) -> None:
        self._handle = handle
        self.job = job
        self.reqs = [RemoteRequest(self, i) for i in range(job.n)]
        self._task: asyncio.Task[None] | None = None
        self._gen: Any = None
        self.replica: str | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump())

    def _end_all(self, reason: str, error: str | None) -> None:
        for r in self.reqs:
            if not r.finished:
                r._push(Delta(finish_reason=reason, error=error))

    async def _pump(self) -> None:
        from ray.exceptions import ActorUnavailableError, RayActorError

        for attempt in range(RETRIES + 1):
            streamed = False
            try:
                self._gen = self._handle.options(stream=True).generate.remote(self.job)
                async for item in self._gen:
                    if isinstance(item, Refused):
                        err = item.body.get("error", {})
                        self._end_all("error", f"{err.get('message')} ({item.status})")
                        return
                    streamed = True
                    i, d, fin = item
                    if isinstance(fin, Final):
                        self.reqs[i].cached_tokens = fin.cached_tokens
                        self.replica = fin.replica
                    self.reqs[i]._push(d)
                self._end_all("error", "the replica ended the stream early")
                return
            except asyncio.CancelledError:
                raise
            except (RayActorError, ActorUnavailableError) as e:
                if streamed or attempt == RETRIES:
                    log.warning("a replica died serving a request: %s", e)
                    self._end_all("error", "the replica serving this request died "
                                  f"({type(e).__name__}); the other replicas go on serving")
                    return
                log.info("a replica died before answering; retrying on another: %s", e)
                await asyncio.sleep(RETRY_WAIT_S)
            except Exception as e:  # noqa: BLE001 - reported as the requests' error
                self._end_all("error", f"{type(e).__name__}: {e}")
                return

    def cancel(self) -> None:
        """Cancel the call on its replica (its engine requests end there); every request of it
        not yet finished ends with finish_reason "cancelled"."""
        if self._gen is not None:
            self._gen.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._end_all("cancelled", None)


class RemoteRequest:
    """Completion i of a call, read as an engine Request is by colibri.serve."""

    def __init__(self, call: _Call, index: int) -> None:
        self._call = call
        self._index = index
        self._q: asyncio.Queue[Delta] = asyncio.Queue()
        self.finished = False
        self.finish_reason: str | None = None
        self.cached_tokens = 0

    def _push(self, d: Delta) -> None:
        if self.finished:
            return
        if d.finish_reason is not None:
            self.finished, self.finish_reason = True, d.finish_reason
        self._q.put_nowait(d)

    @property
    def replica(self) -> str | None:
        """The name of the replica that served it (known once it finished)."""
        return self._call.replica

    def cancel(self) -> None:
        self._call.cancel()

    def stats(self) -> dict[str, Any]:
        return {}  # the replica that ran it counts it in its own metrics

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Delta]:
        self._call.start()
        while True:
            d = await self._q.get()
            yield d
            if d.finish_reason is not None:
                return


class RemoteEngine:
    """submit/submit_n as colibri.Engine's (token-id prompts; the serve code renders and
    tokenizes), each call sent to the replica deployment behind handle."""

    def __init__(self, handle: Any, n_vocab: int, max_seqs: int) -> None:
        self._handle = handle
        self.n_vocab = int(n_vocab)
        self.max_seqs = int(max_seqs)
        self.closed = False

    def _job(self, prompt: Sequence[int], n: int, logprobs: int | None, constraint: Any,
             sampling: dict[str, Any]) -> Job:
        from colibri.inputs import token_ids
        from colibri.sampling import SamplingParams

        if self.closed:
            from colibri.errors import ColibriError

            raise ColibriError("this Engine is closed")
        ids = token_ids(prompt, self.n_vocab, "prompt")
        if not ids:
            raise ValueError("the prompt has no tokens")
        # the engine's argument checks, here, so that a bad request is a 400 before any call
        SamplingParams(**{k: sampling[k] for k in ("temperature", "top_k", "top_p", "min_p",
                                                   "seed", "presence_penalty",
                                                   "frequency_penalty", "logit_bias")
                          if k in sampling},
                       repeat_penalty=sampling.get("repetition_penalty", 1.0)).validate()
        grammar = None
        if constraint is not None:
            grammar = getattr(constraint, "grammar", None)
            if not grammar:
                raise ValueError("constraint: a remote engine takes grammar constraints only "
                                 "(colibri.serve.grammar)")
        return Job(ids=ids, n=n, kw=dict(sampling), grammar=grammar, logprobs=logprobs,
                   prefix=_block_hashes(ids, min(len(ids) // PREFIX_BLOCK, ROUTE_BLOCKS)))

    def submit(self, prompt: Sequence[int], *, logprobs: int | None = None,
               constraint: Any = None, **sampling: Any) -> RemoteRequest:
        return _Call(self._handle, self._job(prompt, 1, logprobs, constraint, sampling)).reqs[0]

    def submit_n(self, prompt: Sequence[int], n: int, *, logprobs: int | None = None,
                 **sampling: Any) -> list[RemoteRequest]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        return _Call(self._handle, self._job(prompt, n, logprobs, None, sampling)).reqs

    def close(self) -> None:
        self.closed = True
