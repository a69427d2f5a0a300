"""Text generation on a Model: prompt evaluation, the sampling loop, stop conditions, streaming
of whole UTF-8 characters, statistics, and chat templates.

Stop conditions: an end-of-generation token (EOS, EOT and the other ids the GGUF names), a stop
string (matched across token boundaries and never included in the output: text that could be
the start of a stop string is held back until it cannot be), max_tokens, and a full context
(a clear error, or a stop when the caller asked for `on_context_full="stop"`).
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.errors import ColibriError, ContextFullError
from colibri.sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from colibri.model import Model


@dataclass
class GenerationStats:
    load_s: float = 0.0
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    generated_tokens: int = 0
    generate_s: float = 0.0
    ttft_s: float = 0.0
    token_latencies_s: list[float] = field(default_factory=list)
    peak_rss_bytes: int = 0
    stop_reason: str = ""
    expert: dict[str, float] = field(default_factory=dict)
    device_expert: dict[str, float] = field(default_factory=dict)  # device="cuda"

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def generate_tps(self) -> float:
        # the first token comes from the prompt's logits; rate over the decode steps
        n = len(self.token_latencies_s)
        t = sum(self.token_latencies_s)
        return n / t if t > 0 else 0.0

    def line(self) -> str:
        parts = [
            f"load {self.load_s:.2f} s",
            f"prompt {self.prompt_tokens} tok {self.prompt_tps:.1f} tok/s",
            f"generated {self.generated_tokens} tok {self.generate_tps:.1f} tok/s",
            f"ttft {self.ttft_s * 1000:.0f} ms",
            f"peak rss {self.peak_rss_bytes / 2**20:.0f} MiB",
        ]
        if self.expert:
            acq = self.expert.get("acquired", 0.0)
            hits = self.expert.get("hits", 0.0)
            rate = hits / acq if acq else 0.0
            parts.append(f"expert hit rate {rate * 100:.1f}%")
            parts.append(f"expert bytes read {self.expert.get('bytes_read', 0.0) / 2**20:.1f} MiB")
            if self.expert.get("resident_bytes"):
                parts.append(f"expert wait {self.expert.get('wait_s', 0.0) * 1000:.0f} ms")
                parts.append(f"experts resident {self.expert['resident_bytes'] / 2**20:.0f} MiB")
            if self.expert.get("prefetch_issued"):
                parts.append(f"prefetch {self.expert.get('prefetch_hits', 0):.0f} hits of "
                             f"{self.expert['prefetch_issued']:.0f} read, "
                             f"{self.expert.get('prefetch_wasted', 0):.0f} wasted")
        dev = self.device_expert
        if dev.get("staged"):
            got = dev.get("hits", 0.0) + dev.get("misses", 0.0)
            parts.append(f"device expert hit rate {dev.get('hits', 0.0) / got * 100 if got else 0:.1f}% "
                         f"staged {dev.get('bytes_staged', 0.0) / 2**20:.1f} MiB "
                         f"({dev.get('device_slots', 0):.0f} device slots)")
        return "[" + " | ".join(parts) + "]"


def peak_rss_bytes() -> int:
    """This process's peak resident set. Linux: VmHWM of /proc/self/status, the high-water
    mark of this address space only (getrusage's ru_maxrss survives exec, so a child started
    from a large parent would report the parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) * (1 if os.uname().sysname == "Darwin" else 1024)


def stop_token_ids(model: Model) -> set[int]:
    """The ids that end a generation: Model.eog_ids (colibri.tokenizer.eog_ids decides)."""
    return set(model.eog_ids)


