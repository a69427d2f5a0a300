"""Request handling shared by the endpoints: the body read and validated into the protocol's
models (OpenAI's 400s), the model name, sampling arguments and the token budget checked, a
structured-output constraint compiled, and the engine requests submitted (admission: 429)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request
from pydantic import ValidationError

from colibri.errors import ColibriError
from colibri.serve.protocol import MAX_STOP, _Sampling
from colibri.serve.state import APIError, ServerState

if TYPE_CHECKING:
    from colibri.engine import Request as EngineRequest

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
    """A 404 for a model name this server does not serve (its id, an alias, or any name under
    --accept-any-model-name are served; responses carry the id)."""
    state.require_model(name)


def _check_sampling(req: _Sampling) -> None:
    """The checks of a request's fields that depend on one another (OpenAI's 400s)."""
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream: true",
                       param="stream_options", code="invalid_value")
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP:
        raise APIError(400, f"stop: at most {MAX_STOP} stop sequences are allowed, got "
                       f"{len(req.stop)}", param="stop", code="invalid_value")


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


async def _response_format(state: ServerState, req: _Sampling,
                           wrap: Callable[[Any], tuple[str, Any]] | None = None
                           ) -> Callable[[], Any] | None:
    """The constraint of req's response_format (None: free text). wrap: the schema to the
    grammar the model's format writes it in (gpt-oss: its final channel's message)."""
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None

    async def make(schema: Any) -> Callable[[], Any]:
        kind, spec = wrap(schema) if wrap is not None else ("json_schema", schema)
        return await _constraint_factory(state, kind, spec)

    if rf.type == "json_object":
        return await make({"type": "object"})
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise APIError(400, "response_format json_schema needs json_schema.schema",
                       param="response_format.json_schema")
    schema: Any = rf.json_schema.schema_
    if rf.json_schema.strict:  # OpenAI's strict mode: closed objects, every property required
        from colibri.serve.grammar import strict_schema

        schema = strict_schema(schema)
    return await make(schema)


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
