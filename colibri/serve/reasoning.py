"""A reasoning model's thinking split from its answer as the text streams, for every chat-like
API (chat completions' reasoning_content, the Responses API's reasoning item, the Messages API's
thinking block): _Choice (streaming.py) feeds each delta's text through the choice's splitter
and gets back Reasoning pieces and answer text (str), in the order the model wrote them.

A format is a small class with `applies(template)` (whether a chat template speaks it) and a
constructor taking the rendered prompt; FORMATS lists them, the first that applies is used.
Implemented: harmony.Harmony (gpt-oss's channels, tried first; see harmony.py) and ThinkTags,
`<think>...</think>` (Qwen3, QwQ, DeepSeek-R1 and its distills):

- the thinking is the text between `<think>` and `</think>`; text before `<think>` is answer
  text (one reasoning block at most: after `</think>` the rest is the answer, a `<think>` in
  it included);
- a prompt that ends inside an open `<think>` (templates that open it in the generation
  prompt: DeepSeek-R1's, Qwen3's thinking variants) starts the output inside the reasoning;
- a model that never writes `</think>` (cut by max_tokens, or done thinking without closing)
  gave only reasoning: the answer is empty;
- a tag split across token pieces is recognised: only what could still be the start of the
  tag being looked for is held back (and trailing blank space, released with the next text);
- blank space around the tags is not part of either text: the reasoning is stripped, the
  answer's leading blank space after `</think>` (and at the start of the output) dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass
class Reasoning:
    """A piece of the model's thinking (an event beside answer text and tool-call pieces)."""

    text: str


Piece = str | Reasoning  # answer text, or thinking


class ReasoningSplitter(ABC):
    """A reasoning format (an interface: ThinkTags is one, harmony.Harmony another): one
    instance per completion, fed its text as it comes."""

    # the format carries the tool calls too (its pieces include tool_parse.ToolCallDelta):
    # the answer text then needs no tool-call parser
    reads_calls: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def applies(cls, template: str) -> bool:
        """Whether a chat template speaks this format."""

    @abstractmethod
    def __init__(self, prompt: str) -> None:
        """A splitter for a completion of prompt (the rendered chat)."""

    @property
    @abstractmethod
    def in_reasoning(self) -> bool:
        """Whether the text now being written is thinking."""

    @abstractmethod
    def feed(self, text: str) -> list[Piece]:
        """The pieces text releases, in order (some may be held back until more comes)."""

    @abstractmethod
    def finish(self) -> list[Piece]:
        """What is still held back, at the end of the output."""


def _partial(s: str, tag: str) -> int:
    """The length of the longest end of s that is a proper beginning of tag."""
    for k in range(min(len(s), len(tag) - 1), 0, -1):
        if s.endswith(tag[:k]):
            return k
    return 0


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if out and type(out[-1]) is type(p):
            last = out[-1]
            out[-1] = (Reasoning(last.text + p.text) if isinstance(last, Reasoning)
                       and isinstance(p, Reasoning) else str(last) + str(p))
        else:
            out.append(p)
    return out


_BEFORE, _THINKING, _ANSWER = "before", "thinking", "answer"


class ThinkTags(ReasoningSplitter):
    """`<think>reasoning</think>answer` (see the module's text)."""

    OPEN: ClassVar[str] = "<think>"
    CLOSE: ClassVar[str] = "</think>"

    @classmethod
    def applies(cls, template: str) -> bool:
        return cls.OPEN in template

    def __init__(self, prompt: str) -> None:
        at = prompt.rfind(self.OPEN)
        self.state = _THINKING if at >= 0 and self.CLOSE not in prompt[at:] else _BEFORE
        self.held = ""  # text not yet released (a possible tag start, trailing blank space)
        self.lead = True  # the current text has released nothing yet (leading blanks dropped)

    @property
    def in_reasoning(self) -> bool:
        return self.state == _THINKING

    def _piece(self, s: str) -> Piece:
        return Reasoning(s) if self.state == _THINKING else s

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        s = self.held + text
        self.held = ""
        while s:
            if self.lead:
                s = s.lstrip()
                if not s:
                    break
            if self.state == _ANSWER:
                out.append(s)
                self.lead = False
                break
            tag = self.OPEN if self.state == _BEFORE else self.CLOSE
            at = s.find(tag)
            if at >= 0:
                body = s[:at].rstrip()
                if body:
                    out.append(self._piece(body))
                self.state = _THINKING if self.state == _BEFORE else _ANSWER
                self.lead = True
                s = s[at + len(tag):]
                continue
            keep = len(s) - _partial(s, tag)
            body = s[:keep].rstrip()
            self.held = s[len(body):]
            if body:
                out.append(self._piece(body))
                self.lead = False
            break
        return _merge(out)

    def finish(self) -> list[Piece]:
        s, self.held = self.held, ""
        if self.lead:
            s = s.lstrip()
        if self.state == _THINKING:  # the thought's trailing blank space is not its text
            s = s.rstrip()
        return [self._piece(s)] if s else []


FORMATS: list[type[ReasoningSplitter]] = [ThinkTags]


def splitter_for(template: str, prompt: str, tools: set[str] | None = None
                 ) -> ReasoningSplitter | None:
    """A new splitter for one completion of prompt, rendered with template; None when the
    template speaks no reasoning format (the output is then the answer, as is). tools: the
    functions whose calls a format that carries them (harmony) reads."""
    from colibri.serve.harmony import Harmony

    if Harmony.applies(template):
        return Harmony(prompt, tools)
    for f in FORMATS:
        if f.applies(template):
            return f(prompt)
    return None


__all__ = ["FORMATS", "Piece", "Reasoning", "ReasoningSplitter", "ThinkTags", "splitter_for"]
