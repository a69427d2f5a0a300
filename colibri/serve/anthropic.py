"""Anthropic's Messages API: POST /v1/messages (JSON or server-sent events) and
POST /v1/messages/count_tokens, so that the official `anthropic` client and the tools built on
it (Claude Code and others) run against colibri serve.

A Messages request (MessagesRequest) is translated into a ChatRequest in one place
(to_chat_request) and goes through the chat endpoint's own path (chat.prepare_chat: the checks,
the chat template with tools, the tool_choice grammar, the engine submission); this module
only formats the answer: content blocks (text, tool_use), stop_reason and usage, or the
Messages event stream (message_start, content_block_start / _delta / _stop, message_delta,
message_stop). Errors have Anthropic's shape, {"type": "error", "error": {"type", "message"}},
the gate's own (401, 413, 429, 503) included (gate.py asks is_messages_path).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import Field

from colibri.serve.chat import ChatRun, prepare_chat
from colibri.serve.handling import _parse, _read_body
from colibri.serve.protocol import MAX_STOP, ChatRequest, _Strict
from colibri.serve.reasoning import Reasoning
from colibri.serve.state import APIError, ServerState
from colibri.serve.streaming import _cached_tokens, _Choice, _collect, _failed, _merged
from colibri.serve.tool_parse import ToolCallDelta

if TYPE_CHECKING:
    from colibri.engine import Delta

log = logging.getLogger("colibri")

MESSAGES_PATH = "/v1/messages"

# Anthropic's error type for each status (https://docs.claude.com/en/api/errors); 503 (the
# model loading, the server shutting down) is overloaded_error, as Anthropic's 529
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
                529: "overloaded_error"}


def is_messages_path(path: str) -> bool:
    """Whether path is one of the Messages API's (its errors then have Anthropic's shape)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_body(err: APIError) -> dict[str, Any]:
    """err in Anthropic's shape."""
    kind = _ERROR_TYPES.get(err.status) or ("api_error" if err.status >= 500
                                            else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)


# -- the request ------------------------------------------------------------------------------

class TextBlock(_Strict):
    type: Literal["text"]
    text: str


class Block(_Strict):
    """A content block of a message: text, tool_use (assistant), tool_result (user), or one
    that is dropped (thinking, redacted_thinking: earlier turns' reasoning); any other type is
    a 400 when translated."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDef(_Strict):
    type: str | None = None  # "custom" (or absent); Anthropic's server tools are refused
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None  # accepted, not enforced


class MessagesRequest(_Strict):
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # required by /v1/messages
    system: str | list[TextBlock] | None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    stream: bool = False
    thinking: ThinkingConfig | None = None  # enable_thinking, where the template reads it
    metadata: dict[str, Any] | None = None  # accepted (user_id), not used


def _block_text(blocks: str | list[Block] | None, where: str) -> str:
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for j, b in enumerate(blocks):
        if b.type != "text" or b.text is None:
            raise APIError(400, f"{where}.{j}: a {b.type!r} block is not supported here (text "
                           "blocks only)", param=f"{where}.{j}.type")
        parts.append(b.text)
    return "\n".join(parts)


def _assistant_turn(blocks: list[Block], where: str, names: dict[str, str]
                    ) -> dict[str, Any]:
    """An assistant turn: its text, its tool_use blocks as tool_calls (their names recorded
    in names by id), its thinking blocks dropped."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b.type == "text" and b.text is not None:
            text.append(b.text)
        elif b.type in ("thinking", "redacted_thinking"):
            continue
        elif b.type == "tool_use":
            if not b.id or not b.name:
                raise APIError(400, f"{at}: a tool_use block needs id and name", param=at)
            names[b.id] = b.name
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input or {})}})
        else:
            raise APIError(400, f"{at}: a {b.type!r} block is not supported in an assistant "
                           "message", param=f"{at}.type")
    turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(text)}
    if calls:
        turn["tool_calls"] = calls
    return turn


def _user_turns(blocks: list[Block], where: str, names: dict[str, str]
                ) -> list[dict[str, Any]]:
    """A user turn: its tool_result blocks as tool messages, in their place among its text
    (a failed tool's result marked 'Error: ')."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b.type == "text" and b.text is not None:
            text.append(b.text)
            continue
        if b.type != "tool_result":
            raise APIError(400, f"{at}: a {b.type!r} block is not supported in a user "
                           "message", param=f"{at}.type")
        if not b.tool_use_id:
            raise APIError(400, f"{at}: a tool_result block needs tool_use_id",
                           param=f"{at}.tool_use_id")
        if text:
            out.append({"role": "user", "content": "\n".join(text)})
            text = []
        result = _block_text(b.content, f"{at}.content")
        tm: dict[str, Any] = {"role": "tool", "tool_call_id": b.tool_use_id,
                              "content": f"Error: {result}" if b.is_error else result}
        if b.tool_use_id in names:
            tm["name"] = names[b.tool_use_id]
        out.append(tm)
    if text:
        out.append({"role": "user", "content": "\n".join(text)})
    return out


def _chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """The conversation as OpenAI chat messages: the system prompt first; an assistant turn's
    tool_use blocks as its tool_calls; a user turn's tool_result blocks as tool messages (in
    their place among its text)."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": req.system if isinstance(req.system, str)
                    else "\n".join(b.text for b in req.system)})
    names: dict[str, str] = {}  # tool_use id -> the tool's name
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            out.append(_assistant_turn(m.content, f"messages.{i}.content", names))
        else:
            out += _user_turns(m.content, f"messages.{i}.content", names)
    return out


