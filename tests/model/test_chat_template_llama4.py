"""Llama 4's published chat template (tests/data/chat_templates/llama4.jinja: Llama-4-Scout /
Maverick-17B Instruct's, as transformers' processing_llama4 holds it) beyond the common cases
of test_chat_template: what colibri's render_template gives equals transformers'
apply_chat_template for tool results as role "ipython" and "tool" (the template writes both
as an ipython turn, the content through tojson), the tools put in the system turn
(tools_in_user_message=false) or given as custom_tools, arguments as a JSON string (as
OpenAI's API carries them), content as a list of text parts, several calls in one turn, and
the template's refusal of tools without a user message."""

from __future__ import annotations

import json

import pytest

from colibri import ColibriError, render_template
from tests.model.test_chat_template import RICH_CONV, RICH_TOOLS, TOOLS, _reference, _template

BOS, EOS = "<|begin_of_text|>", "<|eot|>"

CALL = {"type": "function", "id": "call_1", "function": {
    "name": "get_weather", "arguments": {"city": "Zürich", "unit": "°C"}}}
IPYTHON = [{"role": "system", "content": "  Use tools.  "},
           {"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": "", "tool_calls": [CALL]},
           {"role": "ipython", "content": "{\"temp\": 21}"},
           {"role": "assistant", "content": "21 degrees."},
           {"role": "user", "content": "And tomorrow?"}]
TOOL_ROLE = [{**m, "role": "tool", "tool_call_id": "call_1"} if m["role"] == "ipython" else m
             for m in IPYTHON]
STRING_ARGS = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
    c["function"]["arguments"])}} for c in m["tool_calls"]]} if "tool_calls" in m else m
    for m in RICH_CONV]
PARTS = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
         {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                      {"type": "text", "text": "there"}]},
         {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
         {"role": "user", "content": "Bye"}]

CASES = [  # (messages, the template's other variables)
    (IPYTHON, {"tools": TOOLS}),
    (TOOL_ROLE, {"tools": TOOLS}),
    (IPYTHON, {"tools": TOOLS, "tools_in_user_message": False}),
    (TOOL_ROLE, {"custom_tools": RICH_TOOLS, "tools_in_user_message": False}),
    (RICH_CONV, {"tools": RICH_TOOLS}),
    (STRING_ARGS, {"tools": RICH_TOOLS}),
    (PARTS, {}),
    (IPYTHON, {}),  # calls and results without tools offered
]


@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_llama4_renders_as_transformers_does(case, gen):
    msgs, extra = CASES[case]
    tok = _reference("llama4")
    tpl = _template("llama4")
    want = tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False,
                                   add_generation_prompt=gen, **extra)
    got = render_template(tpl, msgs, add_generation_prompt=gen, bos_token=BOS, eos_token=EOS,
                          **extra)
    assert got == want, case
    assert got.startswith(BOS) and got.endswith(
        "<|header_start|>assistant<|header_end|>\n\n" if gen else "<|eot|>")
    if any("tools" in k for k in extra):
        assert ('"name": "get_weather"' in got) and ("Environment: ipython\n" in got) == (
            msgs[0]["role"] == "system")


def test_llama4_writes_calls_and_results_as_its_own_turns():
    """The shapes the parser and the grammar rely on (tool_llama4), as transformers renders
    them: the content between <|python_start|> and <|python_end|>, then the calls' objects
    back to back; a result as an ipython turn, its text through tojson."""
    tok = _reference("llama4")
    got = tok.apply_chat_template(IPYTHON, chat_template=_template("llama4"), tokenize=False,
                                  tools=TOOLS, add_generation_prompt=False)
    assert ('<|header_start|>assistant<|header_end|>\n\n<|python_start|><|python_end|>'
            '{"name": "get_weather", "parameters": {"city": "Zürich", "unit": "°C"}}<|eot|>'
            in got)
    assert '<|header_start|>ipython<|header_end|>\n\n"{\\"temp\\": 21}"<|eot|>' in got
    rich = render_template(_template("llama4"), RICH_CONV, tools=RICH_TOOLS, bos_token=BOS)
    assert '<|python_start|>On it.<|python_end|>{"name": "search_web", "parameters": {' in rich
    assert '"hi": -2}}}{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot|>' in rich


def test_llama4_refuses_tools_without_a_user_message_as_transformers_does():
    import jinja2

    msgs = [{"role": "system", "content": "Use tools."}]
    tok = _reference("llama4")
    tpl = _template("llama4")
    with pytest.raises(jinja2.exceptions.TemplateError) as ref:
        tok.apply_chat_template(msgs, chat_template=tpl, tokenize=False, tools=TOOLS)
    with pytest.raises(ColibriError) as ours:
        render_template(tpl, msgs, tools=TOOLS, bos_token=BOS, eos_token=EOS)
    assert str(ref.value) in str(ours.value) and "no first user message" in str(ours.value)
