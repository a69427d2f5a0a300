"""The model's tool-call text parsed as it streams: OpenAI `tool_calls` deltas, the name of a
call as soon as it is complete, then its arguments text as it arrives.

Forms understood:
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of
  them, with ordinary text around them (the text becomes the message content).
- Llama 3's JSON form: the output begins with a call object `{"name": ..., "parameters": {...}}`
  (or "arguments"), optionally after `<|python_tag|>`; or a JSON list of such objects; or
  several objects separated by `;` or `,`.
- Granite 3.x: the same JSON form after `<|tool_call|>` (its template asks for
  `<|tool_call|>` followed by a JSON list of calls).
- Hunyuan (A13B): a JSON list of call objects in `<tool_calls>[...]</tool_calls>`, with text
  around it.
- GLM-style XML, as Ling / Bailing writes calls: `<tool_call>NAME<arg_key>K</arg_key>
  <arg_value>V</arg_value>...</tool_call>` (a `<tool_call>` body that does not begin with `{`;
  see tool_formats).
- Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>` (see tool_formats).
- DeepSeek V3.1 / V3 / R1 and Kimi K2, calls between special tags (see tool_tags).
- Llama 4: `<|python_start|>text<|python_end|>` then JSON calls, the tags dropped (tool_llama4).
Every form is recognised in every output (the forms' tags do not collide): the parser needs no
knowledge of the model; tool_choice's grammar (tool_grammar.call_grammar) writes a form it reads.

A call's object is scanned a character at a time (`_CallObject`). It becomes a call when its
"name" string is complete (the `,` or `}` after it seen) and names one of the request's tools;
from then on it is streamed: a first delta with the call's index, id and name (arguments ""),
then the arguments text as the model writes it, the fragments concatenating to the call's
`arguments` string (a JSON object's text as written; a JSON string's decoded contents for a
model that writes the arguments as a string; "{}" when the call has none). Until that point
the text is held back; an object that turns out not to be a call of a known tool (another
name, no name, not JSON) is shown as the content it was. In the Hermes form only what could
still be the start of `</tool_call>` is held back inside a call; `</tool_call>` ends the call
wherever it appears.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from colibri.serve.tool_formats import Gemma4Call, NotACall, XmlCall
from colibri.serve.tool_llama4 import PY_TAGS
from colibri.serve.tool_tags import CLOSERS, OPENERS, TagCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
GRANITE_TAG = "<|tool_call|>"                     # Granite 3.x: a JSON list follows
HY_OPEN, HY_CLOSE = "<tool_calls>", "</tool_calls>"   # Hunyuan: a JSON list inside
G4_OPEN, G4_CLOSE = "<|tool_call>", "<tool_call|>"    # Gemma 4
PREFIX_TAGS = (PYTHON_TAG, GRANITE_TAG)            # tags before the JSON form
OPEN_TAGS = (OPEN, HY_OPEN, G4_OPEN, *OPENERS, *PY_TAGS)  # tags that open calls amid text
AFTER_CALL = (G4_CLOSE, *CLOSERS)                  # tags after a call's body, dropped
ARG_KEYS = ("arguments", "parameters")
_WS = " \t\r\n"


@dataclass
class ToolCall:
    """A call as accumulated from its deltas: arguments is the JSON text of the arguments."""

    name: str
    arguments: str = ""
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


@dataclass
class ToolCallDelta:
    """One streamed piece of call index: its first carries id and name (arguments ""), the
    later ones arguments text only."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def openai(self) -> dict[str, Any]:
        if self.id is not None:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": self.arguments}}
        return {"index": self.index, "function": {"arguments": self.arguments}}


Event = str | ToolCallDelta  # content text, or a piece of a call


def apply_delta(calls: list[ToolCall], d: ToolCallDelta) -> None:
    """Accumulate d into calls (the list of calls by index)."""
    if d.id is not None:
        assert d.index == len(calls), (d.index, len(calls))
        calls.append(ToolCall(d.name or "", d.arguments, d.id))
    else:
        calls[d.index].arguments += d.arguments


def merge_events(events: list[Event]) -> list[Event]:
    """Adjacent content joined, adjacent argument pieces of one call joined (empty ones
    dropped); order kept."""
    out: list[Event] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, str):
            if not e:
                continue
            if isinstance(last, str):
                out[-1] = last + e
                continue
        elif e.id is None:
            if not e.arguments:
                continue
            if isinstance(last, ToolCallDelta) and last.id is None and last.index == e.index:
                out[-1] = ToolCallDelta(last.index, last.arguments + e.arguments)
                continue
        out.append(e)
    return out


