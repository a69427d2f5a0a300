"""OpenAI's Responses API on `colibri serve` (issue #50's part), through the official `openai`
client: `responses.create` (string and message-list input, instructions), `responses.stream`
(the documented events in order, sequence numbers, text deltas joining to the output),
`responses.parse` with a pydantic model, a function-call round trip (a forced call whose
arguments validate, its output answered through previous_response_id), max_output_tokens
reached (status "incomplete" with its reason), the store (store: false, GET / DELETE / cancel,
a response visible only to the API key that created it, least recently used dropped), errors.

The outside check of the translation: at temperature 0 a response's output_text is the chat
endpoint's content for the same conversation and usage.input_tokens its prompt_tokens (the same
prompt rendered).

Servers run on the tiny random MoE model (fast to load), as tests/serve/test_serve_tiny.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import jsonschema
import llguidance  # noqa: F401
import openai
import pytest
from pydantic import BaseModel, Field
from serve_util import Server, start  # noqa: E402

from colibri.serve.handling import _parse  # noqa: E402
from colibri.serve.responses import (  # noqa: E402
    MessageItem,
    ResponsesRequest,
    ResponseStore,
    to_chat_request,
)
from colibri.serve.state import APIError  # noqa: E402

MODEL = "tiny"
KEY = "responses-key-8c1f0e7a93d24b65"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
           "required": ["city"]}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "the weather",
                     "parameters": WEATHER, "strict": True}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
              for t in TOOLS]


class Place(BaseModel):
    city: str = Field(max_length=8)
    rank: int


# -- without a server ------------------------------------------------------------------------

def test_store_is_per_key_and_bounded():
    s = ResponseStore(size=3)
    s.put("r1", "alice", {"id": "r1"}, [])
    assert s.get("r1", "bob") is None and not s.delete("r1", "bob")  # another key sees nothing
    got = s.get("r1", "alice")
    assert got is not None and got.response == {"id": "r1"}
    s.put("r2", "alice", {"id": "r2"}, [])
    s.put("r3", "bob", {"id": "r3"}, [])
    assert s.get("r1", "alice") is not None  # r1 used: r2 is now the least recently used
    s.put("r4", "alice", {"id": "r4"}, [])
    assert len(s) == 3 and s.get("r2", "alice") is None
    assert all(s.get(r, o) is not None for r, o in (("r1", "alice"), ("r3", "bob"),
                                                    ("r4", "alice")))
    assert s.delete("r1", "alice") and s.get("r1", "alice") is None and len(s) == 2


def test_translation_into_a_chat_request():
    req = _parse(ResponsesRequest, json.dumps({
        "model": MODEL, "instructions": "be brief", "tools": TOOLS, "tool_choice": "required",
        "max_output_tokens": 7, "temperature": 0, "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "p", "schema": WEATHER,
                            "strict": True}},
        "input": [
            {"role": "developer", "content": "dev"},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "a"}, {"type": "input_text",
                                                               "text": "b"}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "looking", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Oslo"}', "id": "fc_1", "status": "completed"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "-3 C"},
            {"type": "function_call_output", "call_id": "c9", "output": "?"}]}).encode())
    chat = to_chat_request(req, list(req.input))
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in msgs] == ["system", "developer", "user", "assistant", "tool",
                                         "tool"]
    assert msgs[0]["content"] == "be brief" and msgs[2]["content"] == "ab"
    # the calls ride on the assistant's text before them
    assert msgs[3]["content"] == "looking"
    assert [c["id"] for c in msgs[3]["tool_calls"]] == ["c1", "c2"]
    assert msgs[3]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                    "arguments": '{"city": "Oslo"}'}
    assert msgs[4] == {"role": "tool", "content": "-3 C", "tool_call_id": "c1",
                       "name": "get_weather"}
    assert "name" not in msgs[5]  # an unknown call id: no name
    assert chat.tools is not None and chat.tools[0].function.name == "get_weather"
    assert chat.tools[0].function.strict is True and chat.tool_choice == "required"
    assert chat.max_completion_tokens == 7 and chat.temperature == 0.0
    assert chat.parallel_tool_calls is False
    rf = chat.response_format
    assert rf is not None and rf.type == "json_schema" and rf.json_schema is not None
    assert rf.json_schema.schema_ == WEATHER and rf.json_schema.strict is True
    # a named function; "auto" without tools is no tool_choice at all
    named = _parse(ResponsesRequest, json.dumps({
        "model": MODEL, "input": "x", "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"}}).encode())
    user = [MessageItem(role="user", content="x")]
    tc = to_chat_request(named, user).tool_choice
    assert tc is not None and not isinstance(tc, str) and tc.function.name == "get_weather"
    bare = _parse(ResponsesRequest, b'{"model": "tiny", "input": "x", "tool_choice": "auto"}')
    assert to_chat_request(bare, user).tool_choice is None
    with pytest.raises(APIError):  # no conversation at all
        to_chat_request(_parse(ResponsesRequest, b'{"model": "tiny", "input": []}'), [])


@pytest.mark.parametrize("body", [
    {"model": MODEL},  # no input
    {"model": MODEL, "input": 3},
    {"model": MODEL, "input": [{"type": "input_image", "image_url": "x"}]},
    {"model": MODEL, "input": [{"role": "robot", "content": "x"}]},
    {"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]},
    {"model": MODEL, "input": "x", "max_output_tokens": 0},
    {"model": MODEL, "input": "x", "temperature": "0"},
])
def test_invalid_bodies_are_400(body):
    with pytest.raises(APIError) as e:
        _parse(ResponsesRequest, json.dumps(body).encode())
    assert e.value.status == 400


# -- against a server ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("serve_responses") / "tiny.gguf"),
                     n_layers=2, shape="tiny"))


@pytest.fixture(scope="module")
def server(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLIBRI_API_KEY", raising=False)
        srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "4096",
                     "--max-seqs", "2", "--no-prefault", "--api-key", KEY],
                    str(tmp_path_factory.mktemp("serve_responses_srv") / "log"), api_key=KEY)
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _chat(server: Server, messages: list[dict], **kw: Any) -> dict:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=300,
                   headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": MODEL, "messages": messages, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
def test_create_matches_the_chat_endpoint(server, client):
    """String input with instructions, and a message list: at temperature 0 the output is
    chat's content for the same conversation, input_tokens its prompt_tokens; cut by
    max_output_tokens: "incomplete", reason max_output_tokens."""
    cases = [
        ({"input": "what is the weather?", "instructions": "be brief"},
         [{"role": "system", "content": "be brief"},
          {"role": "user", "content": "what is the weather?"}]),
        ({"input": [{"role": "developer", "content": "answer in French"},
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "bonjour"},
                    {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "and now?"}]}]},
         [{"role": "developer", "content": "answer in French"},
          {"role": "user", "content": "hello"}, {"role": "assistant", "content": "bonjour"},
          {"role": "user", "content": "and now?"}]),
    ]
    for given, messages in cases:
        r = client.responses.create(model=MODEL, temperature=0, max_output_tokens=12, **given)
        c = _chat(server, messages, max_tokens=12)
        assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
        assert r.output_text == c["choices"][0]["message"]["content"]
        assert r.output_text  # the tiny model writes something in 12 tokens
        assert r.usage is not None
        assert r.usage.input_tokens == c["usage"]["prompt_tokens"]
        assert r.usage.output_tokens == c["usage"]["completion_tokens"] == 12
        assert r.usage.total_tokens == r.usage.input_tokens + 12
        # 12 tokens of a random model: cut by the limit, as chat's "length"
        assert c["choices"][0]["finish_reason"] == "length"
        assert r.status == "incomplete"
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
        msg = r.output[0]
        assert msg.type == "message" and msg.role == "assistant" and msg.status == "incomplete"
        assert msg.id.startswith("msg_")
        assert r.instructions == given.get("instructions") and r.max_output_tokens == 12


def _events(server: Server, body: dict) -> list[tuple[str, dict]]:
    """(event line, data) of each server-sent event of a streamed response."""
    with httpx.stream("POST", server.url + "/v1/responses", timeout=300,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        blocks = r.read().decode().split("\n\n")
    out = []
    for b in blocks:
        if not b.strip():
            continue
        ev, data = b.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: "), b
        out.append((ev[len("event: "):], json.loads(data[len("data: "):])))
    return out


MESSAGE_EVENTS = ["response.output_item.added", "response.content_part.added",
                  "response.output_text.delta", "response.output_text.done",
                  "response.content_part.done", "response.output_item.done"]


def _collapsed(types: list[str]) -> list[str]:
    """The event types with runs of one delta type shown once."""
    out: list[str] = []
    for t in types:
        if not (t.endswith(".delta") and out and out[-1] == t):
            out.append(t)
    return out


@pytest.mark.slow
def test_stream_events_in_order(server, client):
    """A streamed structured response: created, in_progress, the message's events, completed,
    numbered 0, 1, ...; the deltas join to the final output_text, which the client parses;
    the same with the raw stream (event line = data type); cut short: response.incomplete."""
    deltas: list[str] = []
    types: list[str] = []
    with client.responses.stream(model=MODEL, input="a place?", text_format=Place,
                                 max_output_tokens=300, temperature=0) as s:
        for e in s:
            types.append(e.type)
            if e.type == "response.output_text.delta":
                deltas.append(e.delta)
        final = s.get_final_response()
    assert _collapsed(types) == ["response.created", "response.in_progress", *MESSAGE_EVENTS,
                                 "response.completed"]
    assert final.status == "completed" and "".join(deltas) == final.output_text
    assert isinstance(final.output_parsed, Place)
    assert final.output_parsed == Place.model_validate_json(final.output_text)
    # the same request answered as JSON: the same text (temperature 0)
    same = client.responses.create(model=MODEL, input="a place?", max_output_tokens=300,
                                   temperature=0, text={"format": {
                                       "type": "json_schema", "name": "Place",
                                       "schema": Place.model_json_schema(), "strict": True}})
    assert same.output_text == final.output_text
    # raw: each event's line names its data's type; sequence numbers 0, 1, 2, ...
    ev = _events(server, {"input": "hi", "max_output_tokens": 5, "temperature": 0})
    assert [e for e, _ in ev] == [d["type"] for _, d in ev]
    assert [d["sequence_number"] for _, d in ev] == list(range(len(ev)))
    assert _collapsed([e for e, _ in ev]) == ["response.created", "response.in_progress",
                                              *MESSAGE_EVENTS, "response.incomplete"]
    created, last = ev[0][1]["response"], ev[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert created["id"] == last["id"]
    assert last["status"] == "incomplete"
    assert last["incomplete_details"] == {"reason": "max_output_tokens"}
    text = "".join(d["delta"] for e, d in ev if e == "response.output_text.delta")
    assert last["output"][0]["content"][0]["text"] == text
    assert last["output"][0]["status"] == "incomplete" and last["usage"]["output_tokens"] == 5
    item_id = ev[2][1]["item"]["id"]
    assert all(d["item_id"] == item_id and d["output_index"] == 0 and d["content_index"] == 0
               for e, d in ev[3:-2])


@pytest.mark.slow
def test_parse_with_a_pydantic_model(client):
    r = client.responses.parse(model=MODEL, input="a place, as JSON", text_format=Place,
                               max_output_tokens=300, temperature=1.0)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, Place)
    jsonschema.validate(json.loads(r.output_text), Place.model_json_schema())
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"


@pytest.mark.slow
def test_function_call_round_trip(server, client):
    """tool_choice naming the function: a function_call item whose arguments validate
    (streamed: its argument deltas join to them); its output, sent with
    previous_response_id, is answered as chat answers the whole conversation."""
    r1 = client.responses.create(model=MODEL, input="the weather in Oslo?", tools=TOOLS,
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=100, temperature=0)
    assert r1.status == "completed"
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    call = calls[0]
    assert call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    # streamed: the function_call events, the deltas joining to the arguments
    ev = _events(server, {"input": "the weather in Oslo?", "tools": TOOLS,
                          "tool_choice": {"type": "function", "name": "get_weather"},
                          "max_output_tokens": 100, "temperature": 0})
    assert _collapsed([e for e, _ in ev]) == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    args = "".join(d["delta"] for e, d in ev if e == "response.function_call_arguments.delta")
    assert args == ev[-1][1]["response"]["output"][0]["arguments"] == call.arguments
    assert ev[-3][1]["arguments"] == args and ev[-3][1]["name"] == "get_weather"
    # the result, continuing r1: what chat answers for the whole conversation
    r2 = client.responses.create(
        model=MODEL, previous_response_id=r1.id, tools=TOOLS, max_output_tokens=10,
        temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                               "output": "-3 C and snow"}])
    assert r2.previous_response_id == r1.id
    c = _chat(server, [{"role": "user", "content": "the weather in Oslo?"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": call.call_id, "type": "function",
                            "function": {"name": "get_weather", "arguments": call.arguments}}]},
                      {"role": "tool", "tool_call_id": call.call_id, "name": "get_weather",
                       "content": "-3 C and snow"}], tools=CHAT_TOOLS, max_tokens=10)
    assert r2.usage is not None and r1.usage is not None
    assert r2.usage.input_tokens == c["usage"]["prompt_tokens"] > r1.usage.input_tokens
    assert r2.output_text == (c["choices"][0]["message"]["content"] or "")


@pytest.mark.slow
def test_the_store(server, client):
    """GET returns a stored response (with the key), DELETE removes it, cancel refuses a
    response not run in the background; store: false keeps nothing; an unknown
    previous_response_id is a 404; without the key, 401."""
    r = client.responses.create(model=MODEL, input="hi", max_output_tokens=3,
                                metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    assert got.store is True
    url = server.url + "/v1/responses/" + r.id
    assert httpx.get(url, timeout=30).status_code == 401  # no key
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(r.id)
    # continuing it with previous_response_id sees its conversation (more input tokens)
    more = client.responses.create(model=MODEL, input="hi", max_output_tokens=3,
                                   previous_response_id=r.id)
    assert more.usage is not None and r.usage is not None
    assert more.usage.input_tokens > r.usage.input_tokens
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=3,
                                previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    # store: false: answered, not kept
    gone = client.responses.create(model=MODEL, input="hi", max_output_tokens=3, store=False)
    assert gone.store is False and gone.output
    for call in (lambda: client.responses.retrieve(gone.id),
                 lambda: client.responses.cancel(gone.id),
                 lambda: client.responses.delete(gone.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    # errors: unknown model 404, bad bodies 400, background 400
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="hi", background=True)
    with pytest.raises(openai.BadRequestError) as b:
        client.responses.create(model=MODEL, input="hi", tool_choice="required")
    assert b.value.body["param"] == "tool_choice"  # type: ignore[index]
    h = {"Authorization": f"Bearer {KEY}"}
    bad = httpx.post(server.url + "/v1/responses", headers=h, timeout=30,
                     json={"model": MODEL, "input": [{"type": "input_image"}]})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
def test_openai_agents_sdk(server):
    """The OpenAI Agents SDK's default model provider (the Responses API, streamed) runs an
    agent unchanged: a forced tool call, the tool's result sent back, a structured final
    answer (openai-agents is in the test extra: missing, this fails)."""
    from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool

    seen: list[str] = []

    @function_tool
    def get_weather(city: Literal["Oslo", "Paris"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return "-3 C and snow"

    provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300))
    agent = Agent(name="weather", instructions="be brief", model=MODEL, tools=[get_weather],
                  output_type=Place,
                  model_settings=ModelSettings(tool_choice="get_weather", max_tokens=200,
                                               temperature=0))
    result = Runner.run_sync(agent, "the weather in Oslo?", max_turns=4,
                             run_config=RunConfig(model_provider=provider,
                                                  tracing_disabled=True))
    assert len(seen) == 1 and seen[0] in ("Oslo", "Paris")  # the tool ran, once
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds
    assert isinstance(result.final_output, Place)