def to_chat_request(req: MessagesRequest) -> ChatRequest:
    """The one translation of a Messages request into the chat endpoint's request."""
    if req.stop_sequences is not None and len(req.stop_sequences) > MAX_STOP:
        raise APIError(400, f"stop_sequences: at most {MAX_STOP} are allowed, got "
                       f"{len(req.stop_sequences)}", param="stop_sequences")
    for t in req.tools or []:
        if t.type not in (None, "custom"):
            raise APIError(400, f"tools: the server tool {t.type!r} ({t.name}) is not "
                           "supported: give custom tools (name, description, input_schema)",
                           param="tools")
    body: dict[str, Any] = {
        "model": req.model, "messages": _chat_messages(req), "max_tokens": req.max_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "stream": req.stream, "stop": req.stop_sequences or None}
    if req.thinking is not None:
        body["enable_thinking"] = req.thinking.type != "disabled"
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "parameters": t.input_schema,
            **({"description": t.description} if t.description is not None else {})}}
            for t in req.tools]
    tc = req.tool_choice
    if tc is not None:
        if tc.type == "tool":
            if not tc.name:
                raise APIError(400, "tool_choice: type 'tool' needs a name",
                               param="tool_choice.name")
            body["tool_choice"] = {"type": "function", "function": {"name": tc.name}}
        else:
            body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
        if tc.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    return ChatRequest.model_validate(body, strict=False)


# -- the answer -------------------------------------------------------------------------------

@dataclass
class _MessageChoice(_Choice):
    """A chat choice that keeps its token ids too (which stop sequence ended it)."""

    ids: list[int] = field(default_factory=list)

    def take(self, d: Delta) -> list[Any]:
        self.ids += d.token_ids
        return super().take(d)


def _tool_id(call_id: str) -> str:
    return "toolu_" + (call_id[5:] if call_id.startswith("call_") else call_id)


