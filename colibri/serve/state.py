"""What `colibri serve` serves: `ServerState` (the model loaded on a thread, its engine, the
grammar factory, admission counts, the names the model answers to, the CORS origins) and
`APIError`, an error in OpenAI's shape."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from colibri.serve.metrics import Metrics

if TYPE_CHECKING:
    from colibri.engine import Engine
    from colibri.engine import Request as EngineRequest
    from colibri.model import Model
    from colibri.serve.grammar import GrammarFactory

log = logging.getLogger("colibri")

DEFAULT_MAX_BODY = 4 * 2**20
DEFAULT_MAX_QUEUE = 256
RETRY_AFTER_S = 1  # the Retry-After (seconds) of a 429: a slot frees as soon as a request ends


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = \
            status, message, type, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ServerState:
    """What the app serves: the model (loaded by load() on a thread), its engine, the grammar
    factory, and the admission counters."""

    def __init__(self, load: Callable[[], Model], model_id: str, max_seqs: int = 16,
                 max_queue: int = DEFAULT_MAX_QUEUE, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY,
                 engine_kwargs: dict[str, Any] | None = None, prefault: bool = True,
                 grace_period: float = 30.0, aliases: Sequence[str] = (),
                 accept_any_model: bool = False,
                 allowed_origins: Sequence[str] = ()) -> None:
        self._load = load
        self.model_id = model_id  # the id responses carry and /v1/models lists first
        # more names the model answers to (--model-name A,B), listed by /v1/models too
        self.aliases = [a for a in dict.fromkeys(aliases) if a != model_id]
        self.accept_any_model = bool(accept_any_model)  # any name is this model
        self.allowed_origins = list(allowed_origins)  # CORS (--allowed-origins); none: off
        self.max_seqs = int(max_seqs)
        self.max_queue = int(max_queue)
        self.api_key = api_key
        self.max_body_bytes = int(max_body_bytes)
        self.engine_kwargs = dict(engine_kwargs or {})
        self.prefault = prefault
        self.prefaulted: dict[str, int] = {}  # touched at the start: bytes by part, tokens
        self.model: Model | None = None
        self.engine: Engine | None = None
        self.grammar: GrammarFactory | None = None
        self.grammar_error: str | None = None
        self.ready = False
        self.draining = False
        self.grace_period = float(grace_period)
        self.cut = False  # the grace period ran out: the requests still running were cancelled
        self.load_error: str | None = None
        self.outstanding: list[EngineRequest] = []  # submitted, not yet seen finished
        self.created = int(time.time())
        self.on_ready: Callable[[], None] | None = None
        self.on_fatal: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self.metrics = Metrics(lambda: (self.engine, self.model,
                                        self.grammar.stats if self.grammar else None))

    @property
    def model_names(self) -> list[str]:
        """Every name the model answers to, its id first."""
        return [self.model_id, *self.aliases]

    def serves(self, name: str) -> bool:
        """Whether a request naming this model is served (an alias, or any name with
        --accept-any-model-name)."""
        return self.accept_any_model or name == self.model_id or name in self.aliases

    def require_model(self, name: str) -> None:
        """A 404 in OpenAI's shape (code model_not_found) for a name this server does not
        serve."""
        if not self.serves(name):
            names = ", ".join(repr(n) for n in self.model_names)
            raise APIError(404, f"the model {name!r} does not exist: this server serves "
                           f"{names} (GET /v1/models)", param="model", code="model_not_found")

    def load(self) -> None:
        """Load the model, touch its memory (prefault: weights, expert pool, KV arena; see
        colibri.serve.prefault), start the engine and describe the vocabulary to llguidance;
        on failure record the error and call on_fatal (the server exits)."""
        from colibri.engine import Engine

        try:
            self.model = self._load()
            if self.prefault:
                from colibri.serve.prefault import prefault

                self.prefaulted = prefault(self.model, self.max_seqs)
            self.engine = Engine(self.model, max_seqs=self.max_seqs, prefault_kv=self.prefault,
                                 **self.engine_kwargs)
            self.max_seqs = self.engine.max_seqs
            try:
                from colibri.serve.grammar import GrammarFactory

                self.grammar = GrammarFactory(self.model)
            except Exception as e:  # structured output then answers 400 with the reason
                self.grammar_error = f"{type(e).__name__}: {e}"
                log.warning("structured output unavailable: %s", self.grammar_error)
            self.ready = True
        except BaseException as e:
            self.load_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            log.error("loading the model failed: %s", self.load_error)
            if self.on_fatal is not None:
                self.on_fatal()
            return
        if self.on_ready is not None:
            self.on_ready()

    def close(self) -> None:
        self.ready = False
        if self.engine is not None:
            self.engine.close()
        if self.model is not None:
            self.model.close()

    def cut_off(self) -> None:
        """The grace period ran out: cancel every request still running or queued (a stream
        then ends with an error event saying so, and [DONE]; a JSON answer is a 503)."""
        with self._lock:
            self.cut = True
            reqs = list(self.outstanding)
        for r in reqs:
            if not r.finished:
                r.cancel()

    def cancelled_error(self) -> APIError:
        """The error of a request cancelled by the server (not by its client)."""
        if self.cut:
            return APIError(503, "the server is shutting down: the request was still running "
                            f"at the end of the grace period ({self.grace_period:g} s, "
                            "--grace-period)", type="server_error", code="shutting_down")
        return APIError(503, "the request was cancelled: the server is shutting down",
                        type="server_error", code="shutting_down")

    def admit(self, n: int) -> None:
        """Refuse (429) n more engine requests when running + queued would pass max_seqs +
        max_queue."""
        if n > self.max_seqs + self.max_queue:
            raise APIError(400, f"this request asks for {n} completions (prompts x n); the "
                           f"server holds {self.max_seqs + self.max_queue} at most "
                           f"(--max-seqs + --max-queue)", param="n", code="invalid_value")
        with self._lock:
            self._prune()
            if len(self.outstanding) + n > self.max_seqs + self.max_queue:
                raise APIError(429, f"the server is at capacity ({len(self.outstanding)} "
                               f"requests running or queued, {self.max_seqs} running at most "
                               f"and --max-queue {self.max_queue} waiting); retry later",
                               type="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(RETRY_AFTER_S)})

    def track(self, reqs: Sequence[EngineRequest]) -> None:
        with self._lock:
            self.outstanding.extend(reqs)

    def prune(self) -> None:
        with self._lock:
            self._prune()

    def _prune(self) -> None:
        """Forget finished requests, their statistics into the metrics."""
        keep = []
        for r in self.outstanding:
            if not r.finished:
                keep.append(r)
                continue
            try:
                self.metrics.observe(r.stats())
            except Exception:  # statistics must never fail a request
                log.exception("metrics")
        self.outstanding = keep