class _StopMatcher:
    """Holds back text that may be the start of a stop string; reports a full match."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.buf = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; returns (text safe to emit, stopped)."""
        self.buf += text
        if not self.stops:
            out, self.buf = self.buf, ""
            return out, False
        first = -1
        for s in self.stops:
            i = self.buf.find(s)
            if i >= 0 and (first < 0 or i < first):
                first = i
        if first >= 0:
            out = self.buf[:first]
            self.buf = ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.buf[: len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold :]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def stream(
    model: Model,
    prompt: str | bytes | Sequence[int],
    max_tokens: int = 128,
    params: SamplingParams | None = None,
    stop: str | Sequence[str] | None = None,
    add_special: bool = True,
    parse_special: bool = False,
    on_context_full: str = "error",
    stats: GenerationStats | None = None,
) -> Iterator[str]:
    """An iterator of the continuation of prompt as pieces of text, each made of whole
    characters. Every argument is checked and the prompt tokenized here, at the call; the
    forward passes run as the iterator is consumed."""
    from colibri.inputs import token_ids

    if on_context_full not in ("error", "stop"):
        raise ValueError(f"on_context_full must be 'error' or 'stop', got {on_context_full!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int | np.integer) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    params = params or SamplingParams()
    sampler = Sampler(params)
    stats = stats if stats is not None else GenerationStats()
    model._tok()
    if isinstance(prompt, str | bytes | bytearray):
        ids = model.tokenize(prompt, add_special=add_special, parse_special=parse_special)
    else:
        ids = token_ids(prompt, model.n_vocab, "prompt")
    if not ids:
        raise ValueError("the prompt has no tokens")
    if len(ids) + (1 if max_tokens else 0) > model.ctx:
        raise ContextFullError(
            f"context full: the prompt has {len(ids)} tokens and the KV cache holds {model.ctx} "
            f"(Model(ctx=...) or COLIBRI_KV_CACHE_SIZE)", ctx=model.ctx, prompt_tokens=len(ids))
    if stop is not None and not isinstance(stop, str):
        stop = list(stop)
        if not all(isinstance(x, str) for x in stop):
            raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    return _stream(model, ids, int(max_tokens), sampler, stop, on_context_full, stats)


def _stream(model: Model, ids: list[int], max_tokens: int, sampler: Sampler,
            stop: str | Sequence[str] | None, on_context_full: str,
            stats: GenerationStats) -> Iterator[str]:
    tok = model._tok()
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    matcher = _StopMatcher(stops)
    eog = stop_token_ids(model)
    decoder = tok.stream()
    seq = model.new_sequence()
    stats.prompt_tokens = len(ids)
    t0 = time.perf_counter()
    try:
        logits = model.eval([seq], tokens=ids, logits=[False] * (len(ids) - 1) + [True])[-1]
        stats.prompt_s = time.perf_counter() - t0
        history = list(ids)
        produced: list[str] = []  # the text yielded, for a ContextFullError to carry
        stats.stop_reason = "max_tokens"
        for i in range(max_tokens):
            nxt = sampler.sample(logits, history)
            if i == 0:
                stats.ttft_s = time.perf_counter() - t0
            if nxt in eog:
                stats.stop_reason = "eos"
                break
            history.append(nxt)
            stats.generated_tokens += 1
            out, stopped = matcher.push(decoder.feed(nxt))
            if out:
                produced.append(out)
                yield out
            if stopped:
                stats.stop_reason = "stop"
                break
            if i + 1 == max_tokens:
                break
            if model.sequence_length(seq) + 1 > model.ctx:
                stats.stop_reason = "context_full"
                break

            ts = time.perf_counter()
            logits = model.eval([seq], tokens=[nxt])[-1]
            stats.token_latencies_s.append(time.perf_counter() - ts)
        if stats.stop_reason != "stop":
            tail = decoder.flush()
            out, stopped = matcher.push(tail)
            if stopped:
                stats.stop_reason = "stop"
            else:
                out += matcher.flush()
            if out:
                produced.append(out)
                yield out
        if stats.stop_reason == "context_full" and on_context_full == "error":
            # everything generated was yielded above (the held-back tail included) and travels
            # with the error: a caller joining the pieces (generate, chat) loses nothing
            raise ContextFullError(
                f"context full after {stats.generated_tokens} generated tokens: the KV cache "
                f"holds {model.ctx} tokens, the prompt {len(ids)} (Model(ctx=...), or "
                f"on_context_full='stop'; the text generated is this error's .text)",
                ctx=model.ctx, prompt_tokens=len(ids), generated_tokens=stats.generated_tokens,
                text="".join(produced))
    finally:
        # also runs when the generator is closed unfinished, possibly at interpreter exit (when
        # builtins may be gone) or after the model was closed: never raise from here
        try:
            if not model.closed:
                model.free_sequence(seq)
                stats.expert = model.expert_stats()
                stats.device_expert = model.device_expert_stats()
            stats.generate_s = time.perf_counter() - t0
            stats.peak_rss_bytes = peak_rss_bytes()
        except Exception:
            pass


# Used when a GGUF carries no tokenizer.chat_template (llama.cpp detects the same families by
# their special tokens). Each is the family's published format.
BUILTIN_TEMPLATES = {
    # Gemma 3 instruction-tuned models' published template (tests/data/chat_templates/gemma3.jinja)
    "gemma": '{{ bos_token }}\n{%- if messages[0][\'role\'] == \'system\' -%}\n    {%- if messages[0][\'content\'] is string -%}\n        {%- set first_user_prefix = messages[0][\'content\'] + \'\\n\\n\' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0][\'content\'][0][\'text\'] + \'\\n\\n\' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = "" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message[\'role\'] == \'user\') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n    {%- endif -%}\n    {%- if (message[\'role\'] == \'assistant\') -%}\n        {%- set role = "model" -%}\n    {%- else -%}\n        {%- set role = message[\'role\'] -%}\n    {%- endif -%}\n    {{ \'<start_of_turn>\' + role + \'\\n\' + (first_user_prefix if loop.first else "") }}\n    {%- if message[\'content\'] is string -%}\n        {{ message[\'content\'] | trim }}\n    {%- elif message[\'content\'] is iterable -%}\n        {%- for item in message[\'content\'] -%}\n            {%- if item[\'type\'] == \'image\' -%}\n                {{ \'<start_of_image>\' }}\n            {%- elif item[\'type\'] == \'text\' -%}\n                {{ item[\'text\'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception("Invalid content type") }}\n    {%- endif -%}\n    {{ \'<end_of_turn>\\n\' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{\'<start_of_turn>model\\n\'}}\n{%- endif -%}\n',
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
        "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "llama2": (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %} {{ m['content'] "
        "| trim }} {{ eos_token }}{% else %}[INST] {{ m['content'] | trim }} [/INST]{% endif %}"
        "{% endfor %}"
    ),
}


