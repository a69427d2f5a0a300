"""Chat rendering against an outside reference: for the published templates in
tests/data/chat_templates, colibri's render_template equals transformers' apply_chat_template on
the same template string and messages - system, multi-turn, tools where the template takes
them, with and without add_generation_prompt. Where a template refuses a conversation itself,
colibri raises ColibriError carrying the template's message. Model.chat (and stream=True) runs
on the real default model.

Where each template comes from:
- gemma3, qwen2.5, llama3, mixtral: the models' Hugging Face tokenizer_config.json.
- The families of issue 48, from llama.cpp's models/templates/ (vendored in the
  llama-cpp-python 0.3.36 sdist, fetched there by its scripts/get_chat_template.py from each
  model's Hugging Face repository):
  granite3.3 (ibm-granite-granite-3.3-2B-Instruct.jinja: Granite 3.x, as granitemoe models
  such as granite-3.1-3b-a800m-instruct use it; tools, `<|tool_call|>[...]` calls),
  granite4.0 (ibm-granite-granite-4.0.jinja: Granite 4.0, the shared-expert MoE; tools, Hermes
  `<tool_call>` calls), phi3.5 (microsoft-Phi-3.5-mini-instruct.jinja: Phi-3.5 and
  Phi-3.5-MoE; no tools), gemma2 (google-gemma-2-2b-it.jinja; no tools, refuses a system
  role), gemma4 (google-gemma-4-31B-it.jinja; tools, `<|tool_call>call:name{...}<tool_call|>`
  calls), ling3 (inclusionai-ling-3.0-flash.jinja: the Bailing template llama.cpp's
  LLM_CHAT_TEMPLATE_BAILING2 detection matches, `<role>HUMAN</role>`...; tools, GLM-style
  `<tool_call>name<arg_key>..</arg_key><arg_value>..</arg_value></tool_call>` calls).
- ernie4.5: transformers' own ERNIE 4.5 template (DEFAULT_CHAT_TEMPLATE of
  transformers/models/ernie4_5/tokenization_ernie4_5_fast.py, the chat_template of
  baidu/ERNIE-4.5-*-PT's tokenizer_config.json); no tools.
- The families of issue 46, from the same llama.cpp models/templates/: deepseek3.1
  (deepseek-ai-DeepSeek-V3.1.jinja; tools, `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME
  <｜tool▁sep｜>{...}<｜tool▁call▁end｜>` calls), deepseek-r1
  (deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja, the DeepSeek-V3 / R1 template as published:
  calls as `function<｜tool▁sep｜>NAME` then a ```json block, arguments given as a JSON string),
  kimi-k2 (moonshotai-Kimi-K2.jinja; tools, `<|tool_call_begin|>functions.NAME:IDX
  <|tool_call_argument_begin|>{...}<|tool_call_end|>` calls), kimi-k2-instruct
  (Kimi-K2-Instruct.jinja, the later revision: its tool-call bookkeeping calls list.append,
  which transformers' sandbox refuses, and colibri's alike), glm4.6 (GLM-4.6.jinja, GLM-4.5's
  glm4moe family; tools, the XML `<arg_key>`/`<arg_value>` calls; GLM-4.5's own file is
  listed in llama.cpp's README but not vendored).
- hunyuan-a13b: the chat_template of models/tokenizer_config.json in Tencent's Hunyuan-A13B
  GitHub repository (as a public fork holds it); tools, `<tool_calls>[...]</tool_calls>` calls;
  it stamps the current time, frozen here for both renderers.
- gpt-oss (issue 47), from the same llama.cpp models/templates/ (openai-gpt-oss-120b.jinja, the
  harmony format: `<|start|>ROLE<|channel|>CHANNEL<|message|>...<|end|>`, the developer
  message, tools as a TypeScript namespace, calls `<|start|>assistant to=functions.NAME
  <|channel|>commentary json<|message|>{...}<|call|>`, the `thinking` of an assistant message
  as its analysis channel, `reasoning_effort`).
- llama4: Llama-4-Scout / Maverick-17B Instruct's template, the chat_template of transformers'
  models/llama4/processing_llama4.py (its convert_llama4_weights_to_hf.py writes the same into
  the Instruct tokenizer); tools, calls as `<|python_start|>CONTENT<|python_end|>` then
  `{"name": ..., "parameters": {...}}` objects; more cases in test_chat_template_llama4.py.
Not here: dots.llm1's published template (not found in the sources this work could reach)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from colibri import ColibriError, render_template
from colibri.generate import BUILTIN_TEMPLATES

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
SPECIAL = {  # the bos/eos strings each family's tokenizer has
    "gemma3": ("<bos>", "<eos>"),
    "qwen2.5": ("", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "mixtral": ("<s>", "</s>"),
    "granite3.3": ("<|end_of_text|>", "<|end_of_text|>"),
    "granite4.0": ("<|end_of_text|>", "<|end_of_text|>"),
    "phi3.5": ("<s>", "<|endoftext|>"),
    "gemma2": ("<bos>", "<eos>"),
    "gemma4": ("<bos>", "<eos>"),
    "ling3": ("", "<|endoftext|>"),
    "ernie4.5": ("<s>", "</s>"),
    "deepseek3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-r1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "kimi-k2": ("", "<|im_end|>"),
    "kimi-k2-instruct": ("", "<|im_end|>"),
    "glm4.6": ("", "<|endoftext|>"),
    "hunyuan-a13b": ("<|startoftext|>", "<|eos|>"),
    "gpt-oss": ("<|startoftext|>", "<|return|>"),
    "llama4": ("<|begin_of_text|>", "<|eot|>"),
}

SYSTEM = [{"role": "system", "content": "You are terse."},
          {"role": "user", "content": "  Hello there!  "}]
MULTI = [{"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "4"},
         {"role": "user", "content": "And 3+3? Say it in Français ünd 日本語."}]
TOOLS_CONV = [{"role": "system", "content": "Use tools."},
              {"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {
                   "name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}}]},
              {"role": "tool", "content": "{\"temp\": 21}"},
              {"role": "user", "content": "Thanks"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
# arguments of every JSON type, two calls in one turn, two tool results (Gemma 4 writes them
# in its own value syntax, Ling as <arg_value>s, Granite 4 and Qwen as JSON)
RICH_CONV = [{"role": "user", "content": "Two searches"},
             {"role": "assistant", "content": "On it.", "tool_calls": [
                 {"type": "function", "id": "call_1", "function": {"name": "search_web", "arguments": {
                     "q": "caf\u00e9 \"quoted\"", "n": 3, "exact": True, "tags": ["a", "b"],
                     "opt": None, "range": {"lo": 1.5, "hi": -2}}}},
                 {"type": "function", "id": "call_2", "function": {
                     "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "3 results"},
             {"role": "tool", "tool_call_id": "call_2", "content": "{\"temp\": -3}"},
             {"role": "user", "content": "Summarise"}]
RICH_TOOLS = TOOLS + [{"type": "function", "function": {
    "name": "search_web", "description": "Search the web",
    "parameters": {"type": "object", "properties": {
        "q": {"type": "string", "description": "query"},
        "n": {"type": "integer"}, "exact": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"type": "string", "enum": ["fast", "deep"]},
        "range": {"type": "object", "properties": {"lo": {"type": "number"}}}},
        "required": ["q"]}}}]

# the arguments as a JSON string, as OpenAI's API carries them, and no content (DeepSeek R1 /
# V3's template concatenates the arguments as text, and writes calls only where content is
# None: transformers' tokenizer drops a None content before rendering, so this case is checked
# against transformers' renderer itself, render_jinja_template)
STRING_ARGS_CONV = [{**m, "tool_calls": [{**c, "function": {
    **c["function"], "arguments": json.dumps(c["function"]["arguments"], ensure_ascii=False)}}
    for c in m["tool_calls"]], "content": None} if "tool_calls" in m else m for m in RICH_CONV]

CASES = {
    "gemma3": [SYSTEM, MULTI],
    "qwen2.5": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "llama3": [SYSTEM, MULTI],
    "mixtral": [MULTI],
    "granite3.3": [SYSTEM, MULTI, TOOLS_CONV],  # MULTI: the default system line, today's date
    "granite4.0": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "phi3.5": [SYSTEM, MULTI],
    "gemma2": [MULTI],
    "gemma4": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "ling3": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "ernie4.5": [SYSTEM, MULTI],
    "deepseek3.1": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "deepseek-r1": [SYSTEM, MULTI, STRING_ARGS_CONV],
    "kimi-k2": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "kimi-k2-instruct": [SYSTEM, MULTI],
    "glm4.6": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "hunyuan-a13b": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
    "gpt-oss": [SYSTEM, MULTI, TOOLS_CONV],  # one call a turn: RICH_CONV's second is dropped
    "llama4": [SYSTEM, MULTI, TOOLS_CONV, RICH_CONV],
}


def _reference(family: str):
    import transformers  # the reference (test extras)
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    bos, eos = SPECIAL[family]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(["<unk>", bos or "<bos>", eos]))}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), unk_token="<unk>",
        bos_token=bos or None, eos_token=eos)
    return tok


def _template(family: str) -> str:
    return (TEMPLATES / f"{family}.jinja").read_text()


@pytest.mark.parametrize("family", sorted(CASES))
@pytest.mark.parametrize("gen", [True, False])
def test_render_equals_transformers(family, gen, monkeypatch):
    from transformers.utils import chat_template_utils

    class Frozen(datetime.datetime):  # strftime_now's clock, for both renderers
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 3, 4, 5, 6, 7)

    monkeypatch.setattr(datetime, "datetime", Frozen)
    monkeypatch.setattr(chat_template_utils, "datetime", Frozen)
    tok = _reference(family)
    tpl = _template(family)
    bos, eos = SPECIAL[family]
    for i, msgs in enumerate(CASES[family]):
        extra = {"tools": TOOLS} if msgs is TOOLS_CONV else \
            {"tools": RICH_TOOLS} if msgs in (RICH_CONV, STRING_ARGS_CONV) else {}
        if msgs is STRING_ARGS_CONV:
            from transformers.utils.chat_template_utils import render_jinja_template

            want = render_jinja_template(conversations=[msgs], chat_template=tpl,
                                         add_generation_prompt=gen, bos_token=bos,
                                         eos_token=eos, **extra)[0][0]
        else:
            want = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False,
                                           add_generation_prompt=gen, **extra)
        got = render_template(tpl, msgs, add_generation_prompt=gen, bos_token=bos,
                              eos_token=eos, **extra)
        assert got == want, f"{family} case {i}"
        assert msgs[-1]["content"].strip() in got or msgs is TOOLS_CONV
        if family == "hunyuan-a13b" and "tools" in extra:
            assert "2026-03-04 05:06:07" in got  # the frozen clock, read by both
        if msgs in (RICH_CONV, STRING_ARGS_CONV):
            assert "search_web" in got and "Oslo" in got


# harmony (gpt-oss): a developer message, an assistant turn's thinking (its analysis channel,
# kept before a call while no later final answer exists), a call, its result, an answer
HARMONY_CONVS = [
    [{"role": "developer", "content": "Answer in French."},
     {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "thinking": "I should call get_weather.",
      "tool_calls": [{"type": "function", "id": "c1", "function": {
          "name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "Let me look.", "tool_calls": [{
         "type": "function", "function": {"name": "search_web", "arguments": {
             "q": "caf\u00e9", "n": 3, "tags": ["a"]}}}]},
     {"role": "tool", "content": "3 results"},
     {"role": "assistant", "content": "Il fait 21 degr\u00e9s.", "thinking": "Easy."},
     {"role": "user", "content": "Merci"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4", "thinking": "Two and two."}],  # training: its CoT
]


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("effort", [None, "high"])
def test_gpt_oss_render_equals_transformers(gen, effort, monkeypatch):
    """The harmony template's own variables and roles: reasoning_effort (default medium),
    the developer role, assistant thinking, calls and their results, a final answer after a
    call, the last assistant turn with its thinking (add_generation_prompt=False)."""
    from transformers.utils import chat_template_utils

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 3, 4, 5, 6, 7)

    monkeypatch.setattr(datetime, "datetime", Frozen)
    monkeypatch.setattr(chat_template_utils, "datetime", Frozen)
    tok, tpl = _reference("gpt-oss"), _template("gpt-oss")
    extra = {"reasoning_effort": effort} if effort else {}
    for i, msgs in enumerate(HARMONY_CONVS):
        want = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False,
                                       add_generation_prompt=gen, tools=RICH_TOOLS, **extra)
        got = render_template(tpl, msgs, add_generation_prompt=gen, bos_token="<|startoftext|>",
                              eos_token="<|return|>", tools=RICH_TOOLS, **extra)
        assert got == want, f"case {i}"
        assert f"Reasoning: {effort or 'medium'}" in got and "Current date: 2026-03-04" in got
        assert "namespace functions" in got and ("to=functions." in got) == (i < 2)
    last = render_template(tpl, HARMONY_CONVS[2], add_generation_prompt=False)
    assert last.endswith("<|start|>assistant<|channel|>analysis<|message|>Two and two.<|end|>"
                         "<|start|>assistant<|channel|>final<|message|>4<|return|>")


def test_kimi_k2_instruct_refuses_tool_calls_as_transformers_does():
    """Kimi-K2-Instruct's later template keeps its call ids with list.append: transformers'
    immutable sandbox refuses that, and colibri's (the same sandbox) too."""
    import jinja2

    tok = _reference("kimi-k2-instruct")
    tpl = _template("kimi-k2-instruct")
    with pytest.raises(jinja2.exceptions.SecurityError) as ref:
        tok.apply_chat_template(TOOLS_CONV, chat_template=tpl, tokenize=False, tools=TOOLS)
    with pytest.raises(ColibriError) as ours:
        render_template(tpl, TOOLS_CONV, tools=TOOLS)
    assert str(ref.value) in str(ours.value) and "append" in str(ours.value)


