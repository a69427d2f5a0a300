"""`colibri serve` against a hostile user: the findings commit 26a8958 fixed, one test (or more)
each, every one failing on the code before it.

- A port already in use or a host that is no address: one line "could not listen on HOST:PORT:
  REASON", exit 1, never "listening on" first.
- SIGTERM with requests still running: in tests/serve/test_serve_shutdown.py.
- The API key from --api-key-file or COLIBRI_API_KEY (401 without it, 200 with it; the key is
  not on the server's command line; `colibri doctor` hides it); a bad key file is one line, exit 1.
- OpenAI's 400s: top_logprobs without logprobs, stream_options without stream, a tool whose
  parameters are not a JSON Schema (under tool_choice "auto"), tool names outside
  ^[a-zA-Z0-9_-]{1,64}$ or given twice, a user message with null content; a stop list over the
  limit names the limit.
- A 429 (beyond --max-seqs + --max-queue) carries Retry-After.
- `colibri serve --help` shows its defaults; docs/SERVING.md names real flags and every route.

Servers run on the tiny random MoE model (fast to load), as tests/serve/test_serve_tiny.py.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import llguidance  # noqa: F401
import openai
import pytest
from serve_util import REPO, free_port, start, stream_lines  # noqa: E402

from colibri.serve.protocol import MAX_STOP  # noqa: E402

MODEL = "tiny"
KEY = "hostile-key-7f3a9c51e2d84b06"
SERVING = Path(REPO) / "docs" / "SERVING.md"
# the tiny model's <|endoftext|> and <|im_start|> (the last two ids of its 2,048) banned: a
# long request runs to max_tokens
NO_END = {"2046": -100, "2047": -100}




def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLIBRI_API_KEY", None)
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str] | None = None,
         timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`colibri ARGS` to its end (subprocess.run kills it at the timeout)."""
    return subprocess.run([sys.executable, "-m", "colibri", *args], cwd=REPO,
                          env=env or _env(), capture_output=True, text=True, timeout=timeout)


def _assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    if param is not None:
        assert err["param"] == param, err
    return err


# -- 1. the address: bound before anything is announced -----------------------------------

def test_a_busy_port_is_one_line_and_exit_1(tiny_path):
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        p = _cli("serve", "-m", tiny_path, "--port", str(port))
    finally:
        busy.close()
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"colibri serve: error: could not listen on 127.0.0.1:{port}: "), \
        p.stderr
    assert "in use" in lines[0].lower(), p.stderr  # the reason: EADDRINUSE's text
    assert "listening on" not in p.stderr and "Traceback" not in p.stderr


def test_a_host_that_is_no_address_is_one_line_and_exit_1(tiny_path):
    port = free_port()
    p = _cli("serve", "-m", tiny_path, "--host", "256.1.1.1", "--port", str(port))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert len(lines) == 1, p.stderr
    m = re.fullmatch(rf"colibri serve: error: could not listen on 256\.1\.1\.1:{port}: (.+)",
                     lines[0])
    assert m and m.group(1).strip(), p.stderr  # a reason after the address
    assert "listening on" not in p.stderr and "Traceback" not in p.stderr




# -- 3. the API key: a file, the environment, not the command line ------------------------

def _check_key(url: str, key: str, wrong: str | None = None) -> None:
    r = httpx.get(url + "/v1/models", timeout=30)
    assert _assert_openai_error(r, 401)["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"].startswith("Bearer")
    for bad in [wrong or key + "x", key[:-1]]:
        r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {bad}"}, timeout=30)
        _assert_openai_error(r, 401)
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "aa bb"}], max_tokens=2,
        temperature=0)
    assert reply.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key=wrong or "nope", max_retries=0,
                      timeout=60).models.list()
    # /health and /metrics stay open (load balancers, Prometheus)
    assert httpx.get(url + "/health", timeout=30).status_code == 200


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


@pytest.mark.slow
def test_api_key_from_a_file_wins_over_the_environment(tiny_path, tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n# the rest of the file is not the key\n")
    other = "env-key-not-used-5b2e"
    monkeypatch.setenv("COLIBRI_API_KEY", other)  # start() passes os.environ on
    srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "512",
                 "--api-key-file", str(key_file), "--no-prefault"], str(tmp_path / "log"),
                api_key=KEY)
    try:
        cmdline = _cmdline(srv.proc.pid)
        assert str(key_file).encode() in cmdline  # the server's own process
        assert KEY.encode() not in cmdline
        _check_key(srv.url, KEY, wrong=other)
    finally:
        assert srv.stop() == 0, srv.log()
    assert KEY not in srv.log()


