"""Tool calls: the grammar that constrains output to a call of the given tools, and (from
colibri.serve.tool_parse) the parser of the model's tool-call text into OpenAI `tool_calls`,
whole or streamed as deltas.

Forms understood (see tool_parse):
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of
  them, with ordinary text around them (the text becomes the message content).
- Llama 3's JSON form: the output begins with a call object `{"name": ..., "parameters": {...}}`
  (or "arguments"), optionally after `<|python_tag|>`, or a JSON list of such objects.

A JSON-looking output that does not name one of the request's tools stays plain content.
"""

from __future__ import annotations

import json
from typing import Any

from colibri.serve.tool_parse import (
    CLOSE,
    OPEN,
    PYTHON_TAG,
    ToolCall,
    ToolCallDelta,
    ToolStreamParser,
    apply_delta,
    parse_tool_calls,
)


def call_schema(tools: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """JSON schema of one call {"name": ..., "arguments": {...}} of the tool named name, or of
    any of tools (tool_choice "required")."""
    alts = []
    for t in tools:
        f = t["function"]
        if name is not None and f["name"] != name:
            continue
        params = f.get("parameters") or {"type": "object"}
        alts.append({"type": "object",
                     "properties": {"name": {"const": f["name"]}, "arguments": params},
                     "required": ["name", "arguments"], "additionalProperties": False})
    if not alts:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def call_grammar(tools: list[dict[str, Any]], name: str | None, hermes: bool) -> tuple[str, Any]:
    """("json_schema", schema) for the bare JSON form, or ("lark", grammar) wrapping it in
    <tool_call> tags (hermes: the model's template uses them)."""
    schema = call_schema(tools, name)
    if not hermes:
        return "json_schema", schema
    from colibri.serve.grammar import JSON_OPTIONS

    lark = (f'start: "{OPEN}\\n" call "\\n{CLOSE}"\n'
            f"call: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}\n")
    return "lark", lark


__all__ = ["CLOSE", "OPEN", "PYTHON_TAG", "ToolCall", "ToolCallDelta", "ToolStreamParser",
           "apply_delta", "call_grammar", "call_schema", "parse_tool_calls"]
