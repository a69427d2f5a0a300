"""POST /v1/completions: OpenAI's legacy completions (prompts as text or token ids, n, echo,
logprobs, stop, response_format), as one JSON answer or server-sent events."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from colibri.serve.handling import (
    _check_sampling,
    _max_tokens,
    _parse,
    _read_body,
    _require_model,
    _response_format,
    _sampling,
    _submit,
)
from colibri.serve.protocol import CompletionRequest
from colibri.serve.state import APIError, ServerState
from colibri.serve.streaming import (
    _cached_tokens,
    _Choice,
    _collect,
    _completion_logprobs,
    _content,
    _failed,
    _merged,
    _sse,
    _stream_error,
    _usage,
)


async def completions(state: ServerState, request: Request) -> Response:
    """POST /v1/completions: text (or token id) prompts, n completions each, JSON or SSE."""
    req: CompletionRequest = _parse(CompletionRequest, await _read_body(request,
                                                                        state.max_body_bytes))
    _require_model(state, req.model)
    _check_sampling(req)
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
            failed = [False]
            merged = _merged(state, reqs)
            try:
                async for i, d in merged:
                    ch = choices[i]
                    content = _content(ch.take(d))
                    if (err := _stream_error(state, ch, failed)) is not None:
                        # the response failed: its error event is the last before [DONE]
                        # (the other choices are cancelled, their pending text dropped)
                        yield err
                        break
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
            finally:
                await merged.aclose()  # cancels the requests still running
            if usage_wanted and not failed[0]:
                yield _sse({"id": cid, "object": "text_completion", "created": created,
                            "model": state.model_id, "choices": [],
                            "usage": _usage(n_prompt, choices, _cached_tokens(reqs, req.n))})
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
        text = "".join(ch.text)
        out.append({"index": ch.index, "text": echo[ch.index] + text,
                    "logprobs": _completion_logprobs(state, ch.logprobs, 0)
                    if req.logprobs is not None else None,
                    "finish_reason": ch.finish_reason})
    return JSONResponse({"id": cid, "object": "text_completion", "created": created,
                         "model": state.model_id, "choices": out,
                         "usage": _usage(n_prompt, choices, _cached_tokens(reqs, req.n))})