_Bad = NotACall  # the text is not (or no longer) a call object


def _escape_cut(raw: str) -> int:
    """Length of the longest prefix of a JSON string's raw contents not ending inside an
    escape (a surrogate pair's two escapes count as one)."""
    i, n = 0, len(raw)
    while i < n:
        if raw[i] != "\\":
            i += 1
            continue
        if i + 1 >= n:
            return i
        if raw[i + 1] != "u":
            i += 2
            continue
        if i + 6 > n:
            return i
        try:
            code = int(raw[i + 2:i + 6], 16)
        except ValueError:
            return n  # not JSON: the decoder says so
        if 0xD800 <= code < 0xDC00:
            if i + 8 > n or (raw[i + 6:i + 8] == "\\u" and i + 12 > n):
                return i
        i += 6
    return n


_DECODER = json.JSONDecoder(strict=False)  # control characters in strings let through


def _decode(raw: str) -> str:
    try:
        s = _DECODER.decode('"' + raw + '"')
    except ValueError:
        raise _Bad from None
    assert isinstance(s, str)
    return s


class _Value:
    """Where one raw JSON value ends (strings, nesting; scalars end at a delimiter)."""

    def __init__(self) -> None:
        self.kind = ""  # "": not begun; c: object or array; s: string; x: scalar
        self.depth = 0
        self.in_str = self.esc = self.done = False

    def feed(self, ch: str) -> bool:
        """Take ch; False when ch is not part of the value (a scalar's end)."""
        if not self.kind:
            if ch in "{[":
                self.kind, self.depth = "c", 1
            elif ch == '"':
                self.kind, self.in_str = "s", True
            elif ch in _WS + ",:}]":
                raise _Bad
            else:
                self.kind = "x"
            return True
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
                self.done = self.kind == "s"
            return True
        if self.kind == "x":
            if ch in _WS + ",}]":
                self.done = True
                return False
            return True
        if ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        return True


class _CallObject:
    """One JSON object that may be a call, scanned a character at a time. on_start(name) when
    it becomes a call, on_args(text) for each piece of its arguments after that."""

    def __init__(self, names: set[str], on_start: Callable[[str], None],
                 on_args: Callable[[str], None]) -> None:
        self.names = names
        self.on_start, self.on_args = on_start, on_args
        self.st = "open"
        self.key = ""
        self.raw = ""          # a string's raw contents so far (a key, the name, string args)
        self.esc = False
        self.val: _Value | None = None
        self.name_pending: str | None = None  # the name, before the , or } that completes it
        self.committed = False
        self.args_state = ""   # "": none seen; raw: a JSON value; str: a string; done
        self.args_held = ""    # arguments text seen before the name
        self.args_any = False  # some arguments text given to on_args

    @property
    def done(self) -> bool:
        return self.st == "done"

    def at_close(self) -> None:
        """</tool_call> came (the object's own end decides)."""

    def _args(self, text: str) -> None:
        if not text:
            return
        if self.committed:
            self.args_any = True
            self.on_args(text)
        else:
            self.args_held += text

    def _string(self, ch: str) -> bool:
        """Read ch of a string's contents into raw; True at its closing quote."""
        if self.esc:
            self.esc = False
        elif ch == "\\":
            self.esc = True
        elif ch == '"':
            return True
        self.raw += ch
        return False

    def _name_decided(self) -> None:
        if self.name_pending is None:
            return
        name, self.name_pending = self.name_pending, None
        if name not in self.names:
            raise _Bad
        self.committed = True
        self.on_start(name)
        held, self.args_held = self.args_held, ""
        self._args(held)

    def feed(self, ch: str) -> bool:
        """Take one character; False when it is not the object's (a scalar's end: feed it
        again). _Bad when the text is not a call object."""
        st = self.st
        if st in ("open", "key_or_end", "colon", "value", "after") and ch in _WS:
            return True
        if st == "open":
            if ch != "{":
                raise _Bad
            self.st = "key_or_end"
        elif st == "key_or_end":
            if ch == "}":
                self.st = "done"
            elif ch == '"':
                self.st, self.raw = "key", ""
            else:
                raise _Bad
        elif st == "key":
            if self._string(ch):
                self.key, self.st = _decode(self.raw), "colon"
        elif st == "colon":
            if ch != ":":
                raise _Bad
            self.st = "value"
        elif st == "value":
            self._value(ch)
        elif st == "name":
            if self._string(ch):
                self.name_pending, self.st = _decode(self.raw), "after"
        elif st == "args_str":
            if self._string(ch):
                self._args(_decode(self.raw))
                self.raw, self.args_state, self.st = "", "done", "after"
            elif not self.esc:
                cut = _escape_cut(self.raw)
                if cut:
                    self._args(_decode(self.raw[:cut]))
                    self.raw = self.raw[cut:]
        elif st in ("args_raw", "skip"):
            assert self.val is not None
            took = self.val.feed(ch)
            if took and st == "args_raw":
                self._args(ch)
            if self.val.done:
                self.st = "after"
                if st == "args_raw":
                    self.args_state = "done"
                if not took:
                    return self.feed(ch)
        elif st == "after":
            if ch not in ",}":
                raise _Bad
            self._name_decided()
            self.st = "key_or_end" if ch == "," else "done"
        return True

    def _value(self, ch: str) -> None:
        if self.key == "name" and not self.committed and self.name_pending is None:
            if ch != '"':
                raise _Bad
            self.st, self.raw = "name", ""
        elif self.key in ARG_KEYS and not self.args_state:
            if ch == '"':
                self.args_state, self.st, self.raw = "str", "args_str", ""
            else:
                self.args_state, self.st, self.val = "raw", "args_raw", _Value()
                self.val.feed(ch)
                self._args(ch)
        else:
            self.st, self.val = "skip", _Value()
            self.val.feed(ch)

    def end(self) -> None:
        """The call's text ended: what arguments text is left, "{}" when there was none."""
        if not self.committed:
            return
        if self.st == "args_str" and self.raw:
            cut = _escape_cut(self.raw)
            try:
                self._args(_decode(self.raw[:cut]))
            except _Bad:
                pass
            self.raw = ""
        if not self.args_any:
            self._args("{}")