def test_template_refusal_is_a_colibri_error_with_its_message():
    """Mixtral's template raises on a system role; transformers' TemplateError and colibri's
    ColibriError carry the template's own words."""
    import jinja2

    tok = _reference("mixtral")
    tpl = _template("mixtral")
    with pytest.raises(jinja2.exceptions.TemplateError) as ref:
        tok.apply_chat_template(SYSTEM, chat_template=tpl, tokenize=False)
    with pytest.raises(ColibriError) as ours:
        render_template(tpl, SYSTEM, bos_token="<s>", eos_token="</s>")
    assert str(ref.value) in str(ours.value)
    assert "Conversation roles must alternate" in str(ours.value)


def test_gemma2_refuses_a_system_role_as_transformers_does():
    import jinja2

    tok = _reference("gemma2")
    tpl = _template("gemma2")
    with pytest.raises(jinja2.exceptions.TemplateError) as ref:
        tok.apply_chat_template(SYSTEM, chat_template=tpl, tokenize=False)
    with pytest.raises(ColibriError) as ours:
        render_template(tpl, SYSTEM, bos_token="<bos>", eos_token="<eos>")
    assert str(ref.value) in str(ours.value) and "System role not supported" in str(ours.value)


def test_the_sandbox_holds():
    """A template cannot reach Python internals: the sandbox refuses, as a ColibriError."""
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ColibriError):
        render_template(evil, MULTI)
    with pytest.raises(ColibriError):
        render_template("{% set x = messages.append(1) %}", MULTI)  # immutable sandbox


