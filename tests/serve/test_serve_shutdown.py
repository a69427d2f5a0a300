"""`colibri serve` shut down with requests still running (a finding of the hostile-user review,
fixed by 26a8958): at the end of --grace-period a stream ends with an error event and
`data: [DONE]` (with n > 1 that event is the last one before [DONE]), a JSON request gets 503,
no traceback in the log, exit 0; the ASGI gate ends a stuck stream the same way when uvicorn
cancels it. Servers run on the tiny random MoE model, as tests/serve/test_serve_tiny.py."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from typing import Any

import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import openai
import pytest
from serve_util import metric, post_json, start, stream_lines  # noqa: E402

MODEL = "tiny"
# the tiny model's <|endoftext|> and <|im_start|> (the last two ids of its 2,048) banned: a
# long request runs to max_tokens
NO_END = {"2046": -100, "2047": -100}




# -- 2. SIGTERM: the grace period runs out ------------------------------------------------

@pytest.mark.slow
def test_sigterm_cuts_off_what_outlives_the_grace_period(tiny_path, tmp_path):
    # four requests of 2 completions of 4,000 tokens each (the end-of-text ids banned): tens of
    # seconds of work on a loaded 2-core machine, seconds on a fast quiet one; the grace period
    # (0.5 s) ends long before
    srv = start(["-m", tiny_path, "--model-name", MODEL, "--threads", "2", "--ctx", "4096",
                 "--max-seqs", "8", "--grace-period", "0.5", "--no-prefault"],
                str(tmp_path / "log"))
    common = {"model": MODEL, "max_tokens": 4000, "temperature": 0, "logit_bias": NO_END,
              "n": 2}
    bodies = {"/v1/completions": dict(common, prompt="aa bb cc dd"),
              "/v1/chat/completions": dict(common, messages=[{"role": "user",
                                                              "content": "aa bb cc dd"}])}
    streams: dict[str, dict] = {path: {} for path in bodies}
    answers: dict[str, dict] = {path: {} for path in bodies}
    threads: list[threading.Thread] = []
    try:
        url = srv.url
        started = [threading.Event() for _ in bodies]
        for (path, body), ev in zip(bodies.items(), started, strict=True):
            threads.append(threading.Thread(target=stream_lines, args=(
                url, dict(body, stream=True), streams[path], ev, path)))
            threads.append(threading.Thread(target=post_json, args=(url, body, answers[path], path)))
        for t in threads:
            t.start()
        assert all(ev.wait(120) for ev in started)
        deadline = time.monotonic() + 120  # every request admitted: 8 engine requests
        while (metric(url, "colibri_requests_running") or 0) + \
                (metric(url, "colibri_requests_waiting") or 0) < 8:
            assert time.monotonic() < deadline, "the JSON requests were never admitted"
            time.sleep(0.05)
        assert all(t.is_alive() for t in threads), (streams, answers)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads)
        assert srv.proc.wait(120) == 0, srv.log()
    finally:
        srv.stop()
        for t in threads:
            t.join(5)
    log = srv.log()
    assert "Traceback" not in log, log
    assert "shutting down" in log, log
    for path in bodies:
        # a stream: its chunks, then one error event, then [DONE]
        out = streams[path]
        assert "exc" not in out, (path, out.get("exc"), log)
        assert out["status"] == 200, (path, out)
        lines = out["lines"]
        assert lines[-1] == "data: [DONE]", (path, lines[-3:])
        events = [json.loads(x[len("data: "):]) for x in lines[:-1]]
        assert "error" in events[-1], (path, lines[-4:])
        err = events[-1]["error"]
        assert err["code"] == "shutting_down" and err["type"] == "server_error", err
        assert "grace period" in err["message"], err
        assert sum("error" in e for e in events) == 1, "one error event for the response"
        # no choice ran to its end: they were cut, not finished
        assert not any(c.get("finish_reason") for e in events[:-1] for c in e["choices"])
        # a JSON request: 503 in OpenAI's shape
        out = answers[path]
        assert "exc" not in out, (path, out.get("exc"), log)
        assert out["status"] == 503, (path, out)
        assert set(out["body"]) == {"error"}, out
        assert out["body"]["error"]["code"] == "shutting_down", (path, out)


class _FakeRequest:
    """An engine request playing a script: Deltas, and callables run between them."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.finished = False
        self.cancelled = False

    def __aiter__(self) -> Any:
        return self._play()

    async def _play(self) -> Any:
        for step in self.script:
            if isinstance(step, asyncio.Event):
                await step.wait()
                continue
            if callable(step):
                step()
                continue
            if step.finish_reason is not None:
                self.finished = True
            yield step

    def cancel(self) -> None:
        self.cancelled = True

    def stats(self) -> dict:
        return {}


