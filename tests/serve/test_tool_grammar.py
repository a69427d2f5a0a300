"""tool_choice "required" / a named tool writes each family's native call form
(colibri.serve.tool_grammar), checked three ways:

- The family's published template (tests/data/chat_templates), rendered by transformers with
  an assistant call, writes text the grammar accepts (so the grammar is the form the model was
  taught, not one colibri made up), and the parser reads that text back to the call.
- Strings the grammar accepts, drawn at random by walking llguidance's own token masks over a
  byte vocabulary, parse back to one call of an offered tool whose arguments the tool's schema
  validates (jsonschema).
- Served: a tiny random model with a family's template, through the official openai client,
  answers tool_choice "required" and a named function with a tool call; with a vocabulary
  where the tags are control tokens (as converted models mark special tokens), the model
  writes those tokens and the call is still read (the engine's text leaves control tokens out;
  the server puts the tags back).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import jsonschema
import llguidance
import numpy as np
import openai
import pytest

from colibri.serve.tool_grammar import call_form, call_grammar
from colibri.serve.tool_parse import parse_tool_calls
from colibri.serve.tools import string_params

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
MODEL = "tiny"

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        "exact": {"type": "boolean"}},
    "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
NAMES = {"get_weather", "add"}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# the form each template teaches (its own tags, see its file); a template that names none:
# the bare JSON object
FORMS = {"deepseek3.1": "deepseek-v3.1", "deepseek-r1": "deepseek-v3", "kimi-k2": "kimi-k2",
         "kimi-k2-instruct": "kimi-k2", "gemma4": "gemma4", "hunyuan-a13b": "hunyuan",
         "glm4.6": "xml", "ling3": "xml", "qwen2.5": "hermes", "granite4.0": "hermes",
         "granite3.3": "granite3", "llama3": "json", "mixtral": "json", "gemma3": "json",
         "gemma2": "json", "phi3.5": "json", "ernie4.5": "json", "gpt-oss": "harmony",
         "llama4": "llama4"}


def template(family: str) -> str:
    return (TEMPLATES / f"{family}.jinja").read_text()


def parse(family: str, text: str) -> tuple[str | None, list[Any]]:
    """(content, calls) of an output, read as the server reads the family's output (gpt-oss's
    harmony by its own reader, which takes the calls out of the commentary channel)."""
    if FORMS[family] == "harmony":
        from colibri.serve.harmony import parse_harmony

        _, answer, calls = parse_harmony(text, NAMES)
        return answer or None, calls
    return parse_tool_calls(text, NAMES, string_params(TOOLS))


def test_every_template_has_its_form():
    assert sorted(FORMS) == sorted(p.stem for p in TEMPLATES.glob("*.jinja"))
    for family, form in FORMS.items():
        assert call_form(template(family)) == form, family


class _Bytes:
    """A byte vocabulary (one token a byte) and an end token, for llguidance."""
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]

    def __call__(self, s: str | bytes) -> list[int]:
        return list(s.encode() if isinstance(s, str) else s)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=257,
                                   eos_token=[256])


def matcher(tools: list[dict], name: str | None, family: str) -> Any:
    kind, spec = call_grammar(tools, name, template(family))
    grammar = llguidance.LLMatcher.grammar_from_lark(spec) if kind == "lark" else \
        llguidance.LLMatcher.grammar_from_json_schema(json.dumps(spec))
    m = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(m: Any, text: str) -> bool:
    return bool(m.consume_tokens(list(text.encode()))) and m.is_accepting()


def rendered(family: str, name: str, args: dict, start: str, end: str,
             content: str | None = "", as_text: bool = False) -> str:
    """The assistant call as transformers renders it with the family's published template,
    from `start` to the end of the last `end`."""
    from transformers.utils.chat_template_utils import render_jinja_template

    msgs = [{"role": "user", "content": "¶go¶"},
            {"role": "assistant", "content": content, "tool_calls": [{
                "type": "function", "id": "call_0", "function": {
                    "name": name, "arguments": json.dumps(args) if as_text else args}}]}]
    described = [{**t, "function": {"description": "d", **t["function"]}} for t in TOOLS]
    out, _ = render_jinja_template(conversations=[msgs], chat_template=template(family),
                                   tools=described, bos_token="<s>", eos_token="</s>")
    text = out[0][out[0].rindex("¶go¶"):]
    text = text[text.index(start):]
    return text[: text.rindex(end) + len(end)]


# the calls rendered: the arguments in the schema's property order (the order the grammar
# writes), with and without the optional ones
CALLS = [("get_weather", {"city": "Paris", "days": 3}),
         ("get_weather", {"city": "Oslo", "days": 1, "unit": "celsius", "tags": ["a", "b"],
                          "exact": True}),
         ("add", {"a": 1.5, "b": -2})]
SPANS = {"deepseek3.1": ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", {}),
         "deepseek-r1": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁end｜>",
                         {"content": None, "as_text": True}),
         "kimi-k2": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", {}),
         "gemma4": ("<|tool_call>", "<tool_call|>", {}),
         "hunyuan-a13b": ("<tool_calls>", "</tool_calls>", {}),
         "glm4.6": ("<tool_call>", "</tool_call>", {}),
         "ling3": ("<tool_call>", "</tool_call>", {}),
         "qwen2.5": ("<tool_call>", "</tool_call>", {}),
         "granite4.0": ("<tool_call>", "</tool_call>", {}),
         # after the prompt's <|start|>assistant; <|call|> ends the generation (not written)
         "gpt-oss": (" to=functions.", "<|call|>", {}),
         "llama4": ("<|python_start|>", "}", {})}


def span(family: str, name: str, args: dict) -> str:
    """The template's call, as the model writes it after the prompt (SPANS)."""
    start, end, kw = SPANS[family]
    text = rendered(family, name, args, start, end, **kw)
    if family == "deepseek-r1":  # its template closes the section only after a 2nd call
        text += "<｜tool▁calls▁end｜>"
    if family == "gpt-oss":
        text = text.removesuffix("<|call|>")
    return text


