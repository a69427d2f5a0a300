"""Structured output and usage in `colibri serve` (issue #50's part):

- OpenAI's strict mode: `"strict": true` on a json_schema response format or a function tool
  constrains the schema with `additionalProperties: false` on every object and every property
  required, nested objects included (grammar.strict_schema; the caller's schema unchanged).
- JSON numbers are at most MAX_NUMBER_CHARS characters under a grammar, so a model pushed
  toward digits does not write them until max_tokens.
- A response cut by max_tokens under a schema ends with finish_reason "length" (chat and
  completions, streaming and not, n > 1) and the official client's parse() refuses it.
- usage.prompt_tokens_details.cached_tokens: the prompt tokens the engine's prefix cache
  served (0 on a first request, the shared prefix on a repeat), in every usage.

Servers run on the tiny random MoE model (fast to load), as tests/serve/test_serve_tiny.py.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import jsonschema
import llguidance  # noqa: F401
import openai
import pytest
from serve_util import metric, start  # noqa: E402

from colibri.serve.grammar import (  # noqa: E402
    _ESC,
    _NUM,
    _OUT,
    _STR,
    MAX_NUMBER_CHARS,
    GrammarFactory,
    _NumberBound,
    _token_tables,
    strict_schema,
)
from colibri.serve.tool_grammar import call_grammar  # noqa: E402
from colibri.serve.tools import call_schema  # noqa: E402

MODEL = "tiny"
DIGITS = {str(t): 30.0 for t in range(48, 58)}  # the tiny model's '0'..'9' (byte tokens)
NO_END = {"2046": -100, "2047": -100}  # its <|endoftext|> and <|im_start|>

# a schema with optional properties everywhere: strict mode makes them all required
NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "place": {"$ref": "#/$defs/place"},
        "tags": {"type": "array", "maxItems": 2,
                 "items": {"type": "object", "properties": {"k": {"type": "boolean"},
                                                            "v": {"type": "integer"}}}},
        "either": {"anyOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}},
                             {"type": "null"}]},
    },
    "required": ["name"],
    "$defs": {"place": {"type": "object", "properties": {
        "lat": {"type": "number"}, "ok": {"type": "boolean"}}}},
}
TEMP = {"type": "object", "properties": {"temp": {"type": "number"},
                                         "more": {"type": "array", "maxItems": 3,
                                                  "items": {"type": "number"}}}}


# -- strict mode: the schema transformation --------------------------------------------------

def objects(schema: Any) -> list[dict]:
    """Every object schema inside schema (type object or properties), wherever nested."""
    out = []
    if isinstance(schema, dict):
        t = schema.get("type")
        if t == "object" or (isinstance(t, list) and "object" in t) or "properties" in schema:
            out.append(schema)
        for v in schema.values():
            out += objects(v)
    elif isinstance(schema, list):
        for v in schema:
            out += objects(v)
    return out


def test_strict_schema_closes_every_object_and_leaves_the_input_alone():
    schema = copy.deepcopy(NESTED)
    schema["properties"]["pair"] = {"type": "array", "prefixItems": [
        {"type": "object", "properties": {"x": {"type": "number"}}}]}
    schema["properties"]["maybe"] = {"type": ["object", "null"],
                                     "properties": {"y": {"type": "string"}}}
    schema["definitions"] = {"old": {"type": "object", "properties": {"z": {"type": "null"}},
                                     "additionalProperties": True}}
    before = copy.deepcopy(schema)
    s = strict_schema(schema)
    assert schema == before  # not mutated
    found = objects(s)
    assert len(found) == 7  # root, place, tags' items, either's first, pair's, maybe, old
    for o in found:
        assert o["additionalProperties"] is False, o
        assert o.get("required", []) == list(o.get("properties", {})), o
    assert s["required"] == ["name", "place", "tags", "either", "pair", "maybe"]
    assert s["$defs"]["place"]["required"] == ["lat", "ok"]
    assert s["properties"]["tags"]["items"]["required"] == ["k", "v"]
    assert s["properties"]["either"]["anyOf"][0]["required"] == ["a"]
    assert s["properties"]["either"]["anyOf"][1] == {"type": "null"}
    assert s["properties"]["pair"]["prefixItems"][0]["additionalProperties"] is False
    assert s["definitions"]["old"]["additionalProperties"] is False
    # jsonschema agrees: a missing or an extra property is now invalid
    v = jsonschema.Draft202012Validator(s)
    good = {"name": "a", "place": {"lat": 1.5, "ok": True}, "tags": [], "either": None,
            "pair": [{"x": 1}], "maybe": None}
    v.validate(good)
    assert not v.is_valid({**good, "extra": 1})
    assert not v.is_valid({k: good[k] for k in good if k != "tags"})
    assert not v.is_valid({**good, "place": {"lat": 1.5, "ok": True, "more": 2}})
    assert strict_schema(True) is True and strict_schema({"type": "integer"}) == {
        "type": "integer"}
    # every nested dict is new: changing the result does not reach the input
    s["$defs"]["place"]["properties"]["lat"]["type"] = "string"
    s["properties"]["tags"]["items"]["properties"]["k"] = {}
    assert schema == before


def test_strict_tools_only():
    params = {"type": "object", "properties": {"city": {"type": "string"},
                                               "days": {"type": "integer"}}}
    before = copy.deepcopy(params)
    loose = {"type": "function", "function": {"name": "f", "parameters": params}}
    strict = {"type": "function", "function": {"name": "g", "parameters": params,
                                               "strict": True}}
    args = call_schema([loose])["properties"]["arguments"]
    assert args == before  # not strict: as given
    args = call_schema([strict])["properties"]["arguments"]
    assert args["additionalProperties"] is False and args["required"] == ["city", "days"]
    assert params == before
    kind, lark = call_grammar([strict], "g", "<tool_call>")
    assert kind == "lark" and '"required": ["city", "days"]' in lark


# -- numbers: the bound's tables against a plain simulation ----------------------------------

def _reference_ok(tok: bytes, state: int, run: int, limit: int) -> bool:
    """Whether tok, coming in lexical state (with run characters of a number written), keeps
    every JSON number within limit characters (finishable: one ending in - + . e E needs one
    more)."""
    for ch in tok.decode("latin-1"):
        if state == _STR:
            state = _ESC if ch == "\\" else _OUT if ch == '"' else _STR
        elif state == _ESC:
            state = _STR
        elif state == _OUT:
            if ch in "0123456789-":
                state, run = _NUM, 1
            elif ch == '"':
                state = _STR
        elif ch in "0123456789-+.eE":
            run += 1
        else:
            state, run = (_STR if ch == '"' else _OUT), 0
        if state == _NUM and run > limit:
            return False
    return not (state == _NUM and tok and chr(tok[-1]) in "-+.eE" and run + 1 > limit)


def test_number_bound_tables_match_a_plain_simulation():
    rng = random.Random(1)
    alphabet = b'0123456789-+.eE"\\ax,:}'
    toks = [bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    toks += [b"1" * 70, b"\xff<|x|>", b"true", b"-", b"1e", b'"12', b"12\"", b"9" * 8]
    limit = 8
    need, ok = _token_tables(toks, limit)
    for state in (_OUT, _NUM, _STR, _ESC):
        for run in ([0] if state != _NUM else range(1, limit + 1)):
            b = _NumberBound(toks, need, ok, limit)
            b.state, b.run = state, run
            got = b.allowed()
            want = [_reference_ok(t, state, run, limit) for t in toks]
            assert got.tolist() == want, (state, run)
    # advance follows the text: a string's digits are no number
    b = _NumberBound(toks, need, ok, limit)
    for t in (b'"12', b"12\"", b"9" * 8):
        b.advance(toks.index(t))
    assert (b.state, b.run) == (_NUM, 8)
    assert not b.allowed()[toks.index(b"1" * 70)]



def number_texts(text: str) -> list[str]:
    """The JSON numbers of a JSON text as written (outside strings)."""
    out, i, in_str = [], 0, False
    while i < len(text):
        c = text[i]
        if in_str:
            i += 2 if c == "\\" else 1
            in_str = c != '"'
            continue
        if c == '"':
            in_str = True
        elif c in "-0123456789":
            m = re.compile(r"[-+.eE0-9]+").match(text, i)
            assert m is not None
            out.append(m.group())
            i = m.end()
            continue
        i += 1
    return out


def test_numbers_are_bounded_under_a_grammar_in_the_engine(tiny_path):
    """The engine with a grammar, digits favoured by logit_bias: unbounded (the old grammar),
    the first number runs to max_tokens; bounded, every number has at most N characters and
    the JSON completes."""
    import colibri
    from colibri.engine import Engine

    with colibri.Model(tiny_path, ctx=1024, verbose=False) as m:
        assert [m.tokenize(str(d), add_special=False) for d in range(10)] == [
            [int(t)] for t in DIGITS]
        bias = {int(k): v for k, v in DIGITS.items()}
        strict = strict_schema(TEMP)
        with Engine(m) as eng:
            g = GrammarFactory(m, max_number_chars=None)
            r = eng.submit("weather:", max_tokens=120, temperature=1.0, seed=0,
                           logit_bias=bias, constraint=g.json_schema(strict))
            text = r.text()
            assert r.finish_reason == "length" and len(number_texts(text)[0]) > 100, text
            g = GrammarFactory(m)
            assert g.max_number_chars == MAX_NUMBER_CHARS == 32
            for seed in range(3):
                r = eng.submit("weather:", max_tokens=300, temperature=1.0, seed=seed,
                               logit_bias=bias, constraint=g.json_schema(strict))
                text = r.text()
                assert r.finish_reason == "stop", text
                jsonschema.validate(json.loads(text), strict)
                nums = number_texts(text)
                assert nums and all(len(x) <= MAX_NUMBER_CHARS for x in nums), text
                assert max(len(x) for x in nums) == MAX_NUMBER_CHARS  # pushed to the bound


# -- end to end ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLIBRI_API_KEY", raising=False)
        srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "4096",
                     "--max-seqs", "4", "--no-prefault"],
                    str(tmp_path_factory.mktemp("serve_strict_srv") / "log"))
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


def _post(server: Any, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=300)


def _sse(server: Any, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={"model": MODEL, "stream": True, **body},
                      timeout=300) as r:
        assert r.status_code == 200, r.read()
        lines = [x for x in r.iter_lines() if x]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(x[len("data: "):]) for x in lines[:-1]]


def _results(server: Any, path: str, body: dict, stream: bool) -> tuple[list[tuple[str, str]],
                                                                       dict | None]:
    """[(text, finish_reason)] per choice, and the usage, of a chat or completions request."""
    chat = path.endswith("chat/completions")
    if not stream:
        r = _post(server, path, body)
        assert r.status_code == 200, r.text
        j = r.json()
        return [((c["message"]["content"] or "") if chat else c["text"], c["finish_reason"])
                for c in sorted(j["choices"], key=lambda c: c["index"])], j["usage"]
    chunks = _sse(server, path, {**body, "stream_options": {"include_usage": True}})
    n = body.get("n", 1)
    text, finish = [""] * n, [None] * n
    for c in chunks:
        for ch in c["choices"]:
            text[ch["index"]] += (ch["delta"].get("content") or "") if chat else ch["text"]
            finish[ch["index"]] = ch["finish_reason"] or finish[ch["index"]]
    assert chunks[-1]["choices"] == [] and all(c.get("usage") is None for c in chunks[:-1])
    return list(zip(text, finish, strict=True)), chunks[-1]["usage"]


def _json_format(schema: dict, strict: bool) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema,
                                                   "strict": strict}}


def _every_property(value: Any, schema: dict) -> None:
    """value (valid under strict_schema(schema)) has every property of every object schema
    it went through."""
    resolved = schema
    if "$ref" in schema:
        resolved = NESTED["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    if isinstance(value, dict):
        props = resolved.get("properties")
        if props is None:
            alts = [a for a in resolved.get("anyOf", []) if a.get("type") == "object"]
            props = alts[0]["properties"] if alts else {}
        assert set(value) == set(props), (value, props)
        for k, v in value.items():
            _every_property(v, props[k])
    elif isinstance(value, list):
        for v in value:
            _every_property(v, resolved.get("items", {}))


@pytest.mark.slow
def test_strict_json_schema_with_the_openai_client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           timeout=300)
    strict = strict_schema(NESTED)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "describe a place"}], n=3,
        max_tokens=400, temperature=1.0, seed=5, response_format=_json_format(NESTED, True))
    assert len(reply.choices) == 3
    for ch in reply.choices:
        assert ch.finish_reason == "stop", ch
        value = json.loads(ch.message.content or "")
        jsonschema.validate(value, strict)
        _every_property(value, NESTED)
        assert all(len(x) <= MAX_NUMBER_CHARS for x in number_texts(ch.message.content or ""))
    # a strict tool, called by name: its arguments have every property, no other
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5},
                                               "days": {"type": "integer"},
                                               "when": {"type": "object", "properties": {
                                                   "hour": {"type": "integer"}}}}}
    for strict_tool in (True, False):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=300,
            temperature=1.0, seed=1, n=2,
            tools=[{"type": "function", "function": {"name": "weather", "parameters": params,
                                                     "strict": strict_tool}}],
            tool_choice={"type": "function", "function": {"name": "weather"}})
        for ch in reply.choices:
            assert ch.finish_reason == "tool_calls", ch
            calls = ch.message.tool_calls or []
            assert len(calls) == 1 and calls[0].function.name == "weather"
            args = json.loads(calls[0].function.arguments)
            if strict_tool:
                jsonschema.validate(args, strict_schema(params))
                assert set(args) == {"city", "days", "when"} and set(args["when"]) == {"hour"}
            else:
                jsonschema.validate(args, params)


@pytest.mark.slow
def test_numbers_are_bounded_end_to_end(server):
    """{"temp": number} with digits favoured: every number within N characters, in chat and
    completions, streaming and not, n > 1; the output valid and complete."""
    strict = strict_schema(TEMP)
    for path, base in (("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "the temperature?"}]}),
                       ("/v1/completions", {"prompt": "the temperature:"})):
        for stream in (False, True):
            body = {**base, "n": 2, "max_tokens": 400, "temperature": 1.0, "seed": 3,
                    "logit_bias": DIGITS, "response_format": _json_format(TEMP, True)}
            results, _ = _results(server, path, body, stream)
            longest = 0
            for text, finish in results:
                assert finish == "stop", (path, stream, text)
                jsonschema.validate(json.loads(text), strict)
                nums = number_texts(text)
                assert all(len(x) <= MAX_NUMBER_CHARS for x in nums), (path, stream, text)
                longest = max(longest, *map(len, nums))
            assert longest == MAX_NUMBER_CHARS  # the bias did push them to the bound


@pytest.mark.slow
def test_cut_by_max_tokens_says_length(server):
    """max_tokens too small for the schema: "length", never "stop", in chat and completions,
    streaming and not, n > 1, with and without strict; the official client's parse()
    refuses such a response rather than hand back a partial object."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 20,
                                                     "maxLength": 24},
                                               "b": {"type": "integer"}}, "required": ["a", "b"]}
    for path, base in (("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "go"}]}),
                       ("/v1/completions", {"prompt": "go"})):
        for stream in (False, True):
            for strict in (False, True):
                body = {**base, "n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 2,
                        "logit_bias": NO_END, "response_format": _json_format(schema, strict)}
                results, usage = _results(server, path, body, stream)
                assert len(results) == 2 and usage is not None
                assert usage["completion_tokens"] == 12
                for text, finish in results:
                    assert finish == "length", (path, stream, text)
                    with pytest.raises(ValueError):
                        json.loads(text)
    # a forced tool call cut short: "length", not "tool_calls"
    tool = {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    for stream in (False, True):
        body = {"messages": [{"role": "user", "content": "go"}], "n": 2, "max_tokens": 6,
                "temperature": 1.0, "seed": 4, "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": "f"}}}
        results, _ = _results(server, "/v1/chat/completions", body, stream)
        assert [f for _, f in results] == ["length", "length"], results
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           timeout=300)
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "go"}], max_tokens=6,
            response_format=_json_format(schema, True))
    # with room, the same schema completes: "stop" and valid
    results, _ = _results(server, "/v1/completions",
                          {"prompt": "go", "max_tokens": 400, "temperature": 0,
                           "response_format": _json_format(schema, True)}, False)
    assert results[0][1] == "stop"
    jsonschema.validate(json.loads(results[0][0]), strict_schema(schema))