def _stop(state: ServerState, req: MessagesRequest, ch: _MessageChoice
          ) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished choice. A stop string ends the text just
    before it: the sequence is the one the decoded tokens have at the end of the text (the
    stop matcher's choice: the earliest, then the first given)."""
    if ch.finish_reason == "length":
        return "max_tokens", None
    if ch.finish_reason == "tool_calls":
        return "tool_use", None
    stops = [s for s in req.stop_sequences or [] if s]
    if stops and ch.ids:
        assert state.model is not None
        raw = state.model._tok().decode(ch.ids)
        text = "".join(ch.text)
        at = raw.rfind(text) + len(text) if ch.thought else len(text)  # the answer ends at
        for s in stops:
            if raw.startswith(s, at):
                return "stop_sequence", s
        found = [(raw.find(s), k) for k, s in enumerate(stops) if s in raw]
        if found:
            return "stop_sequence", stops[min(found)[1]]
    return "end_turn", None


def _usage(run: ChatRun, output_tokens: int) -> dict[str, Any]:
    """Anthropic's usage: input_tokens are the prompt's tokens not read from the prefix cache
    (cache_read_input_tokens); their sum is /v1/messages/count_tokens' input_tokens."""
    cached = _cached_tokens(run.reqs, len(run.reqs))
    return {"input_tokens": run.n_prompt - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": output_tokens}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return (f"event: {kind}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode()
            + b"\n\n")


def _message(state: ServerState, mid: str, content: list[dict[str, Any]],
             stop_reason: str | None, stop_sequence: str | None,
             usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": state.model_id,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": usage}


async def _start(state: ServerState, request: Request, count: bool
                 ) -> tuple[MessagesRequest, ChatRun]:
    req: MessagesRequest = _parse(MessagesRequest,
                                  await _read_body(request, state.max_body_bytes))
    if not count and req.max_tokens is None:
        raise APIError(400, "max_tokens: Field required", param="max_tokens")
    chat_req = to_chat_request(req)
    if count:
        chat_req.max_tokens = None
    run = await prepare_chat(state, chat_req, submit=not count)
    run.choices[:] = [_MessageChoice(**vars(c)) for c in run.choices]
    return req, run


async def messages(state: ServerState, request: Request) -> Response:
    """POST /v1/messages: one message as JSON, or its event stream."""
    req, run = await _start(state, request, count=False)
    ch = run.choices[0]
    assert isinstance(ch, _MessageChoice)
    mid = "msg_" + uuid.uuid4().hex

    if req.stream:
        async def events() -> AsyncIterator[bytes]:
            block = -1  # the open content block's index (-1: none)
            kind = ""  # its type
            merged = _merged(state, run.reqs)
            try:
                async for _i, d in merged:
                    if block == -1 and kind == "":
                        kind = "none"  # the request was admitted: its cached tokens known
                        yield _event("message_start", {"type": "message_start", "message":
                                                       _message(state, mid, [], None, None,
                                                                _usage(run, 0))})
                    out = ch.take(d)
                    err = _failed(state, [ch])
                    if err is not None:  # the last event; the message is not finished
                        yield _event("error", error_body(err))
                        return
                    for e in out:
                        if isinstance(e, Reasoning):
                            if kind != "thinking":
                                if block >= 0:
                                    yield _event("content_block_stop",
                                                 {"type": "content_block_stop",
                                                  "index": block})
                                block, kind = block + 1, "thinking"
                                yield _event("content_block_start", {
                                    "type": "content_block_start", "index": block,
                                    "content_block": {"type": "thinking", "thinking": "",
                                                      "signature": ""}})
                            yield _event("content_block_delta", {
                                "type": "content_block_delta", "index": block,
                                "delta": {"type": "thinking_delta", "thinking": e.text}})
                            continue
                        if isinstance(e, str) and kind != "text":
                            if block >= 0:
                                yield _event("content_block_stop",
                                             {"type": "content_block_stop", "index": block})
                            block, kind = block + 1, "text"
                            yield _event("content_block_start", {
                                "type": "content_block_start", "index": block,
                                "content_block": {"type": "text", "text": ""}})
                        if isinstance(e, str):
                            yield _event("content_block_delta", {
                                "type": "content_block_delta", "index": block,
                                "delta": {"type": "text_delta", "text": e}})
                            continue
                        assert isinstance(e, ToolCallDelta)
                        if e.id is not None:
                            if block >= 0:
                                yield _event("content_block_stop",
                                             {"type": "content_block_stop", "index": block})
                            block, kind = block + 1, "tool_use"
                            yield _event("content_block_start", {
                                "type": "content_block_start", "index": block,
                                "content_block": {"type": "tool_use", "id": _tool_id(e.id),
                                                  "name": e.name, "input": {}}})
                        if e.arguments:
                            yield _event("content_block_delta", {
                                "type": "content_block_delta", "index": block,
                                "delta": {"type": "input_json_delta",
                                          "partial_json": e.arguments}})
            finally:
                await merged.aclose()  # cancels the request if the client went away
            if block >= 0:
                yield _event("content_block_stop", {"type": "content_block_stop",
                                                    "index": block})
            reason, seq = _stop(state, req, ch)
            yield _event("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": reason,
                                                     "stop_sequence": seq},
                                           "usage": {"output_tokens": ch.tokens}})
            yield _event("message_stop", {"type": "message_stop"})

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    if not await _collect(request, state, run.reqs, run.choices):
        return Response(status_code=499)
    err = _failed(state, run.choices)
    if err is not None:
        raise err
    content: list[dict[str, Any]] = []
    if ch.thought:
        content.append({"type": "thinking", "thinking": "".join(ch.thought), "signature": ""})
    text = "".join(ch.text)
    if text:
        content.append({"type": "text", "text": text})
    for c in ch.calls:
        try:
            args = json.loads(c.arguments) if c.arguments.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):  # not an object (a call cut short): the text as is
            args = {"_raw_arguments": c.arguments}
        content.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name,
                        "input": args})
    reason, seq = _stop(state, req, ch)
    return JSONResponse(_message(state, mid, content, reason, seq, _usage(run, ch.tokens)))


async def count_tokens(state: ServerState, request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's tokens, rendered as /v1/messages renders
    it (its usage's input_tokens + cache_read_input_tokens)."""
    _req, run = await _start(state, request, count=True)
    return JSONResponse({"input_tokens": run.n_prompt})


def add_routes(app: FastAPI, state: ServerState) -> None:
    """Register POST /v1/messages and /v1/messages/count_tokens on app; their errors (an
    APIError raised on the chat path included) come out in Anthropic's shape."""

    async def guarded(handler: Any, request: Request) -> Response:
        try:
            return await handler(state, request)  # type: ignore[no-any-return]
        except APIError as e:
            return error_response(e)
        except Exception as e:  # noqa: BLE001 - reported as Anthropic's api_error
            log.exception("request failed")
            return error_response(APIError(500, f"internal error: {type(e).__name__}: {e}",
                                           type="server_error"))

    @app.post(MESSAGES_PATH)
    async def messages_route(request: Request) -> Response:
        return await guarded(messages, request)

    @app.post(MESSAGES_PATH + "/count_tokens")
    async def count_tokens_route(request: Request) -> Response:
        return await guarded(count_tokens, request)


__all__ = ["MessagesRequest", "add_routes", "error_body", "is_messages_path",
           "to_chat_request"]
