"""Chat rendering against an outside reference: for the published templates of Gemma 3,
Qwen2.5 (ChatML, with tools), Llama 3 and Mixtral (tests/data/chat_templates), colibri's
render_template equals transformers' apply_chat_template on the same template string and
messages - system, multi-turn, tools, with and without add_generation_prompt. Where a template
refuses a conversation itself, colibri raises ColibriError carrying the template's message.
Model.chat (and stream=True) runs on the real default model."""

from __future__ import annotations

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

CASES = {
    "gemma3": [SYSTEM, MULTI],
    "qwen2.5": [SYSTEM, MULTI, TOOLS_CONV],
    "llama3": [SYSTEM, MULTI],
    "mixtral": [MULTI],
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
def test_render_equals_transformers(family, gen):
    tok = _reference(family)
    tpl = _template(family)
    bos, eos = SPECIAL[family]
    for i, msgs in enumerate(CASES[family]):
        extra = {"tools": TOOLS} if msgs is TOOLS_CONV else {}
        want = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False,
                                       add_generation_prompt=gen, **extra)
        got = render_template(tpl, msgs, add_generation_prompt=gen, bos_token=bos,
                              eos_token=eos, **extra)
        assert got == want, f"{family} case {i}"
        assert msgs[-1]["content"].strip() in got or msgs is TOOLS_CONV


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