class ToolStreamParser:
    """feed(text) and finish() return events: content text (str, safe to show) and
    ToolCallDelta pieces of calls (see the module doc). `calls` accumulates the calls."""

    def __init__(self, names: set[str], string_args: dict[str, set[str]] | None = None) -> None:
        """names: the request's tools; string_args: per tool, the arguments its schema types
        "string" (the XML form writes strings raw: "123" stays a string there)."""
        self.names = names
        self.string_args = string_args
        self.wrap = ""  # the tag that closes the JSON form's list (</tool_calls>)
        self.buf = ""
        self.state = "start"
        self.calls: list[ToolCall] = []
        self.obj: _CallObject | Gemma4Call | XmlCall | TagCall | None = None
        self.held = ""        # text of a call not yet decided: content if it is not one
        self.in_list = False  # the JSON form is a [...] list
        self.json_calls = 0   # calls of the JSON form
        self.tag_seen = False
        self.out: list[Event] = []

    # ---- events ----

    def _on_start(self, name: str) -> None:
        d = ToolCallDelta(len(self.calls), "", "call_" + uuid.uuid4().hex[:24], name)
        apply_delta(self.calls, d)
        self.out.append(d)
        self.held = ""

    def _on_args(self, text: str) -> None:
        d = ToolCallDelta(len(self.calls) - 1, text)
        apply_delta(self.calls, d)
        self.out.append(d)

    def _content(self, text: str) -> None:
        if text:
            self.out.append(text)

    def _new_obj(self) -> _CallObject:
        self.obj = _CallObject(self.names, self._on_start, self._on_args)
        return self.obj

    def _feed_obj(self, text: str) -> str:
        """Feed text to the call object until it is done or fails; the text it left
        (from the failing character on, or after the object's end)."""
        obj = self.obj
        assert obj is not None
        for i, ch in enumerate(text):
            try:
                obj.feed(ch)
            except _Bad:
                if obj.committed:
                    obj.end()
                return text[i:]
            if not obj.committed:
                self.held += ch
            if obj.done:
                obj.end()
                return text[i + 1:]
        return ""

    # ---- states ----

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        while self.buf and getattr(self, "_s_" + self.state)():
            pass
        out, self.out = merge_events(self.out), []
        return out

    def _s_start(self) -> bool:
        s = self.buf.lstrip()
        if not s:
            return False
        if s.startswith(PREFIX_TAGS) or s[0] in "{[":
            self.state = "json_pre"
        elif any(t.startswith(s) for t in PREFIX_TAGS):
            return False
        else:
            self.state = "text"
        return True

    def _s_json_pre(self) -> bool:
        k = len(self.buf) - len(self.buf.lstrip())
        self.held += self.buf[:k]
        self.buf = self.buf[k:]
        tag = next((t for t in PREFIX_TAGS if self.buf.startswith(t)), None)
        if not self.tag_seen and not self.wrap and tag:
            self.tag_seen = True
            self.held += tag
            self.buf = self.buf[len(tag):]
            return True
        if not self.buf:
            return False
        if self.buf[0] == "[":
            self.in_list = True
            self.held += "["
            self.buf = self.buf[1:]
            self.state = "json_item"
        elif self.buf[0] == "{":
            self._new_obj()
            self.state = "json_obj"
        else:
            self._fail()
        return True

    def _s_json_item(self) -> bool:
        k = len(self.buf) - len(self.buf.lstrip())
        self.held += self.buf[:k]
        self.buf = self.buf[k:]
        if not self.buf:
            return False
        if self.buf[0] == "{":
            self._new_obj()
            self.state = "json_obj"
        elif self.buf[0] == "]" and self.in_list and self.json_calls:
            self.buf, self.held, self.state = self.buf[1:], "", "after"
        else:
            self._fail()
        return True

    def _s_json_obj(self) -> bool:
        assert self.obj is not None
        rest = self._feed_obj(self.buf)
        self.buf = rest
        if self.obj.committed:
            if self.obj.done or rest:  # ended (or broke off after its name: the rest is text)
                self.json_calls += 1
                self.held = ""
                self.state = "json_sep" if self.obj.done else "after"
                self.obj = None
            return bool(rest)
        if self.obj.done or rest:  # not a call
            self._fail()
            return True
        return False

    def _s_json_sep(self) -> bool:
        k = len(self.buf) - len(self.buf.lstrip())
        self.held += self.buf[:k]
        self.buf = self.buf[k:]
        if not self.buf:
            return False
        c = self.buf[0]
        if c in ",;":
            self.held += c
            self.buf = self.buf[1:]
            self.state = "json_item"
        elif c == "]" and self.in_list:
            self.buf, self.held, self.state = self.buf[1:], "", "after"
        elif c == "{" and not self.in_list:
            self.state = "json_item"
        else:
            self.state = "after"
        return True

    def _s_after(self) -> bool:
        """After the JSON form: whitespace held (dropped at the end), other text content;
        the list's closing tag (</tool_calls>) dropped."""
        k = len(self.buf) - len(self.buf.lstrip())
        self.held += self.buf[:k]
        self.buf = self.buf[k:]
        if not self.buf:
            return False
        if self.wrap:
            if self.buf.startswith(self.wrap):
                self.buf, self.held, self.wrap, self.state = \
                    self.buf[len(self.wrap):], "", "", "text"
                return True
            if self.wrap.startswith(self.buf):
                return False
        self._content(self.held)
        self.held, self.state = "", "text"
        return True

    def _fail(self) -> None:
        """The held text is not a call: shown as content (the rest of a <tool_call> too)."""
        hermes = self.state == "call"
        self._content(self.held)
        self.held, self.obj, self.wrap = "", None, ""
        self.state = "bad_call" if hermes else "text"

    def _s_text(self) -> bool:
        found = [(i, t) for t in OPEN_TAGS if (i := self.buf.find(t)) >= 0]
        if found:
            i, tag = min(found)
            self._content(self.buf[:i])
            self.buf = self.buf[i + len(tag):]
            self.held = tag
            if tag == OPEN:
                self.state = "call_sniff"
            elif tag == G4_OPEN:
                self.obj = Gemma4Call(self.names, self._on_start, self._on_args)
                self.state = "body"
            elif tag in OPENERS:
                self.obj = TagCall(tag, self.names, self._on_start, self._on_args)
                self.state = "body"
            elif tag in PY_TAGS:  # Llama 4 (tool_llama4): dropped, a JSON call may follow
                self.held, self.state, self.in_list, self.json_calls = "", "start", False, 0
            else:  # Hunyuan's list of JSON calls
                self.wrap, self.in_list, self.json_calls = HY_CLOSE, False, 0
                self.state = "json_pre"
            return True
        hold = max(_partial(self.buf, t) for t in OPEN_TAGS)
        self._content(self.buf[: len(self.buf) - hold])
        self.buf = self.buf[len(self.buf) - hold:]
        return False

    def _s_call_sniff(self) -> bool:
        """After <tool_call>: a JSON object (Hermes) or a name (the XML form)."""
        s = self.buf.lstrip()
        if not s:
            return False
        if s[0] == "{":
            self._new_obj()
        else:
            self.obj = XmlCall(self.names, self._on_start, self._on_args, self.string_args)
        self.state = "call"
        return True

    def _s_body(self) -> bool:
        """After Gemma 4's <|tool_call> or a tag of tool_tags: the body to its reader, to the
        arguments' end."""
        obj = self.obj
        assert obj is not None
        rest = self.buf = self._feed_obj(self.buf)
        if obj.committed:
            if obj.done or rest:  # ended (or broke off: the rest is text)
                self.obj, self.held = None, ""
                self.state = "close" if obj.done else "text"
            return bool(rest)
        if obj.done or rest:
            self._fail()
            return True
        return False

    def _s_close(self) -> bool:
        """After a call's body: the tags that close it dropped, with the whitespace before
        them and before another call's tag; other text is content."""
        s = self.buf.lstrip()
        if not s:
            return False
        tag = next((t for t in AFTER_CALL if s.startswith(t)), None)
        if tag:
            self.buf = s[len(tag):]
            return True
        if any(t.startswith(s) for t in AFTER_CALL + OPEN_TAGS):
            return False
        if s.startswith(OPEN_TAGS):
            self.buf = s
        self.state = "text"
        return True

    def _s_call(self) -> bool:
        """Inside <tool_call>: the body to the call object, what may be </tool_call> held."""
        obj = self.obj
        assert obj is not None
        j = self.buf.find(CLOSE)
        body = self.buf[:j] if j >= 0 else self.buf[: len(self.buf) - _partial(self.buf, CLOSE)]
        self.buf = self.buf[len(body):]
        rest = self._feed_obj(body)
        if not obj.committed and (obj.done or rest):  # not a call
            self.held += rest
            self._fail()  # state bad_call: the rest of the body is content
            return True
        if obj.done or rest:
            self.state = "skip"  # the call ended (or broke off): the rest of its body unshown
            return True
        if j >= 0:  # </tool_call> before the object's end
            try:
                obj.at_close()
            except _Bad:
                pass
            if obj.committed:
                obj.end()
                self.obj, self.held = None, ""
            else:
                self.held += CLOSE
                self._fail()
            self.buf = self.buf[len(CLOSE):]
            self.state = "text"
            return True
        return False

    def _s_skip(self) -> bool:
        return self._until_close(show=False)

    def _s_bad_call(self) -> bool:
        return self._until_close(show=True)

    def _until_close(self, show: bool) -> bool:
        j = self.buf.find(CLOSE)
        if j >= 0:
            if show:
                self._content(self.buf[: j + len(CLOSE)])
            self.buf = self.buf[j + len(CLOSE):]
            self.obj, self.held, self.state = None, "", "text"
            return True
        n = len(self.buf) - _partial(self.buf, CLOSE)
        if show:
            self._content(self.buf[:n])
        self.buf = self.buf[n:]
        return False

    def finish(self) -> list[Event]:
        """The output ended: what was held back, decided."""
        buf, self.buf = self.buf, ""
        st = self.state
        if st in ("json_obj", "call", "body") and self.obj is not None and self.obj.committed:
            if st == "call":
                self._feed_obj(buf)  # not </tool_call> after all
            self.obj.end()
        elif st == "json_pre" or (st in ("json_item", "json_obj") and not self.json_calls):
            self._content(self.held + buf)
        elif st in ("call", "call_sniff", "body"):
            self._content(self.held + buf)
        elif st in ("start", "text", "bad_call"):
            self._content(buf)
        # json_sep, after, skip, close, json_item after a call: trailing separators dropped
        self.held, self.obj, self.state = "", None, "done"
        out, self.out = merge_events(self.out), []
        return out

    def _s_done(self) -> bool:
        raise ValueError("ToolStreamParser: feed() after finish()")


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of text that is a proper beginning of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def parse_tool_calls(text: str, names: set[str], string_args: dict[str, set[str]] | None = None,
                     ) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole output: content is the text outside the calls (None when
    there is none), calls [] when the output holds no call of a known tool."""
    p = ToolStreamParser(names, string_args)
    events = p.feed(text) + p.finish()
    content = "".join(e for e in events if isinstance(e, str))
    return (content if content or not p.calls else None), p.calls


__all__ = ["G4_CLOSE", "G4_OPEN", "GRANITE_TAG", "HY_CLOSE", "HY_OPEN", "ToolCall", "ToolCallDelta", "ToolStreamParser", "apply_delta", "merge_events",
           "parse_tool_calls"]
