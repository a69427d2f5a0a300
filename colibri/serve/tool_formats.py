"""The call bodies of the families whose tool calls are not a JSON object (tool_parse reads
the JSON ones): scanned a character at a time, as tool_parse's `_CallObject` is, with the same
interface (feed, committed, done, end), the arguments streamed as JSON text.

- Gemma 4: `<|tool_call>call:NAME{key:value,...}<tool_call|>` (google-gemma-4-31B-it's
  template), values in Gemma's own syntax: strings between `<|"|>` marks (written raw, no
  escapes), numbers, true/false, None, nested {...} (keys bare or quoted) and [...]. The body
  after `<|tool_call>` is read here, up to the `}` that closes the arguments; the arguments
  stream as the equivalent JSON, piece by piece.
- GLM-style XML, as Ling / Bailing's template (and GLM 4.5's) writes calls:
  `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>`. A value
  is written raw when it is a string, as JSON otherwise: it is taken as a JSON string when the
  tool's schema types that argument "string", else as JSON when it parses, else as a string.
  The arguments stream one argument at a time (each once its `</arg_value>` is seen).
"""

from __future__ import annotations

import json
from collections.abc import Callable

QUOTE = '<|"|>'  # Gemma 4's string mark
_WS = " \t\r\n"


class NotACall(Exception):
    """The text is not (or no longer) a call of a known tool."""


class _Body:
    def __init__(self, names: set[str], on_start: Callable[[str], None],
                 on_args: Callable[[str], None]) -> None:
        self.names = names
        self.on_start, self.on_args = on_start, on_args
        self.committed = False
        self.done = False

    def _start(self, name: str) -> None:
        if name not in self.names:
            raise NotACall
        self.committed = True
        self.on_start(name)

    def at_close(self) -> None:
        """The call's closing tag came (the XML form's end)."""


class Gemma4Call(_Body):
    """The body of a Gemma 4 call after `<|tool_call>`: `call:NAME{...}`."""

    def __init__(self, names: set[str], on_start: Callable[[str], None],
                 on_args: Callable[[str], None]) -> None:
        super().__init__(names, on_start, on_args)
        self.st = "prefix"
        self.text = ""          # the prefix or name so far; a bare key or scalar so far
        self.stack: list[str] = []
        self.expect = ""        # key, colon, value, sep
        self.pending = ""       # what may be the start of <|"|>
        self.in_str = ""        # "": no string; k: a quoted key; v: a string value

    def feed(self, ch: str) -> None:
        if self.done:
            raise NotACall
        if self.st == "prefix":
            self.text += ch
            if not "call:".startswith(self.text):
                raise NotACall
            if self.text == "call:":
                self.st, self.text = "name", ""
            return
        if self.st == "name":
            if ch != "{":
                if ch in _WS + "}<>[]:,\"":
                    raise NotACall
                self.text += ch
                return
            if not self.text:
                raise NotACall
            self._start(self.text)
            self.st, self.text = "args", ""
        self._arg(ch)

    def _emit(self, text: str) -> None:
        self.on_args(text)

    def _arg(self, ch: str) -> None:
        if self.in_str:
            self.pending += ch
            if QUOTE.startswith(self.pending):
                if self.pending == QUOTE:
                    self.pending = ""
                    self._string_end()
                return
            s, self.pending = self.pending, ""
            first, rest = s[0], s[1:]
            self._str_chars(first)
            for c in rest:  # what followed a "<" that was not the mark
                self._arg(c)
            return
        if self.pending:  # a "<" where a key or value begins: <|"|>, or not a call
            self.pending += ch
            if not QUOTE.startswith(self.pending):
                raise NotACall
            if self.pending == QUOTE:
                self.pending = ""
                self.in_str = "k" if self.expect == "key" else "v"
                if self.in_str == "v":
                    self._emit('"')
            return
        if self.text:  # a bare key or scalar
            if ch in ",}]" or (ch == ":" and self.expect == "key"):
                self._bare_end()
            else:
                if ch not in _WS:
                    self.text += ch
                return
        if ch in _WS:
            return
        self._structural(ch)

    def _structural(self, ch: str) -> None:
        exp = self.expect
        if ch == "<" and exp in ("key", "value", ""):
            self.pending = "<"
            return
        if ch in "{[" and exp in ("value", ""):
            self.stack.append(ch)
            self.expect = "key" if ch == "{" else "value"
            self._emit(ch)
            return
        if ch in "}]" and self.stack and exp in ("key", "value", "sep"):
            if (ch == "}") != (self.stack[-1] == "{"):
                raise NotACall
            self.stack.pop()
            self._emit(ch)
            self.expect = "sep"
            if not self.stack:
                self.done = True
            return
        if ch == "," and exp == "sep" and self.stack:
            self._emit(",")
            self.expect = "key" if self.stack[-1] == "{" else "value"
            return
        if ch == ":" and exp == "colon":
            self._emit(":")
            self.expect = "value"
            return
        if exp in ("key", "value") and ch not in ":,":
            self.text = ch  # a bare key or scalar
            return
        raise NotACall

    def _bare_end(self) -> None:
        tok, self.text = self.text, ""
        if self.expect == "key":
            self._emit(json.dumps(tok, ensure_ascii=False))
            self.expect = "colon"
            return
        if tok in ("true", "false"):
            self._emit(tok)
        elif tok in ("None", "null"):
            self._emit("null")
        else:
            try:
                float(tok)
                json.loads(tok)
                self._emit(tok)
            except ValueError:
                self._emit(json.dumps(tok, ensure_ascii=False))
        self.expect = "sep"

    def _str_chars(self, s: str) -> None:
        if self.in_str == "k":
            self.text += s
        else:
            self._emit(json.dumps(s, ensure_ascii=False)[1:-1])

    def _string_end(self) -> None:
        if self.in_str == "k":
            self._emit(json.dumps(self.text, ensure_ascii=False))
            self.text, self.expect = "", "colon"
        else:
            self._emit('"')
            self.expect = "sep"
        self.in_str = ""

    def end(self) -> None:
        """The output ended inside the call: what was held goes out as written."""
        if self.committed and not self.done and self.in_str == "v" and self.pending:
            self._emit(json.dumps(self.pending, ensure_ascii=False)[1:-1])
        self.pending = ""