@pytest.mark.parametrize("family", sorted(SPANS))
def test_the_templates_own_call_is_what_the_grammar_writes(family):
    for name, args in CALLS:
        text = span(family, name, args)
        assert accepts(matcher(TOOLS, None, family), text), (family, text)
        assert accepts(matcher(TOOLS, name, family), text), (family, text)
        other = "add" if name == "get_weather" else "get_weather"
        assert not accepts(matcher(TOOLS, other, family), text), (family, text)
        content, calls = parse(family, text)
        assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
            (name, args)], (family, text)


def walk(m: Any, rng: random.Random, limit: int = 3000) -> str:
    """A random string the grammar accepts: at each step a random allowed byte (printable
    ASCII where the grammar allows one), the end as soon as it is allowed after a while."""
    out = bytearray()
    for step in range(limit):
        mask = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[:257].astype(bool)
        allowed = np.nonzero(mask)[0]
        assert allowed.size, (m.get_error(), bytes(out))
        if mask[256] and (step > 40 or allowed.size == 1 or rng.random() < 0.2):
            return out.decode()
        ascii_ = [int(t) for t in allowed if 32 <= t < 127 or t == 10]
        t = rng.choice(ascii_ if ascii_ and rng.random() < 0.97 else [int(x) for x in allowed
                                                                          if x != 256])
        assert m.consume_token(t)
        out.append(t)
    raise AssertionError(f"no end after {limit} bytes: {bytes(out)!r}")


@pytest.mark.parametrize("family", sorted(FORMS))
def test_what_the_grammar_accepts_parses_back_to_a_valid_call(family):
    rng = random.Random(family)
    for i in range(12):
        name = None if i % 3 else rng.choice(sorted(NAMES))
        text = walk(matcher(TOOLS, name, family), rng)
        content, calls = parse(family, text)
        assert content is None and len(calls) == 1, (family, text)
        assert calls[0].name == name or (name is None and calls[0].name in NAMES), text
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])


