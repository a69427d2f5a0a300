"""gpt-oss's harmony format read as the text streams: the analysis channel is the reasoning,
the final channel (and a commentary preamble) the answer, a message to `functions.NAME` a tool
call (reasoning.py's interface; _Choice takes the ToolCallDelta pieces as they come).

The model writes messages after the prompt's `<|start|>assistant`, each a header, then
`<|message|>` and the body up to `<|end|>` (`<|call|>` after a call, `<|return|>` after the
final answer: both end the generation, as llama.cpp's vocabulary makes them, so the text
usually just stops there):

    <|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final<|message|>answer
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}

- a header is an optional `<|start|>ROLE`, an optional recipient ` to=R` (before or after the
  channel), `<|channel|>NAME` and an optional content type (` <|constrain|>json`, ` json`);
  of two channels the last counts (gpt-oss-20b may write a stray `<|channel|>commentary`
  before `<|channel|>analysis`, as llama.cpp's parser allows);
- a body to `functions.NAME`, NAME one of the request's tools, is that call's arguments as
  written (its JSON text, streamed; "{}" when empty); a message to another recipient (a
  built-in tool, a function not offered, any call when tools are not read) is dropped, as
  llama.cpp's parser consumes unsolicited calls;
- the analysis channel's bodies are the reasoning; every other body (final, a commentary
  preamble, no channel) the answer; bodies are kept as written (no stripping);
- output that does not begin as a header (a model that ignores the format) is the answer as
  is; a header cut off by the end of the output is dropped;
- a tag split across token pieces is recognised: only what could still be a tag's start is
  held back.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, ClassVar

from colibri.serve.reasoning import Reasoning, ReasoningSplitter
from colibri.serve.tool_parse import ToolCall, ToolCallDelta, apply_delta

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
TAGS = (START, CHANNEL, MESSAGE, CONSTRAIN, END)  # the tags the text carries (tool_grammar)
_BODY_ENDS = (END, CALL, RETURN, START)
_HEADER_STARTS = (START, CHANNEL, "to=")
_MAX_HEADER = 512
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([\w-]+)")
FUNCTIONS = "functions."

Out = str | Reasoning | ToolCallDelta  # answer text, thinking, a piece of a call


def _partial(s: str, tags: tuple[str, ...]) -> int:
    """The length of the longest end of s that is a proper beginning of one of tags."""
    best = 0
    for tag in tags:
        for k in range(min(len(s), len(tag) - 1), best, -1):
            if s.endswith(tag[:k]):
                best = k
                break
    return best


def _merge(out: list[Out]) -> list[Out]:
    merged: list[Out] = []
    for p in out:
        last = merged[-1] if merged else None
        if isinstance(p, str) and isinstance(last, str):
            merged[-1] = last + p
        elif isinstance(p, Reasoning) and isinstance(last, Reasoning):
            merged[-1] = Reasoning(last.text + p.text)
        elif (isinstance(p, ToolCallDelta) and p.id is None and isinstance(last, ToolCallDelta)
              and last.id is None and last.index == p.index):
            merged[-1] = ToolCallDelta(p.index, last.arguments + p.arguments)
        elif p != "" and p != Reasoning("") and not (isinstance(p, ToolCallDelta)
                                                     and p.id is None and not p.arguments):
            merged.append(p)
    return merged


class Harmony(ReasoningSplitter):
    """The harmony format (see the module's text)."""

    reads_calls: ClassVar[bool] = True

    @classmethod
    def applies(cls, template: str) -> bool:
        return all(t in template for t in (START, CHANNEL, MESSAGE))

    def __init__(self, prompt: str, tools: set[str] | None = None) -> None:
        self.tools = set(tools or ())  # the functions whose calls are read
        self.state = "header"  # header, body or raw (not harmony: all answer)
        self.kind = ""         # the body's: reasoning, answer, call or drop
        self.held = ""
        self.n_calls = 0
        self.call_args = False  # the open call has had arguments text

    @property
    def in_reasoning(self) -> bool:
        return self.state == "body" and self.kind == "reasoning"

    def _open(self, header: str) -> list[Out]:
        """The message whose header (without <|message|>) is header begins."""
        to = next((r for r in reversed(_RECIPIENT.findall(header)) if r != "assistant"), "")
        ch = _CHANNEL.findall(header)  # the last: gpt-oss-20b may write a stray one first
        self.state = "body"
        if to:
            name = to[len(FUNCTIONS):] if to.startswith(FUNCTIONS) else ""
            if name not in self.tools:
                self.kind = "drop"
                return []
            self.kind, self.call_args = "call", False
            self.n_calls += 1
            return [ToolCallDelta(self.n_calls - 1, "", "call_" + uuid.uuid4().hex[:24], name)]
        self.kind = "reasoning" if ch and ch[-1] == "analysis" else "answer"
        return []

    def _body(self, text: str) -> list[Out]:
        if not text or self.kind == "drop":
            return []
        if self.kind == "call":
            self.call_args = True
            return [ToolCallDelta(self.n_calls - 1, text)]
        return [Reasoning(text) if self.kind == "reasoning" else text]

    def _close(self) -> list[Out]:
        out: list[Out] = []
        if self.kind == "call" and not self.call_args:
            out.append(ToolCallDelta(self.n_calls - 1, "{}"))
        self.state, self.kind = "header", ""
        return out

    def feed(self, text: str) -> list[Out]:  # type: ignore[override]
        out: list[Out] = []
        s, self.held = self.held + text, ""
        while s:
            if self.state == "raw":
                out.append(s)
                break
            if self.state == "header":
                at = s.find(MESSAGE)
                head = s if at < 0 else s[:at]
                lead = head.lstrip()
                if lead and not any(t.startswith(lead[:len(t)]) for t in _HEADER_STARTS) \
                        or len(head) > _MAX_HEADER:
                    self.state = "raw"  # not a header: the answer, as written
                    continue
                if at < 0:
                    self.held = s
                    break
                out += self._open(head)
                s = s[at + len(MESSAGE):]
                continue
            found = [(i, t) for t in _BODY_ENDS if (i := s.find(t)) >= 0]
            if found:
                i, tag = min(found)
                out += self._body(s[:i])
                out += self._close()
                s = s[i:] if tag == START else s[i + len(tag):]
                continue
            keep = len(s) - _partial(s, _BODY_ENDS)
            out += self._body(s[:keep])
            self.held = s[keep:]
            break
        return _merge(out)

    def finish(self) -> list[Out]:  # type: ignore[override]
        s, self.held = self.held, ""
        out: list[Out] = []
        if self.state == "body":
            out += self._body(s) + self._close()
        elif self.state == "raw":
            out.append(s)
        return _merge(out)  # a header cut off is dropped


def described(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tools as the gpt-oss template takes them: it joins each function's description to its
    text (a tool without one would fail the render), so a missing description is ""."""
    return [{**t, "function": {"description": "", **t["function"]}} if isinstance(
        t.get("function"), dict) else t for t in tools]


def with_thinking(msgs: list[dict[str, Any]], given: list[Any]) -> list[dict[str, Any]]:
    """The template's messages (msgs, one per request message in given) with each assistant
    turn's reasoning_content as gpt-oss's template takes it, `thinking` (as llama.cpp's server
    copies it; with calls the content goes, the template refusing both)."""
    out = []
    for d, m in zip(msgs, given, strict=True):
        thought = getattr(m, "reasoning_content", None)
        if d.get("role") == "assistant" and isinstance(thought, str) and thought:
            d = {**d, "thinking": thought}
            if d.get("tool_calls"):
                d["content"] = ""
        out.append(d)
    return out


def parse_harmony(text: str, tools: set[str]) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, answer, calls) of a whole output."""
    h = Harmony("", tools)
    reasoning, answer, calls = "", "", []  # type: ignore[var-annotated]
    for p in h.feed(text) + h.finish():
        if isinstance(p, Reasoning):
            reasoning += p.text
        elif isinstance(p, str):
            answer += p
        else:
            apply_delta(calls, p)
    return reasoning, answer, calls


__all__ = ["CALL", "CHANNEL", "CONSTRAIN", "END", "MESSAGE", "RETURN", "START", "TAGS",
           "Harmony", "described", "parse_harmony", "with_thinking"]