def _saved(server: Any) -> float:
    v = metric(server.url, "colibri_prefix_cache_tokens_saved_total")
    assert v is not None
    return v


@pytest.mark.slow
def test_cached_tokens_in_usage(server):
    """0 on a first request; on a repeat, the prompt tokens the engine's prefix cache served
    (its tokens_saved counter moves by as much), in chat and completions, streaming and not."""
    shared = [(13 * i) % 1800 + 100 for i in range(80)]  # token ids: 5 blocks of 16
    for stream in (False, True):
        head = [7 + stream] + shared  # a fresh prefix for each pass
        body = {"max_tokens": 3, "temperature": 0}
        before = _saved(server)
        _, usage = _results(server, "/v1/completions", {**body, "prompt": head + [40, 41]},
                            stream)
        assert usage is not None and usage["prompt_tokens"] == len(head) + 2
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        assert _saved(server) == before
        # the same prompt: all but its last token
        _, usage = _results(server, "/v1/completions", {**body, "prompt": head + [40, 41]},
                            stream)
        assert usage is not None
        assert usage["prompt_tokens_details"]["cached_tokens"] == len(head) + 1
        assert _saved(server) - before == len(head) + 1
        # another suffix: the shared part
        before = _saved(server)
        _, usage = _results(server, "/v1/completions", {**body, "prompt": head + [50]}, stream)
        assert usage is not None
        assert usage["prompt_tokens_details"]["cached_tokens"] == len(head)
        assert _saved(server) - before == len(head)
        # n = 2 on a cached prompt: each completion reused it, counted once as prompt_tokens is
        _, usage = _results(server, "/v1/completions",
                            {**body, "prompt": head + [50], "n": 2}, stream)
        assert usage is not None and usage["prompt_tokens"] == len(head) + 1
        assert usage["prompt_tokens_details"]["cached_tokens"] == len(head)
        # chat: a long system prompt, asked twice
        system = f"pass {int(stream)}. " + " ".join(f"rule {i}: be brief" for i in range(30))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
        before = _saved(server)
        _, usage = _results(server, "/v1/chat/completions", {**body, "messages": msgs}, stream)
        assert usage is not None and usage["prompt_tokens"] > 100
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
        _, again = _results(server, "/v1/chat/completions", {**body, "messages": msgs}, stream)
        assert again is not None and again["prompt_tokens"] == usage["prompt_tokens"]
        assert again["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
        assert _saved(server) - before == usage["prompt_tokens"] - 1
    # the official client reads it
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           timeout=300)
    reply = client.completions.create(model=MODEL, prompt=[7, *shared, 40, 41], max_tokens=2,
                                      temperature=0)
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == len(shared) + 2
