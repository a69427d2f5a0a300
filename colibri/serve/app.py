"""The OpenAI-compatible HTTP app (FastAPI) on a colibri.Engine.

Routes: GET /v1/models, /v1/models/{id}; POST /v1/completions, /v1/chat/completions (JSON or
server-sent events); GET /health, /metrics. The model loads in a background thread after the
app starts: until then /health and every /v1/ route answer 503. Errors have OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, with OpenAI's status codes (400, not FastAPI's
422, for a body that does not validate).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from colibri.errors import ColibriError
from colibri.serve.metrics import Metrics
from colibri.serve.protocol import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    NamedToolChoice,
    _Sampling,
)
from colibri.serve.tools import ToolCall, ToolStreamParser, call_grammar

if TYPE_CHECKING:
    from colibri.engine import Delta, Engine
    from colibri.engine import Request as EngineRequest
    from colibri.model import Model
    from colibri.serve.grammar import GrammarFactory

log = logging.getLogger("colibri")

DEFAULT_MAX_BODY = 4 * 2**20
DEFAULT_MAX_QUEUE = 256
ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics")


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = \
            status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


class ServerState:
    """What the app serves: the model (loaded by load() on a thread), its engine, the grammar
    factory, and the admission counters."""

    def __init__(self, load: Callable[[], Model], model_id: str, max_seqs: int = 16,
                 max_queue: int = DEFAULT_MAX_QUEUE, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY,
                 engine_kwargs: dict[str, Any] | None = None) -> None:
        self._load = load
        self.model_id = model_id
        self.max_seqs = int(max_seqs)
        self.max_queue = int(max_queue)
        self.api_key = api_key
        self.max_body_bytes = int(max_body_bytes)
        self.engine_kwargs = dict(engine_kwargs or {})
        self.model: Model | None = None
        self.engine: Engine | None = None
        self.grammar: GrammarFactory | None = None
        self.grammar_error: str | None = None
        self.ready = False
        self.draining = False
        self.load_error: str | None = None
        self.outstanding: list[EngineRequest] = []  # submitted, not yet seen finished
        self.created = int(time.time())
        self.on_ready: Callable[[], None] | None = None
        self.on_fatal: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self.metrics = Metrics(lambda: (self.engine, self.model,
                                        self.grammar.stats if self.grammar else None))

    def load(self) -> None:
        """Load the model, start the engine and describe the vocabulary to llguidance; on
        failure record the error and call on_fatal (the server exits)."""
        from colibri.engine import Engine

        try:
            self.model = self._load()
            self.engine = Engine(self.model, max_seqs=self.max_seqs, **self.engine_kwargs)
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
                               type="rate_limit_error", code="queue_full")

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


# ---- the ASGI gate: auth, readiness, body size, request counts ----

def _gate(app: Any, state: ServerState) -> Any:
    key = state.api_key.encode() if state.api_key else None

    async def send_error(send: Any, err: APIError) -> None:
        body = json.dumps(err.body()).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if err.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="colibri"'))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def check(scope: dict[str, Any]) -> APIError | None:
        path: str = scope["path"]
        headers = dict(scope.get("headers") or [])
        if path.startswith("/v1/"):
            if key is not None:
                auth = headers.get(b"authorization", b"")
                given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
                if not hmac.compare_digest(given, key):
                    return APIError(401, "invalid or missing API key: send the header "
                                    "'Authorization: Bearer KEY' (colibri serve --api-key)",
                                    type="invalid_request_error", code="invalid_api_key")
            if state.draining:
                return APIError(503, "the server is shutting down", type="server_error",
                                code="shutting_down")
            if not state.ready:
                if state.load_error:
                    return APIError(503, f"the model failed to load: {state.load_error}",
                                    type="server_error", code="load_failed")
                return APIError(503, "the model is loading; retry when GET /health answers 200",
                                type="server_error", code="loading")
        cl = headers.get(b"content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                return APIError(400, "the Content-Length header is not a number")
            if n > state.max_body_bytes:
                return APIError(413, f"the request body has {n} bytes, more than the "
                                f"{state.max_body_bytes} this server takes (--max-body-bytes)",
                                code="request_too_large")
        return None

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path = scope["path"]
        label = path if path in ROUTES else ("/v1/models" if path.startswith("/v1/models/")
                                             else "other")
        status = [500]

        async def counted_send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            err = check(scope)
            if err is not None:
                await send_error(counted_send, err)
            else:
                await app(scope, receive, counted_send)
        finally:
            state.metrics.requests.labels(label, str(status[0])).inc()

    return asgi


# ---- request handling ----

async def _read_body(request: Request, limit: int) -> bytes:
    parts: list[bytes] = []
    n = 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise APIError(413, f"the request body is over the {limit} bytes this server takes "
                           "(--max-body-bytes)", code="request_too_large")
        parts.append(chunk)
    return b"".join(parts)


def _validation_error(e: ValidationError) -> APIError:
    errs = e.errors(include_url=False)
    err = errs[0]
    if err["type"] == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}")
    loc = [x for x in err["loc"]]
    if not loc:
        return APIError(400, f"the request body must be a JSON object: {err['msg']}")
    # union members appear in loc as their type names: keep the path of fields and indices
    names = [str(x) for x in loc if isinstance(x, int) or (isinstance(x, str) and x.isidentifier()
                                                           and x not in ("str", "int", "float",
                                                                         "bool", "list", "dict"))]
    param = ".".join(names) if names else str(loc[0])
    got = repr(err.get("input"))
    if len(got) > 80:
        got = got[:77] + "..."
    msg = f"{param}: {err['msg']}" + ("" if err["type"] == "missing" else f" (got {got})")
    return APIError(400, msg, param=param, code="invalid_value")


def _parse(cls: type[Any], body: bytes) -> Any:
    if not body.strip():
        raise APIError(400, "the request body is empty: a JSON object is expected")
    try:
        return cls.model_validate_json(body)
    except ValidationError as e:
        raise _validation_error(e) from None


def _require_model(state: ServerState, name: str) -> None:
    if name != state.model_id:
        raise APIError(404, f"the model {name!r} does not exist: this server serves "
                       f"{state.model_id!r} (GET /v1/models)", param="model",
                       code="model_not_found")


def _logit_bias(req: _Sampling, n_vocab: int) -> dict[int, float] | None:
    if not req.logit_bias:
        return None
    out: dict[int, float] = {}
    for k, v in req.logit_bias.items():
        try:
            tid = int(k)
        except ValueError:
            raise APIError(400, f"logit_bias: the key {k!r} is not a token id", param="logit_bias",
                           code="invalid_value") from None
        if not 0 <= tid < n_vocab:
            raise APIError(400, f"logit_bias: token id {tid} is out of the vocabulary "
                           f"[0, {n_vocab})", param="logit_bias", code="invalid_value")
        out[tid] = float(v)
    return out


def _sampling(req: _Sampling, state: ServerState, max_tokens: int) -> dict[str, Any]:
    assert state.model is not None
    return dict(max_tokens=max_tokens, temperature=req.temperature, top_k=req.top_k,
                top_p=req.top_p, min_p=req.min_p, repetition_penalty=req.repetition_penalty,
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                seed=req.seed, stop=req.stop, logit_bias=_logit_bias(req, state.model.n_vocab))


def _max_tokens(state: ServerState, n_prompt: int, asked: int | None, default: int | None,
                what: str) -> int:
    assert state.model is not None
    ctx = state.model.ctx
    if n_prompt + 1 > ctx:
        raise APIError(400, f"this model's context holds {ctx} tokens and the prompt has "
                       f"{n_prompt}: shorten it (or serve with a larger --ctx)",
                       param=what, code="context_length_exceeded")
    if asked is not None:
        if n_prompt + asked > ctx:
            raise APIError(400, f"this model's context holds {ctx} tokens; the request needs "
                           f"{n_prompt + asked} ({n_prompt} of prompt, {asked} of completion): "
                           f"ask for fewer tokens", param="max_tokens",
                           code="context_length_exceeded")
        return asked
    return min(default, ctx - n_prompt) if default is not None else ctx - n_prompt


async def _constraint_factory(state: ServerState, kind: str, spec: Any,
                              param: str = "response_format") -> Callable[[], Any]:
    """A function making one grammar constraint per engine request: the grammar is compiled
    once, on a worker thread (a large schema can take a while), and copied per request."""
    if state.grammar is None:
        raise APIError(400, f"structured output is not available with this model: "
                       f"{state.grammar_error or 'llguidance is missing'}", param=param)
    g = state.grammar

    def make() -> Any:
        return g.json_schema(spec) if kind == "json_schema" else g.lark(spec)

    try:
        proto = await asyncio.to_thread(make)
    except ValueError as e:
        raise APIError(400, str(e), param=param, code="invalid_value") from None
    return proto.copy


async def _response_format(state: ServerState, req: _Sampling) -> Callable[[], Any] | None:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return await _constraint_factory(state, "json_schema", {"type": "object"})
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise APIError(400, "response_format json_schema needs json_schema.schema",
                       param="response_format.json_schema")
    return await _constraint_factory(state, "json_schema", rf.json_schema.schema_)


def _submit(state: ServerState, prompts: list[list[int]], n: int, kw: dict[str, Any],
            constraint: Callable[[], Any] | None, logprobs: int | None) -> list[EngineRequest]:
    eng = state.engine
    assert eng is not None
    state.admit(len(prompts) * n)
    reqs: list[EngineRequest] = []
    try:
        for ids in prompts:
            if constraint is None:
                reqs += eng.submit_n(ids, n, logprobs=logprobs, **kw)
            else:  # a grammar state per request
                for i in range(n):
                    kwi = dict(kw, seed=None if kw["seed"] is None else kw["seed"] + i)
                    reqs.append(eng.submit(ids, logprobs=logprobs, constraint=constraint(), **kwi))
    except (ValueError, TypeError, ColibriError) as e:
        for r in reqs:
            r.cancel()
        if isinstance(e, ColibriError):
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None
        raise APIError(400, str(e), code="invalid_value") from None
    finally:
        state.track(reqs)
    return reqs


async def _merged(state: ServerState, reqs: list[EngineRequest]
                  ) -> AsyncIterator[tuple[int, Delta]]:
    """The deltas of every request as they come, tagged with the request's index. Closing
    the iterator (a client gone) cancels the requests still running."""
    from colibri.engine import Delta

    q: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()

    async def pump(i: int, r: EngineRequest) -> None:
        try:
            async for d in r:
                q.put_nowait((i, d))
        except Exception as e:  # noqa: BLE001 - reported as this request's error
            q.put_nowait((i, Delta(finish_reason="error", error=str(e))))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(reqs)]
    left = len(reqs)
    try:
        while left:
            i, d = await q.get()
            if d.finish_reason is not None:
                left -= 1
            yield i, d
    finally:
        for r in reqs:
            if not r.finished:
                r.cancel()
        for t in tasks:
            t.cancel()


@dataclass
class _Choice:
    """One choice's output as it accumulates (and the tool-call parser, when tools apply)."""

    index: int
    parser: ToolStreamParser | None = None
    max_calls: int | None = None  # parallel_tool_calls=false: the first call only
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    logprobs: list[Any] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    def take(self, d: Delta) -> tuple[str, list[ToolCall]]:
        """Add a delta; returns the content and the complete tool calls it releases."""
        self.tokens += len(d.token_ids)
        if d.logprobs:
            self.logprobs += d.logprobs
        content = d.text
        calls: list[ToolCall] = []
        if self.parser is not None:
            events = self.parser.feed(d.text)
            if d.finish_reason is not None:
                events += self.parser.finish()
            content = "".join(e for e in events if isinstance(e, str))
            calls = [e for e in events if isinstance(e, ToolCall)]
            if self.max_calls is not None:
                calls = calls[: max(0, self.max_calls - len(self.calls))]
        self.text.append(content)
        self.calls += calls
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason
            self.error = d.error
            if self.calls and d.finish_reason == "stop":
                self.finish_reason = "tool_calls"
        return content, calls