@pytest.mark.slow
def test_api_key_from_the_environment(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_API_KEY", KEY)  # start() passes os.environ on
    srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "512",
                 "--no-prefault"], str(tmp_path / "log"), api_key=KEY)
    try:
        cmdline = _cmdline(srv.proc.pid)
        assert b"serve" in cmdline and KEY.encode() not in cmdline
        _check_key(srv.url, KEY)
    finally:
        assert srv.stop() == 0, srv.log()
    assert KEY not in srv.log()


def test_a_bad_key_file_is_one_line_and_exit_1(tiny_path, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    blank_first = tmp_path / "blank"
    blank_first.write_text("   \nthe key on the second line\n")
    for path, what in ((tmp_path / "missing", "cannot read"), (empty, "empty"),
                       (blank_first, "empty"), (tmp_path, "cannot read")):
        p = _cli("serve", "-m", tiny_path, "--port", "0", "--api-key-file", str(path))
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1, (path, p.returncode, p.stderr)
        assert len(lines) == 1 and "--api-key-file" in lines[0] and what in lines[0], p.stderr
        assert str(path) in lines[0] and "Traceback" not in p.stderr, p.stderr
    # COLIBRI_API_KEY of blanks: an error, never silently an open server
    p = subprocess.run([sys.executable, "-m", "colibri", "serve", "-m", tiny_path, "--port", "0"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLIBRI_API_KEY": "   "})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "COLIBRI_API_KEY" in lines[0], p.stderr
    # the key given twice: argparse refuses the pair
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    p = _cli("serve", "-m", tiny_path, "--port", "0", "--api-key", KEY,
             "--api-key-file", str(key_file))
    assert p.returncode == 2 and "not allowed with" in p.stderr, p.stderr


def test_doctor_hides_the_api_key():
    p = _cli("doctor", env=_env(COLIBRI_API_KEY=KEY))
    assert p.returncode == 0, p.stderr
    assert KEY not in p.stdout and KEY not in p.stderr
    line = next((x for x in p.stdout.splitlines() if "COLIBRI_API_KEY" in x), None)
    assert line is not None, p.stdout  # it says the variable is set, without its value
    assert "hidden" in line, line


# -- 4-6. the checks of a request: OpenAI's 400s, and 429 with Retry-After ---------------

@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory: pytest.TempPathFactory):
    # one slot, no queue: the 429 test holds the slot with one stream
    srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "4096",
                 "--max-seqs", "1", "--max-queue", "0", "--no-prefault"],
                str(tmp_path_factory.mktemp("serve_hostile_srv") / "log"))
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


def _chat(server: Any, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "aa bb"}],
            "max_tokens": 2, "temperature": 0, **fields}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def _completion(server: Any, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": "aa bb", "max_tokens": 2, "temperature": 0, **fields}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def _tool(name: str, parameters: dict | None = None) -> dict:
    f: dict[str, Any] = {"name": name, "description": "a tool"}
    if parameters is not None:
        f["parameters"] = parameters
    return {"type": "function", "function": f}


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.slow
def test_top_logprobs_needs_logprobs(server):
    for fields in ({"top_logprobs": 2}, {"top_logprobs": 0, "logprobs": False}):
        _assert_openai_error(_chat(server, **fields), 400, "top_logprobs")
    r = _chat(server, top_logprobs=2, logprobs=True)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2


@pytest.mark.slow
def test_stream_options_need_stream(server):
    opts = {"include_usage": True}
    for call in (_chat, _completion):
        for fields in ({"stream_options": opts}, {"stream_options": opts, "stream": False}):
            _assert_openai_error(call(server, **fields), 400, "stream_options")
        r = call(server, stream_options=opts, stream=True)
        assert r.status_code == 200, r.text
        assert r.text.rstrip().endswith("data: [DONE]")
    # the official client sees it as a BadRequestError
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           timeout=120)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="aa", max_tokens=2,
                                  stream_options={"include_usage": True})


