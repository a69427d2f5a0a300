"""Tool calls: the grammar that constrains output to a call of the given tools, and (from
colibri.serve.tool_parse) the parser of the model's tool-call text into OpenAI `tool_calls`,
whole or streamed as deltas.

Forms understood (see tool_parse):
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of
  them, with ordinary text around them (the text becomes the message content).
- Llama 3's JSON form: the output begins with a call object `{"name": ..., "parameters": {...}}`
  (or "arguments"), optionally after `<|python_tag|>` (or Granite 3's `<|tool_call|>`), or a
  JSON list of such objects.
- Hunyuan's `<tool_calls>[...]</tool_calls>` (a JSON list of call objects).
- DeepSeek V3.1 / V3 / R1's and Kimi K2's calls between special tags.
- GLM-style XML (Ling / Bailing): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>
  </tool_call>`.
- Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,...}<tool_call|>`.
- Llama 4: `<|python_start|>text<|python_end|>` then Llama 3's objects (see tool_llama4).

The grammar of tool_choice "required" or a named tool (tool_grammar.call_grammar) writes
the form the model's template teaches: DeepSeek's, Kimi K2's, Gemma 4's, Hunyuan's, GLM's XML,
Hermes, Granite 3's, Llama 4's, or the bare JSON object (Llama 3 and templates with no form of their own).

A JSON-looking output that does not name one of the request's tools stays plain content.
"""

from __future__ import annotations

import json
import re
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

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name


class ToolError(ValueError):
    """A request's tools are unusable: message, and param naming the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def schema_problem(schema: Any) -> str | None:
    """Why schema is not a valid JSON Schema (None when it is): jsonschema's metaschema check
    where jsonschema is installed, else llguidance's parse of it (its "not implemented yet"
    answers do not count: the schema may still be valid)."""
    try:
        import jsonschema
    except ImportError:
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
            problem = llguidance.LLMatcher.validate_grammar(grammar, None)
        except (ValueError, TypeError) as e:
            problem = str(e)
        return problem if problem and not problem.startswith("Unimplemented") else None
    try:
        cls = jsonschema.validators.validator_for(schema,
                                                  default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(x) for x in e.absolute_path)
        return e.message + (f" (at {where})" if where else "")
    except (TypeError, KeyError, ValueError) as e:  # e.g. {"$schema": []}: not even readable
        return f"not a JSON Schema ({type(e).__name__}: {e})"
    return None


def check_tools(tools: list[dict[str, Any]]) -> None:
    """ToolError for a function name that is not ^[a-zA-Z0-9_-]{1,64}$ or is given twice, or
    parameters that are not a valid JSON Schema (whatever tool_choice says: OpenAI's rules)."""
    seen: set[str] = set()
    for i, t in enumerate(tools):
        f = t["function"]
        name = f["name"]
        if not NAME.fullmatch(name):
            raise ToolError(f"tools.{i}.function.name: {name!r} is not a valid function name "
                            "(1 to 64 of a-z, A-Z, 0-9, _ and -)", f"tools.{i}.function.name")
        if name in seen:
            raise ToolError(f"tools.{i}.function.name: the function {name!r} is given twice "
                            "(each tool needs its own name)", f"tools.{i}.function.name")
        seen.add(name)
        if f.get("parameters") is not None:
            problem = schema_problem(f["parameters"])
            if problem is not None:
                raise ToolError(f"tools.{i}.function.parameters is not a valid JSON Schema: "
                                f"{problem}", f"tools.{i}.function.parameters")


def tool_parameters(f: dict[str, Any]) -> dict[str, Any]:
    """A function's parameters schema, as OpenAI's strict mode constrains it where the tool
    says "strict": true (grammar.strict_schema)."""
    params = f.get("parameters") or {"type": "object"}
    if f.get("strict"):  # closed objects, every property required
        from colibri.serve.grammar import strict_schema

        params = strict_schema(params)
    return params


def call_schema(tools: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """JSON schema of one call {"name": ..., "arguments": {...}} of the tool named name, or of
    any of tools (tool_choice "required"); a tool with "strict": true has its parameters
    constrained as OpenAI's strict mode does (grammar.strict_schema)."""
    alts = []
    for t in tools:
        f = t["function"]
        if name is not None and f["name"] != name:
            continue
        params = tool_parameters(f)
        alts.append({"type": "object",
                     "properties": {"name": {"const": f["name"]}, "arguments": params},
                     "required": ["name", "arguments"], "additionalProperties": False})
    if not alts:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def string_params(tools: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per tool, the top-level arguments its schema types "string" (the XML form writes a
    string raw, so "123" is a string there only by the schema's word)."""
    out: dict[str, set[str]] = {}
    for t in tools:
        f = t["function"]
        props = (f.get("parameters") or {}).get("properties") or {}
        out[f["name"]] = {k for k, v in props.items()
                          if isinstance(v, dict) and v.get("type") == "string"}
    return out


__all__ = ["CLOSE", "OPEN", "PYTHON_TAG", "ToolCall", "ToolCallDelta", "ToolError",
           "ToolStreamParser", "apply_delta", "call_schema", "check_tools",
           "parse_tool_calls", "schema_problem", "string_params", "tool_parameters"]