def test_a_stream_ends_at_its_error_event_whatever_n():
    """Two choices cut off at the end of the grace period: the first one's cancellation is the
    stream's error event, then [DONE]; text the second one still had queued is not sent after
    it (the official client stops at the error event), nor the usage chunk."""
    from types import SimpleNamespace

    from colibri.engine import Delta
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState

    def scripts() -> list[_FakeRequest]:
        first_cut = asyncio.Event()
        return [_FakeRequest([Delta(text="a", token_ids=[1]),
                              Delta(finish_reason="cancelled"), first_cut.set]),
                _FakeRequest([Delta(text="b", token_ids=[2]), first_cut,
                              Delta(text="late", token_ids=[3]),
                              Delta(finish_reason="cancelled")])]

    made: list[_FakeRequest] = []

    def submit_n(ids: list[int], n: int, **kw: Any) -> list[_FakeRequest]:
        assert n == 2
        made.extend(scripts())
        return made[-2:]

    tok = SimpleNamespace(bos_id=None, eos_id=None)
    model = SimpleNamespace(
        ctx=4096, n_vocab=100, path="fake.gguf",
        gguf=SimpleNamespace(metadata={
            "tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}),
        tokenize=lambda text, *a, **kw: [5, 6, 7], detokenize=lambda ids: "x",
        _tok=lambda: tok)
    state = ServerState(lambda: None, MODEL)  # type: ignore[arg-type]
    state.model = model  # type: ignore[assignment]
    state.engine = SimpleNamespace(submit_n=submit_n, max_seqs=16)  # type: ignore[assignment]
    state.ready = True
    state.cut = True  # the grace period ran out
    app = create_app(state)

    async def post(path: str, body: dict) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://colibri") as c:
            return await c.post(path, json=body, timeout=60)

    common = {"model": MODEL, "n": 2, "max_tokens": 8, "stream": True,
              "stream_options": {"include_usage": True}}
    for path, body in (("/v1/completions", dict(common, prompt="aa")),
                       ("/v1/chat/completions",
                        dict(common, messages=[{"role": "user", "content": "aa"}]))):
        r = asyncio.run(post(path, body))
        assert r.status_code == 200, r.text
        lines = [x for x in r.text.split("\n") if x]
        assert lines[-1] == "data: [DONE]", lines
        err = json.loads(lines[-2][len("data: "):])
        assert err["error"]["code"] == "shutting_down", lines
        assert "grace period" in err["error"]["message"]
        assert sum('"error"' in x for x in lines) == 1, lines
        assert not any("late" in x for x in lines), lines
        assert not any('"usage": {' in x for x in lines), lines  # no usage after the error
        assert all(r.finished or r.cancelled for r in made[-2:])

    async def with_the_client() -> list[Any]:
        client = openai.AsyncOpenAI(
            base_url="http://colibri/v1", api_key="none", max_retries=0,
            http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app)))
        stream = await client.chat.completions.create(
            model=MODEL, n=2, max_tokens=8, stream=True,
            messages=[{"role": "user", "content": "aa"}])
        got = []
        with pytest.raises(openai.APIError, match="grace period"):
            async for chunk in stream:
                got.append(chunk)
        return got

    got = asyncio.run(with_the_client())  # the official client raises the error event
    assert got and all(c.choices[0].finish_reason is None for c in got)


def test_the_gate_ends_a_stuck_stream_when_uvicorn_cancels_it():
    """Beyond the grace period's cut-off, uvicorn cancels what still runs: a stream still gets
    the error event and [DONE], a response not yet started a 503, and no exception escapes;
    outside a shutdown the cancellation goes through untouched."""
    from colibri.serve.gate import _gate
    from colibri.serve.state import ServerState

    def make_app(kind: str, stuck: asyncio.Event) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if kind == "sse":
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
                await send({"type": "http.response.body", "body": b'data: {"x": 1}\n\n',
                            "more_body": True})
            stuck.set()
            await asyncio.Event().wait()  # never set: stuck until cancelled
        return app

    async def run(kind: str, draining: bool) -> tuple[list[dict], bool]:
        state = ServerState(lambda: None, MODEL)  # type: ignore[arg-type]
        state.ready = True
        sent: list[dict] = []
        stuck = asyncio.Event()

        async def send(msg: dict) -> None:
            sent.append(msg)

        async def receive() -> dict:
            await asyncio.Event().wait()
            return {}

        scope = {"type": "http", "path": "/v1/completions", "headers": []}
        task = asyncio.ensure_future(_gate(make_app(kind, stuck), state)(scope, receive, send))
        await asyncio.wait_for(stuck.wait(), 60)
        state.draining = draining
        state.cut = draining
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return sent, True
        return sent, False

    sent, cancelled = asyncio.run(run("sse", True))
    assert not cancelled
    last = sent[-1]
    assert last["type"] == "http.response.body" and not last.get("more_body", False)
    blocks = last["body"].decode().strip().split("\n\n")
    assert blocks[-1] == "data: [DONE]", blocks
    err = json.loads(blocks[-2][len("data: "):])["error"]
    assert err["code"] == "shutting_down", err

    sent, cancelled = asyncio.run(run("json", True))
    assert not cancelled
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"]["code"] == "shutting_down"

    sent, cancelled = asyncio.run(run("sse", False))
    assert cancelled and len(sent) == 2  # not shutting down: nothing added