@pytest.mark.slow
def test_a_tool_schema_that_is_no_json_schema_is_400_under_auto(server):
    bad_schemas = [{"type": "object", "properties": {"city": {"type": "strng"}}},
                   {"type": "object", "properties": 3},
                   {"type": "object", "required": "city"},
                   {"type": 5}]
    for schema in bad_schemas:
        for choice in ("auto", None):  # None: tools given, auto by default
            fields: dict[str, Any] = {"tools": [_tool("get_weather", schema)]}
            if choice is not None:
                fields["tool_choice"] = choice
            err = _assert_openai_error(_chat(server, **fields), 400,
                                       "tools.0.function.parameters")
            assert "JSON Schema" in err["message"], err
    # the second tool's schema is the bad one: the param says so
    r = _chat(server, tools=[_tool("ok", CITY), _tool("bad", {"type": "strng"})],
              tool_choice="auto")
    _assert_openai_error(r, 400, "tools.1.function.parameters")
    # valid schemas (and none at all) are served
    r = _chat(server, tools=[_tool("get_weather", CITY), _tool("now")], tool_choice="auto")
    assert r.status_code == 200, r.text


def test_schema_check_without_jsonschema(monkeypatch):
    """The serve extra does not install jsonschema: then llguidance judges the schema."""
    from colibri.serve.tools import schema_problem

    assert schema_problem({"type": "strng"}) is not None  # with jsonschema (test extras)
    # schemas jsonschema cannot even look up a validator for: a problem (a 400), not a 500
    for unreadable in ({"$schema": []}, {"$schema": {}}):
        assert "not a JSON Schema" in (schema_problem(unreadable) or ""), unreadable
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    for bad in ({"type": "object", "properties": {"city": {"type": "strng"}}},
                {"type": "object", "properties": 3}, {"type": "object", "required": "city"},
                {"type": 5}):
        assert schema_problem(bad) is not None, bad
    assert schema_problem(CITY) is None
    assert schema_problem({}) is None


@pytest.mark.slow
def test_tool_names_outside_openais_rule_are_400(server):
    for name in ("get weather", "get.weather", "wetter_\u00fcberall", "a/b", "x" * 65, "",
                 "name\n"):
        r = _chat(server, tools=[_tool(name, CITY)], tool_choice="auto")
        _assert_openai_error(r, 400, "tools.0.function.name")
    r = _chat(server, tools=[_tool("A-z_0-9" + "x" * 57, CITY)], tool_choice="auto")  # 64
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_duplicated_tool_names_are_400(server):
    r = _chat(server, tools=[_tool("add", CITY), _tool("sub"), _tool("add")])
    err = _assert_openai_error(r, 400, "tools.2.function.name")
    assert "add" in err["message"], err
    # under tool_choice "none" too: the tools are still the request's (OpenAI's rule)
    r = _chat(server, tools=[_tool("add"), _tool("add")], tool_choice="none")
    _assert_openai_error(r, 400, "tools.1.function.name")


@pytest.mark.slow
def test_a_message_without_content_is_400(server):
    for messages, param in (
            ([{"role": "user", "content": None}], "messages.0.content"),
            ([{"role": "user"}], "messages.0.content"),
            ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": None}],
             "messages.1.content"),
            ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}],
             "messages.1.content")):
        _assert_openai_error(_chat(server, messages=messages), 400, param)
    # null content is fine in an assistant turn that carries tool calls
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}]
    r = _chat(server, messages=messages, tools=[_tool("get_weather", CITY)])
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_stop_list_over_the_limit_names_it(server):
    too_many = ["x"] * (MAX_STOP + 1)  # no digits of their own: a number in the message is the limit
    for call in (_chat, _completion):
        err = _assert_openai_error(call(server, stop=too_many), 400, "stop")
        assert str(MAX_STOP) in err["message"], err
        r = call(server, stop=["x"] * MAX_STOP)
        assert r.status_code == 200, r.text


