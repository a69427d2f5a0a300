"""One colibri replica on Ray Serve: a colibri.Engine behind the same `ServerState` as
`colibri serve` (the same load, prefault, grammar factory, admission and request tracking),
whose requests stream their deltas back to the ingress.

A `Job` is what the ingress sends for one prompt: the token ids (already rendered and checked
by the ingress, with the serve code), n completions, the engine's sampling arguments, the
grammar text of a structured-output constraint (compiled again here, against the same
vocabulary) and the prompt's prefix block hashes, which the router reads (routing.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("colibri")

REPORT_S = 0.25  # seconds between a replica's reports to the hub (metrics, load)


@dataclass
class Job:
    """One prompt's generation, as the ingress sends it to a replica."""

    ids: list[int]
    n: int
    kw: dict[str, Any]
    grammar: str | None = None  # llguidance grammar text (GrammarConstraint.grammar)
    logprobs: int | None = None
    prefix: list[int] = field(default_factory=list)  # block hashes of ids (engine.prefix)


@dataclass
class Final:
    """What a replica adds to a completion's last delta: the prompt tokens its prefix cache
    served, and the replica's name."""

    cached_tokens: int
    replica: str


@dataclass
class Refused:
    """A job the replica refused before generating (its own admission or argument checks):
    the error in OpenAI's shape and its status."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


class Replica:
    """The replica deployment's class (colibri.ray.deployment() wraps it): the model loads in
    the constructor, so Ray routes to a replica only once it can serve."""

    def __init__(self, model_kwargs: dict[str, Any], model_id: str, max_seqs: int = 16,
                 max_queue: int = 256, engine_kwargs: dict[str, Any] | None = None,
                 prefault: bool = True, hub: str | None = None) -> None:
        import ray

        from colibri.model import Model
        from colibri.serve.prefault import tune_malloc
        from colibri.serve.state import ServerState

        tune_malloc()
        self.state = ServerState(lambda: Model(**model_kwargs), model_id, max_seqs=max_seqs,
                                 max_queue=max_queue, engine_kwargs=engine_kwargs,
                                 prefault=prefault)
        self.state.load()
        if self.state.load_error:  # Ray retries the constructor, then marks the deployment failed
            raise RuntimeError(f"the model failed to load: {self.state.load_error}")
        ctx = ray.get_runtime_context()
        self.name = str(ctx.get_actor_name() or ctx.get_actor_id())
        self._hub_name = hub
        self._stop = threading.Event()
        self._wake = threading.Event()
        if hub is not None:  # a first report before the replica is ready: /metrics has it
            from colibri.ray.hub import connect

            ray.get(self._report_to(connect(hub)))
            threading.Thread(target=self._report, name="colibri-report", daemon=True).start()

    # ---- serving ----

    async def generate(self, job: Job) -> AsyncIterator[Any]:
        """The job's deltas as they come: (i, Delta, Final | None) with completion i's index;
        a Refused first (and alone) when the job is not taken. Cancelling the call (the
        ingress's client went away) cancels the engine requests."""
        from colibri.serve.handling import _submit
        from colibri.serve.state import APIError
        from colibri.serve.streaming import _merged

        st = self.state
        try:
            constraint = None
            if job.grammar is not None:
                if st.grammar is None:
                    raise APIError(400, f"structured output is not available with this model: "
                                   f"{st.grammar_error}", param="response_format")
                constraint = st.grammar.from_grammar(job.grammar).copy
            reqs = _submit(st, [job.ids], job.n, job.kw, constraint, job.logprobs)
        except APIError as e:
            yield Refused(e.status, e.body(), e.headers)
            return
        merged = _merged(st, reqs)
        try:
            async for i, d in merged:
                fin = None if d.finish_reason is None else \
                    Final(int(reqs[i].cached_tokens), self.name)
                yield i, d, fin
        finally:
            await merged.aclose()  # cancels what still runs
            st.prune()
            self._wake.set()  # report now

    def load(self) -> dict[str, Any]:
        """What the router and the autoscaler read: running and waiting requests, the KV
        arena's use (0..1), the prefix cache's hits."""
        eng = self.state.engine
        if eng is None or eng.closed:
            return {"running": 0, "waiting": 0, "kv_used": 0.0, "prefix_hits": 0}
        s = eng.stats()
        kv = s.get("kv") or {}
        cap = kv.get("capacity") or 0
        return {"running": int(s["running"]), "waiting": int(s["waiting"]),
                "kv_used": float(kv.get("used", 0)) / cap if cap else 0.0,
                "prefix_hits": int(s["prefix_cache"]["hits"]),
                "max_seqs": self.state.max_seqs}

    def record_routing_stats(self) -> dict[str, Any]:  # Ray Serve: the router's replica stats
        return self.load()

    def record_autoscaling_stats(self) -> dict[str, float]:  # Ray Serve: the autoscaler's
        ld = self.load()
        return {"demand": (ld["running"] + ld["waiting"]) / max(1, self.state.max_seqs),
                "kv_used": ld["kv_used"]}

    def check_health(self) -> None:  # Ray Serve: a raise marks the replica unhealthy
        eng = self.state.engine
        if eng is None or eng.closed:
            raise RuntimeError("the engine is closed")

    def info(self) -> dict[str, Any]:
        """The replica's name (its Ray actor's) and its load."""
        return {"replica": self.name, **self.load()}

    # ---- the hub (metrics for the ingress) ----

    def _report_to(self, hub: Any) -> Any:
        """Send the hub this replica's metrics and load (the call's ObjectRef)."""
        return hub.put.remote(self.name, self.state.metrics.render(), self.load())

    def _report(self) -> None:
        from colibri.ray.hub import connect

        hub = None
        while not self._stop.is_set():
            self._wake.wait(REPORT_S)
            self._wake.clear()
            try:
                self.state.prune()
                if hub is None:
                    hub = connect(self._hub_name or "")
                self._report_to(hub)
            except Exception as e:  # noqa: BLE001 - the hub comes back; serving goes on
                log.warning("colibri: report to the hub: %s", e)
                hub = None

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        st = getattr(self, "state", None)
        if st is not None:
            st.close()