def _piece(state: ServerState, tid: int) -> bytes:
    assert state.model is not None
    return bytes(state.model._tok().token_to_piece(tid, special=True))


def _chat_logprobs(state: ServerState, lps: list[Any], top: bool) -> list[dict[str, Any]]:
    out = []
    for lp in lps:
        b = _piece(state, lp.token_id)
        entry: dict[str, Any] = {"token": b.decode("utf-8", "replace"), "logprob": lp.logprob,
                                 "bytes": list(b), "top_logprobs": []}
        if top:
            for tid, v in lp.top:
                tb = _piece(state, tid)
                entry["top_logprobs"].append({"token": tb.decode("utf-8", "replace"),
                                              "logprob": v, "bytes": list(tb)})
        out.append(entry)
    return out


def _completion_logprobs(state: ServerState, lps: list[Any], offset: int) -> dict[str, Any]:
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in lps:
        s = _piece(state, lp.token_id).decode("utf-8", "replace")
        tokens.append(s)
        token_lps.append(lp.logprob)
        top: dict[str, float] = {}
        for tid, v in lp.top:
            top.setdefault(_piece(state, tid).decode("utf-8", "replace"), v)
        tops.append(top)
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _until_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _collect(request: Request, state: ServerState, reqs: list[EngineRequest],
                   choices: list[_Choice]) -> bool:
    """Read every request to its end (False: the client went away first, and the requests
    were cancelled)."""
    async def run() -> None:
        async for i, d in _merged(state, reqs):
            choices[i].take(d)

    work = asyncio.ensure_future(run())
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()  # _merged's cleanup cancels the engine requests
    if not work.done() or work.cancelled():
        return False
    work.result()
    return True


