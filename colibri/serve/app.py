"""The OpenAI-compatible HTTP app (FastAPI) on a colibri.Engine.

Routes: GET /v1/models, /v1/models/{id}; POST /v1/completions, /v1/chat/completions (JSON or
server-sent events); POST /tokenize, /detokenize (vLLM's shapes); GET /health, /metrics. The
model loads in a background thread after the app starts: until then /health, every /v1/ route
and /tokenize, /detokenize answer 503. Errors have OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, with OpenAI's status codes (400, not FastAPI's
422, for a body that does not validate).

The app is assembled here; its parts: state.py (ServerState, APIError), gate.py (the ASGI
gate: auth, readiness, body size, counts, model aliases), handling.py (parsing and checking a
request, submitting it), streaming.py (reading the engine requests: merged deltas, choices,
SSE), completions.py and chat.py (the two generation endpoints), tokenize.py (/tokenize,
/detokenize). With --allowed-origins, Starlette's CORSMiddleware wraps the gate: a preflight is
answered before the API key is asked for.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from colibri.serve.anthropic import add_routes as add_messages_routes
from colibri.serve.chat import chat
from colibri.serve.completions import completions
from colibri.serve.gate import ROUTES, _gate
from colibri.serve.responses import add_routes as add_responses_routes
from colibri.serve.state import DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE, APIError, ServerState
from colibri.serve.tokenize import detokenize, tokenize

log = logging.getLogger("colibri")


def create_app(state: ServerState) -> Any:
    """The ASGI app serving state (wrapped in the gate: auth, readiness, body limit, counts,
    aliases; and with state.allowed_origins, in CORS outside the gate)."""

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

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": state.created,
                "owned_by": "colibri"}

    @app.get("/v1/models")
    async def models() -> JSONResponse:  # the id first, then the aliases
        return JSONResponse({"object": "list",
                             "data": [model_card(n) for n in state.model_names]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        state.require_model(model_id)  # any name under --accept-any-model-name
        return JSONResponse(model_card(model_id))

    @app.post("/v1/completions")
    async def completions_route(request: Request) -> Response:
        return await completions(state, request)

    @app.post("/v1/chat/completions")
    async def chat_route(request: Request) -> Response:
        return await chat(state, request)

    add_messages_routes(app, state)  # Anthropic's Messages API (anthropic.py)
    add_responses_routes(app, state)  # OpenAI's Responses API (responses.py)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        return await tokenize(state, request)

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> Response:
        return await detokenize(state, request)

    gated = _gate(app, state)
    if not state.allowed_origins:
        return gated  # no CORS headers at all
    from starlette.middleware.cors import CORSMiddleware

    # outside the gate: a preflight (OPTIONS with Origin and Access-Control-Request-Method)
    # is answered here, without the API key; the gate's own answers (401, 413, 429, 503)
    # carry the allow header too, so that a browser client can read them
    return CORSMiddleware(gated, allow_origins=state.allowed_origins,
                          allow_methods=["GET", "POST"], allow_headers=["*"],
                          expose_headers=["Retry-After"])


__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_QUEUE", "ROUTES", "APIError", "ServerState",
           "create_app"]
