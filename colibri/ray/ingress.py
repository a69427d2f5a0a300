"""The ingress: colibri.serve's app (create_app: the same routes, schemas, errors, auth,
limits and streaming) on a `RayServerState`, whose engine is the replica deployment
(remote.RemoteEngine) and whose model is the file's tokenizer and chat template alone
(`ModelFront`: no weights, no KV). /metrics is every replica's metrics, labelled by replica
(through the hub); the ingress reserves no CPU."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from colibri.model import Model
from colibri.serve.metrics import Metrics
from colibri.serve.state import ServerState

log = logging.getLogger("colibri")


class ModelFront(Model):
    """What the ingress needs of a model: its metadata, tokenizer and chat template. The
    forward pass, the KV cache and the experts are the replicas'."""

    def _load(self, kv_dtype: str, tokenizer: bool, *_: Any) -> None:
        from colibri.tokenizer import Tokenizer

        d = self.desc
        self.n_vocab, self.n_embd = d.n_vocab, d.n_embd
        self.experts = self.cuda_experts = self.pool = self._fw = None
        self.device = "cpu"
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self._lock = threading.Lock()


class _HubMetrics(Metrics):
    """ServerState.metrics for the ingress: its own HTTP counts, and the replicas' metrics
    (through the hub) labelled by replica."""

    def __init__(self, hub_name: str) -> None:
        super().__init__(lambda: (None, None, None))  # no engine here: the replicas' figures
        self.hub_name = hub_name

    def observe(self, stats: dict[str, Any]) -> None:
        pass  # the replica that ran a request counts it

    def reports(self, fresh: bool = True) -> dict[str, Any]:
        import ray

        from colibri.ray.hub import connect

        return ray.get(connect(self.hub_name).snapshot.remote(fresh), timeout=10)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        from colibri.ray.hub import relabel

        own = self.registry.restricted_registry(["colibri_http_requests_total",
                                                 "colibri_http_requests_created"])
        return relabel(self.reports(), own=generate_latest(own))  # type: ignore[arg-type]


class RayServerState(ServerState):
    """ServerState whose engine is the replica deployment behind handle."""

    def __init__(self, handle: Any, model_kwargs: dict[str, Any], hub: str,
                 **kw: Any) -> None:
        self._handle = handle
        self._model_kwargs = dict(model_kwargs)
        super().__init__(lambda: ModelFront(**self._model_kwargs), **kw)
        self.metrics = _HubMetrics(hub)  # type: ignore[assignment]

    def load_front(self) -> None:
        """The tokenizer and chat template (ModelFront), the remote engine and the grammar
        factory; load_error set on failure."""
        from colibri.ray.remote import RemoteEngine

        try:
            self.model = self._load()
            self.engine = RemoteEngine(self._handle, self.model.n_vocab,  # type: ignore[assignment]
                                       self.max_seqs)
            try:
                from colibri.serve.grammar import GrammarFactory

                self.grammar = GrammarFactory(self.model)
            except Exception as e:
                self.grammar_error = f"{type(e).__name__}: {e}"
        except BaseException as e:
            self.load_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    def load(self) -> None:
        """(The app's start, on a thread) ready once a replica has loaded its model and
        reported to the hub: until then /health and the API answer 503 loading, as
        `colibri serve` does while its model loads."""
        if self.model is None and self.load_error is None:
            self.load_front()
        if self.load_error is not None:
            log.error("the ingress failed to load the model's tokenizer: %s", self.load_error)
            if self.on_fatal is not None:
                self.on_fatal()
            return
        while not self.draining:
            try:
                if self.metrics.reports(fresh=False):  # type: ignore[attr-defined]
                    break
            except Exception as e:  # noqa: BLE001 - the hub is being made: ask again
                log.debug("hub: %s", e)
            time.sleep(0.2)
        else:
            return
        self.ready = True
        if self.on_ready is not None:
            self.on_ready()


class Ingress:
    """The ingress deployment's class (colibri.ray.app() wraps it with serve.ingress)."""

    def __init__(self, replicas: Any, model_kwargs: dict[str, Any], hub: str,
                 server: dict[str, Any]) -> None:
        self.hub = hub
        self.state = RayServerState(replicas, model_kwargs, hub, **server)
        self.state.load_front()  # now: a model without a tokenizer fails the deployment
        if self.state.load_error:
            raise RuntimeError(f"the ingress could not load the model's tokenizer: "
                               f"{self.state.load_error}")

    def __serve_build_asgi_app__(self) -> Any:
        from colibri.serve.app import create_app

        return create_app(self.state)
