"""The ASGI gate in front of the app: the API key (`Authorization: Bearer KEY` or
`x-api-key: KEY`, Anthropic's header, on every route), readiness (503 while loading or shutting
down), the body-size limit and the request counts by route and status. Its errors have
OpenAI's shape, Anthropic's under /v1/messages. CORS sits in front of the gate (app.py): a
preflight needs no key."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from colibri.serve.anthropic import error_body, is_messages_path
from colibri.serve.state import APIError, ServerState

ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses",
          "/v1/responses/{id}", "/v1/messages", "/v1/messages/count_tokens", "/tokenize",
          "/detokenize", "/health", "/metrics")
# request paths counted under one label: the prefix, then the label
LABELS = (("/v1/models/", "/v1/models"), ("/v1/responses/", "/v1/responses/{id}"))
# the routes outside /v1/ that need the key and the model, as /v1/ does
MODEL_ROUTES = ("/tokenize", "/detokenize")


def _gate(app: Any, state: ServerState) -> Any:
    key = state.api_key.encode() if state.api_key else None

    def body_of(err: APIError, path: str) -> dict[str, Any]:
        return error_body(err) if is_messages_path(path) else err.body()

    async def send_error(send: Any, err: APIError, path: str) -> None:
        body = json.dumps(body_of(err, path)).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        if err.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="colibri"'))
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def check(scope: dict[str, Any]) -> APIError | None:
        path: str = scope["path"]
        headers = dict(scope.get("headers") or [])
        if path.startswith("/v1/") or path in MODEL_ROUTES:
            if key is not None:
                auth = headers.get(b"authorization", b"")
                bearer = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
                x_key = headers.get(b"x-api-key", b"").strip()
                # both compared, in constant time: either one may carry the key
                ok = hmac.compare_digest(bearer, key) | hmac.compare_digest(x_key, key)
                if not ok:
                    return APIError(401, "invalid or missing API key: send the header "
                                    "'Authorization: Bearer KEY' or 'x-api-key: KEY' "
                                    "(colibri serve --api-key)",
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
        label = path if path in ROUTES else next(
            (lab for prefix, lab in LABELS if path.startswith(prefix)), "other")
        status = [500]
        started = [False]
        sse = [False]  # the response is a stream of server-sent events
        complete = [False]

        async def counted_send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
                started[0] = True
                sse[0] = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                             for k, v in msg.get("headers") or [])
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                complete[0] = True
            await send(msg)

        try:
            err = check(scope)
            if err is not None:
                await send_error(counted_send, err, path)
            else:
                await app(scope, receive, counted_send)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs CUT_OFF_SLACK s after the grace period (whose
            # end cut the requests off; only a stuck response gets here): a stream still ends
            # with the error event and [DONE], and the log gets no traceback
            if not state.draining or complete[0]:
                raise
            err = state.cancelled_error()
            try:
                if sse[0] and is_messages_path(path):  # Anthropic's error event
                    await send({"type": "http.response.body", "more_body": False,
                                "body": b"event: error\ndata: "
                                + json.dumps(error_body(err)).encode() + b"\n\n"})
                elif sse[0]:
                    await send({"type": "http.response.body", "more_body": False,
                                "body": b"data: " + json.dumps(err.body()).encode()
                                + b"\n\ndata: [DONE]\n\n"})
                elif not started[0]:
                    await send_error(counted_send, err, path)
            except Exception:  # noqa: BLE001 - the connection is going away anyway
                pass
        finally:
            state.metrics.requests.labels(label, str(status[0])).inc()

    return asgi
