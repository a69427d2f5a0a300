"""Exceptions raised by colibri. The C status codes map to them in one place,
colibri/_core/_check.pxi (keyed by the names of include/colibri/status.h)."""

from __future__ import annotations


class ColibriError(RuntimeError):
    """An error inside colibri that is neither a bad argument, a lack of memory nor an OS error."""


class OutOfRangeError(IndexError, ValueError):
    """An index or id outside its range (a layer, an expert): an IndexError, and a ValueError as
    such bad arguments were before the boundary checks named them (like numpy's AxisError)."""


class ContextFullError(ColibriError):
    """The KV cache (ctx tokens) cannot hold the prompt, or filled while generating. Nothing
    generated is lost: `text` is every character generated before it filled (also yielded by a
    stream before this is raised), `generated_tokens` their count; `prompt_tokens` and `ctx`
    say why. on_context_full="stop" returns the text instead of raising."""

    def __init__(self, message: str, *, ctx: int, prompt_tokens: int,
                 generated_tokens: int = 0, text: str = "") -> None:
        super().__init__(message)
        self.ctx = ctx
        self.prompt_tokens = prompt_tokens
        self.generated_tokens = generated_tokens
        self.text = text
