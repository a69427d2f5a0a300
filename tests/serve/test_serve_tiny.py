"""`colibri serve` on a tiny random MoE model (fast to load): the queue limit (429), SIGTERM
with a request running (it finishes, exit 0), the expert-store metrics; the tool-call parser;
the CLI's checks and the missing-extra message."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import llguidance  # noqa: F401
import pytest
from serve_util import REPO, metric, start, stream_lines  # noqa: E402

from colibri.serve.tools import ToolStreamParser, call_schema, parse_tool_calls  # noqa: E402

MODEL = "tiny"



def _long_stream(max_tokens: int) -> dict:
    return {"model": MODEL, "prompt": "aa bb cc dd", "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.slow
def test_queue_limit_sigterm_and_expert_metrics(tiny_path, tmp_path):
    srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "2048",
                 "--max-seqs", "1", "--max-queue", "0", "--grace-period", "60",
                 "--prefill-chunk", "16"], str(tmp_path / "log"))
    try:
        url = srv.url
        assert metric(url, "colibri_expert_bytes_read_total") is not None  # a MoE model
        assert metric(url, "colibri_expert_cache_hit_rate") is not None
        # one request holds the only slot: a second one is refused with 429, then served
        out: dict = {}
        started = threading.Event()
        t = threading.Thread(target=stream_lines, args=(url, _long_stream(1500), out, started))
        t.start()
        assert started.wait(60)
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x",
                                                      "max_tokens": 2}, timeout=60)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "queue_full"
        # more completions than the server can ever hold: not "retry later" but 400
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x", "n": 2,
                                                      "max_tokens": 2}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        assert httpx.get(url + "/health").status_code == 200
        # SIGTERM while it streams: it runs to its end, then the server exits 0
        assert t.is_alive()  # still streaming (1,500 tokens: seconds even on a quiet machine)
        srv.proc.send_signal(signal.SIGTERM)
        # the signal handler prints this, then marks the server draining, on the thread that
        # runs the event loop: once the line is there, no request is served as before
        deadline = time.monotonic() + 60
        while "colibri serve: shutting down" not in srv.log():
            assert time.monotonic() < deadline, srv.log()
            time.sleep(0.02)
        try:  # no new work: the listener is closed (refused) or, still open, 503
            late = httpx.post(url + "/v1/completions", timeout=10,
                              json={"model": MODEL, "prompt": "x", "max_tokens": 2})
            outcome: int | str = late.status_code
        except httpx.ConnectError:
            outcome = "refused"
        assert outcome in (503, "refused"), outcome
        t.join(120)
        assert not t.is_alive()
        assert srv.proc.wait(90) == 0, srv.log()
        assert "exc" not in out, out
        lines = out["lines"]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(x[6:]) for x in lines[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 1500  # it was not cut short
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        # nothing listens any more
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=5)
    finally:
        srv.stop()


def test_tool_call_parsing():
    names = {"get_weather", "add"}
    # Hermes / Qwen form, with text around and two calls
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
            '</tool_call><tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    content, calls = parse_tool_calls(text, names)
    assert content == "Let me check. "
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}), ("add", {"a": 1, "b": 2})]
    assert len({c.id for c in calls}) == 2
    oa = calls[0].openai(0)
    assert oa["type"] == "function" and json.loads(oa["function"]["arguments"]) == {"city": "Oslo"}
    # Llama 3's JSON form (parameters), alone or after <|python_tag|>, or a list
    for t in ('{"name": "add", "parameters": {"a": 1}}',
              '<|python_tag|>{"name": "add", "parameters": {"a": 1}}',
              '[{"name": "add", "parameters": {"a": 1}}]'):
        content, calls = parse_tool_calls(t, names)
        assert content is None and [(c.name, c.arguments) for c in calls] == [("add",
                                                                              '{"a": 1}')]
    # not calls: unknown tool, broken JSON, plain text; kept as content
    for t in ('{"name": "rm", "parameters": {}}', '<tool_call>{"name": "add"', "just text",
              '{"a": 1}', "<tool_call>{oops}</tool_call>"):
        content, calls = parse_tool_calls(t, names)
        assert calls == [] and content == t, t
    # streamed in pieces of every size: the same events, content never showing a call's text
    for size in (1, 2, 3, 7, 1000):
        p = ToolStreamParser(names)
        events = []
        for i in range(0, len(text), size):
            events += p.feed(text[i:i + size])
        events += p.finish()
        shown = "".join(e for e in events if isinstance(e, str))
        assert shown == "Let me check. "
        assert [e.name for e in events if not isinstance(e, str) and e.id] == ["get_weather",
                                                                               "add"]
    # text streams as it comes when it cannot be a call
    p = ToolStreamParser(names)
    assert p.feed("Hello there") == ["Hello there"]
    assert p.feed(" <tool") == [" "]  # a possible tag is held back
    assert p.feed("kit>") == ["<toolkit>"]


def test_call_schema():
    tools = [{"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}},
             {"type": "function", "function": {"name": "b"}}]
    s = call_schema(tools, "a")
    assert s["properties"]["name"] == {"const": "a"}
    assert s["properties"]["arguments"]["properties"]["x"] == {"type": "integer"}
    assert len(call_schema(tools)["anyOf"]) == 2
    with pytest.raises(ValueError, match="not among"):
        call_schema(tools, "c")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "colibri", "serve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_checks_its_arguments(tmp_path):
    for args, msg in ((["--port", "70000"], "--port"), (["--max-seqs", "0"], "--max-seqs"),
                      (["--max-queue", "-1"], "--max-queue"), (["--api-key", ""], "--api-key"),
                      (["-m", str(tmp_path / "none.gguf")], "not found"),
                      (["--grace-period", "-2"], "--grace-period")):
        p = _cli(*args)
        assert p.returncode == 1 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_model_that_fails_to_load_exits_1(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    start_t = time.monotonic()
    p = _cli("-m", str(bad), "--port", "0")
    assert p.returncode == 1 and "failed to load" in p.stderr, p.stderr
    assert time.monotonic() - start_t < 100


def test_missing_extra_names_it(monkeypatch, capsys):
    from colibri.cli import main

    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance -> ImportError
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert 'pip install "colibri-moe[serve]"' in err and "llguidance" in err


def test_messages_for_templates_with_and_without_tools():
    from colibri.generate import render_template
    from colibri.serve.chat import _template_messages
    from colibri.serve.protocol import ChatRequest

    req = ChatRequest.model_validate_json(json.dumps({"model": "m", "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in "},
                                     {"type": "text", "text": "Oslo?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}]}))
    hermes = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools>"
              "{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
              "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}"
              "</tool_call>{% endfor %}{% endfor %}")
    msgs = _template_messages(req.messages, tools_in_template=True)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[1]["content"] == "Weather in Oslo?"
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # a dict
    out = render_template(hermes, msgs, tools=[{"type": "function",
                                                "function": {"name": "get_weather"}}])
    assert "<tools>get_weather</tools>" in out and '{"city": "Oslo"}' in out
    # a template without tools: calls folded into the assistant's text, the result a user turn
    folded = _template_messages(req.messages, tools_in_template=False)
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "user"]
    assert json.loads(folded[2]["content"]) == {"name": "get_weather",
                                                "arguments": {"city": "Oslo"}}
    assert folded[3]["content"] == "Tool result: -3 C"


def test_parallel_tool_calls_false_keeps_the_first():
    from colibri.engine import Delta
    from colibri.serve.streaming import _Choice

    two = ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
           '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>')
    for max_calls, want in ((None, [{"a": 1}, {"a": 2}]), (1, [{"a": 1}])):
        ch = _Choice(index=0, parser=ToolStreamParser({"add"}), max_calls=max_calls)
        ch.take(Delta(text=two[:50], token_ids=[1]))
        ch.take(Delta(text=two[50:], token_ids=[2], finish_reason="stop"))
        assert [json.loads(c.arguments) for c in ch.calls] == want
        assert ch.finish_reason == "tool_calls" and "".join(ch.text) == ""
