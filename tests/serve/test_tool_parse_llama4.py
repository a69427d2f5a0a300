"""Llama 4's tool calls (colibri.serve.tool_llama4, read by tool_parse): the text parsed is
what transformers renders with Llama 4's published template (tests/data/chat_templates/
llama4.jinja) for an assistant turn of generated calls - `<|python_start|>CONTENT<|python_end|>`
then the calls' `{"name": ..., "parameters": ...}` objects back to back, up to the `<|eot|>`
where generation stops - fed whole, a character at a time and split at random boundaries
(hypothesis), rebuilt from OpenAI's streaming shape (the helpers of test_tool_parse). Also
Meta's own placing of the call inside the tags, and what is not a call staying content (the
tags, control tokens a model's text leaves out, dropped). Served: the official openai client,
streaming and not, gets the calls a tiny model is made to write in that form."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from colibri.serve.tool_llama4 import PY_END, PY_START
from colibri.serve.tool_parse import PYTHON_TAG, ToolCallDelta, ToolStreamParser, parse_tool_calls
from tests.serve.test_tool_parse import (
    NAMES,
    SETTINGS,
    calls_st,
    check,
    draw_cuts,
    dump_styles,
    rebuild,
    rendered_calls,
    run,
)

EOT = "<|eot|>"


def llama4(calls: list[tuple[str, dict]], content: str = "", as_text: dict | None = None) -> str:
    """The assistant turn's calls as transformers renders them with Llama 4's template."""
    text = rendered_calls("llama4", calls, PY_START, "", content=content, as_text=as_text,
                          stop=EOT)
    assert text.startswith(PY_START + content + PY_END + '{"name": "')
    return text


@SETTINGS
@given(calls_st, st.sampled_from(["", "On it.", "Let me look: {x}\n"]), st.data())
def test_llama4_calls_as_its_template_writes_them(calls, content, data):
    text = llama4(calls, content)
    assert text.count('"parameters": ') >= len(calls)
    check(text, draw_cuts(data, text), content or None, calls)
    check(text, list(range(1, len(text))), content or None, calls)


@SETTINGS
@given(calls_st, dump_styles, st.data())
def test_llama4_arguments_given_as_text_are_decoded(calls, style, data):
    """Arguments given to the template as JSON text (as OpenAI's API carries them) are written
    as a JSON string: the call's arguments are that text."""
    text = llama4(calls, as_text=style)
    assert '"parameters": "' in text
    got = check(text, draw_cuts(data, text), None, calls)
    assert [c["arguments"] for c in got] == [json.dumps(a, **style) for _, a in calls]


@SETTINGS
@given(calls_st, dump_styles, st.sampled_from(["", "\n", "Sure. "]),
       st.sampled_from(["one", "list", "back to back"]), st.data())
def test_llama4_calls_inside_the_tags(calls, style, pre, shape, data):
    """Meta's own format: the call inside <|python_start|>...<|python_end|>."""
    objs = [json.dumps({"name": n, "parameters": a}, **style) for n, a in calls]
    if shape == "one":
        calls, body = calls[:1], objs[0]
    else:
        body = "[" + ", ".join(objs) + "]" if shape == "list" else "".join(objs)
    text = pre + PY_START + body + PY_END
    check(text, draw_cuts(data, text), pre or None, calls)
    check(text, list(range(1, len(text))), pre or None, calls)


def test_llama4_the_name_first_and_arguments_as_they_arrive():
    text = llama4([("add", {"a": 12, "b": "x}y"}), ("get_weather", {"city": "Oslo"})])
    p = ToolStreamParser(NAMES)
    seen = [(i, p.feed(ch)) for i, ch in enumerate(text)] + [(len(text), p.finish())]
    starts = [(i, e.name) for i, ev in seen for e in ev
              if isinstance(e, ToolCallDelta) and e.id is not None]
    # a call starts at the , after its name; the second right after the first's }
    assert [n for _, n in starts] == ["add", "get_weather"]
    assert starts[0][0] == text.index('"parameters"') - 2
    assert starts[1][0] == text.rindex('"parameters"') - 2
    pieces = [e for _, ev in seen for e in ev if isinstance(e, ToolCallDelta) and e.id is None]
    assert len(pieces) > 20  # the arguments a character at a time
    assert [c.arguments for c in p.calls] == ['{"a": 12, "b": "x}y"}', '{"city": "Oslo"}']
    assert not any(isinstance(e, str) for _, ev in seen for e in ev)


def test_llama4_what_is_not_a_call_stays_content_without_the_tags():
    for text, want in (
            (PY_START + "print(1)" + PY_END, "print(1)"),  # code, not a call
            ("Hi " + PY_START + PY_END + '{"name": "rm", "parameters": {}}',
             'Hi {"name": "rm", "parameters": {}}'),          # no such tool
            (PY_START + '{"a": 1}' + PY_END + " ok", '{"a": 1} ok'),
            (PY_START + "[1, 2]" + PY_END, "[1, 2]"),
            (PY_START + PY_END + "{oops", "{oops"),
            ("a<|python_st", "a<|python_st"),                 # not the tag after all
            ("<|python_end", "<|python_end"),
            (PY_START + PYTHON_TAG + "x", PYTHON_TAG + "x")):
        for cuts in ([], list(range(1, len(text)))):
            _, events = run(text, cuts)
            content, calls = rebuild(events)
            assert calls == [] and content == want, (text, cuts)
    # text after the calls is content
    text = llama4([("add", {"a": 1})]) + " done"
    assert parse_tool_calls(text, NAMES)[0] == " done"


@SETTINGS
@given(calls_st, st.sampled_from(["", "On it."]))
def test_llama4_calls_read_back_render_as_written(calls, content):
    """The calls read from what the template wrote, sent back as OpenAI's API carries them
    (arguments as text, content null where there is none) with a tool result, render through
    the server's messages as transformers renders the original turn: the next prompt holds the
    model's own call as it was written."""
    from colibri import render_template
    from colibri.serve.chat import _template_messages
    from colibri.serve.protocol import ChatMessage
    from tests.model.test_chat_template import _reference
    from tests.serve.test_tool_parse import TEMPLATES

    got_content, got = parse_tool_calls(llama4(calls, content), NAMES)
    api = [{"role": "user", "content": "go"},
           {"role": "assistant", "content": got_content, "tool_calls": [c.openai() for c in got]},
           {"role": "tool", "tool_call_id": got[0].id, "content": "done"}]
    msgs = _template_messages([ChatMessage.model_validate(m) for m in api], True)
    tpl = (TEMPLATES / "llama4.jinja").read_text()
    ours = render_template(tpl, msgs, bos_token="<|begin_of_text|>", eos_token=EOT)
    original = [api[0], {"role": "assistant", "content": content, "tool_calls": [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]},
        {"role": "tool", "content": "done"}]
    assert ours == _reference("llama4").apply_chat_template(
        original, chat_template=tpl, tokenize=False, add_generation_prompt=True)


# ---- served ----

MODEL = "tiny"
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def served(tiny_path: str) -> Any:
    """The tiny random model served in-process with Llama 4's template."""
    from colibri.model import Model
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState
    from tests.serve.test_tool_parse import TEMPLATES

    state = ServerState(lambda: Model(tiny_path, threads=1, ctx=4096, verbose=False), MODEL,
                        max_seqs=2, prefault=False)
    state.load()
    assert state.ready, state.load_error
    state.model.gguf.metadata["tokenizer.chat_template"] = (
        TEMPLATES / "llama4.jinja").read_text()
    yield SimpleNamespace(app=create_app(state), state=state)
    state.close()


def test_llama4_served_calls_whole_and_streamed(served):
    """tool_choice naming the tool: the model writes Llama 4's form (the grammar), the server
    reads it back; streamed, the deltas rebuild the call the whole answer has (same seed)."""
    async def go() -> tuple[Any, list[Any]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app),
                                     base_url="http://colibri", timeout=300) as http:
            client = openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none",
                                        max_retries=0, http_client=http)
            kw: dict[str, Any] = dict(
                model=MODEL, messages=[{"role": "user", "content": "Add 1 and 2"}],
                tools=[ADD], tool_choice={"type": "function", "function": {"name": "add"}},
                max_tokens=200, temperature=1.0, seed=3,
                logit_bias={"2046": -100, "2047": -100})
            whole = await client.chat.completions.create(**kw)
            chunks = [c async for c in await client.chat.completions.create(**kw, stream=True)]
            return whole, chunks

    whole, chunks = asyncio.run(go())
    c = whole.choices[0]
    assert c.finish_reason == "tool_calls" and not c.message.content
    call = c.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "add" and set(args) == {"a", "b"}
    name, streamed, ids = None, "", set()
    for ch in chunks:
        for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            assert d.index == 0
            if d.id:
                ids.add(d.id)
                name = d.function.name
            streamed += d.function.arguments or ""
        if ch.choices:
            assert not ch.choices[0].delta.content
    assert len(ids) == 1 and name == "add" and streamed == call.function.arguments
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "tool_calls"
    assert any(ch.choices and ch.choices[0].finish_reason == "tool_calls" for ch in chunks)


