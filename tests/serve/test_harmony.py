"""gpt-oss's harmony output read by the server (colibri/serve/harmony.py): the analysis
channel as reasoning, the final channel as the answer, calls to `functions.NAME` as tool
calls, whole and cut into pieces anywhere (every split point, and hypothesis).

The outside reference is the published template (tests/data/chat_templates/gpt-oss.jinja,
rendered by transformers): an assistant turn with its thinking and answer, or with a call, is
rendered as the model is trained to write it; what follows the prompt's `<|start|>assistant`
(less the end-of-generation token, which the engine's text leaves out) must read back to that
turn's thinking, answer and call. The form the model writes itself (the recipient after the
channel, `<|constrain|>json`) is llama.cpp's parser's other case (common/parsers/gpt-oss.cpp).

Then a real vocabulary: a tiny model whose harmony tokens are typed as a converted gpt-oss
GGUF types them (CONTROL): colibri's tokenizer makes `<|channel|>` `<|message|>` `<|start|>`
`<|constrain|>` and `<|end|>` user-defined (rendered in the text), `<|return|>` and `<|call|>`
end the generation, as llama.cpp's vocabulary does; served, it answers a named tool_choice
with a harmony call written in those tokens, read back through the official openai client.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colibri.serve.harmony import Harmony, parse_harmony
from colibri.serve.reasoning import Reasoning, splitter_for
from colibri.serve.tool_parse import ToolCallDelta, apply_delta

TEMPLATE = (Path(__file__).resolve().parents[1] / "data" / "chat_templates"
            / "gpt-oss.jinja").read_text()
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "add", "description": "Add",
             "parameters": {"type": "object", "properties": {
                 "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"],
                 "additionalProperties": False}}}]
NAMES = {"get_weather", "add"}


def rendered(turn: dict[str, Any]) -> str:
    """What the model writes for the assistant turn, as the published template renders it
    (transformers): after the prompt's <|start|>assistant, less <|return|> / <|call|>."""
    from transformers.utils.chat_template_utils import render_jinja_template

    user = [{"role": "user", "content": "¶go¶"}]
    prompt = render_jinja_template(conversations=[user], chat_template=TEMPLATE, tools=TOOLS,
                                   add_generation_prompt=True)[0][0]
    whole = render_jinja_template(conversations=[user + [turn]], chat_template=TEMPLATE,
                                  tools=TOOLS, add_generation_prompt=False)[0][0]
    assert prompt.endswith("<|start|>assistant")
    head = prompt[: -len("<|start|>assistant")]
    assert whole.startswith(head)
    out = whole[len(head):].removeprefix("<|start|>assistant")
    for eog in ("<|return|>", "<|call|>"):
        out = out.removesuffix(eog)
    return out