def test_bad_messages_are_value_errors():
    for bad in (["hi"], [{"content": "x"}], [{"role": "user"}], [{"role": 1, "content": "x"}]):
        with pytest.raises(ValueError):
            render_template(_template("llama3"), bad)


def test_builtin_gemma_template_is_the_published_one():
    """The default model's GGUF has no tokenizer.chat_template: colibri falls back to its
    family's template, which must be Gemma 3's published one (the reference file)."""
    assert BUILTIN_TEMPLATES["gemma"] == _template("gemma3")


@pytest.fixture(scope="module")
def gemma():
    import colibri

    m = colibri.Model(ctx=512, verbose=False)
    yield m
    m.close()


def test_render_chat_on_the_default_model_equals_transformers(gemma):
    from colibri.generate import chat_template, render_chat

    tok = _reference("gemma3")
    for msgs in CASES["gemma3"]:
        want = tok.apply_chat_template(msgs, chat_template=chat_template(gemma), tokenize=False,
                                       add_generation_prompt=True)
        assert render_chat(gemma, msgs) == want


def test_model_chat_on_the_default_model(gemma):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    text = gemma.chat(msgs, max_tokens=12, temperature=0)
    assert isinstance(text, str) and text.strip()
    pieces = list(gemma.chat(msgs, max_tokens=12, temperature=0, stream=True))
    assert len(pieces) >= 2 and "".join(pieces) == text
    assert "<end_of_turn>" not in text and "<start_of_turn>" not in text
    # multi-turn continues the conversation the template renders
    more = gemma.chat(msgs + [{"role": "assistant", "content": text},
                              {"role": "user", "content": "And of Italy?"}],
                      max_tokens=8, temperature=0)
    assert isinstance(more, str) and more.strip()
