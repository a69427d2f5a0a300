"""OpenAI's Responses API on the chat endpoint: POST /v1/responses (JSON or server-sent events),
GET / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel.

A Responses request is translated into a ChatRequest in one place (to_chat_request) and run
by chat.prepare_chat: the checks, the chat template, tools, the grammar of tool_choice or
text.format and the engine submission are the chat endpoint's own. What is here is the
translation, the Responses output shapes (output items, the event stream), and the store of
responses that previous_response_id continues: the last STORE_SIZE responses in memory, each
with its whole conversation, visible only to the API key that created it.

Not served: background responses (400; cancel therefore answers 400, as OpenAI does for a
response not created with background: true), built-in tools (only function tools), input
images and files.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter

from colibri.serve.chat import prepare_chat
from colibri.serve.handling import _parse, _read_body
from colibri.serve.protocol import ChatMessage, ChatRequest
from colibri.serve.reasoning import Reasoning
from colibri.serve.state import APIError, ServerState
from colibri.serve.streaming import (
    _cached_tokens,
    _Choice,
    _collect,
    _failed,
    _merged,
)
from colibri.serve.tool_parse import ToolCallDelta

STORE_SIZE = 1000  # stored responses kept (the least recently used go first)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


# -- the request ------------------------------------------------------------------------------

class TextContent(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextContent]


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    arguments: str


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1)]
    output: str | list[TextContent]


class ReasoningItem(_Strict):
    """An earlier turn's reasoning, given back: accepted, not shown to the model (as chat
    templates drop the thinking of earlier turns)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None


def _item_type(v: Any) -> str:
    t = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")
    return t if isinstance(t, str) else ""


Item = Annotated[Annotated[MessageItem, Tag("message")]
                 | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                 | Annotated[ReasoningItem, Tag("reasoning")],
                 Discriminator(_item_type)]
_ITEMS: TypeAdapter[list[Item]] = TypeAdapter(list[Item])


class FunctionTool(_Strict):
    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None


class ReasoningConfig(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Strict):
    model: str | None = None  # optional in this API: the served model
    input: str | list[Item]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    store: bool = True
    background: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None


