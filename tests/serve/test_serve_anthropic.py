"""Anthropic's Messages API on `colibri serve` (POST /v1/messages, /v1/messages/count_tokens),
driven by the OFFICIAL `anthropic` client: create and stream, system and multi-turn,
stop_sequences, max_tokens, a tool round trip (a forced tool_use whose input validates against
its input_schema, then a tool_result answered), count_tokens, Anthropic's error shape with
x-api-key and Bearer auth.

The outside check that the translation renders the conversation as the chat endpoint does:
under greedy decoding the Messages answer is the OpenAI chat endpoint's answer for the same
conversation (tool call and result included), and count_tokens is its usage.prompt_tokens.

Servers run on the tiny random MoE model (fast to load), as tests/serve/test_serve_tiny.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import jsonschema
import llguidance  # noqa: F401
import pytest
from serve_util import Server, start  # noqa: E402

from colibri.serve.anthropic import MessagesRequest, error_body, to_chat_request  # noqa: E402
from colibri.serve.state import APIError  # noqa: E402

MODEL = "tiny"
KEY = "anthropic-key-7c1f0e92d4b3a856"
MAX_BODY = 65536
# greedy decoding: the client takes no temperature argument (newer releases dropped the
# sampling arguments), the request body does
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object",
                            "properties": {"city": {"type": "string", "maxLength": 8},
                                           "days": {"type": "integer", "minimum": 1,
                                                    "maximum": 7}},
                            "required": ["city", "days"], "additionalProperties": False}}
SYSTEM = "You answer in one short sentence."
CONV = [{"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "hi, how can I help?"},
        {"role": "user", "content": "tell me about bees"}]


@pytest.fixture(scope="module", autouse=True)
def _no_key_from_the_environment() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLIBRI_API_KEY", raising=False)
        mp.delenv("ANTHROPIC_API_KEY", raising=False)
        mp.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
        mp.delenv("ANTHROPIC_BASE_URL", raising=False)
        yield


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from colibri.tools.make_bench_model import write

    d = tmp_path_factory.mktemp("serve_anthropic")
    tiny = str(write(str(d / "tiny.gguf"), n_layers=2, shape="tiny"))
    srv = start(["-m", tiny, "--model-name", MODEL, "--threads", "2", "--ctx", "2048",
                 "--no-prefault", "--max-seqs", "2", "--api-key", KEY,
                 "--max-body-bytes", str(MAX_BODY)], str(d / "log"), api_key=KEY)
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


def _client(srv: Server, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("api_key", KEY)
    return anthropic.Anthropic(base_url=srv.url, max_retries=0, timeout=300, **kw)


def _post(srv: Server, path: str, body: Any, headers: dict[str, str] | None = None
          ) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=300,
                      headers={"x-api-key": KEY} if headers is None else headers)


def _anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind and body["error"]["message"], body
    return str(body["error"]["message"])


def _text(msg: Any) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def _sse_events(r: httpx.Response) -> list[tuple[str, dict]]:
    out, kind = [], None
    for line in r.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == kind, (kind, data)
            out.append((kind, data))
    return out


# -- the translation, without a server ---------------------------------------------------------

def test_translation_into_a_chat_request():
    req = MessagesRequest.model_validate({
        "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "x"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                 "content": [{"type": "text", "text": "no such city"}]},
                {"type": "text", "text": "try again"}]}],
        "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather",
                                             "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "temperature": 0, "top_k": 5, "metadata": {"user_id": "u"}})
    chat = to_chat_request(req)
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert msgs == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": "Error: no such city", "tool_call_id": "toolu_1",
         "name": "get_weather"},
        {"role": "user", "content": "try again"}], msgs
    assert chat.max_tokens == 9 and chat.stop == ["END"] and chat.temperature == 0
    assert chat.top_k == 5 and chat.parallel_tool_calls is False
    assert chat.tools is not None and chat.tools[0].function.parameters == WEATHER["input_schema"]
    assert chat.tool_choice is not None and not isinstance(chat.tool_choice, str)
    assert chat.tool_choice.function.name == "get_weather"
    for given, want in (("auto", "auto"), ("any", "required"), ("none", "none")):
        r = to_chat_request(MessagesRequest.model_validate(
            {**req.model_dump(exclude_none=True), "tool_choice": {"type": given}}))
        assert r.tool_choice == want
    # a block the server cannot take is a 400 naming it
    bad = MessagesRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "", "media_type": "image/png"}}]}]})
    with pytest.raises(APIError) as e:
        to_chat_request(bad)
    assert e.value.status == 400 and "messages.0.content.0" in e.value.message


def test_error_shape_by_status():
    for status, kind in ((400, "invalid_request_error"), (401, "authentication_error"),
                         (404, "not_found_error"), (413, "request_too_large"),
                         (429, "rate_limit_error"), (500, "api_error"),
                         (503, "overloaded_error")):
        assert error_body(APIError(status, "m")) == {
            "type": "error", "error": {"type": kind, "message": "m"}}


# -- against a server --------------------------------------------------------------------------

@pytest.mark.slow
def test_create_and_stream(server: Server):
    client = _client(server)
    msg = client.messages.create(model=MODEL, max_tokens=16, **GREEDY, system=SYSTEM,
                                 messages=CONV, metadata={"user_id": "u1"})
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == MODEL
    assert [b.type for b in msg.content] == ["text"] and _text(msg), msg
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None, msg
    assert 1 <= msg.usage.output_tokens <= 16
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 20
    # the stream: text deltas that add up to the final message, the same greedy text
    with client.messages.stream(model=MODEL, max_tokens=16, **GREEDY, system=SYSTEM,
                                messages=CONV) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == _text(final) == _text(msg), (pieces, msg)
    assert final.stop_reason == msg.stop_reason and final.id.startswith("msg_")
    assert final.usage.output_tokens == msg.usage.output_tokens
    # the events themselves, in Anthropic's order
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "system": SYSTEM,
            "messages": CONV, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=300,
                      headers={"x-api-key": KEY}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r)
    kinds = [k for k, _ in events if k != "ping"]
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) == {"content_block_delta"}, kinds
    start_msg = events[0][1]["message"]
    assert start_msg["content"] == [] and start_msg["stop_reason"] is None
    assert events[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}
    deltas = [d for k, d in events if k == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == _text(msg)
    md = [d for k, d in events if k == "message_delta"][0]
    assert md["delta"] == {"stop_reason": msg.stop_reason, "stop_sequence": None}, md
    assert md["usage"]["output_tokens"] == msg.usage.output_tokens


@pytest.mark.slow
def test_greedy_text_and_count_match_the_chat_endpoint(server: Server):
    """The Messages request and its OpenAI chat twin (system, multi-turn, a tool call and its
    result): the same greedy text, and count_tokens is the chat's prompt_tokens."""
    client = _client(server)
    anth = [*CONV,
            {"role": "assistant", "content": [
                {"type": "text", "text": "let me look"},
                {"type": "tool_use", "id": "toolu_abc", "name": "get_weather",
                 "input": {"city": "Paris", "days": 2}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_abc", "content": "sunny, 21 C"},
                {"type": "text", "text": "and tomorrow?"}]}]
    openai_msgs = [{"role": "system", "content": SYSTEM}, *CONV,
                   {"role": "assistant", "content": "let me look", "tool_calls": [
                       {"id": "toolu_abc", "type": "function", "function": {
                           "name": "get_weather",
                           "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
                   {"role": "tool", "tool_call_id": "toolu_abc", "name": "get_weather",
                    "content": "sunny, 21 C"},
                   {"role": "user", "content": "and tomorrow?"}]
    tool_oai = {"type": "function", "function": {"name": WEATHER["name"],
                                                 "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
    for with_tools in (False, True):
        extra_a: dict[str, Any] = {"tools": [WEATHER]} if with_tools else {}
        extra_o: dict[str, Any] = {"tools": [tool_oai]} if with_tools else {}
        msg = client.messages.create(model=MODEL, max_tokens=24, **GREEDY, system=SYSTEM,
                                     messages=anth, **extra_a)
        r = _post(server, "/v1/chat/completions",
                  {"model": MODEL, "messages": openai_msgs, "max_tokens": 24,
                   "temperature": 0, **extra_o})
        assert r.status_code == 200, r.text
        chat = r.json()
        want = chat["choices"][0]["message"]["content"] or ""
        assert _text(msg) == want and want, (with_tools, _text(msg), want)
        n = chat["usage"]["prompt_tokens"]
        assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == n
        count = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=anth,
                                             **extra_a)
        assert count.input_tokens == n, (count, n)
    # the result's text is in the prompt: a longer result, more tokens
    longer = [*anth[:-1], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_abc",
         "content": [{"type": "text", "text": "sunny, 21 C, light wind from the west"}]},
        {"type": "text", "text": "and tomorrow?"}]}]
    more = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=longer)
    assert more.input_tokens > client.messages.count_tokens(
        model=MODEL, system=SYSTEM, messages=anth).input_tokens


@pytest.mark.slow
def test_stop_sequences_and_max_tokens(server: Server):
    client = _client(server)
    conv = [{"role": "user", "content": "write a long story about a fox"}]
    full = client.messages.create(model=MODEL, max_tokens=40, **GREEDY, messages=conv)
    text = _text(full)
    assert len(text) >= 12, text
    # a piece from the middle of the greedy text: the answer stops just before it
    k = len(text) // 2
    seq = text[k:k + 3]
    cut = text.find(seq)
    assert cut > 0, (text, seq)
    for stream in (False, True):
        kw: dict[str, Any] = dict(model=MODEL, max_tokens=40, **GREEDY, messages=conv,
                                  stop_sequences=["\u2603never\u2603", seq])
        if stream:
            with client.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kw)
        assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == seq, (stream, msg)
        assert _text(msg) == text[:cut], (stream, _text(msg), text[:cut])
    # max_tokens reached
    for stream in (False, True):
        kw = dict(model=MODEL, max_tokens=3, **GREEDY, messages=conv)
        if stream:
            with client.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kw)
        assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None, (stream, msg)
        assert msg.usage.output_tokens == 3, msg.usage


