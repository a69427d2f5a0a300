"""POST /v1/chat/completions: messages rendered with the model's chat template (tool calls and
results folded into plain turns for a template without tools), tools and tool_choice (a call
grammar), logprobs, as one JSON answer or server-sent events."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from colibri.errors import ColibriError
from colibri.serve.handling import (
    _check_sampling,
    _constraint_factory,
    _max_tokens,
    _parse,
    _read_body,
    _require_model,
    _response_format,
    _sampling,
    _submit,
)
from colibri.serve.harmony import Harmony, described, with_thinking
from colibri.serve.protocol import ChatMessage, ChatRequest, NamedToolChoice
from colibri.serve.reasoning import Reasoning, ThinkTags, splitter_for
from colibri.serve.state import APIError, ServerState
from colibri.serve.streaming import (
    _cached_tokens,
    _chat_logprobs,
    _Choice,
    _collect,
    _failed,
    _merged,
    _sse,
    _stream_error,
    _usage,
)
from colibri.serve.tool_grammar import call_grammar, control_tags, harmony_final
from colibri.serve.tools import (
    ToolError,
    ToolStreamParser,
    check_tools,
    string_params,
)


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


# what chat_template_kwargs may not set: the render's own arguments, and tools (checked first)
_RESERVED_KWARGS = ("messages", "add_generation_prompt", "tools")


def template_context(req: Any) -> dict[str, Any]:
    """The chat template's extra variables a request sets (a ChatRequest, or /tokenize's chat
    form): chat_template_kwargs (as vLLM), then enable_thinking (the top-level field wins)."""
    ctx = dict(req.chat_template_kwargs or {})
    for k in _RESERVED_KWARGS:
        if k in ctx:
            raise APIError(400, f"chat_template_kwargs: {k!r} cannot be set here",
                           param="chat_template_kwargs", code="invalid_value")
    if req.enable_thinking is not None:
        ctx["enable_thinking"] = req.enable_thinking
    return ctx



def render_prompt(state: ServerState, req: Any, tools: list[dict[str, Any]],
                  add_generation_prompt: bool = True
                  ) -> tuple[str, list[dict[str, Any]], str]:
    """(prompt text, the messages as the template took them, the template) of a chat request
    (a ChatRequest, or /tokenize's chat form): its messages through the model's chat template
    with the request's template variables and tools (a template without tools gets them
    folded into plain turns); a template that refuses them is a 400."""
    from colibri.generate import chat_template, render_chat

    m = state.model
    assert m is not None
    try:
        template = chat_template(m)
    except ColibriError as e:
        raise APIError(400, str(e), param="messages") from None
    ctx = template_context(req)
    if tools:
        ctx["tools"] = described(tools) if Harmony.applies(template) else tools
    msgs = _template_messages(req.messages, "tool" in template)
    if Harmony.applies(template):
        msgs = with_thinking(msgs, req.messages)
    try:
        text = render_chat(m, msgs, add_generation_prompt=add_generation_prompt, **ctx)
    except (ColibriError, ValueError, TypeError) as e:
        raise APIError(400, f"messages: {e}", param="messages") from None
    return text, msgs, template


@dataclass
class ChatRun:
    """A chat request checked, rendered and submitted to the engine: what every API built on
    chat (OpenAI's chat completions, and the APIs translated into a ChatRequest) formats as its
    own answer. reqs[i] is completion i; choices[i] reads its deltas (text, tool calls)."""

    n_prompt: int
    reqs: list[Any]
    choices: list[_Choice]
    top_logprobs: int  # 0: none asked for


async def prepare_chat(state: ServerState, req: ChatRequest, submit: bool = True) -> ChatRun:
    """Check req (OpenAI's 400s), render it with the model's chat template (tools included),
    compile its constraint (tool_choice or response_format) and submit its n completions
    (submit=False: checked and rendered only, for a count of the prompt's tokens)."""
    _require_model(state, req.model)
    _check_sampling(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs",
                       code="invalid_value")
    for i, turn in enumerate(req.messages):
        if turn.content is None and not (turn.role == "assistant" and turn.tool_calls):
            raise APIError(400, f"messages.{i}.content: a {turn.role} message needs content "
                           "(null is allowed only in an assistant message with tool_calls)",
                           param=f"messages.{i}.content", code="invalid_value")
    m = state.model
    assert m is not None
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    try:
        check_tools(tools)
    except ToolError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_value") from None
    choice = req.tool_choice or ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    use_tools = bool(tools) and choice != "none"
    names = {t["function"]["name"] for t in tools}
    text, _, template = render_prompt(state, req, tools if use_tools else [])
    ids = m.tokenize(text, add_special=False, parse_special=True)
    if not ids:
        raise APIError(400, "the messages render to no tokens", param="messages")
    if not submit:
        return ChatRun(len(ids), [], [], 0)
    asked = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    kw = _sampling(req, state, _max_tokens(state, len(ids), asked, None, "messages"))
    constraint: Callable[[], Any] | None
    tags = control_tags(m) if use_tools or splitter_for(template, text) else {}
    if use_tools and (choice == "required" or isinstance(choice, NamedToolChoice)):
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        if name is not None and name not in names:
            raise APIError(400, f"tool_choice names {name!r}, which is not among the "
                           f"tools", param="tool_choice")
        thought = splitter_for(template, text)  # a thought the prompt leaves open: closed
        close = thought.CLOSE if isinstance(thought, ThinkTags) and thought.in_reasoning else ""
        kind, spec = call_grammar(tools, name, template, close, tags)
        constraint = await _constraint_factory(state, kind, spec, param="tools")
    else:
        constraint = await _response_format(state, req, (lambda s: harmony_final(s, tags))
                                            if Harmony.applies(template) else None)
    parse_tools = use_tools and (req.response_format is None
                                 or req.response_format.type == "text"
                                 or choice == "required" or isinstance(choice, NamedToolChoice))
    top = req.top_logprobs if req.top_logprobs is not None else 0
    reqs = _submit(state, [ids], req.n, kw, constraint, top if req.logprobs else None)
    strings = string_params(tools)
    read = names if parse_tools else set()
    choices = []
    for i in range(len(reqs)):
        split = splitter_for(template, text, read)
        parser = ToolStreamParser(names, strings) if parse_tools and not (
            split is not None and split.reads_calls) else None
        choices.append(_Choice(index=i, parser=parser, reasoning=split,
                               max_calls=1 if req.parallel_tool_calls is False else None,
                               tags={tid: tag for tag, tid in tags.items()}))
    return ChatRun(len(ids), reqs, choices, top)


async def chat(state: ServerState, request: Request) -> Response:
    """POST /v1/chat/completions: messages through the chat template, tools, JSON or SSE."""
    req: ChatRequest = _parse(ChatRequest, await _read_body(request, state.max_body_bytes))
    run = await prepare_chat(state, req)
    reqs, choices, top = run.reqs, run.choices, run.top_logprobs
    cid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())

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
            failed = [False]
            merged = _merged(state, reqs)
            try:
                async for i, d in merged:
                    ch = choices[i]
                    out = ch.take(d)
                    if (err := _stream_error(state, ch, failed)) is not None:
                        # the response failed: its error event is the last before [DONE]
                        # (the other choices are cancelled, their pending text dropped)
                        yield err
                        break
                    lp = None
                    if req.logprobs and d.logprobs:
                        lp = {"content": _chat_logprobs(state, d.logprobs, top > 0)}
                    # content and tool-call pieces in the order the model wrote them; this
                    # step's logprobs ride on its first content chunk (an empty one if none)
                    if lp is not None and (not out or not isinstance(out[0], str)):
                        yield chunk(i, {"content": ""}, None, lp)
                        lp = None
                    for e in out:
                        if isinstance(e, str):
                            yield chunk(i, {"content": e}, None, lp)
                            lp = None
                        elif isinstance(e, Reasoning):
                            yield chunk(i, {"reasoning_content": e.text})
                        else:
                            yield chunk(i, {"tool_calls": [e.openai()]})
                    if ch.finish_reason is not None:
                        yield chunk(i, {}, ch.finish_reason)
            finally:
                await merged.aclose()  # cancels the requests still running
            if usage_wanted and not failed[0]:
                yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created,
                            "model": state.model_id, "system_fingerprint": None,
                            "choices": [],
                            "usage": _usage(run.n_prompt, choices,
                                            _cached_tokens(reqs, len(reqs)))})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    if not await _collect(request, state, reqs, choices):
        return Response(status_code=499)
    err = _failed(state, choices)
    if err is not None:
        raise err
    out = []
    for ch in choices:
        content = "".join(ch.text)
        msg: dict[str, Any] = {"role": "assistant",
                               "content": content if content or not ch.calls else None}
        if ch.reasoning is not None:  # a reasoning model (vLLM's and llama-server's field)
            msg["reasoning_content"] = "".join(ch.thought) or None
        if ch.calls:
            msg["tool_calls"] = [c.openai() for c in ch.calls]
        out.append({"index": ch.index, "message": msg,
                    "logprobs": {"content": _chat_logprobs(state, ch.logprobs, top > 0)}
                    if req.logprobs else None,
                    "finish_reason": ch.finish_reason})
    return JSONResponse({"id": cid, "object": "chat.completion", "created": created,
                         "model": state.model_id, "system_fingerprint": None,
                         "choices": out,
                         "usage": _usage(run.n_prompt, choices, _cached_tokens(reqs, len(reqs)))})