@pytest.mark.slow
def test_429_carries_retry_after(server):
    out: dict = {}
    started = threading.Event()
    body = {"model": MODEL, "prompt": "aa bb cc dd", "max_tokens": 4000, "temperature": 0,
            "logit_bias": NO_END, "stream": True}
    t = threading.Thread(target=stream_lines, args=(server.url, body, out, started))
    t.start()
    try:
        assert started.wait(120)
        assert t.is_alive()  # 4,000 tokens: seconds even on a quiet machine
        for call in (_completion, _chat):
            r = call(server)
            err = _assert_openai_error(r, 429)
            assert err["code"] == "queue_full" and err["type"] == "rate_limit_error", err
            retry = r.headers.get("retry-after")
            assert retry is not None and retry.isdigit() and int(retry) >= 1, r.headers
        # what the official client reads
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                               timeout=120)
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert e.value.response.headers.get("retry-after") == retry
    finally:
        t.join(180)  # the stream runs to its end: the slot is free again after this test
    assert not t.is_alive() and "exc" not in out, out
    assert out["lines"][-1] == "data: [DONE]"


# -- 7. serve --help shows its defaults ------------------------------------------------------

def _option_help(help_text: str) -> dict[str, str]:
    """option string -> its help text (whitespace collapsed), from an argparse help."""
    out: dict[str, str] = {}
    _, _, options = help_text.partition("options:")
    current: list[str] = []
    for line in options.splitlines():
        m = re.match(r"  (-\S.*?)(?:\s{2,}(.*)|$)", line)
        if m:
            current = re.findall(r"--?[\w-]+", m.group(1))
            for flag in current:
                out[flag] = m.group(2) or ""
        elif current and line.strip():
            for flag in current:
                out[flag] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in out.items()}


def test_serve_help_shows_the_defaults():
    p = _cli("serve", "--help", env=_env(COLUMNS="100"))
    assert p.returncode == 0, p.stderr
    helps = _option_help(p.stdout)
    for flag, default in (("--host", "127.0.0.1"), ("--port", "8000"), ("--max-seqs", "16"),
                          ("--max-queue", "256"), ("--max-body-bytes", str(4 * 2**20)),
                          ("--grace-period", "30.0")):
        assert f"(default: {default})" in helps[flag], (flag, helps[flag])
    assert "COLIBRI_API_KEY" in helps["--api-key"]
    assert "--api-key-file" in helps
    # every option that has a default says what it is
    from colibri.cli import _build_parser

    sub = next(a for a in _build_parser()._actions if a.dest == "command")
    serve = sub.choices["serve"]  # type: ignore[attr-defined]
    for action in serve._actions:
        if (action.option_strings and action.default not in (None, False)
                and action.default is not argparse.SUPPRESS):
            text = helps[action.option_strings[-1]]
            assert "default" in text, (action.option_strings, text)


# -- 8. docs/SERVING.md ------------------------------------------------------------------

def test_serving_doc_is_where_the_code_points():
    import colibri.serve

    assert "docs/SERVING.md" in (colibri.serve.__doc__ or "")
    assert SERVING.is_file()
    p = _cli("serve", "--help")
    assert "docs/SERVING.md" in p.stdout


def test_serving_doc_names_real_flags_routes_and_statuses():
    text = SERVING.read_text()
    p = _cli("serve", "--help")
    known = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", p.stdout.partition("options:")[2]))
    # every flag of a `colibri serve ...` command the guide shows
    shown = [m.group(1) for m in re.finditer(r"colibri serve([^`\n|;&#]*)", text)]
    flags = {f for s in shown for f in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)",
                                                 re.sub(r"\"[^\"]*\"|'[^']*'", " ", s))}
    assert flags, "the guide shows colibri serve commands"
    assert flags <= known, f"flags colibri serve --help does not list: {flags - known}"
    # every option of serve's own is explained
    for flag in ("--host", "--port", "--max-seqs", "--max-queue", "--api-key", "--api-key-file",
                 "--model-name", "--max-body-bytes", "--grace-period", "--prefill-chunk",
                 "--no-prefix-cache", "--no-prefault", "-m"):
        assert flag in text, flag
    from colibri.serve.gate import ROUTES

    for route in (*ROUTES, "/v1/models/{id}"):
        assert route in text, route
    for status in ("400", "401", "404", "413", "429", "503", "Retry-After", "COLIBRI_API_KEY",
                   "smollm2-135m-instruct", "[DONE]"):
        assert status in text, status
    # the client example is Python (it was run against the chat model when written)
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks and any("from openai import OpenAI" in b for b in blocks)
    for block in blocks:
        compile(block, str(SERVING), "exec")