log = logging.getLogger("colibri")
_warned_no_template: set[str] = set()  # files already warned about (once per process)


def chat_template(model: Model) -> str:
    """The model's chat template, or the built-in one of its family when the file has none.
    The fallback is logged as a warning (logger "colibri", once per file): a file without a
    template is most likely a base model, not tuned for chat, and its replies show it."""
    tpl = model.gguf.metadata.get("tokenizer.chat_template")
    if isinstance(tpl, str) and tpl:
        return tpl
    tokens = model.gguf.metadata.get("tokenizer.ggml.tokens")
    vocab = set(tokens) if isinstance(tokens, list) else set()
    for marker, name in (("<start_of_turn>", "gemma"), ("<|im_start|>", "chatml"),
                         ("<|start_header_id|>", "llama3"), ("[INST]", "llama2")):
        if marker in vocab:
            if model.path not in _warned_no_template:
                _warned_no_template.add(model.path)
                log.warning(
                    "%s has no chat template (tokenizer.chat_template): it is likely a base "
                    "model, not tuned for chat, so its replies may be nonsense; falling back to "
                    "the built-in %s template (for chat, use an instruction-tuned model such as "
                    "smollm2-135m-instruct: colibri.chat_model_path())",
                    os.path.basename(model.path), name)
            return BUILTIN_TEMPLATES[name]
    raise ColibriError(f"{model.path} has no chat template (tokenizer.chat_template) and no "
                       f"known chat tokens")


@functools.lru_cache(maxsize=32)
def _compile_template(template: str) -> Any:
    """A chat template compiled in jinja2's immutable sandbox, with the environment chat
    templates are written for (the one transformers' apply_chat_template gives them):
    trim_blocks and lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII text,
    `raise_exception(message)`, `strftime_now(format)`."""
    import datetime
    import json

    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def render_template(template: str, messages: Sequence[dict[str, Any]],
                    add_generation_prompt: bool = True, **context: Any) -> str:
    """Render a chat template (a jinja2 string, as GGUF's tokenizer.chat_template holds) on
    messages in a sandbox. `context` gives the template its other variables: bos_token,
    eos_token, tools, ... An error the template raises itself (raise_exception, e.g. a role
    it does not support) is a ColibriError carrying the template's own message."""
    from jinja2.exceptions import TemplateError

    msgs = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"a chat message is a dict with a 'role' string: {m!r}")
        if "content" not in m and "tool_calls" not in m:
            raise ValueError(f"a chat message needs 'content' (or 'tool_calls'): {m!r}")
        msgs.append(dict(m))
    try:
        compiled = _compile_template(template)
        return str(compiled.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                   **context))
    except TemplateError as e:
        raise ColibriError(f"chat template: {e.message or e}") from None


def render_chat(model: Model, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                template: str | None = None, **context: Any) -> str:
    """Render messages with the model's own chat template (tokenizer.chat_template, else its
    family's built-in one) and its special tokens, in a jinja2 sandbox (render_template)."""
    tpl = template or chat_template(model)
    tok = model._tok()

    def piece(tid: int | None) -> str:
        if tid is None:
            return ""
        return str(tok.token_to_piece(tid, special=True).decode("utf-8", "replace"))

    context.setdefault("bos_token", piece(tok.bos_id))
    context.setdefault("eos_token", piece(tok.eos_id))
    return render_template(tpl, messages, add_generation_prompt, **context)
