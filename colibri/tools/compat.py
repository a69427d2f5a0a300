"""llama.cpp's server compatibility tests for the Responses and Messages APIs, run against
`colibri serve`.

    python tools/compat/run.py [--model GGUF] [--url http://HOST:PORT] [--list] [--json OUT]

The cases are ported from llama.cpp's tools/server/tests/unit/test_compat_oai_responses.py and
test_compat_anthropic.py (ggml-org/llama.cpp, read at commits 084f0cf3 and 010c16bd;
rewritten, not copied): each sends the request its llama.cpp test sends
and checks the properties it asserts. Where a llama.cpp test asserts the exact text its preset
model (tinyllama2) writes, the port asserts the property instead (non-empty, the right shape,
the right stop reason); llama-server's own paths (`/responses` beside `/v1/responses`) become the
API's. The cases that test something only llama-server has (its flags, its preset models, its
extensions) are in NOT_APPLICABLE, each with its reason.

Without --url a server is started on a tiny random MoE model (colibri.tools.make_bench_model,
written in seconds) or on --model, on a free port, answering to the model names the llama.cpp
tests send ("test", "gpt-4.1"), and stopped at the end. Each case prints pass, fail (with the
assertion) or n/a (with the reason); the exit status is 1 when any case fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

MODEL_NAMES = ("tiny", "test", "gpt-4.1")   # the names the llama.cpp tests send


@dataclass
class Reply:
    status_code: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class Harness:
    """llama.cpp's ServerProcess, the part its compat tests use: make_request (the JSON body of
    a reply) and make_stream_request (the JSON of each SSE `data:` line, up to `[DONE]`)."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes] | None = None,
                 log_path: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.proc = proc
        self.log_path = log_path

    def make_request(self, method: str, path: str, data: Any = None,
                     headers: dict[str, str] | None = None, timeout: float = 300) -> Reply:
        r = httpx.request(method, self.url + path, json=data, headers=headers, timeout=timeout)
        try:
            body = r.json()
        except ValueError:
            body = r.text
        return Reply(r.status_code, body, dict(r.headers))

    def make_stream_request(self, method: str, path: str, data: Any = None,
                            headers: dict[str, str] | None = None,
                            timeout: float = 300) -> list[dict]:
        out: list[dict] = []
        with httpx.stream(method, self.url + path, json=data, headers=headers,
                          timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                raise AssertionError(f"stream answered {r.status_code}: {r.text}")
            for line in r.iter_lines():
                if "[DONE]" in line:
                    break
                if line.startswith("data: "):
                    out.append(json.loads(line[6:]))
        return out

    def openai(self) -> Any:
        import openai

        return openai.OpenAI(api_key="dummy", base_url=self.url + "/v1", max_retries=0,
                             timeout=300)

    def log(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int | None:
        """Stop the server this harness started (SIGTERM, then SIGKILL after 60 s)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model(folder: str) -> str:
    """The tiny random MoE model (hidden 256, vocabulary 2048), written into folder."""
    from colibri.tools.make_bench_model import write

    return str(write(os.path.join(folder, "tiny.gguf"), n_layers=2, shape="tiny"))


def start(model: str, log_path: str, extra: list[str] | None = None,
          timeout: float = 300) -> Harness:
    """`colibri serve -m model` on a free port, answering to MODEL_NAMES; waits for /health."""
    port = _free_port()
    cmd = [sys.executable, "-m", "colibri", "serve", "-m", model, "--port", str(port),
           "--model-name", ",".join(MODEL_NAMES), "--threads", "2", "--ctx", "8192",
           "--no-prefault", "--max-seqs", "2", *(extra or [])]
    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_API_KEY"}
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
    h = Harness(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"colibri serve exited {proc.returncode}:\n{h.log()}")
        try:
            if httpx.get(h.url + "/health", timeout=5).status_code == 200:
                return h
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    h.stop()
    raise RuntimeError(f"colibri serve did not become ready in {timeout} s:\n{h.log()}")


# ------------------------------------------------------------------------------ the cases

Case = Callable[[Harness], None]
CASES: dict[str, Case] = {}

NOT_APPLICABLE: dict[str, str] = {
    "test_responses_stream_with_llama_telemetry":
        "llama-server's own extensions (timings_per_token, return_progress: prompt_progress "
        "and timings in the events) and its --ctx-size/--batch-size/--parallel flags",
    "test_anthropic_vision_base64_with_multimodal_model":
        "llama.cpp's preset multimodal model (tinygemma3 with its mmproj, downloaded from "
        "Hugging Face at test time); colibri serves text-only models",
    "test_anthropic_thinking_with_reasoning_model[False]":
        "llama.cpp's preset reasoning model (DeepSeek-R1-Distill-Qwen-7B, downloaded) under "
        "its --reasoning-format deepseek flag; the tiny random model does not think",
    "test_anthropic_thinking_with_reasoning_model[True]":
        "llama.cpp's preset reasoning model (DeepSeek-R1-Distill-Qwen-7B, downloaded) under "
        "its --reasoning-format deepseek flag (streamed); the tiny random model does not think",
}


def case(name: str) -> Callable[[Case], Case]:
    def add(fn: Case) -> Case:
        assert name not in CASES and name not in NOT_APPLICABLE, name
        CASES[name] = fn
        return fn
    return add


def _ok(res: Reply) -> dict:
    assert res.status_code == 200, f"expected 200, got {res.status_code}: {res.body}"
    assert isinstance(res.body, dict), res.body
    return res.body


def _message(res: Reply) -> dict:
    body = _ok(res)
    assert body.get("type") == "message", f"type {body.get('type')!r}, not 'message'"
    return body


# --- test_compat_oai_responses.py

def _text_format(fmt: dict, max_output_tokens: int, pattern: str | None) -> Case:
    def run(h: Harness) -> None:
        res = h.make_request("POST", "/v1/responses", {
            "input": "Write an example", "max_output_tokens": max_output_tokens,
            "text": {"format": fmt}})
        if pattern is not None:
            body = _ok(res)
            msg = next(o for o in body["output"] if o["type"] == "message")
            text = msg["content"][0]["text"]
            assert re.search(pattern, text), f"{text!r} does not match {pattern!r}"
        elif fmt.get("type") == "text":
            _ok(res)
        else:
            assert res.status_code == 400, f"expected 400, got {res.status_code}: {res.body}"
            assert isinstance(res.body, dict) and "error" in res.body, res.body
            # llama.cpp asserts the status only (its request is also refused for
            # max_output_tokens 0): with a valid count, the refusal is for the missing schema
            res = h.make_request("POST", "/v1/responses", {
                "input": "Write an example", "max_output_tokens": 10, "text": {"format": fmt}})
            assert res.status_code == 400, f"expected 400, got {res.status_code}: {res.body}"
            err = res.body["error"]
            assert "schema" in f"{err.get('param')} {err.get('message')}", err
    return run


# llama.cpp's model writes "Suddenly..." under json_object: the property is that the answer is
# JSON's start, an object
for _id, _fmt, _n, _pat in (
        ("json_schema", {"type": "json_schema", "name": "test", "schema": {"const": "foooooo"}},
         10, '"foooooo"'),
        ("json_object", {"type": "json_object"}, 10, r"^\s*\{"),
        ("text", {"type": "text"}, 10, None),
        ("json_schema_without_schema", {"type": "json_schema", "name": "test"}, 0, None)):
    case(f"test_responses_with_text_format[{_id}]")(_text_format(_fmt, _n, _pat))

BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


@case("test_responses_with_openai_library")
def _responses_openai(h: Harness) -> None:
    res = h.openai().responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8,
                                      temperature=0.8)
    assert res.id.startswith("resp_"), res.id
    assert res.output[0].id is not None and res.output[0].id.startswith("msg_"), res.output
    # llama.cpp: matches "(Suddenly)+", its model's text; here: 8 tokens written, cut there
    assert isinstance(res.output_text, str) and res.output_text, repr(res.output_text)
    if res.status == "incomplete":
        assert res.incomplete_details.reason == "max_output_tokens", res.incomplete_details
    else:
        assert res.status == "completed", res.status


@case("test_responses_stream_with_openai_library")
def _responses_stream_openai(h: Harness) -> None:
    stream = h.openai().responses.create(model="gpt-4.1", input=BOOK, max_output_tokens=8,
                                         temperature=0.8, stream=True)
    text, resp_id, msg_id, completed = "", "", "", None
    for r in stream:
        if r.type == "response.created":
            assert r.response.id.startswith("resp_"), r.response.id
            resp_id = r.response.id
        if r.type == "response.in_progress":
            assert r.response.id == resp_id
        if r.type == "response.output_item.added":
            assert r.item.id is not None and r.item.id.startswith("msg_"), r.item
            msg_id = r.item.id
        if r.type in ("response.content_part.added", "response.output_text.delta",
                      "response.output_text.done", "response.content_part.done"):
            assert r.item_id == msg_id, (r.type, r.item_id, msg_id)
        if r.type == "response.output_item.done":
            assert r.item.id == msg_id
        if r.type == "response.output_text.delta":
            text += r.delta
        if r.type in ("response.completed", "response.incomplete"):
            completed = r.response
    assert completed is not None, "no response.completed (or response.incomplete) event"
    assert completed.id.startswith("resp_")
    assert completed.output[0].id is not None and completed.output[0].id.startswith("msg_")
    assert text == completed.output_text, (text, completed.output_text)
    assert completed.output_text, "empty answer"   # llama.cpp: "(Suddenly)+"


# --- test_compat_anthropic.py

def _messages(h: Harness, **body: Any) -> Reply:
    return h.make_request("POST", "/v1/messages", {"model": "test", **body})


HELLO = [{"role": "user", "content": "Hello"}]


@case("test_anthropic_messages_basic")
def _basic(h: Harness) -> None:
    b = _message(_messages(h, max_tokens=50, messages=[{"role": "user", "content": "Say hello"}]))
    assert b["role"] == "assistant", b
    assert isinstance(b.get("content"), list) and b["content"], b
    assert b["content"][0]["type"] == "text" and "text" in b["content"][0], b["content"]
    assert b["stop_reason"] in ("end_turn", "max_tokens"), b["stop_reason"]
    u = b.get("usage")
    assert isinstance(u, dict), b
    for k in ("cache_read_input_tokens", "input_tokens", "output_tokens"):
        assert isinstance(u.get(k), int), f"usage.{k}: {u.get(k)!r}"
    assert u["output_tokens"] > 0, u
    assert "timings" not in b, "timings in an Anthropic reply"


@case("test_anthropic_messages_with_system")
def _with_system(h: Harness) -> None:
    b = _message(_messages(h, max_tokens=50, system="You are a helpful assistant.",
                           messages=HELLO))
    assert len(b["content"]) > 0, b


@case("test_anthropic_messages_multipart_content")
def _multipart(h: Harness) -> None:
    _message(_messages(h, max_tokens=50, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is"}, {"type": "text", "text": " the answer?"}]}]))


@case("test_anthropic_messages_conversation")
def _conversation(h: Harness) -> None:
    _message(_messages(h, max_tokens=50, messages=[
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"}]))


def _first(events: list[dict], kind: str) -> dict:
    return next(e for e in events if e["type"] == kind)


@case("test_anthropic_messages_streaming")
def _streaming(h: Harness) -> None:
    events = h.make_stream_request("POST", "/v1/messages", {
        "model": "test", "max_tokens": 30, "stream": True,
        "messages": [{"role": "user", "content": "Say hello"}]})
    for e in events:
        assert "type" in e, f"an event without type: {e}"
    kinds = [e["type"] for e in events]
    for k in ("message_start", "content_block_start", "content_block_delta",
              "content_block_stop", "message_delta", "message_stop"):
        assert k in kinds, f"no {k} event: {kinds}"
    m = _first(events, "message_start")["message"]
    assert m["type"] == "message" and m["role"] == "assistant" and m["content"] == [], m
    assert m["usage"]["input_tokens"] > 0, m["usage"]
    s = _first(events, "content_block_start")
    assert s["index"] == 0 and s["content_block"]["type"] == "text", s
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    for d in deltas:
        assert "index" in d and d["delta"]["type"] == "text_delta" and "text" in d["delta"], d
    assert _first(events, "content_block_stop")["index"] == 0
    md = _first(events, "message_delta")
    assert md["delta"]["stop_reason"] in ("end_turn", "max_tokens"), md
    assert md["usage"]["output_tokens"] > 0, md
    assert "timings" not in _first(events, "message_stop"), "timings in message_stop"


def _count(h: Harness, **body: Any) -> dict:
    return _ok(h.make_request("POST", "/v1/messages/count_tokens", {"model": "test", **body}))


@case("test_anthropic_count_tokens")
def _count_tokens(h: Harness) -> None:
    b = _count(h, messages=[{"role": "user", "content": "Hello world"}])
    assert isinstance(b.get("input_tokens"), int) and b["input_tokens"] > 0, b
    assert "output_tokens" not in b, b


@case("test_anthropic_count_tokens_with_system")
def _count_tokens_system(h: Harness) -> None:
    assert _count(h, system="You are a helpful assistant.", messages=HELLO)["input_tokens"] > 0


@case("test_anthropic_count_tokens_no_max_tokens")
def _count_tokens_no_max(h: Harness) -> None:
    assert "input_tokens" in _count(h, messages=HELLO)


def _tool(name: str, desc: str, prop: str, prop_desc: str | None = None) -> dict:
    p: dict = {"type": "string"}
    if prop_desc:
        p["description"] = prop_desc
    return {"name": name, "description": desc, "input_schema": {
        "type": "object", "properties": {prop: p}, "required": [prop]}}


WEATHER = _tool("get_weather", "Get the current weather in a location", "location", "City name")


@case("test_anthropic_tool_use_basic")
def _tool_use(h: Harness) -> None:
    b = _message(_messages(h, max_tokens=200, tools=[WEATHER],
                           messages=[{"role": "user", "content": "What's the weather in Paris?"}]))
    assert len(b["content"]) > 0, b
    uses = [c for c in b["content"] if c.get("type") == "tool_use"]
    if uses:   # the model may answer in text instead
        assert b["stop_reason"] == "tool_use", b["stop_reason"]
        assert "id" in uses[0] and uses[0]["name"] == "get_weather", uses[0]
        assert isinstance(uses[0].get("input"), dict), uses[0]


def _tool_turns(tool_id: str, location: str, question: str, result: list[dict]) -> list[dict]:
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id,
                                               "name": "get_weather",
                                               "input": {"location": location}}]},
            {"role": "user", "content": result}]


@case("test_anthropic_tool_result")
def _tool_result(h: Harness) -> None:
    b = _message(_messages(h, max_tokens=100, messages=_tool_turns(
        "test123", "Paris", "What's the weather?",
        [{"type": "tool_result", "tool_use_id": "test123",
          "content": "The weather is sunny, 25°C"}])))
    assert len(b["content"]) > 0 and b["content"][0]["type"] == "text", b["content"]


@case("test_anthropic_tool_result_with_text")
def _tool_result_text(h: Harness) -> None:
    b = _message(_messages(h, max_tokens=100, messages=_tool_turns(
        "tool_1", "Paris", "What's the weather?",
        [{"type": "text", "text": "Here are the results:"},
         {"type": "tool_result", "tool_use_id": "tool_1", "content": "Sunny, 25°C"}])))
    assert len(b["content"]) > 0, b


@case("test_anthropic_tool_result_error")
def _tool_result_error(h: Harness) -> None:
    _message(_messages(h, max_tokens=100, messages=_tool_turns(
        "test123", "InvalidCity", "Get the weather",
        [{"type": "tool_result", "tool_use_id": "test123", "is_error": True,
          "content": "City not found"}])))


@case("test_anthropic_tool_streaming")
def _tool_streaming(h: Harness) -> None:
    events = h.make_stream_request("POST", "/v1/messages", {
        "model": "test", "max_tokens": 200, "stream": True,
        "tools": [_tool("calculator", "Calculate math", "expression")],
        "messages": [{"role": "user", "content": "Calculate 2+2"}]})
    kinds = [e["type"] for e in events]
    assert "message_start" in kinds and "message_stop" in kinds, kinds
    starts = [e for e in events if e["type"] == "content_block_start"
              and e.get("content_block", {}).get("type") == "tool_use"]
    if starts:   # the model may answer in text instead
        assert "index" in starts[0] and "name" in starts[0]["content_block"], starts[0]


RED_PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJ"
             "RU5ErkJggg==")


@case("test_anthropic_vision_format_accepted")
def _vision_format(h: Harness) -> None:
    # llama.cpp: 500 "image input is not supported" (no mmproj). The property: the block
    # parses, and a text-only model refuses it with an error in Anthropic's shape that says so
    # (a refusal of the request is 400, not a server error)
    res = _messages(h, max_tokens=10, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": RED_PIXEL}},
        {"type": "text", "text": "What is this?"}]}])
    assert res.status_code == 400, f"expected 400, got {res.status_code}: {res.body}"
    assert isinstance(res.body, dict) and res.body.get("type") == "error", res.body
    msg = res.body.get("error", {}).get("message", "").lower()
    assert "image" in msg, f"the error does not say images are unsupported: {msg!r}"


@case("test_anthropic_stop_sequences")
def _stop_sequences(h: Harness) -> None:
    b = _message(_messages(h, max_tokens=100, stop_sequences=["\n", "END"],
                           messages=[{"role": "user", "content": "Count to 10"}]))
    # llama.cpp checks the type only; the stop reason follows Anthropic's API
    assert b["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence"), b["stop_reason"]
    if b["stop_reason"] == "stop_sequence":
        assert b.get("stop_sequence") in ("\n", "END"), b.get("stop_sequence")
    text = "".join(c.get("text", "") for c in b["content"])
    assert "\n" not in text and "END" not in text, repr(text)


def _sampling(key: str, value: float) -> Case:
    def run(h: Harness) -> None:
        _message(_messages(h, max_tokens=50, messages=HELLO, **{key: value}))
    return run


for _name, _param in (("temperature", 0.5), ("top_p", 0.9), ("top_k", 40)):
    case(f"test_anthropic_{_name}")(_sampling(_name, _param))


@case("test_anthropic_missing_messages")
def _missing_messages(h: Harness) -> None:
    res = _messages(h, max_tokens=50)
    assert res.status_code >= 400, f"expected an error, got {res.status_code}: {res.body}"


@case("test_anthropic_empty_messages")
def _empty_messages(h: Harness) -> None:
    # llama.cpp is permissive (200); Anthropic's API refuses an empty list (400). Either is a
    # deliberate answer; a crash or a hang is not
    res = _messages(h, max_tokens=50, messages=[])
    if res.status_code == 200:
        _message(res)
    else:
        assert res.status_code == 400, f"expected 200 or 400, got {res.status_code}: {res.body}"
        assert isinstance(res.body, dict) and res.body.get("type") == "error", res.body


@case("test_anthropic_streaming_content_block_indices")
def _block_indices(h: Harness) -> None:
    events = h.make_stream_request("POST", "/v1/messages", {
        "model": "test", "max_tokens": 400, "stream": True,
        "tools": [_tool("test_tool", "A test tool", "param")],
        "messages": [{"role": "user", "content": "Use the test tool"}]})
    starts = [e["index"] for e in events if e.get("type") == "content_block_start"]
    stops = [e["index"] for e in events if e.get("type") == "content_block_stop"]
    assert starts == list(range(len(starts))), f"block indices {starts}"
    assert set(starts) == set(stops), f"starts {starts}, stops {stops}"


@case("test_anthropic_thinking")
def _thinking(h: Harness) -> None:
    _message(_messages(h, max_tokens=100, thinking={"type": "enabled", "budget_tokens": 50},
                       messages=[{"role": "user", "content": "What is 2+2?"}]))


@case("test_anthropic_metadata")
def _metadata(h: Harness) -> None:
    _message(_messages(h, max_tokens=50, metadata={"user_id": "test_user_123"}, messages=HELLO))


@case("test_anthropic_vs_openai_different_response_format")
def _vs_openai(h: Harness) -> None:
    o = _ok(h.make_request("POST", "/v1/chat/completions",
                           {"model": "test", "max_tokens": 50, "messages": HELLO}))
    a = _message(_messages(h, max_tokens=50, messages=HELLO))
    assert o.get("object") == "chat.completion" and "choices" in o, o
    assert "content" in a, a
    assert "prompt_tokens" in o["usage"] and "completion_tokens" in o["usage"], o["usage"]
    assert "input_tokens" in a["usage"] and "output_tokens" in a["usage"], a["usage"]


# ------------------------------------------------------------------------------ running

def run_case(h: Harness, name: str) -> tuple[str, str]:
    """(outcome, detail) of one case: pass, fail (the assertion or error) or n/a (why)."""
    if name in NOT_APPLICABLE:
        return "n/a", NOT_APPLICABLE[name]
    try:
        CASES[name](h)
    except AssertionError as e:
        return "fail", f"{e}" or traceback.format_exc(limit=-1).strip()
    except Exception as e:  # noqa: BLE001 - a case's error is its failure
        return "fail", f"{type(e).__name__}: {e}"
    return "pass", ""


def all_names() -> list[str]:
    return [*CASES, *NOT_APPLICABLE]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF or model name for the server (default: the tiny "
                    "random MoE model, written to a temporary folder)")
    ap.add_argument("--url", help="a running colibri serve (answering to the model names "
                    f"{', '.join(MODEL_NAMES[1:])}) instead of starting one")
    ap.add_argument("--case", action="append", help="run only this case (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--json", help="write {case: [outcome, detail]} to this file")
    args = ap.parse_args(argv)
    names = args.case or all_names()
    unknown = [n for n in names if n not in CASES and n not in NOT_APPLICABLE]
    if unknown:
        ap.error(f"unknown cases: {unknown}")
    if args.list:
        print("\n".join(names))
        return 0
    with tempfile.TemporaryDirectory(prefix="colibri-compat-") as tmp:
        if args.url:
            h = Harness(args.url)
        else:
            h = start(args.model or tiny_model(tmp), os.path.join(tmp, "serve.log"))
        try:
            results = {n: run_case(h, n) for n in names}
        finally:
            rc = h.stop()
            if rc not in (None, 0):
                print(f"colibri serve exited {rc}:\n{h.log()[-4000:]}", file=sys.stderr)
    for n, (outcome, detail) in results.items():
        print(f"{outcome:4}  {n}" + (f"  -- {detail}" if detail else ""))
    counts = {k: sum(o == k for o, _ in results.values()) for k in ("pass", "fail", "n/a")}
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['n/a']} not applicable")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