def _text(content: str | list[TextContent]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def to_chat_request(req: ResponsesRequest, items: list[Any]) -> ChatRequest:
    """The chat request a Responses request is: instructions a system turn, then the
    conversation's items (a run of function_call items one assistant turn with tool_calls, on
    the assistant's text before them; a function_call_output a tool turn), the function tools,
    tool_choice, text.format as response_format, max_output_tokens as max_completion_tokens."""
    msgs: list[dict[str, Any]] = []
    if req.instructions is not None:
        msgs.append({"role": "system", "content": req.instructions})
    names: dict[str, str] = {}  # call_id -> function name
    for it in items:
        if isinstance(it, ReasoningItem):
            continue
        if isinstance(it, MessageItem):
            msgs.append({"role": it.role, "content": _text(it.content)})
        elif isinstance(it, FunctionCallItem):
            names[it.call_id] = it.name
            call = {"id": it.call_id, "type": "function",
                    "function": {"name": it.name, "arguments": it.arguments}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            tool: dict[str, Any] = {"role": "tool", "tool_call_id": it.call_id,
                                    "content": _text(it.output)}
            if it.call_id in names:
                tool["name"] = names[it.call_id]
            msgs.append(tool)
    if not msgs:
        raise APIError(400, "input: the conversation is empty", param="input",
                       code="invalid_value")
    body: dict[str, Any] = {
        "model": req.model, "messages": [ChatMessage.model_validate(m) for m in msgs],
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "max_completion_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls}
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None:  # thinking off for "none", on otherwise (where the template reads it)
        body["enable_thinking"] = effort != "none"
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(
            exclude={"type"}, exclude_none=True)} for t in req.tools]
    if isinstance(req.tool_choice, FunctionToolChoice):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None and (req.tools or req.tool_choice != "auto"):
        body["tool_choice"] = req.tool_choice
    fmt = req.text.format if req.text is not None else None
    if fmt is not None:
        rf: dict[str, Any] = {"type": fmt.type}
        if fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise APIError(400, "text.format: a json_schema format needs a schema",
                               param="text.format.schema", code="invalid_value")
            rf["json_schema"] = {"name": fmt.name, "description": fmt.description,
                                 "schema": fmt.schema_, "strict": fmt.strict}
        body["response_format"] = rf
    return ChatRequest.model_validate(body)


# -- the store --------------------------------------------------------------------------------

@dataclass
class Stored:
    owner: str  # the hash of the API key that created it ("" when the server has none)
    response: dict[str, Any]
    items: list[Any]  # the conversation: its input items (history included), then its output


class ResponseStore:
    """The last `size` stored responses (least recently used dropped first), each visible only
    to its owner. Thread-safe."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self._d: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, owner: str, response: dict[str, Any], items: list[Any]) -> None:
        with self._lock:
            self._d[rid] = Stored(owner, response, items)
            self._d.move_to_end(rid)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def get(self, rid: str, owner: str) -> Stored | None:
        with self._lock:
            s = self._d.get(rid)
            if s is None or s.owner != owner:
                return None
            self._d.move_to_end(rid)
            return s

    def delete(self, rid: str, owner: str) -> bool:
        with self._lock:
            s = self._d.get(rid)
            if s is None or s.owner != owner:
                return False
            del self._d[rid]
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._d)


def _owner(request: Request, state: ServerState) -> str:
    """Who a stored response belongs to: the hash of the request's API key (the one the gate
    checked), or "" when the server takes no key (everyone shares the store)."""
    if not state.api_key:
        return ""
    auth = request.headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else \
        request.headers.get("x-api-key", "")
    return hashlib.sha256(key.encode()).hexdigest()


def _not_found(rid: str, param: str | None = None) -> APIError:
    what = "Previous response" if param else "Response"
    return APIError(404, f"{what} with id {rid!r} not found (unknown, not stored, deleted, "
                    f"or created with another API key)", param=param,
                    code="previous_response_not_found" if param else "response_not_found")


# -- the answer -------------------------------------------------------------------------------

def _message(text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _reasoning(text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def _function_call(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def _output(ch: _Choice) -> list[dict[str, Any]]:
    """The output items of a finished choice: its reasoning, its text as a message (unless it
    is only blank space around tool calls or after reasoning cut short), then its calls; cut
    by the token limit, the last one incomplete."""
    text, thought = "".join(ch.text), "".join(ch.thought)
    items = [_reasoning(thought, "completed")] if thought else []
    if text.strip() or not (ch.calls or thought):
        items.append(_message(text, "completed"))
    items += [_function_call(c.id, c.name, c.arguments, "completed") for c in ch.calls]
    if ch.finish_reason == "length":
        items[-1]["status"] = "incomplete"
    return items


class _Response:
    """The Response object of one request, from in_progress to its end."""

    def __init__(self, state: ServerState, req: ResponsesRequest) -> None:
        self.state, self.req = state, req
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())

    def body(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
             incomplete: bool = False, error: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.req
        fmt = r.text.format if r.text is not None and r.text.format is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status, "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
            "model": self.state.model_id, "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": r.reasoning.model_dump() if r.reasoning is not None
            else {"effort": None, "summary": None}, "store": r.store,
            "temperature": 1.0 if r.temperature is None else r.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt is not None else {"type": "text"}},
            "tool_choice": r.tool_choice.model_dump() if isinstance(r.tool_choice, BaseModel)
            else r.tool_choice or "auto",
            "tools": [t.model_dump() for t in r.tools or []],
            "top_p": 1.0 if r.top_p is None else r.top_p, "truncation": "disabled",
            "usage": usage, "user": r.user, "metadata": r.metadata or {}}

    @staticmethod
    def usage(n_prompt: int, ch: _Choice, cached: int) -> dict[str, Any]:
        return {"input_tokens": n_prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": ch.tokens,
                "output_tokens_details": {"reasoning_tokens": ch.reasoning_tokens},
                "total_tokens": n_prompt + ch.tokens}


class _Events:
    """The event stream of one response: output items opened and closed as the model's text
    and tool calls come (blank text before a call is no message of its own), each event with
    its sequence_number."""

    def __init__(self) -> None:
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # the output so far
        self.open: dict[str, Any] | None = None  # the item being written
        self.blank = ""  # blank text not yet given to a message

    def event(self, type: str, **fields: Any) -> bytes:
        body = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return (f"event: {type}\ndata: ".encode()
                + json.dumps(body, ensure_ascii=False).encode() + b"\n\n")

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        self.open = item
        self.items.append(item)
        shown = {**item, "content": []} if item["type"] in ("message", "reasoning") else item
        out = [self.event("response.output_item.added", output_index=len(self.items) - 1,
                          item=shown)]
        if item["type"] in ("message", "reasoning"):
            part = {"type": "output_text", "text": "", "annotations": []} \
                if item["type"] == "message" else {"type": "reasoning_text", "text": ""}
            out.append(self.event("response.content_part.added", item_id=item["id"],
                                  output_index=len(self.items) - 1, content_index=0,
                                  part=part))
        return out

    def close(self, status: str = "completed") -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        i = len(self.items) - 1
        out = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", item_id=item["id"],
                                  output_index=i, content_index=0, text=part["text"],
                                  logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"],
                                  output_index=i, content_index=0,
                                  part={k: v for k, v in part.items() if k != "logprobs"}))
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out.append(self.event("response.reasoning_text.done", item_id=item["id"],
                                  output_index=i, content_index=0, text=part["text"]))
            out.append(self.event("response.content_part.done", item_id=item["id"],
                                  output_index=i, content_index=0, part=part))
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=i, name=item["name"],
                                  arguments=item["arguments"]))
        out.append(self.event("response.output_item.done", output_index=i, item=item))
        return out

    def text(self, s: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != "message":
            if not (self.blank + s).strip():
                self.blank += s
                return []
            out += self.close()
            out += self._add(_message("", "in_progress"))
            s, self.blank = self.blank + s, ""
        assert self.open is not None
        self.open["content"][0]["text"] += s
        out.append(self.event("response.output_text.delta", item_id=self.open["id"],
                              output_index=len(self.items) - 1, content_index=0, delta=s,
                              logprobs=[]))
        return out

    def reasoning(self, s: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open is None or self.open["type"] != "reasoning":
            out += self.close()
            out += self._add(_reasoning("", "in_progress"))
        assert self.open is not None
        self.open["content"][0]["text"] += s
        out.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                              output_index=len(self.items) - 1, content_index=0, delta=s))
        return out

    def call(self, d: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        if d.id is not None:  # a new call
            self.blank = ""
            out += self.close()
            out += self._add(_function_call(d.id, d.name or "", "", "in_progress"))
        assert self.open is not None and self.open["type"] == "function_call"
        if d.arguments:
            self.open["arguments"] += d.arguments
            out.append(self.event("response.function_call_arguments.delta",
                                  item_id=self.open["id"], output_index=len(self.items) - 1,
                                  delta=d.arguments))
        return out

    def finish(self, status: str) -> list[bytes]:
        out: list[bytes] = []
        if not self.items:  # nothing but blank text (or nothing): one message of it
            out += self.text(self.blank) if self.blank else self._add(_message("", "in_progress"))
        return out + self.close(status)


# -- the routes -------------------------------------------------------------------------------

def add_routes(app: FastAPI, state: ServerState) -> None:
    """POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel
    on app (the store is this app's)."""
    store = ResponseStore()

    @app.post("/v1/responses")
    async def create(request: Request) -> Response:
        req: ResponsesRequest = _parse(ResponsesRequest,
                                       await _read_body(request, state.max_body_bytes))
        if req.background:
            raise APIError(400, "background responses are not supported by colibri serve",
                           param="background", code="unsupported_value")
        owner = _owner(request, state)
        history: list[Any] = []
        if req.previous_response_id is not None:
            prev = store.get(req.previous_response_id, owner)
            if prev is None:
                raise _not_found(req.previous_response_id, "previous_response_id")
            history = list(prev.items)
        given = ([MessageItem(role="user", content=req.input)] if isinstance(req.input, str)
                 else list(req.input))
        conversation = history + given
        if req.model is None:  # optional in this API: the served model
            req = req.model_copy(update={"model": state.model_id})
        run = await prepare_chat(state, to_chat_request(req, conversation))
        resp = _Response(state, req)
        ch = run.choices[0]

        def keep(body: dict[str, Any]) -> None:
            if req.store:
                store.put(resp.id, owner, body,
                          conversation + _ITEMS.validate_python(body["output"]))

        def final(output: list[dict[str, Any]]) -> dict[str, Any]:
            incomplete = ch.finish_reason == "length"
            return resp.body("incomplete" if incomplete else "completed", output,
                             resp.usage(run.n_prompt, ch, _cached_tokens(run.reqs, 1)),
                             incomplete)

        if not req.stream:
            if not await _collect(request, state, run.reqs, run.choices):
                return Response(status_code=499)
            err = _failed(state, run.choices)
            if err is not None:
                raise err
            body = final(_output(ch))
            keep(body)
            return JSONResponse(body)

        async def events() -> AsyncIterator[bytes]:
            ev = _Events()
            yield ev.event("response.created", response=resp.body("in_progress", [], None))
            yield ev.event("response.in_progress", response=resp.body("in_progress", [], None))
            merged = _merged(state, run.reqs)
            try:
                async for _, d in merged:
                    for e in ch.take(d):
                        for b in (ev.text(e) if isinstance(e, str) else ev.reasoning(e.text)
                                  if isinstance(e, Reasoning) else ev.call(e)):
                            yield b
                    if (err := _failed(state, [ch])) is not None:
                        yield ev.event("error", code=err.code, message=err.message,
                                       param=err.param)
                        yield ev.event("response.failed", response=resp.body(
                            "failed", ev.items, None,
                            error={"code": "server_error", "message": err.message}))
                        return
                    if ch.finish_reason is not None:
                        break
            finally:
                await merged.aclose()  # cancels the request if still running (client gone)
            incomplete = ch.finish_reason == "length"
            for b in ev.finish("incomplete" if incomplete else "completed"):
                yield b
            body = final(ev.items)
            keep(body)
            yield ev.event("response.incomplete" if incomplete else "response.completed",
                           response=body)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.get("/v1/responses/{rid}")
    async def retrieve(rid: str, request: Request) -> JSONResponse:
        s = store.get(rid, _owner(request, state))
        if s is None:
            raise _not_found(rid)
        return JSONResponse(s.response)

    @app.delete("/v1/responses/{rid}")
    async def delete(rid: str, request: Request) -> JSONResponse:
        if not store.delete(rid, _owner(request, state)):
            raise _not_found(rid)
        return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})

    @app.post("/v1/responses/{rid}/cancel")
    async def cancel(rid: str, request: Request) -> JSONResponse:
        if store.get(rid, _owner(request, state)) is None:
            raise _not_found(rid)
        raise APIError(400, "only a response created with background: true can be cancelled "
                       "(colibri serve runs none: this one has finished)", param=None,
                       code="invalid_request")


__all__ = ["STORE_SIZE", "ResponseStore", "ResponsesRequest", "add_routes", "to_chat_request"]