@pytest.mark.slow
def test_tool_round_trip(server: Server):
    client = _client(server)
    conv: list[dict[str, Any]] = [{"role": "user", "content": "weather in Oslo for 3 days?"}]
    forced = {"type": "tool", "name": "get_weather"}
    msg = client.messages.create(model=MODEL, max_tokens=200, **GREEDY, messages=conv,
                                 tools=[WEATHER], tool_choice=forced)  # type: ignore[arg-type]
    assert msg.stop_reason == "tool_use", msg
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    # streamed: the tool_use block's input arrives as input_json_delta pieces
    with client.messages.stream(model=MODEL, max_tokens=200, **GREEDY, messages=conv,
                                tools=[WEATHER], tool_choice=forced) as s:  # type: ignore
        final = s.get_final_message()
    s_uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(s_uses) == 1, final
    assert s_uses[0].input == uses[0].input and s_uses[0].id.startswith("toolu_")
    body = {"model": MODEL, "max_tokens": 200, "temperature": 0, "messages": conv,
            "tools": [WEATHER], "tool_choice": forced, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=300,
                      headers={"x-api-key": KEY}) as r:
        events = _sse_events(r)
    starts = [d for k, d in events if k == "content_block_start"]
    tool_start = [d for d in starts if d["content_block"]["type"] == "tool_use"]
    assert len(tool_start) == 1 and tool_start[0]["content_block"]["input"] == {}
    idx = tool_start[0]["index"]
    partial = "".join(d["delta"]["partial_json"] for k, d in events
                      if k == "content_block_delta" and d["index"] == idx)
    assert json.loads(partial) == uses[0].input
    # the tool's result goes back; the model answers
    conv += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                               for b in msg.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                           "content": "snow, -4 C"}]}]
    answer = client.messages.create(model=MODEL, max_tokens=16, **GREEDY, messages=conv,
                                    tools=[WEATHER], tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens") and _text(answer), answer
    assert all(b.type == "text" for b in answer.content)
    # tool_choice "any" must call some tool
    anyc = client.messages.create(model=MODEL, max_tokens=200, **GREEDY, messages=conv[:1],
                                  tools=[WEATHER], tool_choice={"type": "any"})
    assert anyc.stop_reason == "tool_use" and anyc.content[-1].type == "tool_use", anyc


@pytest.mark.slow
def test_errors_in_anthropic_shape(server: Server):
    ok = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    # max_tokens is required (count_tokens takes the body without it)
    body = {k: v for k, v in ok.items() if k != "max_tokens"}
    assert "max_tokens" in _anthropic_error(_post(server, "/v1/messages", body), 400,
                                            "invalid_request_error")
    r = _post(server, "/v1/messages/count_tokens", body)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text
    # the key: wrong by x-api-key and by Bearer (the client's api_key and auth_token)
    for kw in ({"api_key": "wrong"}, {"api_key": None, "auth_token": "wrong"}):
        with pytest.raises(anthropic.AuthenticationError) as e:
            _client(server, **kw).messages.create(model=MODEL, max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 401
        assert e.value.body["error"]["type"] == "authentication_error", e.value.body
    msg = _client(server, api_key=None, auth_token=KEY).messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert msg.usage.output_tokens >= 1
    _anthropic_error(_post(server, "/v1/messages", ok, headers={}), 401, "authentication_error")
    _anthropic_error(_post(server, "/v1/messages/count_tokens", body, headers={}), 401,
                     "authentication_error")
    # the OpenAI routes take x-api-key too, and keep OpenAI's error shape
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    r = httpx.get(server.url + "/v1/models", headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and set(r.json()) == {"error"}, r.text
    # an unknown model
    with pytest.raises(anthropic.NotFoundError) as nf:
        _client(server).messages.create(model="claude-nope", max_tokens=2,
                                        messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body["error"]["type"] == "not_found_error", nf.value.body
    _anthropic_error(_post(server, "/v1/messages/count_tokens", {**body, "model": "x"}), 404,
                     "not_found_error")
    # 400s raised on the shared chat path, and the body's own
    with pytest.raises(anthropic.BadRequestError) as br:
        _client(server).messages.create(model=MODEL, max_tokens=2, tools=[WEATHER],  # type: ignore
                                        tool_choice={"type": "tool", "name": "nope"},
                                        messages=[{"role": "user", "content": "hi"}])
    assert br.value.body["error"]["type"] == "invalid_request_error" and "nope" in str(br.value)
    for bad in ({**ok, "max_tokens": 0}, {**ok, "temperature": 1.5}, {**ok, "messages": []},
                {**ok, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                {**ok, "max_tokens": 4096}):
        _anthropic_error(_post(server, "/v1/messages", bad), 400, "invalid_request_error")
    r = httpx.post(server.url + "/v1/messages", content=b"{not json", timeout=60,
                   headers={"x-api-key": KEY, "content-type": "application/json"})
    _anthropic_error(r, 400, "invalid_request_error")
    # the gate's own: a body over --max-body-bytes
    big = {**ok, "system": "x" * (MAX_BODY + 10)}
    _anthropic_error(_post(server, "/v1/messages", big), 413, "request_too_large")
