"""Tool calls between special tags, as DeepSeek and Kimi K2 write them (read by tool_parse,
a character at a time, with tool_formats' interface: feed, committed, done, end):

- DeepSeek V3.1 (deepseek-ai-DeepSeek-V3.1's template):
  `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
  <｜tool▁calls▁end｜>`.
- DeepSeek V3 / R1 (their published template): `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
  \\n```json\\n{...}\\n```<｜tool▁call▁end｜>`, calls separated by a newline.
- Kimi K2 (moonshotai-Kimi-K2's template): `<|tool_calls_section_begin|><|tool_call_begin|>
  functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>...
  <|tool_calls_section_end|>` (the `functions.` prefix and `:IDX` suffix are the call's id).

A reader starts after a section's or a call's opening tag and ends with the arguments' JSON
value; what may follow a call (``` , the call's and the section's closing tags, whitespace
before them) is the parser's `CLOSERS` to drop. The arguments stream as their JSON text as
written; arguments written as a JSON string (a template given them as text writes them so)
are decoded once complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from colibri.serve.tool_formats import NotACall, _Body

DS_SECTION, DS_SECTION_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
KIMI_SECTION, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL, KIMI_SEP, KIMI_CALL_END = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                      "<|tool_call_end|>")
OPENERS = {DS_SECTION: DS_CALL, DS_CALL: "", KIMI_SECTION: KIMI_CALL, KIMI_CALL: ""}
SEP = {DS_SECTION: DS_SEP, DS_CALL: DS_SEP, KIMI_SECTION: KIMI_SEP, KIMI_CALL: KIMI_SEP}
# what may follow a call's arguments, dropped (whitespace between them too)
CLOSERS = ("```", DS_CALL_END, DS_SECTION_END, KIMI_CALL_END, KIMI_SECTION_END)
_WS = " \t\r\n"
_KIMI_ID = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?")
_MAX_HEADER = 256
_DECODER = json.JSONDecoder(strict=False)


class TagCall(_Body):
    """One call after `tag` (a section's or a call's opening tag, a key of OPENERS)."""

    def __init__(self, tag: str, names: set[str], on_start: Callable[[str], None],
                 on_args: Callable[[str], None]) -> None:
        super().__init__(names, on_start, on_args)
        self.kimi = tag in (KIMI_SECTION, KIMI_CALL)
        self.call_tag, self.sep = OPENERS[tag], SEP[tag]
        self.st = "call_tag" if self.call_tag else "header"
        self.text = ""
        self.depth = 0
        self.in_str = self.esc = False
        self.as_string = False  # the arguments are a JSON string
        self.any_args = False

    def feed(self, ch: str) -> None:
        if self.done:
            raise NotACall
        getattr(self, "_" + self.st)(ch)

    def _call_tag(self, ch: str) -> None:
        if not self.text and ch in _WS:
            return
        self.text += ch
        if not self.call_tag.startswith(self.text):
            raise NotACall
        if self.text == self.call_tag:
            self.st, self.text = "header", ""

    def _header(self, ch: str) -> None:
        self.text += ch
        if len(self.text) > _MAX_HEADER + len(self.sep):
            raise NotACall
        if not self.text.endswith(self.sep):
            return
        header, self.text = self.text[: -len(self.sep)].strip(), ""
        if self.kimi:
            m = _KIMI_ID.fullmatch(header)
            self._named(m.group(1) if m else "")
        elif header == "function" and "function" not in self.names:
            self.st = "v3_name"  # DeepSeek V3: the name after the separator
        else:
            self._named(header)

    def _named(self, name: str) -> None:
        if not name:
            raise NotACall
        self._start(name)
        self.st = "args"

    def _v3_name(self, ch: str) -> None:
        if ch == "\n" or (ch == "`" and self.text.strip()):
            name, self.text = self.text.strip(), ""
            self._named(name)
            self.st = "fence"
            if ch == "`":
                self._fence(ch)
            return
        if len(self.text) > _MAX_HEADER or ch in "<{":
            raise NotACall
        self.text += ch

    def _fence(self, ch: str) -> None:
        """DeepSeek V3: the ```json line before the arguments."""
        if not self.text and ch in _WS:
            return
        if self.text == "```json" and ch in _WS:
            return
        if ch == "{" and self.text in ("```", "```json"):
            self.st, self.text = "args", ""
            self._args(ch)
            return
        self.text += ch
        if not "```json".startswith(self.text):
            raise NotACall

    def _args(self, ch: str) -> None:
        if self.depth == 0 and not self.in_str and not self.as_string:  # the value's start
            if ch in _WS:
                return
            if ch == '"':
                self.as_string, self.in_str, self.text = True, True, ""
                return
            if ch not in "{":
                raise NotACall
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
        elif ch == '"':
            self.in_str = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
        if self.as_string:
            if self.in_str:
                self.text += ch
                return
            try:
                text = _DECODER.decode('"' + self.text + '"')  # the string's text
            except ValueError:
                raise NotACall from None
            self._emit(text)
            self.done = True
            return
        self._emit(ch)
        if self.depth == 0:
            self.done = True

    def _emit(self, text: str) -> None:
        self.any_args = True
        self.on_args(text)

    def end(self) -> None:
        if self.committed and not self.any_args:
            self.on_args("{}")


__all__ = ["CLOSERS", "DS_CALL", "DS_CALL_END", "DS_SECTION", "DS_SECTION_END", "DS_SEP",
           "KIMI_CALL", "KIMI_CALL_END", "KIMI_SECTION", "KIMI_SECTION_END", "KIMI_SEP",
           "OPENERS", "TagCall"]
