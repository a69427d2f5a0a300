"""Reading engine requests for a response: their deltas merged as they come (a client gone
cancels them), each choice's text, tool calls and logprobs accumulated, server-sent events,
usage, and the error a failed or cancelled choice gives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from colibri.serve.reasoning import Reasoning, ReasoningSplitter
from colibri.serve.state import APIError, ServerState
from colibri.serve.tool_parse import (
    Event,
    ToolCall,
    ToolCallDelta,
    ToolStreamParser,
    apply_delta,
    merge_events,
)

if TYPE_CHECKING:
    from colibri.engine import Delta
    from colibri.engine import Request as EngineRequest

async def _merged(state: ServerState, reqs: list[EngineRequest]
                  ) -> AsyncGenerator[tuple[int, Delta], None]:
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
    """One choice's output as it accumulates: the reasoning splitter (a model that thinks
    before answering) takes the text first, the tool-call parser (when tools apply) the
    answer text it releases."""

    index: int
    parser: ToolStreamParser | None = None
    reasoning: ReasoningSplitter | None = None
    max_calls: int | None = None  # parallel_tool_calls=false: the first call only
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    logprobs: list[Any] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    thought: list[str] = field(default_factory=list)  # the reasoning text
    reasoning_tokens: int = 0
    # control tokens whose text the parsers need (tool_grammar.control_tags: id -> tag): the
    # engine's text leaves them out, they are put back here
    tags: dict[int, str] = field(default_factory=dict)

    def _answer(self, text: str, last: bool) -> list[Event]:
        if self.parser is None:
            return [text] if text else []
        events = self.parser.feed(text)
        if last:
            events += self.parser.finish()
        return merge_events(events)

    def take(self, d: Delta) -> list[Event | Reasoning]:
        """Add a delta; returns what it releases, in order: reasoning (Reasoning), content
        text and the pieces of tool calls (ToolCallDelta)."""
        self.tokens += len(d.token_ids)
        if d.logprobs:
            self.logprobs += d.logprobs
        last = d.finish_reason is not None
        text = d.text + "".join(self.tags[t] for t in d.token_ids if t in self.tags)
        events: list[Event | Reasoning] = []
        if self.reasoning is None:
            events += self._answer(text, last)
        else:
            thinking = self.reasoning.in_reasoning
            pieces = self.reasoning.feed(text)
            if last:
                pieces += self.reasoning.finish()
            if thinking or self.reasoning.in_reasoning:  # the tags' own tokens included
                self.reasoning_tokens += len(d.token_ids)
            for p in pieces:  # a format that carries calls (harmony) gives their pieces
                events += self._answer(p, False) if isinstance(p, str) else [p]
            if last and self.parser is not None:
                events += self._answer("", True)
        if self.max_calls is not None:
            events = [e for e in events
                      if not isinstance(e, ToolCallDelta) or e.index < self.max_calls]
        for e in events:
            if isinstance(e, str):
                self.text.append(e)
            elif isinstance(e, Reasoning):
                self.thought.append(e.text)
            else:
                apply_delta(self.calls, e)
        if d.finish_reason is not None:
            self.finish_reason = d.finish_reason
            self.error = d.error
            if self.calls and d.finish_reason == "stop":
                self.finish_reason = "tool_calls"
        return events


def _content(events: list[Event | Reasoning]) -> str:
    return "".join(e for e in events if isinstance(e, str))


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


def _cached_tokens(reqs: list[EngineRequest], n: int) -> int:
    """Prompt tokens served from the engine's prefix cache, for usage: reqs are n completions
    of each prompt in turn; a prompt counts once (as in prompt_tokens), with the tokens that
    every one of its completions reused (the first of n prefills what the others copy)."""
    return sum(min(r.cached_tokens for r in reqs[i:i + n]) for i in range(0, len(reqs), n))


def _usage(prompt_tokens: int, choices: list[_Choice], cached: int = 0) -> dict[str, Any]:
    c = sum(ch.tokens for ch in choices)
    u: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": c,
                         "total_tokens": prompt_tokens + c,
                         "prompt_tokens_details": {"cached_tokens": cached}}
    if any(ch.reasoning is not None for ch in choices):  # a reasoning model
        u["completion_tokens_details"] = {
            "reasoning_tokens": sum(ch.reasoning_tokens for ch in choices)}
    return u


def _failed(state: ServerState, choices: list[_Choice]) -> APIError | None:
    for ch in choices:
        if ch.finish_reason == "error":
            return APIError(500, f"generation failed: {ch.error}", type="server_error",
                            code="generation_error")
        if ch.finish_reason == "cancelled":
            return state.cancelled_error()
    return None


def _stream_error(state: ServerState, ch: _Choice, sent: list[bool]) -> bytes | None:
    """The error event a stream sends when choice ch failed or was cancelled by the server
    (once per response: sent[0] records it; the stream then ends with [DONE]), or None."""
    if ch.finish_reason == "error":
        err = APIError(500, f"generation failed: {ch.error}", type="server_error",
                       code="generation_error")
    elif ch.finish_reason == "cancelled":
        err = state.cancelled_error()
    else:
        return None
    if sent[0]:
        return b""
    sent[0] = True
    return _sse(err.body())
