"""Tool calls: the model's tool-call text parsed into OpenAI `tool_calls`, whole or as it
streams, and the grammar that constrains output to a call of the given tools.

Forms understood:
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of
  them, with ordinary text around them (the text becomes the message content).
- Llama 3's JSON form: the whole output one JSON object `{"name": ..., "parameters": {...}}`
  (or "arguments"), optionally after `<|python_tag|>`, or a JSON list of such objects.

A JSON-looking output that does not name one of the request's tools stays plain content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = "call_" + uuid.uuid4().hex[:24]

    def openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name,
                                          "arguments": json.dumps(self.arguments,
                                                                  ensure_ascii=False)}}
        if index is not None:
            d["index"] = index
        return d


def _call_from(obj: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], args)


def _json_calls(text: str, names: set[str]) -> list[ToolCall] | None:
    """Llama 3's form: the text is one call object or a list of them."""
    s = text.strip()
    if s.startswith(PYTHON_TAG):
        s = s[len(PYTHON_TAG):].strip()
    if not s or s[0] not in "{[":
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    objs = obj if isinstance(obj, list) else [obj]
    calls = [_call_from(o, names) for o in objs]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output: content is the text outside the calls (None when
    there is none), calls [] when the output holds no well-formed call of a known tool."""
    p = ToolStreamParser(names)
    events = p.feed(text) + p.finish()
    content = "".join(e for e in events if isinstance(e, str))
    calls = [e for e in events if isinstance(e, ToolCall)]
    return (content if content or not calls else None), calls


class ToolStreamParser:
    """Incremental form of parse_tool_calls: feed(text) and finish() return events, each either
    content text (a str, safe to show) or a ToolCall once a call is complete. Text that may
    still turn out to be a call is held back."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.buf = ""
        self.state = "start"   # start: nothing shown yet; text; call: inside <tool_call>
        self.json_form = False  # the output began as JSON: held to the end (Llama 3's form)

    def feed(self, text: str) -> list[str | ToolCall]:
        self.buf += text
        out: list[str | ToolCall] = []
        while True:
            if self.state == "start":
                s = self.buf.lstrip()
                if not s:
                    return out
                if s[0] in "{[" or s.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(s):
                    if s[0] in "{[" or s.startswith(PYTHON_TAG):
                        self.json_form = True
                    return out  # hold: decided at finish()
                self.state = "text"
            if self.state == "text":
                i = self.buf.find(OPEN)
                if i >= 0:
                    if i:
                        out.append(self.buf[:i])
                    self.buf = self.buf[i + len(OPEN):]
                    self.state = "call"
                    continue
                hold = 0
                for k in range(min(len(OPEN) - 1, len(self.buf)), 0, -1):
                    if self.buf.endswith(OPEN[:k]):
                        hold = k
                        break
                if len(self.buf) > hold:
                    out.append(self.buf[: len(self.buf) - hold])
                    self.buf = self.buf[len(self.buf) - hold:]
                return out
            if self.state == "call":
                j = self.buf.find(CLOSE)
                if j < 0:
                    return out
                body, self.buf = self.buf[:j], self.buf[j + len(CLOSE):]
                out.extend(self._call(body))
                self.state = "text"
                continue
            return out

    def _call(self, body: str) -> list[str | ToolCall]:
        try:
            call = _call_from(json.loads(body), self.names)
        except ValueError:
            call = None
        # not a call of a known tool: shown as the text it was
        return [call] if call is not None else [OPEN + body + CLOSE]

    def finish(self) -> list[str | ToolCall]:
        buf, self.buf = self.buf, ""
        if self.state == "start":
            if self.json_form:
                calls = _json_calls(buf, self.names)
                if calls is not None:
                    return list(calls)
            return [buf] if buf else []
        if self.state == "call":  # the output ended before </tool_call>
            try:
                call = _call_from(json.loads(buf), self.names)
            except ValueError:
                call = None
            return [call] if call is not None else [OPEN + buf]
        return [buf] if buf else []


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


__all__ = ["ToolCall", "ToolStreamParser", "call_grammar", "call_schema", "parse_tool_calls"]