def _usage(prompt_tokens: int, choices: list[_Choice]) -> dict[str, int]:
    c = sum(ch.tokens for ch in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": c,
            "total_tokens": prompt_tokens + c}


def _failed(choices: list[_Choice]) -> APIError | None:
    for ch in choices:
        if ch.finish_reason == "error":
            return APIError(500, f"generation failed: {ch.error}", type="server_error",
                            code="generation_error")
        if ch.finish_reason == "cancelled":
            return APIError(503, "the request was cancelled: the server is shutting down",
                            type="server_error", code="shutting_down")
    return None


# ---- chat: messages, tools ----

def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content)


def _template_messages(msgs: list[ChatMessage], tools_in_template: bool) -> list[dict[str, Any]]:
    """The request's messages as a chat template takes them. A template that knows no tools
    (no 'tool' anywhere in it) gets tool calls and results folded into plain turns (assistant:
    the calls as JSON; tool results: a user turn), consecutive turns of one role merged."""
    out: list[dict[str, Any]] = []
    for m in msgs:
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                             "content": _text_of(m.content)}
        if m.tool_calls:
            calls = []
            for c in m.tool_calls:
                f = dict(c.get("function") or {})
                if isinstance(f.get("arguments"), str):
                    try:
                        f["arguments"] = json.loads(f["arguments"])
                    except ValueError:
                        pass
                calls.append({**c, "function": f})
            d["tool_calls"] = calls
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    if tools_in_template:
        return out
    folded: list[dict[str, Any]] = []
    for d in out:
        role, content = d["role"], d["content"]
        if d.get("tool_calls"):
            calls = [{"name": c.get("function", {}).get("name"),
                      "arguments": c.get("function", {}).get("arguments")}
                     for c in d["tool_calls"]]
            content = "\n".join(x for x in [content] + [json.dumps(c) for c in calls] if x)
        if role == "tool":
            role = "user"
            content = f"Tool result{' (' + d['name'] + ')' if d.get('name') else ''}: {content}"
        if folded and folded[-1]["role"] == role and role != "system":
            folded[-1]["content"] += "\n\n" + content
        else:
            folded.append({"role": role, "content": content})
    return folded