_KEY, _KEY_END = "<arg_key>", "</arg_key>"
_VAL, _VAL_END = "<arg_value>", "</arg_value>"


class XmlCall(_Body):
    """The body of a GLM-style `<tool_call>` (the parser finds `</tool_call>`)."""

    def __init__(self, names: set[str], on_start: Callable[[str], None],
                 on_args: Callable[[str], None],
                 string_args: dict[str, set[str]] | None = None) -> None:
        super().__init__(names, on_start, on_args)
        self.string_args = string_args or {}
        self.st = "name"
        self.name = ""
        self.text = ""
        self.key = ""
        self.n_args = 0

    def _decide(self) -> None:
        name = self.name.strip()
        if not name:
            raise NotACall
        self._start(name)
        self.st = "tag"

    def feed(self, ch: str) -> None:
        if self.st == "name":
            if ch in "<\n" and self.name.strip():
                self._decide()
            elif ch in "<{":
                raise NotACall
            else:
                self.name += ch
                return
        if self.st == "tag":  # <arg_key> or <arg_value>, after whitespace
            if not self.text and ch in _WS:
                return
            self.text += ch
            want = _VAL if self.key else _KEY
            if not want.startswith(self.text):
                raise NotACall
            if self.text == want:
                self.st, self.text = ("value" if self.key else "key"), ""
            return
        self.text += ch
        end = _KEY_END if self.st == "key" else _VAL_END
        if not self.text.endswith(end):
            return
        body, self.text = self.text[:-len(end)], ""
        if self.st == "key":
            self.key, self.st = body.strip(), "tag"
            return
        self.on_args(("{" if not self.n_args else ", ")
                     + json.dumps(self.key, ensure_ascii=False) + ": "
                     + self._value(body))
        self.n_args += 1
        self.key, self.st = "", "tag"

    def _value(self, raw: str) -> str:
        if self.key in self.string_args.get(self.name.strip(), set()):
            return json.dumps(raw, ensure_ascii=False)
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except ValueError:
            return json.dumps(raw, ensure_ascii=False)

    def at_close(self) -> None:
        if self.st == "name":
            self._decide()

    def end(self) -> None:
        if self.committed:
            self.on_args("}" if self.n_args else "{}")


__all__ = ["QUOTE", "Gemma4Call", "NotACall", "XmlCall"]