@pytest.fixture(scope="module")
def control_served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model with <|python_start|> and <|python_end|> as control tokens (as Llama 4's
    converted vocabulary marks them), served in-process with Llama 4's template."""
    import gguf

    from colibri.model import Model
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState
    from colibri.tools import make_bench_model as mbm
    from tests.serve.test_tool_parse import TEMPLATES

    first, tags = 256 + 26 * 26, [PY_START, PY_END]  # after the byte and letter-pair tokens
    real_vocab, real_types = mbm._vocab, gguf.GGUFWriter.add_token_types

    def vocab(n: int) -> tuple[list[str], list[str]]:
        tokens, merges = real_vocab(n)
        tokens[first:first + len(tags)] = tags
        return tokens, merges

    def types(self: Any, ts: Any) -> None:
        ts = list(ts)
        ts[first:first + len(tags)] = [gguf.TokenType.CONTROL] * len(tags)
        real_types(self, ts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mbm, "_vocab", vocab)
        mp.setattr(gguf.GGUFWriter, "add_token_types", types)
        path = str(mbm.write(str(tmp_path_factory.mktemp("l4") / "tiny.gguf"), n_layers=2,
                             shape="tiny"))
    state = ServerState(lambda: Model(path, threads=1, ctx=4096, verbose=False), MODEL,
                        max_seqs=2, prefault=False)
    state.load()
    assert state.ready, state.load_error
    state.model.gguf.metadata["tokenizer.chat_template"] = (
        TEMPLATES / "llama4.jinja").read_text()
    yield SimpleNamespace(app=create_app(state), state=state,
                          ids={t: first + k for k, t in enumerate(tags)})
    state.close()