def create_app(state: ServerState) -> Any:
    """The ASGI app serving state (wrapped in the gate: auth, readiness, body limit, counts)."""

    def lifespan_startup() -> None:
        threading.Thread(target=state.load, name="colibri-load", daemon=True).start()

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        lifespan_startup()
        try:
            yield
        finally:
            state.draining = True
            await asyncio.to_thread(state.close)

    app = FastAPI(title="colibri", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(APIError)
    async def _api_error(_r: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, e: RequestValidationError) -> JSONResponse:
        return APIError(400, f"invalid request: {e.errors()[0].get('msg')}").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_r: Request, e: StarletteHTTPException) -> JSONResponse:
        msg = "no such route" if e.status_code == 404 else str(e.detail)
        return APIError(e.status_code, msg, code=str(e.status_code)).response()

    @app.exception_handler(Exception)
    async def _crash(_r: Request, e: Exception) -> JSONResponse:
        log.exception("request failed")
        return APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error",
                        code="internal_error").response()

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.ready and not state.draining:
            return JSONResponse({"status": "ok", "model": state.model_id})
        status = ("shutting down" if state.draining else
                  "error" if state.load_error else "loading")
        body: dict[str, Any] = {"status": status}
        if state.load_error:
            body["error"] = state.load_error
        return JSONResponse(body, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        state.prune()
        data = await asyncio.to_thread(state.metrics.render)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict[str, Any]:
        return {"id": state.model_id, "object": "model", "created": state.created,
                "owned_by": "colibri"}

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        _require_model(state, model_id)
        return JSONResponse(model_card())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req: CompletionRequest = _parse(CompletionRequest, await _read_body(request,
                                                                            state.max_body_bytes))
        _require_model(state, req.model)
        m = state.model
        assert m is not None
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of is not supported (n completions are returned as they "
                           "are)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported (prompt tokens carry no "
                           "logprobs here)", param="echo")
        p = req.prompt
        raw: list[str | list[int]]
        if isinstance(p, str):
            raw = [p]
        elif not p:
            raise APIError(400, "prompt is empty", param="prompt")
        elif all(isinstance(x, int) for x in p):
            raw = [list(p)]  # type: ignore[arg-type]
        else:
            raw = list(p)  # type: ignore[arg-type]
        prompts: list[list[int]] = []
        for x in raw:
            if isinstance(x, str):
                ids = m.tokenize(x)
            else:
                bad = [t for t in x if not 0 <= t < m.n_vocab]
                if bad:
                    raise APIError(400, f"prompt: token id {bad[0]} is out of the vocabulary "
                                   f"[0, {m.n_vocab})", param="prompt")
                ids = list(x)
            if not ids:
                raise APIError(400, "the prompt has no tokens", param="prompt")
            prompts.append(ids)
        longest = max(len(x) for x in prompts)
        max_tokens = _max_tokens(state, longest, req.max_tokens, 16, "prompt")
        kw = _sampling(req, state, max_tokens)
        constraint = await _response_format(state, req)
        reqs = _submit(state, prompts, req.n, kw, constraint, req.logprobs)
        n_prompt = sum(len(x) for x in prompts)
        cid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        choices = [_Choice(index=i) for i in range(len(reqs))]
        echo = [m.detokenize(prompts[i // req.n]) if req.echo else "" for i in range(len(reqs))]

        if req.stream:
            usage_wanted = bool(req.stream_options and req.stream_options.include_usage)

            async def events() -> AsyncIterator[bytes]:
                sent = [0] * len(reqs)
                if req.echo:
                    for i in range(len(reqs)):
                        yield _sse({"id": cid, "object": "text_completion", "created": created,
                                    "model": state.model_id, "choices": [
                                        {"index": i, "text": echo[i], "logprobs": None,
                                         "finish_reason": None}]})
                async for i, d in _merged(state, reqs):
                    ch = choices[i]
                    content, _ = ch.take(d)
                    if ch.finish_reason == "error":
                        yield _sse(APIError(500, f"generation failed: {ch.error}",
                                            type="server_error").body())
                        continue
                    if ch.finish_reason == "cancelled":
                        continue
                    lp = None
                    if req.logprobs is not None and d.logprobs:
                        lp = _completion_logprobs(state, d.logprobs, sent[i])
                    sent[i] += len(content)
                    if not content and d.finish_reason is None and lp is None:
                        continue
                    chunk: dict[str, Any] = {
                        "id": cid, "object": "text_completion", "created": created,
                        "model": state.model_id, "choices": [
                            {"index": i, "text": content, "logprobs": lp,
                             "finish_reason": ch.finish_reason}]}
                    if usage_wanted:
                        chunk["usage"] = None
                    yield _sse(chunk)
                if usage_wanted:
                    yield _sse({"id": cid, "object": "text_completion", "created": created,
                                "model": state.model_id, "choices": [],
                                "usage": _usage(n_prompt, choices)})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        if not await _collect(request, state, reqs, choices):
            return Response(status_code=499)
        err = _failed(choices)
        if err is not None:
            raise err
        out = []
        for ch in choices:
            text = "".join(ch.text)
            out.append({"index": ch.index, "text": echo[ch.index] + text,
                        "logprobs": _completion_logprobs(state, ch.logprobs, 0)
                        if req.logprobs is not None else None,
                        "finish_reason": ch.finish_reason})
        return JSONResponse({"id": cid, "object": "text_completion", "created": created,
                             "model": state.model_id, "choices": out,
                             "usage": _usage(n_prompt, choices)})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        from colibri.generate import chat_template, render_chat

        req: ChatRequest = _parse(ChatRequest, await _read_body(request, state.max_body_bytes))
        _require_model(state, req.model)
        m = state.model
        assert m is not None
        try:
            template = chat_template(m)
        except ColibriError as e:
            raise APIError(400, str(e), param="messages") from None
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        choice = req.tool_choice or ("auto" if tools else "none")
        if choice != "none" and not tools:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        use_tools = bool(tools) and choice != "none"
        names = {t["function"]["name"] for t in tools}
        ctx: dict[str, Any] = {"tools": tools} if use_tools else {}
        try:
            text = render_chat(m, _template_messages(req.messages, "tool" in template), **ctx)
        except (ColibriError, ValueError, TypeError) as e:
            raise APIError(400, f"messages: {e}", param="messages") from None
        ids = m.tokenize(text, add_special=False, parse_special=True)
        if not ids:
            raise APIError(400, "the messages render to no tokens", param="messages")
        asked = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        kw = _sampling(req, state, _max_tokens(state, len(ids), asked, None, "messages"))
        constraint: Callable[[], Any] | None
        if use_tools and (choice == "required" or isinstance(choice, NamedToolChoice)):
            name = choice.function.name if isinstance(choice, NamedToolChoice) else None
            if name is not None and name not in names:
                raise APIError(400, f"tool_choice names {name!r}, which is not among the "
                               f"tools", param="tool_choice")
            kind, spec = call_grammar(tools, name, hermes="<tool_call>" in template)
            constraint = await _constraint_factory(state, kind, spec, param="tools")
        else:
            constraint = await _response_format(state, req)
        parse_tools = use_tools and (req.response_format is None
                                     or req.response_format.type == "text"
                                     or choice == "required" or isinstance(choice, NamedToolChoice))
        top = req.top_logprobs if req.top_logprobs is not None else 0
        reqs = _submit(state, [ids], req.n, kw, constraint, top if req.logprobs else None)
        cid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        choices = [_Choice(index=i, parser=ToolStreamParser(names) if parse_tools else None,
                           max_calls=1 if req.parallel_tool_calls is False else None)
                   for i in range(len(reqs))]

        if req.stream:
            usage_wanted = bool(req.stream_options and req.stream_options.include_usage)

            def chunk(i: int, delta: dict[str, Any], finish: str | None = None,
                      lp: Any = None) -> bytes:
                c: dict[str, Any] = {
                    "id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": state.model_id, "system_fingerprint": None,
                    "choices": [{"index": i, "delta": delta, "logprobs": lp,
                                 "finish_reason": finish}]}
                if usage_wanted:
                    c["usage"] = None
                return _sse(c)

            async def events() -> AsyncIterator[bytes]:
                for i in range(len(reqs)):
                    yield chunk(i, {"role": "assistant", "content": ""})
                async for i, d in _merged(state, reqs):
                    ch = choices[i]
                    n_calls = len(ch.calls)
                    content, calls = ch.take(d)
                    if ch.finish_reason == "error":
                        yield _sse(APIError(500, f"generation failed: {ch.error}",
                                            type="server_error").body())
                        continue
                    if ch.finish_reason == "cancelled":
                        continue
                    lp = None
                    if req.logprobs and d.logprobs:
                        lp = {"content": _chat_logprobs(state, d.logprobs, top > 0)}
                    if content or lp is not None:
                        yield chunk(i, {"content": content}, None, lp)
                    for k, call in enumerate(calls):
                        yield chunk(i, {"tool_calls": [call.openai(n_calls + k)]})
                    if ch.finish_reason is not None:
                        yield chunk(i, {}, ch.finish_reason)
                if usage_wanted:
                    yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                                "model": state.model_id, "system_fingerprint": None,
                                "choices": [], "usage": _usage(len(ids), choices)})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        if not await _collect(request, state, reqs, choices):
            return Response(status_code=499)
        err = _failed(choices)
        if err is not None:
            raise err
        out = []
        for ch in choices:
            content = "".join(ch.text)
            msg: dict[str, Any] = {"role": "assistant",
                                   "content": content if content or not ch.calls else None}
            if ch.calls:
                msg["tool_calls"] = [c.openai() for c in ch.calls]
            out.append({"index": ch.index, "message": msg,
                        "logprobs": {"content": _chat_logprobs(state, ch.logprobs, top > 0)}
                        if req.logprobs else None,
                        "finish_reason": ch.finish_reason})
        return JSONResponse({"id": cid, "object": "chat.completion", "created": created,
                             "model": state.model_id, "system_fingerprint": None,
                             "choices": out, "usage": _usage(len(ids), choices)})

    return _gate(app, state)


__all__ = ["APIError", "ServerState", "create_app"]
