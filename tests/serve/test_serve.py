"""`colibri serve` on the default model (Gemma 3 270M), driven by the official openai client.

One server for the module (a subprocess on a free port, 2 threads). Greedy outputs are compared
with the same model run directly in this process (Model.eval, greedy), which batch invariance
makes exact; structured outputs are validated with jsonschema.
"""

from __future__ import annotations

import asyncio
import json
import time

import fastapi  # noqa: F401  the serve extra and its test clients (test extras)
import httpx
import jsonschema  # noqa: E402
import llguidance  # noqa: F401
import numpy as np
import openai  # noqa: E402
import pytest
from engine_util import greedy_alone
from serve_util import metric, start  # noqa: E402

import colibri  # noqa: E402
from colibri.generate import render_chat  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "test-key-0123456789"
MODEL = "gemma-3-270m-q4_k_m"
CTX = 1024
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module", params=["local", "ray"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """colibri serve, and (ray) colibri serve --ray with two one-thread replicas on a Ray
    cluster of its own: every test of this module runs against both."""
    log = str(tmp_path_factory.mktemp("serve") / "server.log")
    # -m: serve's default is the chat model; these tests compare with the text model
    where = ["--ray", "--replicas", "2", "--threads", "1"] if request.param == "ray" else \
        ["--threads", "2"]
    srv = start(["-m", "gemma3-270m", "--model-name", MODEL, *where, "--ctx", str(CTX),
                 "--max-seqs", "16", "--api-key", KEY,
                 "--max-body-bytes", str(2**20)], log, api_key=KEY, timeout=300)
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model():
    with colibri.Model(ctx=CTX, threads=2, verbose=False) as m:
        yield m


def chat_ids(m: colibri.Model, messages: list[dict]) -> list[int]:
    return m.tokenize(render_chat(m, messages), add_special=False, parse_special=True)


PROMPTS = [f"Question {i}: what is the capital of {c}? Answer:" for i, c in enumerate(
    ["France", "Spain", "Italy", "Japan", "Peru", "Chile", "Kenya", "Egypt", "India", "Nepal",
     "Chad", "Mali", "Laos", "Cuba", "Fiji", "Oman"])]


def test_health_models_and_loading(server, client):
    # while the model loaded, /health and the /v1/ routes answered 503 "loading" (on Ray the
    # ingress is routed to only once it has loaded: Serve's proxy answers until then)
    if server.ray_tmp is None:
        assert server.seen_loading, "the server was never seen loading"
        first = server.seen_loading[0]
        assert first["health"]["status"] == "loading"
        assert first["models"]["error"]["code"] == "loading"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # no key needed
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert "colibri_requests_running" in httpx.get(server.url + "/metrics").text


def test_completion_greedy_equals_the_model(client, model):
    p = PROMPTS[0]
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0)
    ref = greedy_alone(model, model.tokenize(p), 10)
    assert r.choices[0].text == model.detokenize(ref)
    assert r.choices[0].finish_reason == ("length" if len(ref) == 10 else "stop")
    assert r.usage.prompt_tokens == len(model.tokenize(p))
    assert r.usage.completion_tokens == len(ref)
    # a prompt given as token ids is the same request
    r2 = client.completions.create(model=MODEL, prompt=model.tokenize(p), max_tokens=10,
                                   temperature=0)
    assert r2.choices[0].text == r.choices[0].text


def test_chat_and_its_stream_equal_the_model(client, model):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a color."}]
    ref = model.detokenize(greedy_alone(model, chat_ids(model, msgs), 12))
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == ref and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(chat_ids(model, msgs))
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == r.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == r.usage.total_tokens
    # completions stream too
    p = PROMPTS[1]
    full = client.completions.create(model=MODEL, prompt=p, max_tokens=8, temperature=0)
    parts = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=p, max_tokens=8, temperature=0, stream=True)]
    assert "".join(parts) == full.choices[0].text


def test_logprobs(client, model):
    p = PROMPTS[2]
    ids = model.tokenize(p)
    ref = greedy_alone(model, ids, 6)
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ref) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    # the model's own distribution: its log-softmax at the first position
    s = model.new_sequence()
    try:
        x = model.eval([s], ids, logits=[False] * (len(ids) - 1) + [True])[-1].astype(np.float64)
    finally:
        model.free_sequence(s)
    lse = x.max() + np.log(np.exp(x - x.max()).sum())
    assert lp.token_logprobs[0] == pytest.approx(x[ref[0]] - lse, abs=1e-4)
    for _tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) <= 3 and v <= 0
        assert max(top.values()) == pytest.approx(v, abs=1e-6)  # greedy: the top choice
    msgs = [{"role": "user", "content": "Say yes."}]
    c = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert "".join(e.token for e in content) == c.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.top_logprobs[0].token == e.token and bytes(e.bytes).decode() == e.token
    streamed = [e for ch in client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2,
        stream=True) if ch.choices and ch.choices[0].logprobs
        for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_n_and_seed(client):
    p = PROMPTS[3]
    kw = dict(model=MODEL, prompt=p, max_tokens=8, temperature=1.0, top_p=1.0)
    r = client.completions.create(n=3, seed=11, **kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    # completion i samples with seed + i, whatever else runs
    for c in r.choices:
        one = client.completions.create(n=1, seed=11 + c.index, **kw)
        assert one.choices[0].text == c.text
    again = client.completions.create(n=3, seed=11, **kw)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    assert len({c.text for c in r.choices}) > 1  # different seeds, different samples
    g = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       n=2, max_tokens=6, temperature=0)
    assert g.choices[0].message.content == g.choices[1].message.content
    g1 = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=6, temperature=0)
    assert g.usage.completion_tokens == 2 * g1.usage.completion_tokens  # usage sums the choices
    assert g.usage.prompt_tokens == g1.usage.prompt_tokens
    parts: dict[int, str] = {}
    for ch in client.chat.completions.create(model=MODEL, n=2, max_tokens=6, temperature=0,
                                             messages=[{"role": "user", "content": "Hi"}],
                                             stream=True):
        for c in ch.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
    assert parts == {0: g.choices[0].message.content, 1: g.choices[1].message.content}


def test_stop_strings(client):
    p = PROMPTS[4]
    full = client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip(), text
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0,
                                  stop=[stop, "@@never@@"])
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_output_validates(client):
    msgs = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                  "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48, temperature=0,
                                       response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    # sampled and streamed too
    for seed in (1, 2):
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=48, temperature=1.0, seed=seed,
            response_format=fmt, stream=True) if c.choices)
        jsonschema.validate(json.loads(text), PERSON)
    obj = client.completions.create(model=MODEL, prompt="A JSON object:", max_tokens=40,
                                    temperature=0, extra_body={
                                        "response_format": {"type": "json_object"}})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].text), dict)
    else:  # cut by max_tokens: still a prefix of a JSON object
        assert obj.choices[0].text.lstrip().startswith("{")


def test_tool_call_round_trip(client):
    msgs: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=40, temperature=0, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # the same call streamed ("required": any of the tools): OpenAI's delta shape, the name
    # first (id, type, arguments ""), then the arguments in pieces as the tokens come
    calls: dict[int, dict] = {}
    finish = None
    for c in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40,
                                            temperature=0, tools=[WEATHER],
                                            tool_choice="required", stream=True):
        if not c.choices:
            continue
        for tc in c.choices[0].delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.arguments == ""
                calls[tc.index] = {"name": tc.function.name, "arguments": "", "pieces": 0}
            else:
                assert tc.id is None and tc.function.name is None and tc.function.arguments
                calls[tc.index]["arguments"] += tc.function.arguments
                calls[tc.index]["pieces"] += 1
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["pieces"] > 1, calls
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])
    assert calls[0]["arguments"] == call.function.arguments  # greedy: the same call
    # the openai client's own stream accumulation (named function)
    with client.chat.completions.stream(
            model=MODEL, messages=msgs, max_tokens=40, temperature=0, tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}}) as stream:
        pieces = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    (acc,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and len(pieces) > 1
    assert acc.function.name == "get_weather" and acc.id
    assert acc.function.arguments == "".join(e.arguments_delta for e in pieces)
    jsonschema.validate(json.loads(acc.function.arguments), WEATHER["function"]["parameters"])
    # the tool's result goes back; the model answers in text
    msgs += [ch.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    r2 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12,
                                        temperature=0, tools=[WEATHER], tool_choice="none")
    assert r2.choices[0].finish_reason in ("stop", "length")
    assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls
    # "auto": this small model answers by calling again (its output begins a JSON call, cut by
    # max_tokens): the call is streamed as written, finish_reason "length"
    r3 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12,
                                        temperature=0, tools=[WEATHER])
    m3 = r3.choices[0].message
    assert r3.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert m3.content or m3.tool_calls
    assert all(tc.function.name == "get_weather" for tc in m3.tool_calls or [])


def test_concurrent_streams_equal_sequential(client, server):
    async def run(concurrent: bool) -> list[str]:
        ac = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                                timeout=300)

        async def one(p: str) -> str:
            parts = []
            async for c in await ac.completions.create(model=MODEL, prompt=p, max_tokens=10,
                                                       temperature=0, stream=True):
                parts.append(c.choices[0].text)
            return "".join(parts)

        try:
            if concurrent:
                return list(await asyncio.gather(*(one(p) for p in PROMPTS)))
            return [await one(p) for p in PROMPTS]
        finally:
            await ac.close()

    together = asyncio.run(run(True))
    alone = asyncio.run(run(False))
    assert len(together) == 16 and together == alone
    assert len(set(together)) > 1


def _error(server, path: str, body: bytes | dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, dict):
        return httpx.post(server.url + path, json=body, headers=headers, timeout=60)
    return httpx.post(server.url + path, content=body, headers=headers, timeout=60)


@pytest.mark.parametrize("path,body,key,status,param", [
    ("/v1/completions", b"{not json", KEY, 400, None),
    ("/v1/completions", b"[1, 2]", KEY, 400, None),
    ("/v1/completions", b"", KEY, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": "hot"}, KEY, 400,
     "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": 2.5}, KEY, 400,
     "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": -1}, KEY, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "n": 0}, KEY, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "logit_bias": {"x": 1}}, KEY, 400,
     "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "logit_bias": {"999999999": 1}}, KEY,
     400, "logit_bias"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, -5]}, KEY, 400, "prompt"),
    ("/v1/completions", {"model": MODEL}, KEY, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 1500}, KEY, 400, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
                                                            "content": "word " * 1500}]},
     KEY, 400, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": CTX}, KEY, 400,
     "max_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, KEY, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
     KEY, 400, "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": {
                                                      "type": "frobnicate"}}}}, KEY, 400,
     "response_format"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                              "tools": [WEATHER], "tool_choice": {
                                  "type": "function", "function": {"name": "nope"}}}, KEY, 400,
     "tool_choice"),
    ("/v1/completions", {"model": "gpt-9", "prompt": "a"}, KEY, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "a"}, None, 401, None),
    ("/v1/completions", {"model": MODEL, "prompt": "a"}, "wrong-key", 401, None),
    ("/v1/models", {}, "wrong-key", 401, None),
    ("/v1/completions", {"model": MODEL, "prompt": "a" * (2**20 + 10)}, KEY, 413, None),
])
def test_errors_have_openai_shape_and_leave_the_server_healthy(server, path, body, key, status,
                                                               param):
    if path == "/v1/models":
        r = httpx.get(server.url + path, headers={"Authorization": f"Bearer {key}"})
    else:
        r = _error(server, path, body, key)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert httpx.get(server.url + "/health").status_code == 200


def test_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="a", temperature=9)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a")
    bad = openai.OpenAI(base_url=client.base_url, api_key="bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=2).choices


def test_metrics_count_what_happened(server, client):
    def value(text: str, name: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    before = httpx.get(server.url + "/metrics").text
    r = client.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=5, temperature=0,
                                  logit_bias={str(t): -100 for t in (1, 106)})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="a", n=0)
    after = httpx.get(server.url + "/metrics").text
    assert r.usage.completion_tokens == 5
    assert value(after, "colibri_generation_tokens_total") - \
        value(before, "colibri_generation_tokens_total") == 5
    assert value(after, "colibri_prompt_tokens_total") - \
        value(before, "colibri_prompt_tokens_total") == r.usage.prompt_tokens
    assert value(after, "colibri_time_to_first_token_seconds_count") - \
        value(before, "colibri_time_to_first_token_seconds_count") == 1
    assert value(after, "colibri_inter_token_latency_seconds_count") - \
        value(before, "colibri_inter_token_latency_seconds_count") == 4
    key = 'colibri_http_requests_total{endpoint="/v1/completions",status="400"}'
    assert value(after, key) - value(before, key) == 1
    assert value(after, "colibri_kv_capacity_bytes") > 0
    assert "colibri_grammar_masks_total" in after


def test_disconnect_mid_stream_frees_the_kv(server):
    url = server.url
    # settle: the prefix cache holds what earlier tests left; nothing runs
    deadline = time.monotonic() + 30
    while metric(url, "colibri_requests_running") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    base = metric(url, "colibri_kv_used_bytes")
    body = {"model": MODEL, "prompt": "Tell a very long story about a dragon.",
            "max_tokens": 600, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as h, h.stream(
            "POST", url + "/v1/completions", json=body,
            headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: {"):
                got += 1
                if got == 3:
                    break
        assert metric(url, "colibri_requests_running") == 1
    # the client is gone: the request is cancelled and its KV returned within a step or two.
    # The prefix cache may have given up sequences of earlier tests meanwhile (a new request
    # evicts the least recently used past the cache's limit), so the KV in use comes back to
    # at most the base: a leaked sequence would leave it above.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if metric(url, "colibri_requests_running") == 0 and \
                metric(url, "colibri_kv_used_bytes") <= base:
            break
        time.sleep(0.05)
    assert metric(url, "colibri_requests_running") == 0
    assert metric(url, "colibri_kv_used_bytes") <= base


def test_disconnect_while_waiting_for_a_whole_answer_cancels_it(server):
    url = server.url
    # ~1000 tokens (the end-of-generation ids banned): 10 s or more even on a quiet machine
    body = {"model": MODEL, "prompt": "Tell a very long story about a castle.",
            "max_tokens": 1000, "temperature": 0, "logit_bias": {"1": -100, "106": -100}}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=2.0),
                   headers={"Authorization": f"Bearer {KEY}"})
    deadline = time.monotonic() + 3
    while metric(url, "colibri_requests_running") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(url, "colibri_requests_running") == 0