def read(pieces: list[str], tools: set[str] = NAMES) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, answer, [(name, arguments)]) of pieces fed in turn."""
    h = Harmony("", tools)
    out = [p for s in pieces for p in h.feed(s)] + h.finish()
    calls: list[Any] = []
    for p in out:
        if isinstance(p, ToolCallDelta):
            apply_delta(calls, p)
    return ("".join(p.text for p in out if isinstance(p, Reasoning)),
            "".join(p for p in out if isinstance(p, str)),
            [(c.name, c.arguments) for c in calls])


def every_split(text: str, want: tuple[str, str, list[tuple[str, str]]]) -> None:
    assert read([text]) == want
    assert read(list(text)) == want
    for i in range(len(text) + 1):
        assert read([text[:i], text[i:]]) == want, i
        for j in range(i, len(text) + 1, 5):
            assert read([text[:i], text[i:j], text[j:]]) == want, (i, j)


THINK, ANSWER = "The user greets me; a < b <b> stays.", "Hello  there!\n"
ARGS = {"city": "Paris \"15e\""}

CASES = [  # (the template's assistant turn, reasoning, answer, calls)
    ({"role": "assistant", "thinking": THINK, "content": ANSWER}, THINK, ANSWER, []),
    ({"role": "assistant", "content": ANSWER}, "", ANSWER, []),
    ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": ARGS}}]}, "", "",
     [("get_weather", json.dumps(ARGS))]),
    # the thinking before a call is kept (no later answer)
    ({"role": "assistant", "content": "", "thinking": THINK, "tool_calls": [{
        "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2.5}}}]},
     THINK, "", [("add", '{"a": 1, "b": 2.5}')]),
]


@pytest.mark.parametrize("turn, reasoning, answer, calls", CASES)
def test_the_templates_turn_reads_back_at_every_split_point(turn, reasoning, answer, calls):
    text = rendered(turn)
    assert text.startswith("<|channel|>") or text.startswith(" to=functions."), text
    every_split(text, (reasoning, answer, calls))


def test_the_form_the_model_writes():
    """The recipient after the channel with <|constrain|>json (llama.cpp's tool_in_channel),
    a commentary preamble (answer text), two analysis messages, unknown and built-in
    recipients dropped, plain text (a model that ignores the format), a header cut off."""
    every_split('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant'
                '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                '{"city": "Oslo"}', ("Need weather.", "", [("get_weather", '{"city": "Oslo"}')]))
    every_split('<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary'
                '<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis<|message|>b'
                '<|end|><|start|>assistant<|channel|>final<|message|>Done.',
                ("ab", "Checking.Done.", []))
    every_split('<|channel|>analysis<|message|>x<|end|><|start|>assistant to=browser.search'
                '<|channel|>commentary json<|message|>{"q": 1}<|call|><|start|>assistant'
                '<|channel|>commentary to=functions.nope json<|message|>{}<|end|>'
                '<|start|>assistant<|channel|>final<|message|>ok', ("x", "ok", []))
    # a stray commentary channel before the analysis (llama.cpp's stray_commentary)
    every_split("<|channel|>commentary to=assistant<|channel|>analysis<|message|>r<|end|>"
                "<|start|>assistant<|channel|>commentary<|channel|>final<|message|>a",
                ("r", "a", []))
    every_split("<|channel|>commentary to=assistant<|channel|>commentary to=functions.add json"
                "<|message|>{}", ("", "", [("add", "{}")]))
    every_split("Just text, <b>no</b> format.", ("", "Just text, <b>no</b> format.", []))
    every_split("<|channel|>analysis<|message|>cut", ("cut", "", []))
    every_split("<|channel|>analysis<|message|>t<|end|><|start|>assistant<|chan", ("t", "", []))
    # a call with no arguments text; calls not read when no tools apply
    assert read(["<|channel|>commentary to=functions.add json<|message|>"]) == (
        "", "", [("add", "{}")])
    assert read([rendered(CASES[2][0])], set()) == ("", "", [])


def test_streams_and_holds_back_only_a_possible_tag():
    h = Harmony("", NAMES)
    assert h.feed("<|channel|>analysis<|mess") == []
    assert not h.in_reasoning
    assert h.feed("age|>Let me") == [Reasoning("Let me")] and h.in_reasoning
    assert h.feed(" see<|e") == [Reasoning(" see")]
    assert h.feed("nd|>") == [] and not h.in_reasoning
    assert h.feed("<|start|>assistant<|channel|>commentary to=functions.add<|message|>") == [
        ToolCallDelta(0, "", h_id(h), "add")]
    assert h.feed('{"a": 1, ') == [ToolCallDelta(0, '{"a": 1, ')]
    assert h.feed('"b": 2}') == [ToolCallDelta(0, '"b": 2}')]
    assert h.finish() == []


def h_id(h: Harmony) -> Any:
    class Any_:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, str) and other.startswith("call_")
    return Any_()


def test_the_template_speaks_harmony():
    h = splitter_for(TEMPLATE, "<|start|>assistant", NAMES)
    assert isinstance(h, Harmony) and h.reads_calls and h.tools == NAMES


_body = st.text(alphabet="ab <>|/\n{}\"", max_size=30)


@settings(max_examples=300, deadline=None)
@given(think=_body, answer=_body, args=_body, to_first=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_any_chunking_reads_the_same(think: str, answer: str, args: str, to_first: bool,
                                     cuts: list[int]) -> None:
    """Bodies without harmony tags, cut anywhere: the same reasoning, answer and call."""
    for tag in ("<|end|>", "<|start|>", "<|call|>", "<|return|>"):
        think, answer, args = (x.replace(tag, "") for x in (think, answer, args))
    call = (" to=functions.add<|channel|>commentary json" if to_first else
            "<|channel|>commentary to=functions.add <|constrain|>json")
    for text, want in (
            (f"<|channel|>analysis<|message|>{think}<|end|><|start|>assistant<|channel|>final"
             f"<|message|>{answer}", (think, answer, [])),
            (f"<|channel|>analysis<|message|>{think}<|end|><|start|>assistant{call}<|message|>"
             f"{args}", (think, "", [("add", args or "{}")]))):
        at = sorted({min(c, len(text)) for c in cuts})
        pieces = [text[i:j] for i, j in zip([0, *at], [*at, len(text)], strict=True)]
        assert read(pieces) == want
        assert parse_harmony(text, NAMES)[:2] == want[:2]


# ---- a real vocabulary ----

HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                  "<|return|>", "<|call|>"]


@pytest.fixture(scope="module")
def harmony_served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model with harmony's tokens in its vocabulary, typed CONTROL (as the GGUF
    converter types a gpt-oss vocabulary's special tokens), the gpt-oss template, served."""
    import gguf

    from colibri.model import Model
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState
    from colibri.tools import make_bench_model as mbm

    first = 256 + 26 * 26
    real_vocab, real_types = mbm._vocab, gguf.GGUFWriter.add_token_types

    def vocab(n: int) -> tuple[list[str], list[str]]:
        tokens, merges = real_vocab(n)
        tokens[first:first + len(HARMONY_TOKENS)] = HARMONY_TOKENS
        return tokens, merges

    def types(self: Any, ts: Any) -> None:
        ts = list(ts)
        ts[first:first + len(HARMONY_TOKENS)] = [gguf.TokenType.CONTROL] * len(HARMONY_TOKENS)
        real_types(self, ts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mbm, "_vocab", vocab)
        mp.setattr(gguf.GGUFWriter, "add_token_types", types)
        path = str(mbm.write(str(tmp_path_factory.mktemp("harmony") / "tiny.gguf"),
                             n_layers=2, shape="tiny"))

    def load() -> Model:
        m = Model(path, threads=1, ctx=4096, verbose=False)
        m.gguf.metadata["tokenizer.chat_template"] = TEMPLATE
        return m

    state = ServerState(load, "tiny", max_seqs=2, prefault=False)
    state.load()
    assert state.ready, state.load_error
    yield SimpleNamespace(app=create_app(state), state=state,
                          ids={t: first + k for k, t in enumerate(HARMONY_TOKENS)})
    state.close()


def test_the_vocabulary_renders_the_tags_and_ends_on_return_and_call(harmony_served):
    """As llama.cpp's vocabulary: the message tags are user-defined (the engine's text keeps
    them), <|return|> and <|call|> end a generation, <|end|> does not."""
    m, ids = harmony_served.state.model, harmony_served.ids
    text = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>ok"
    toks = m.tokenize(text, add_special=False, parse_special=True)
    assert [t for t in toks if t in ids.values()] == [ids[t] for t in (
        "<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|channel|>", "<|message|>")]
    assert m.detokenize(toks) == text
    stream = m._tok().stream()
    assert "".join(stream.feed(t) for t in toks) == text  # the engine's decoder
    assert {ids["<|return|>"], ids["<|call|>"]} <= m.eog_ids
    assert ids["<|end|>"] not in m.eog_ids


@pytest.mark.parametrize("choice", ["required", "add"])
def test_a_call_in_harmony_tokens(harmony_served, choice):
    """tool_choice "required" or naming a function: the grammar's harmony call (after an
    analysis message the model may write first), the model pushed to the harmony tokens
    (logit_bias: an analysis is then ended at once), is read back as the call (whole, and
    streamed)."""
    ids = harmony_served.ids
    bias = {str(ids[t]): 40.0 for t in HARMONY_TOKENS[:5]}
    tool_choice: Any = choice if choice == "required" else {
        "type": "function", "function": {"name": choice}}

    async def go() -> tuple[Any, list[Any]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harmony_served.app),
                                     base_url="http://colibri", timeout=300) as http:
            client = openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none",
                                        max_retries=0, http_client=http)
            kw: dict[str, Any] = dict(
                model="tiny", messages=[{"role": "user", "content": "Add 1 and 2"}],
                tools=TOOLS, tool_choice=tool_choice, max_tokens=300, temperature=1.0, seed=3,
                logit_bias={**bias, "2046": -100, "2047": -100})
            whole = await client.chat.completions.create(logprobs=True, **kw)
            chunks = [c async for c in await client.chat.completions.create(stream=True, **kw)]
            return whole, chunks

    whole, chunks = asyncio.run(go())
    c = whole.choices[0]
    written = [t.token for t in c.logprobs.content]
    assert "<|channel|>" in written and "<|message|>" in written, written  # the tokens
    assert c.finish_reason == "tool_calls", ("".join(written), c.message)
    call = c.message.tool_calls[0].function
    assert call.name in NAMES and (choice == "required" or call.name == choice), call
    schema = TOOLS[[t["function"]["name"] for t in TOOLS].index(call.name)]["function"]
    jsonschema.validate(json.loads(call.arguments), schema["parameters"])
    assert not c.message.content, "".join(written)
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    args = "".join(tc.function.arguments or "" for d in deltas for tc in d.tool_calls or [])
    names = [tc.function.name for d in deltas for tc in d.tool_calls or [] if tc.function.name]
    assert names == [call.name] and args == call.arguments  # the same seed: the same call
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_response_format_in_the_final_channel(harmony_served):
    """response_format json_schema: the model writes its final channel's message as the
    JSON (after an analysis it may write first); the answer is that JSON, valid."""
    ids = harmony_served.ids
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=harmony_served.app),
                                     base_url="http://colibri", timeout=300) as http:
            client = openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none",
                                        max_retries=0, http_client=http)
            return await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "A number"}],
                response_format={"type": "json_schema", "json_schema": {
                    "name": "n", "schema": schema}},  # type: ignore[typeddict-item]
                max_tokens=200, temperature=1.0, seed=5, logprobs=True,
                logit_bias={**{str(ids[t]): 40.0 for t in HARMONY_TOKENS[:5]},
                            "2046": -100, "2047": -100})

    c = asyncio.run(go()).choices[0]
    written = "".join(t.token for t in c.logprobs.content)
    assert "<|channel|>final" in written and c.finish_reason == "stop", (written, c)
    jsonschema.validate(json.loads(c.message.content), schema)