def test_a_harmony_response_format_reads_back_as_its_answer():
    """gpt-oss under a response_format: the final channel's JSON after an optional analysis
    (llama.cpp's gpt-oss response-format rule), read back by the harmony reader as the answer,
    valid under the schema."""
    from colibri.serve.harmony import parse_harmony
    from colibri.serve.tool_grammar import harmony_final

    schema = SCHEMAS["get_weather"]
    _, spec = harmony_final(schema)
    rng = random.Random("harmony")
    # the walk is started past the analysis (random text seldom ends it), then free
    think = "<|channel|>analysis<|message|>x < y, <a|><|end|><|start|>assistant"
    for i in range(12):
        m = llguidance.LLMatcher(TOKENIZER, llguidance.LLMatcher.grammar_from_lark(spec),
                                 log_level=0)
        start = (think if i % 2 else "") + "<|channel|>f"
        assert m.consume_tokens(list(start.encode()))
        text = start + walk(m, rng)
        reasoning, answer, calls = parse_harmony(text, NAMES)
        assert not calls and reasoning == ("x < y, <a|>" if i % 2 else ""), text
        jsonschema.validate(json.loads(answer), schema)
    for text in ('<|channel|>final <|constrain|>json<|message|>{"city": "Oslo", "days": 2}',
                 '<|channel|>analysis<|message|>a < b<|end|><|start|>assistant<|channel|>final'
                 '<|message|>{"city": "Oslo", "days": 2}'):
        m = llguidance.LLMatcher(TOKENIZER, llguidance.LLMatcher.grammar_from_lark(spec),
                                 log_level=0)
        assert accepts(m, text), text


def test_schemas_beyond_a_form_fall_back_to_the_hermes_form():
    free = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"anyOf": [{"type": "string"},
                                                        {"type": "integer"}]}}}}}
    for family in ("gemma4", "glm4.6"):
        kind, spec = call_grammar([free], None, template(family))
        assert kind == "lark" and spec.startswith('start: "<tool_call>" "\\n"'), spec


# ---- served ----

@pytest.fixture(scope="module")
def served(tiny_path: str) -> Any:
    """The tiny random model served in-process by a real Engine; each test sets the chat
    template (this process's copy of the file's metadata)."""
    from colibri.model import Model
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState

    state = ServerState(lambda: Model(tiny_path, threads=1, ctx=4096, verbose=False), MODEL,
                        max_seqs=2, prefault=False)
    state.load()
    assert state.ready, state.load_error
    yield SimpleNamespace(app=create_app(state), state=state)
    state.close()


@pytest.mark.parametrize("family", ["deepseek3.1", "deepseek-r1", "kimi-k2", "gemma4",
                                    "hunyuan-a13b", "glm4.6", "granite3.3", "qwen2.5",
                                    "llama4"])
# (gpt-oss: tests/serve/test_harmony.py, on a vocabulary with harmony's tokens: its grammar lets
# the model think first, and a random model pushed to no <|end|> thinks to max_tokens)
def test_a_served_model_calls_in_its_family_form(served, family):
    served.state.model.gguf.metadata["tokenizer.chat_template"] = template(family)

    async def go() -> list[Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app),
                                     base_url="http://colibri", timeout=300) as http:
            client = openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none",
                                        max_retries=0, http_client=http)
            out = []
            for choice in ("required", {"type": "function", "function": {"name": "add"}}):
                r = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tools=TOOLS, tool_choice=choice, max_tokens=300, temperature=1.0, seed=1,
                    logit_bias={"2046": -100, "2047": -100})  # type: ignore[arg-type]
                out.append(r)
            return out

    for r, want in zip(asyncio.run(go()), (None, "add"), strict=True):
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (family, c)
        call = c.message.tool_calls[0].function
        assert call.name == want or (want is None and call.name in NAMES), (family, call)
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


# ---- tags that are control tokens ----

CONTROL = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
           "<|tool_call_end|>", "<|tool_calls_section_end|>", "<think>", "</think>"]