@pytest.mark.parametrize("stream", [False, True])
def test_llama4_tags_written_as_control_tokens(control_served, stream):
    """The grammar lets the model write the tags as their control tokens (pushed to, here);
    the engine's text leaves them out, the server puts them back for the parser: the call is
    read and no tag reaches the content, whole or streamed."""
    from colibri.serve.tool_grammar import control_tags

    assert control_tags(control_served.state.model) == control_served.ids
    bias = {str(i): 40.0 for i in control_served.ids.values()}

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=control_served.app),
                                     base_url="http://colibri", timeout=300) as http:
            client = openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none",
                                        max_retries=0, http_client=http)
            r = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Add 1 and 2"}],
                tools=[ADD], tool_choice="required", max_tokens=200, temperature=1.0, seed=4,
                logprobs=True, stream=stream,
                logit_bias={**bias, "2046": -100, "2047": -100})  # type: ignore[arg-type]
            return [c async for c in r] if stream else r

    r = asyncio.run(go())
    if stream:
        choices = [c.choices[0] for c in r if c.choices]
        written = [t.token for c in choices if c.logprobs for t in c.logprobs.content]
        content = "".join(c.delta.content or "" for c in choices)
        deltas = [d for c in choices for d in c.delta.tool_calls or []]
        name = next(d.function.name for d in deltas if d.id)
        args = "".join(d.function.arguments or "" for d in deltas)
        finish = choices[-1].finish_reason
    else:
        c = r.choices[0]
        written = [t.token for t in c.logprobs.content]
        content, finish = c.message.content or "", c.finish_reason
        call = c.message.tool_calls[0].function
        name, args = call.name, call.arguments
    assert written[:2] == [PY_START, PY_END], written  # the control tokens themselves
    assert finish == "tool_calls" and name == "add" and content == ""
    assert set(json.loads(args)) == {"a", "b"}
