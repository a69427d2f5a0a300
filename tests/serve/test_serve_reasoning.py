"""Reasoning models on `colibri serve`: the thinking (`<think>...</think>`) split from the answer
as the text streams (colibri/serve/reasoning.py), returned as chat's reasoning_content, the
Responses API's reasoning item and the Messages API's thinking block, and turned off through
the chat template (enable_thinking, chat_template_kwargs, Responses' reasoning.effort,
Anthropic's thinking.type).

The splitter is tested over every split point of its input (and by hypothesis); the three APIs
end to end through the app (the official openai and anthropic clients over an ASGI transport)
on a scripted engine: a fake model whose chat template thinks as Qwen3's does, and whose
output is given in pieces, so that the tags are split across deltas where the test says.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import fastapi  # noqa: F401  the serve extra (test extras)
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colibri.serve.reasoning import Reasoning, ThinkTags, splitter_for

MODEL = "thinker"

# Qwen3's own generation prompt: thinking on by default, enable_thinking=false writes an empty
# thought into the prompt
QWEN3 = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
         "{%- if enable_thinking is defined and enable_thinking is false %}"
         "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
# DeepSeek-R1's (and Qwen3-Thinking-2507's): the generation prompt opens <think> itself
OPENS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"  # no thinking


def split(prompt: str, pieces: list[str]) -> tuple[str, str]:
    """(reasoning, content) of pieces fed to a <think> splitter in turn."""
    t = ThinkTags(prompt)
    out = [p for s in pieces for p in t.feed(s)] + t.finish()
    return ("".join(p.text for p in out if isinstance(p, Reasoning)),
            "".join(p for p in out if isinstance(p, str)))


# -- the splitter -----------------------------------------------------------------------------

CASES = [  # (prompt, output, reasoning, content)
    ("", "<think>\nI think.\n</think>\n\nThe answer.", "I think.", "The answer."),
    ("", "  <think>a < b </ c</think>x", "a < b </ c", "x"),
    ("", "<think>never closed, cut by max_tokens", "never closed, cut by max_tokens", ""),
    ("", "No tags at all: <b> </thin", "", "No tags at all: <b> </thin"),
    ("", "Before.<think>mid</think>after <think> stays", "mid", "Before.after <think> stays"),
    ("<|im_start|>assistant\n<think>\n", "inside already</think>\n\nanswer", "inside already",
     "answer"),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "just the answer", "",
     "just the answer"),
    ("<|im_start|>assistant\n<think>\n", "the model never closes it", "the model never closes it",
     ""),
]


@pytest.mark.parametrize("prompt, output, reasoning, content", CASES)
def test_splitter_at_every_split_point(prompt: str, output: str, reasoning: str,
                                       content: str) -> None:
    """The same split whole, a character at a time, and cut in two and three anywhere (a tag
    split across pieces included)."""
    assert split(prompt, [output]) == (reasoning, content)
    assert split(prompt, list(output)) == (reasoning, content)
    n = len(output)
    for i in range(n + 1):
        assert split(prompt, [output[:i], output[i:]]) == (reasoning, content), i
        for j in range(i, n + 1, 3):
            assert split(prompt, [output[:i], output[i:j], output[j:]]) == (reasoning, content)


def test_splitter_streams_and_holds_back_only_a_possible_tag() -> None:
    t = ThinkTags("")
    assert t.feed("<thi") == []  # could be <think>
    assert t.feed("nk>Let me") == [Reasoning("Let me")]
    assert t.in_reasoning
    assert t.feed(" see</") == [Reasoning(" see")]
    assert t.feed("think>") == []
    assert not t.in_reasoning
    assert t.feed("\n\nDone") == ["Done"]
    assert t.feed(" <think>") == [" <think>"]  # after the thought everything is answer
    assert t.finish() == []
    t = ThinkTags("")
    assert t.feed("Hi <") == ["Hi"]
    assert t.finish() == [" <"]  # held back, released at the end


def test_splitter_only_for_templates_that_think() -> None:
    assert splitter_for(PLAIN, "x") is None
    assert isinstance(splitter_for(QWEN3, "x"), ThinkTags)
    assert splitter_for(OPENS, "<|im_start|>assistant\n<think>\n").in_reasoning  # type: ignore[union-attr]
    assert not splitter_for(QWEN3, "<|im_start|>assistant\n").in_reasoning  # type: ignore[union-attr]


_text = st.text(alphabet="ab <>/\nthink", max_size=30)


@settings(max_examples=300, deadline=None)
@given(lead=st.sampled_from(["", " ", "\n"]), r=_text, a=_text, cuts=st.lists(
    st.integers(min_value=0, max_value=120), max_size=6))
def test_splitter_property(lead: str, r: str, a: str, cuts: list[int]) -> None:
    """Any thought and answer (without the tags themselves), cut anywhere: the thought is
    the reasoning (stripped), the answer the content (leading blank space dropped)."""
    while "</think>" in r:  # the thought cannot hold its own end (a removal may make one)
        r = r.replace("</think>", "")
    text = f"{lead}<think>{r}</think>{a}"  # the answer may hold anything, tags included
    at = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[i:j] for i, j in zip([0, *at], [*at, len(text)], strict=True)]
    assert split("", pieces) == (r.strip(), a.lstrip())
    # never closed: everything after <think> is reasoning, the content empty
    unclosed = f"{lead}<think>{r}{a}"
    if "</think>" not in unclosed:
        pieces = [unclosed[i:j] for i, j in zip([0, *at], [*at, len(unclosed)], strict=True)
                  if i <= len(unclosed)]
        assert split("", pieces) == ((r + a).strip(), "")
    # no tags: the text is the content as is (leading blank space dropped)
    plain = (r + a).replace("<think>", "")
    if "<think>" not in plain:
        assert split("", [plain[:len(plain) // 2], plain[len(plain) // 2:]]) == \
            ("", plain.lstrip())


# -- the APIs on a scripted engine ------------------------------------------------------------

class _FakeRequest:
    """An engine request playing its deltas."""

    def __init__(self, deltas: list[Any]) -> None:
        self.deltas = deltas
        self.finished = False
        self.cached_tokens = 0

    def __aiter__(self) -> Any:
        return self._play()

    async def _play(self) -> Any:
        for d in self.deltas:
            if d.finish_reason is not None:
                self.finished = True
            yield d

    def cancel(self) -> None:
        self.finished = True

    def stats(self) -> dict:
        return {}


class Fake:
    """An app on a fake model (chat template `template`) whose every completion writes
    `pieces` (one token each), then finishes with `finish`; prompts records the rendered
    prompts."""

    def __init__(self, template: str, pieces: list[str], finish: str = "stop") -> None:
        from colibri.engine import Delta
        from colibri.serve.app import create_app
        from colibri.serve.state import ServerState

        self.pieces, self.finish = pieces, finish
        self.prompts: list[str] = []

        def tokenize(text: str, *a: Any, **kw: Any) -> list[int]:
            self.prompts.append(text)
            return list(range(len(text)))

        def submit_n(ids: list[int], n: int, **kw: Any) -> list[_FakeRequest]:
            return [_FakeRequest([Delta(text=p, token_ids=[7]) for p in self.pieces]
                                 + [Delta(finish_reason=self.finish)]) for _ in range(n)]

        tok = SimpleNamespace(bos_id=None, eos_id=None,
                              decode=lambda ids: "".join(self.pieces))
        model = SimpleNamespace(ctx=100000, n_vocab=100, path="fake.gguf",
                                gguf=SimpleNamespace(metadata={
                                    "tokenizer.chat_template": template}),
                                tokenize=tokenize, detokenize=lambda ids: "x", _tok=lambda: tok)
        state = ServerState(lambda: None, MODEL)  # type: ignore[arg-type]
        state.model = model  # type: ignore[assignment]
        state.engine = SimpleNamespace(submit_n=submit_n, max_seqs=16)  # type: ignore[assignment]
        state.ready = True
        self.app = create_app(state)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                 base_url="http://colibri", timeout=60)

    def post(self, path: str, body: dict) -> httpx.Response:
        async def go() -> httpx.Response:
            async with self.http() as c:
                return await c.post(path, json=body)
        return asyncio.run(go())

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none", max_retries=0,
                                  http_client=self.http())

    def anthropic(self) -> anthropic.AsyncAnthropic:
        # the anthropic client runs on httpx's fork httpx2 (the same transports)
        import httpx2

        return anthropic.AsyncAnthropic(
            base_url="http://colibri", api_key="none", max_retries=0,
            http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app),
                                           timeout=60))


# the model thinks (<think> one token, as Qwen3's), </think> cut across pieces
THINKING = ["<think>", "\nThe user", " greets me.\n</th", "ink>\n\n", "Hello", " there!"]
THOUGHT, ANSWER = "The user greets me.", "Hello there!"
USER = [{"role": "user", "content": "hi"}]


def _sse(text: str) -> list[dict]:
    return [json.loads(x[6:]) for x in text.split("\n")
            if x.startswith("data: ") and x != "data: [DONE]"]


def test_chat_reasoning_content() -> None:
    fake = Fake(QWEN3, THINKING)
    r = fake.post("/v1/chat/completions", {"model": MODEL, "messages": USER})
    assert r.status_code == 200, r.text
    body = r.json()
    msg = body["choices"][0]["message"]
    assert msg["content"] == ANSWER and msg["reasoning_content"] == THOUGHT, msg
    # the tokens written while thinking, the tags' own included: <think> ... </th ink>
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4, body["usage"]
    assert body["usage"]["completion_tokens"] == len(THINKING)

    r = fake.post("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True})
    chunks = _sse(r.text)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    assert not any("think>" in (d.get("content") or "") for d in deltas)
    # the reasoning streams before the answer
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content"), kinds
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    async def with_the_client() -> tuple[Any, str, str]:
        c = fake.openai()
        done = await c.chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
        stream = await c.chat.completions.create(model=MODEL, messages=USER,  # type: ignore[arg-type]
                                                 stream=True)
        thought, answer = "", ""
        async for ch in stream:
            d = ch.choices[0].delta
            thought += getattr(d, "reasoning_content", None) or ""
            answer += d.content or ""
        return done, thought, answer

    done, thought, answer = asyncio.run(with_the_client())
    assert done.choices[0].message.content == ANSWER
    assert done.choices[0].message.reasoning_content == THOUGHT  # type: ignore[attr-defined]
    assert (thought, answer) == (THOUGHT, ANSWER)


def test_chat_unclosed_reasoning_and_a_template_that_opens_it() -> None:
    """Cut by max_tokens while thinking: all reasoning, content empty. A template that opens
    <think> in the prompt: the output starts inside the reasoning."""
    fake = Fake(QWEN3, ["<think>", "still", " thinking"], finish="length")
    msg = fake.post("/v1/chat/completions", {"model": MODEL, "messages": USER}).json()[
        "choices"][0]
    assert msg["finish_reason"] == "length"
    assert msg["message"]["content"] == "" and msg["message"]["reasoning_content"] == \
        "still thinking", msg

    fake = Fake(OPENS, ["Hmm, a greeting.", "</think>", "\n\nHi!"])
    msg = fake.post("/v1/chat/completions", {"model": MODEL, "messages": USER}).json()[
        "choices"][0]["message"]
    assert fake.prompts[-1].endswith("<think>\n")
    assert (msg["reasoning_content"], msg["content"]) == ("Hmm, a greeting.", "Hi!"), msg


def test_a_model_that_does_not_think_is_unchanged() -> None:
    fake = Fake(PLAIN, THINKING)
    body = fake.post("/v1/chat/completions", {"model": MODEL, "messages": USER}).json()
    msg = body["choices"][0]["message"]
    assert msg["content"] == "".join(THINKING) and "reasoning_content" not in msg, msg
    assert "completion_tokens_details" not in body["usage"]
    out = fake.post("/v1/responses", {"model": MODEL, "input": "hi"}).json()["output"]
    assert [o["type"] for o in out] == ["message"], out
    blocks = fake.post("/v1/messages", {"model": MODEL, "messages": USER,
                                        "max_tokens": 8}).json()["content"]
    assert blocks == [{"type": "text", "text": "".join(THINKING)}], blocks


def test_enable_thinking_false_renders_the_prompt_without_thinking() -> None:
    """enable_thinking (top level), chat_template_kwargs, Responses' reasoning.effort "none"
    and Anthropic's thinking "disabled" all reach the template: Qwen3's writes an empty
    thought into the prompt (more prompt tokens); a model that then answers directly gives no
    reasoning."""
    fake = Fake(QWEN3, ["Hello", " there!"])
    base = {"model": MODEL, "messages": USER}
    on = fake.post("/v1/chat/completions", base).json()
    prompt_on = fake.prompts[-1]
    assert prompt_on.endswith("<|im_start|>assistant\n")
    for extra in ({"enable_thinking": False},
                  {"chat_template_kwargs": {"enable_thinking": False}},
                  {"chat_template_kwargs": {"enable_thinking": True}, "enable_thinking": False}):
        off = fake.post("/v1/chat/completions", {**base, **extra}).json()
        assert fake.prompts[-1] == prompt_on + "<think>\n\n</think>\n\n", extra
        assert off["usage"]["prompt_tokens"] == on["usage"]["prompt_tokens"] + 19
        msg = off["choices"][0]["message"]
        assert msg["content"] == ANSWER and msg["reasoning_content"] is None, msg
    fake.post("/v1/chat/completions", {**base, "chat_template_kwargs": {"enable_thinking": True}})
    assert fake.prompts[-1] == prompt_on

    r = fake.post("/v1/responses", {"model": MODEL, "input": "hi",
                                    "reasoning": {"effort": "none"}})
    assert r.status_code == 200, r.text
    assert fake.prompts[-1].endswith("<think>\n\n</think>\n\n")
    assert [o["type"] for o in r.json()["output"]] == ["message"]
    assert r.json()["reasoning"]["effort"] == "none"
    fake.post("/v1/responses", {"model": MODEL, "input": "hi", "reasoning": {"effort": "high"}})
    assert fake.prompts[-1].endswith("assistant\n")

    r = fake.post("/v1/messages", {"model": MODEL, "messages": USER, "max_tokens": 8,
                                   "thinking": {"type": "disabled"}})
    assert r.status_code == 200, r.text
    assert fake.prompts[-1].endswith("<think>\n\n</think>\n\n")
    assert [b["type"] for b in r.json()["content"]] == ["text"]
    fake.post("/v1/messages", {"model": MODEL, "messages": USER, "max_tokens": 8,
                               "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert fake.prompts[-1].endswith("assistant\n")

    r = fake.post("/v1/chat/completions", {**base, "chat_template_kwargs": {"messages": []}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"

    # /tokenize's chat form renders as the chat endpoint does, enable_thinking included
    for extra in ({}, {"enable_thinking": False}, {"chat_template_kwargs": {"enable_thinking": False}}):
        chat = fake.post("/v1/chat/completions", {**base, **extra}).json()
        counted = fake.post("/tokenize", {"model": MODEL, "messages": USER, **extra})
        assert counted.status_code == 200, counted.text
        assert counted.json()["count"] == chat["usage"]["prompt_tokens"], extra


def test_responses_reasoning_item() -> None:
    fake = Fake(QWEN3, THINKING)

    async def go() -> tuple[Any, list[Any], Any, Any]:
        c = fake.openai()
        resp = await c.responses.create(model=MODEL, input="hi")
        events = []
        async with c.responses.stream(model=MODEL, input="hi") as s:
            async for e in s:
                events.append(e)
            final = await s.get_final_response()
        # the reasoning item given back (as clients pass the output on) is accepted
        follow = await c.responses.create(model=MODEL, input=[
            {"role": "user", "content": "hi"}, *[o.model_dump(exclude_none=True)
                                                 for o in resp.output],
            {"role": "user", "content": "and again"}])  # type: ignore[list-item]
        return resp, events, final, follow

    resp, events, final, follow = asyncio.run(go())
    for r in (resp, final):
        assert [o.type for o in r.output] == ["reasoning", "message"], r.output
        rs = r.output[0]
        assert rs.summary == [] and rs.content is not None
        assert [(p.type, p.text) for p in rs.content] == [("reasoning_text", THOUGHT)]
        assert r.output_text == ANSWER
        assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == 4
    assert follow.output_text == ANSWER
    assert "and again" in fake.prompts[-1] and THOUGHT not in fake.prompts[-1]
    types = [e.type for e in events]
    assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
    assert types.index("response.reasoning_text.done") < types.index(
        "response.output_text.delta")
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") \
        == THOUGHT
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]

    # cut while thinking: the reasoning item only, incomplete
    fake = Fake(QWEN3, ["<think>", "still"], finish="length")
    body = fake.post("/v1/responses", {"model": MODEL, "input": "hi"}).json()
    assert body["status"] == "incomplete"
    assert [(o["type"], o["status"]) for o in body["output"]] == [("reasoning", "incomplete")]
    streamed = _sse(fake.post("/v1/responses", {"model": MODEL, "input": "hi",
                                                "stream": True}).text)
    assert streamed[-1]["type"] == "response.incomplete"
    assert [o["type"] for o in streamed[-1]["response"]["output"]] == ["reasoning"]


def test_messages_thinking_block() -> None:
    fake = Fake(QWEN3, THINKING)

    async def go() -> tuple[Any, list[Any], Any]:
        c = fake.anthropic()
        msg = await c.messages.create(model=MODEL, max_tokens=64, messages=USER)  # type: ignore[arg-type]
        events = []
        async with c.messages.stream(model=MODEL, max_tokens=64, messages=USER) as s:  # type: ignore[arg-type]
            async for e in s:
                events.append(e)
            final = await s.get_final_message()
        return msg, events, final

    msg, events, final = asyncio.run(go())
    for m in (msg, final):
        assert [b.type for b in m.content] == ["thinking", "text"], m.content
        assert m.content[0].thinking == THOUGHT and m.content[0].signature == ""
        assert m.content[1].text == ANSWER
        assert m.stop_reason == "end_turn"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THOUGHT
    assert "".join(d.text for d in deltas if d.type == "text_delta") == ANSWER
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]


# -- gpt-oss's harmony channels (colibri/serve/harmony.py) --------------------------------------

GPT_OSS = (Path(__file__).resolve().parents[1] / "data" / "chat_templates"
           / "gpt-oss.jinja").read_text()
# one piece a token, as gpt-oss's vocabulary has them; <|end|> cut across two deltas
HARMONY = ["<|channel|>", "analysis", "<|message|>", "The user", " greets me.", "<|e", "nd|>",
           "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Hello", " there!"]
HARMONY_CALL = ["<|channel|>", "analysis", "<|message|>", "Need", " the weather.", "<|end|>",
                "<|start|>", "assistant", "<|channel|>", "commentary", " to", "=functions",
                ".get", "_weather", " <|constrain|>", "json", "<|message|>", '{"city"',
                ': "Paris"}']
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # no description


def test_harmony_analysis_is_reasoning_final_is_content() -> None:
    """gpt-oss's template: the analysis channel comes back as reasoning (chat, Responses,
    Messages), the final channel as the answer, whole and streamed; the template's own
    reasoning_effort is set through chat_template_kwargs."""
    fake = Fake(GPT_OSS, HARMONY)
    body = fake.post("/v1/chat/completions", {
        "model": MODEL, "messages": USER,
        "chat_template_kwargs": {"reasoning_effort": "high"}}).json()
    assert fake.prompts[-1].endswith("<|start|>assistant") and \
        "Reasoning: high" in fake.prompts[-1]
    msg = body["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, ANSWER), msg
    # the analysis message's tokens from its <|message|> to its <|end|> (both included)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5, body["usage"]

    async def go() -> tuple[Any, str, str, Any, Any]:
        c = fake.openai()
        done = await c.chat.completions.create(model=MODEL, messages=USER)  # type: ignore[arg-type]
        thought, answer = "", ""
        async for ch in await c.chat.completions.create(model=MODEL, messages=USER,  # type: ignore[arg-type]
                                                        stream=True):
            d = ch.choices[0].delta
            thought += getattr(d, "reasoning_content", None) or ""
            answer += d.content or ""
        resp = await c.responses.create(model=MODEL, input="hi")
        msg = await fake.anthropic().messages.create(model=MODEL, max_tokens=64,
                                                     messages=USER)  # type: ignore[arg-type]
        return done, thought, answer, resp, msg

    done, thought, answer, resp, m = asyncio.run(go())
    assert done.choices[0].message.content == ANSWER
    assert done.choices[0].message.reasoning_content == THOUGHT  # type: ignore[attr-defined]
    assert (thought, answer) == (THOUGHT, ANSWER)
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == THOUGHT and resp.output_text == ANSWER
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert (m.content[0].thinking, m.content[1].text) == (THOUGHT, ANSWER)


def test_harmony_call_in_the_commentary_channel() -> None:
    """A call to functions.get_weather in the commentary channel (after the analysis) is an
    OpenAI tool call, whole and streamed through the official client; a tool without a
    description renders (the template joins descriptions); tool_choice "none": not read."""
    fake = Fake(GPT_OSS, HARMONY_CALL)
    base = {"model": MODEL, "messages": USER, "tools": WEATHER}

    async def go() -> tuple[Any, list[Any]]:
        c = fake.openai()
        done = await c.chat.completions.create(**base)  # type: ignore[call-overload]
        chunks = [x async for x in await c.chat.completions.create(stream=True, **base)]  # type: ignore[call-overload]
        return done, chunks

    done, chunks = asyncio.run(go())
    assert "namespace functions" in fake.prompts[-1] and "type get_weather" in fake.prompts[-1]
    c = done.choices[0]
    assert c.finish_reason == "tool_calls" and not c.message.content, c
    assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]
    assert c.message.reasoning_content == "Need the weather."  # type: ignore[attr-defined]
    deltas = [x.choices[0].delta for x in chunks if x.choices]
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert [t.function.name for t in calls if t.function.name] == ["get_weather"]
    assert "".join(t.function.arguments or "" for t in calls) == '{"city": "Paris"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == \
        "Need the weather."

    off = fake.post("/v1/chat/completions", {**base, "tool_choice": "none"}).json()
    msg = off["choices"][0]
    assert msg["finish_reason"] == "stop" and "tool_calls" not in msg["message"], msg
    assert msg["message"]["content"] == "" and msg["message"]["reasoning_content"]
    r = fake.post("/v1/responses", {"model": MODEL, "input": "hi", "tools": [
        {"type": "function", "name": "get_weather", "parameters": WEATHER[0]["function"][
            "parameters"]}]}).json()
    assert [(o["type"], o.get("name")) for o in r["output"]] == [
        ("reasoning", None), ("function_call", "get_weather")], r["output"]


def test_harmony_thinking_given_back_before_a_call() -> None:
    """An assistant turn's reasoning_content, given back with its call, reaches gpt-oss's
    template as its `thinking` (as llama.cpp's server maps it): the prompt is transformers'
    render of the conversation with that field (the analysis kept before the call)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    fake = Fake(GPT_OSS, ["<|channel|>", "final", "<|message|>", "It is 21."])
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "I should call it.",
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'}]
    body = fake.post("/v1/chat/completions", {"model": MODEL, "messages": msgs,
                                              "tools": WEATHER}).json()
    assert body["choices"][0]["message"]["content"] == "It is 21.", body
    ref = [msgs[0], {"role": "assistant", "content": "", "thinking": "I should call it.",
                     "tool_calls": [{**call, "function": {"name": "get_weather",
                                                          "arguments": {"city": "Paris"}}}]},
           msgs[2]]
    tools = [{**WEATHER[0], "function": {"description": "", **WEATHER[0]["function"]}}]
    want = render_jinja_template(conversations=[ref], chat_template=GPT_OSS, tools=tools,
                                 add_generation_prompt=True)[0][0]
    assert fake.prompts[-1] == want
    assert "<|channel|>analysis<|message|>I should call it.<|end|><|start|>assistant to=" \
        "functions.get_weather" in want


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real tiny model (the random MoE of make-bench-model) whose chat template opens
    <think> in the generation prompt, as DeepSeek-R1's does, served in-process by a real
    Engine: its output starts inside the thought."""
    from colibri.model import Model
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState
    from colibri.tools.make_bench_model import write

    path = str(write(str(tmp_path_factory.mktemp("think") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))

    def load() -> Model:
        m = Model(path, threads=1, ctx=256, verbose=False)
        # the template of a thinking model, in this process's copy of the metadata
        m.gguf.metadata["tokenizer.chat_template"] = OPENS
        return m

    state = ServerState(load, MODEL, max_seqs=2, prefault=False)
    state.load()
    assert state.ready, state.load_error
    yield SimpleNamespace(app=create_app(state), state=state)
    state.close()


def test_a_real_model_whose_template_opens_the_thought(thinking_model: Any) -> None:
    """Through the real engine and tokenizer: the rendered prompt ends inside <think>, so
    what the model writes is reasoning; cut by max_tokens before any </think>, the answer is
    empty and every generated token is a reasoning token (chat), the Responses output is the
    reasoning item alone, incomplete; the text is the plain completion's for the same prompt."""
    async def go() -> tuple[dict, dict, dict]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=thinking_model.app),
                                     base_url="http://colibri", timeout=120) as c:
            chat = (await c.post("/v1/chat/completions", json={
                "model": MODEL, "messages": USER, "max_tokens": 6, "temperature": 0,
                "logit_bias": {"2046": -100, "2047": -100}})).json()
            # the same prompt's tokens (/tokenize's chat form renders as chat does), continued
            # by the plain completions endpoint
            ids = (await c.post("/tokenize", json={"model": MODEL, "messages": USER})).json()
            text = (await c.post("/detokenize", json={"model": MODEL,
                                                      "tokens": ids["tokens"]})).json()
            assert text["prompt"].endswith("assistant\n<think>\n"), text
            plain = (await c.post("/v1/completions", json={
                "model": MODEL, "prompt": ids["tokens"], "max_tokens": 6, "temperature": 0,
                "logit_bias": {"2046": -100, "2047": -100}})).json()
            resp = (await c.post("/v1/responses", json={
                "model": MODEL, "input": "hi", "max_output_tokens": 6, "temperature": 0})).json()
            return chat, plain, resp

    chat, plain, resp = asyncio.run(go())
    msg = chat["choices"][0]["message"]
    assert chat["choices"][0]["finish_reason"] == "length"
    assert msg["content"] == "" and msg["reasoning_content"], chat
    assert chat["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6
    assert msg["reasoning_content"] == plain["choices"][0]["text"].strip()
    assert resp["status"] == "incomplete", resp
    assert [o["type"] for o in resp["output"]] == ["reasoning"], resp["output"]
