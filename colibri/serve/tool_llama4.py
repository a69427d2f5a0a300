"""Llama 4's tool calls, as its published template (Llama-4-Scout / Maverick-17B Instruct's
chat_template, transformers' processing_llama4) writes an assistant's calls:

    <|python_start|>CONTENT<|python_end|>{"name": "NAME", "parameters": {...}}{...}<|eot|>

the message's content between `<|python_start|>` and `<|python_end|>`, then each call as a
JSON object with "name" and "parameters" (the arguments as its tojson writes them), the calls
one after another with nothing between them.

tool_parse reads it with the JSON form's reader (Llama 3's objects): the two tags are dropped
wherever they appear (they are control tokens: the text a model writes without tools leaves
them out), and after each the output may begin a JSON call again, as at the start of the
output. So the text between them is content, and JSON calls are read before `<|python_end|>`
too (Meta's own format puts the call inside the tags).

tool_choice "required" / named (tool_grammar.call_grammar, form "llama4") writes what the
template writes for a call with empty content: `<|python_start|><|python_end|>` then one call
object, the name's literal text before the arguments' JSON (the template's key order).
"""

from __future__ import annotations

import json
from typing import Any

PY_START, PY_END = "<|python_start|>", "<|python_end|>"
PY_TAGS = (PY_START, PY_END)


def call_rule(g: Any, chosen: list[dict[str, Any]]) -> str:
    """The lark rule of one Llama 4 call of one of the chosen functions, g a
    tool_grammar._Lark (its lit, rule and json)."""
    from colibri.serve.tools import tool_parameters  # tools imports tool_parse, which this

    alts = [g.rule(json.dumps('{"name": "' + f["name"] + '", "parameters": ', ensure_ascii=False)
                   + " " + g.json(tool_parameters(f)) + ' "}"') for f in chosen]
    return f"{g.lit(PY_START)} {g.lit(PY_END)} ({' | '.join(alts)})"


__all__ = ["PY_END", "PY_START", "PY_TAGS", "call_rule"]