@pytest.fixture(scope="module")
def control_served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model with Kimi K2's tool tags and <think> / </think> as control tokens (as
    a converted vocabulary marks special tokens), served in-process."""
    import gguf

    from colibri.model import Model
    from colibri.serve.app import create_app
    from colibri.serve.state import ServerState
    from colibri.tools import make_bench_model as mbm

    first = 256 + 26 * 26  # after the byte and letter-pair tokens
    real_vocab, real_types = mbm._vocab, gguf.GGUFWriter.add_token_types

    def vocab(n: int) -> tuple[list[str], list[str]]:
        tokens, merges = real_vocab(n)
        tokens[first:first + len(CONTROL)] = CONTROL
        return tokens, merges

    def types(self: Any, ts: Any) -> None:
        ts = list(ts)
        ts[first:first + len(CONTROL)] = [gguf.TokenType.CONTROL] * len(CONTROL)
        real_types(self, ts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mbm, "_vocab", vocab)
        mp.setattr(gguf.GGUFWriter, "add_token_types", types)
        path = str(mbm.write(str(tmp_path_factory.mktemp("ctl") / "tiny.gguf"), n_layers=2,
                             shape="tiny"))
    state = ServerState(lambda: Model(path, threads=1, ctx=4096, verbose=False), MODEL,
                        max_seqs=2, prefault=False)
    state.load()
    assert state.ready, state.load_error
    yield SimpleNamespace(app=create_app(state), state=state,
                          ids={t: first + k for k, t in enumerate(CONTROL)})
    state.close()


@pytest.mark.parametrize("family", ["kimi-k2", "deepseek-r1"])
def test_tags_written_as_control_tokens_are_read(control_served, family):
    """The grammar lets the model write a tag as its control token (pushed to, here); the
    engine's text leaves control tokens out, the server puts the tags back: the call is read
    (and DeepSeek-R1's open thought is closed by the </think> token)."""
    from colibri.serve.tool_grammar import control_tags

    m = control_served.state.model
    m.gguf.metadata["tokenizer.chat_template"] = template(family)
    assert control_tags(m) == control_served.ids
    bias = {str(i): 40.0 for i in control_served.ids.values()}

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=control_served.app),
                                     base_url="http://colibri", timeout=300) as http:
            client = openai.AsyncOpenAI(base_url="http://colibri/v1", api_key="none",
                                        max_retries=0, http_client=http)
            return await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Add 1 and 2"}],
                tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                max_tokens=300, temperature=1.0, seed=2, logprobs=True,
                logit_bias={**bias, "2046": -100, "2047": -100})  # type: ignore[arg-type]

    r = asyncio.run(go())
    c = r.choices[0]
    written = [t.token for t in c.logprobs.content]
    used = {"kimi-k2": "<|tool_call_begin|>", "deepseek-r1": "</think>"}[family]
    assert used in written, written  # the control token itself, not its spelling
    assert c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "add"
    jsonschema.validate(json.loads(c.message.tool_calls[0].function.arguments), SCHEMAS["add"])
    assert not getattr(c.message, "reasoning_content", None)


@pytest.mark.parametrize("family", sorted(SPANS))
def test_the_templates_call_with_its_tags_as_control_tokens_is_accepted(family):
    """A vocabulary where every tag is a control token: the template's call, each tag written
    as its token, is what the grammar (given those tokens) accepts."""
    import re

    from colibri.serve.tool_grammar import PRESERVED

    tags = sorted(set(PRESERVED), key=len, reverse=True)
    special = {t: 257 + k for k, t in enumerate(tags)}

    class Vocab(_Bytes):
        tokens = _Bytes.tokens + [b"\xff" + t.encode() for t in tags]

    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocab()),
                                 n_vocab=len(Vocab.tokens), eos_token=[256])
    for name, args in CALLS:
        text = span(family, name, args)
        ids: list[int] = []
        for piece in re.split("(" + "|".join(map(re.escape, tags)) + ")", text):
            ids += [special[piece]] if piece in special else list(piece.encode())
        assert any(i > 256 for i in ids)
        kind, spec = call_grammar(TOOLS, name, template(family), special=special)
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(spec), log_level=0)
        assert m.consume_tokens(ids) and m.is_accepting(), (family, text)
