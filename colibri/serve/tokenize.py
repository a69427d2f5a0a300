"""POST /tokenize and POST /detokenize, in vLLM's shapes.

/tokenize takes a text, {"model"?, "prompt", "add_special_tokens": true}, tokenized as
/v1/completions tokenizes a prompt (control tokens written in the text stay text), or a chat,
{"model"?, "messages", "add_generation_prompt": true, "continue_final_message": false,
"add_special_tokens": false, "tools"?}, rendered and tokenized as /v1/chat/completions renders
and tokenizes its messages (its count is that endpoint's usage.prompt_tokens). It answers
{"count", "max_model_len", "tokens"} and, with "return_token_strs": true, "token_strs" (each
token's vocabulary string, as HF's convert_ids_to_tokens).

/detokenize takes {"model"?, "tokens"} and answers {"prompt"}: the text of the ids, control
tokens included (as HF's decode), byte pieces that are not whole UTF-8 characters as U+FFFD
(as the model's tokenizer decodes them).

Both need the API key when the server has one; a "model" that is given must be one the server
serves (404 otherwise); a bad body, an id outside the vocabulary or a text the tokenizer refuses
is a 400 in OpenAI's shape.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field

from colibri.serve.handling import _parse, _read_body
from colibri.serve.protocol import ChatMessage, Tool, _Strict
from colibri.serve.state import APIError, ServerState


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Strict):
    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    tools: list[Tool] | None = None
    # as the chat endpoint's: variables for the chat template (enable_thinking...)
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: bool | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def _chat_prompt(state: ServerState, req: TokenizeChatRequest) -> str:
    """The chat's prompt text, through the chat endpoint's template path."""
    from colibri.serve.chat import render_prompt

    if req.add_generation_prompt and req.continue_final_message:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be "
                       "true", param="continue_final_message", code="invalid_value")
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    text, msgs, _ = render_prompt(state, req, tools, req.add_generation_prompt)
    if req.continue_final_message:  # open-ended: cut after the last message's text
        last = str(msgs[-1].get("content") or "")
        at = text.rfind(last) if last else -1
        if at >= 0:
            text = text[:at + len(last)]
    return text


def _token_strs(state: ServerState, ids: list[int]) -> list[str]:
    """Each id's vocabulary string (byte-level BPE: 'Ġword'; SentencePiece: '▁word')."""
    m = state.model
    assert m is not None
    vocab = m.gguf.metadata.get("tokenizer.ggml.tokens")
    tok = m._tok()
    if isinstance(vocab, list) and len(vocab) >= tok.vocab_size:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in (vocab[i] for i in ids)]
    return [tok.token_to_piece(i, special=True).decode("utf-8", "replace") for i in ids]


async def tokenize(state: ServerState, request: Request) -> JSONResponse:
    """POST /tokenize: a prompt or a chat's messages to token ids."""
    body = await _read_body(request, state.max_body_bytes)
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None  # _parse names what is wrong
    chat = isinstance(obj, dict) and "messages" in obj
    if chat and "prompt" in obj:
        raise APIError(400, "give either prompt or messages, not both", param="prompt",
                       code="invalid_value")
    req = _parse(TokenizeChatRequest if chat else TokenizeCompletionRequest, body)
    if req.model is not None:
        state.require_model(req.model)
    m = state.model
    assert m is not None
    try:
        if isinstance(req, TokenizeChatRequest):
            ids = m.tokenize(_chat_prompt(state, req), add_special=req.add_special_tokens,
                             parse_special=True)
        else:
            ids = m.tokenize(req.prompt, add_special=req.add_special_tokens)
    except (ValueError, TypeError) as e:
        raise APIError(400, f"{'messages' if chat else 'prompt'}: {e}",
                       param="messages" if chat else "prompt", code="invalid_value") from None
    out: dict[str, Any] = {"count": len(ids), "max_model_len": m.ctx, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = _token_strs(state, ids)
    return JSONResponse(out)


async def detokenize(state: ServerState, request: Request) -> JSONResponse:
    """POST /detokenize: token ids to their text."""
    req: DetokenizeRequest = _parse(DetokenizeRequest,
                                    await _read_body(request, state.max_body_bytes))
    if req.model is not None:
        state.require_model(req.model)
    m = state.model
    assert m is not None
    try:
        text = m._tok().decode(req.tokens, special=True)
    except (ValueError, TypeError, OverflowError) as e:
        raise APIError(400, f"tokens: {e}", param="tokens", code="invalid_value") from None
    return JSONResponse({"prompt": text})


__all__ = ["DetokenizeRequest", "TokenizeChatRequest", "TokenizeCompletionRequest",
           "detokenize", "tokenize"]
