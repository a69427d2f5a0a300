"""The grammar of tool_choice "required" or a named tool: one call, in the form the model's
chat template teaches it (its native form, where tool_parse reads it), else the Hermes or the
bare JSON form.

`call_form(template)` names the form by the template's own tags:
- deepseek-v3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
  <｜tool▁calls▁end｜>`; deepseek-v3 (a template with a ```json block, V3 / R1):
  `...<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>...`
- kimi-k2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
  <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`
- gemma4: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, values in Gemma's syntax (strings
  between `<|"|>` marks, keys bare and sorted as its template sorts them, null as None).
- hunyuan: `<tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>`
- xml (GLM-4.5 / 4.6, Ling): `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>
  ...</tool_call>`, a string argument raw, any other as JSON (a newline after each argument
  as GLM's template writes it, or before `</tool_call>` only as Ling's does).
- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
- granite3: `<|tool_call|>[{"name": ..., "arguments": {...}}]`
- harmony (gpt-oss): after the prompt's `<|start|>assistant`, an optional analysis message
  (`<|channel|>analysis<|message|>...<|end|><|start|>assistant`: the model may think first,
  as it was trained to; its text has no `<|`), then `<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>{...}` (as the model writes it) or ` to=functions.NAME
  <|channel|>commentary json<|message|>{...}` (as its template renders a call); the
  generation then ends (`<|call|>` is an end-of-generation token).
- llama4: `<|python_start|><|python_end|>{"name": ..., "parameters": {...}}` (tool_llama4)
- json: the bare call object (Llama 3 and templates with no form of their own).
Where a tool's schema is beyond what the gemma4 or xml grammar writes ($ref, anyOf, a
free-form object...), those fall back to the hermes form (the parser reads it everywhere).

A tag that is a control token in the model's vocabulary (`control_tags`) may be written as
that token (llguidance's `<[id]>`) or spelled as text: the engine's text leaves control tokens
out, and the server puts these tags back into the text it parses (streaming._Choice), as
llama.cpp's server keeps a chat format's "preserved tokens".
"""

from __future__ import annotations

import json
from typing import Any

from colibri.serve.grammar import JSON_OPTIONS
from colibri.serve.harmony import CHANNEL, CONSTRAIN, END, MESSAGE, START
from colibri.serve.harmony import TAGS as HARMONY_TAGS
from colibri.serve.tool_llama4 import PY_END, PY_START, call_rule
from colibri.serve.tool_parse import (
    CLOSE,
    G4_CLOSE,
    G4_OPEN,
    GRANITE_TAG,
    HY_CLOSE,
    HY_OPEN,
    OPEN,
    PYTHON_TAG,
)
from colibri.serve.tool_tags import (
    DS_CALL,
    DS_CALL_END,
    DS_SECTION,
    DS_SECTION_END,
    DS_SEP,
    KIMI_CALL,
    KIMI_CALL_END,
    KIMI_SECTION,
    KIMI_SECTION_END,
    KIMI_SEP,
)
from colibri.serve.tools import call_schema, tool_parameters

QUOTE = '<|"|>'  # Gemma 4's string mark
# JSON as the templates' tojson writes it (", " and ": "), no other whitespace
CALL_JSON: dict[str, Any] = {**JSON_OPTIONS, "item_separator": ", ", "key_separator": ": "}


# the tags of the call forms and of ThinkTags: text the parsers need to see
PRESERVED = (OPEN, CLOSE, G4_OPEN, G4_CLOSE, QUOTE, GRANITE_TAG, PYTHON_TAG, HY_OPEN, HY_CLOSE,
             "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", DS_SECTION,
             DS_SECTION_END, DS_CALL, DS_SEP, DS_CALL_END, KIMI_SECTION, KIMI_SECTION_END,
             KIMI_CALL, KIMI_SEP, KIMI_CALL_END, "<think>", "</think>", *HARMONY_TAGS, PY_START,
             PY_END)


def control_tags(model: Any) -> dict[str, int]:
    """The PRESERVED tags that are one control token each in model's vocabulary: tag -> id
    ({} for a model without a tokenizer)."""
    from colibri.tokenizer import ATTR_CONTROL

    get = getattr(model, "_tok", None)
    attrs = getattr(get(), "token_attrs", None) if get is not None else None
    if attrs is None:
        return {}
    out = {}
    for tag in PRESERVED:
        ids = model.tokenize(tag, add_special=False, parse_special=True)
        if len(ids) == 1 and int(attrs[ids[0]]) & ATTR_CONTROL:
            out[tag] = int(ids[0])
    return out


class Unsupported(Exception):
    """A schema beyond what a form's grammar writes."""


def call_form(template: str) -> str:
    """The form of a call the model whose chat template is template was taught (see the
    module doc)."""
    if CHANNEL in template and "commentary" in template:
        return "harmony"
    if DS_CALL in template:
        return "deepseek-v3" if "```json" in template else "deepseek-v3.1"
    if KIMI_CALL in template:
        return "kimi-k2"
    if G4_OPEN in template:
        return "gemma4"
    if HY_OPEN in template:
        return "hunyuan"
    if OPEN in template:
        return "xml" if "<arg_key>" in template else "hermes"
    if GRANITE_TAG in template:
        return "granite3"
    if PY_START in template:
        return "llama4"
    return "json"


class _Lark:
    """Rules of a lark grammar under construction."""

    def __init__(self, special: dict[str, int] | None = None) -> None:
        self.special = special or {}
        self.rules: list[str] = []

    def lit(self, text: str) -> str:
        """A literal; a tag that is a control token, that token or its text."""
        s = json.dumps(text, ensure_ascii=False)
        return f"({s} | <[{self.special[text]}]>)" if text in self.special else s

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def json(self, schema: Any) -> str:
        return self.rule("%json " + json.dumps({**schema, "x-guidance": CALL_JSON}
                                                if isinstance(schema, dict) else schema))

    def text(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.rules]) + "\n"


def _string_body(schema: dict[str, Any], stop: str) -> str:
    """A raw string's characters (none of `stop`'s first), up to maxLength."""
    hi = schema.get("maxLength")
    lo = schema.get("minLength", 0)
    rep = f"{{{int(lo)},{int(hi)}}}" if isinstance(hi, int) else f"{{{int(lo)},}}" if lo else "*"
    return f"/[^{stop}]{rep}/"


def _typed(schema: Any) -> str:
    if not isinstance(schema, dict):
        raise Unsupported
    for k in ("$ref", "anyOf", "oneOf", "allOf", "not", "if", "const", "patternProperties",
              "prefixItems", "pattern", "format"):
        if k in schema:
            raise Unsupported
    t = schema.get("type")
    if isinstance(t, list):
        if len(t) != 1:
            raise Unsupported
        t = t[0]
    if t is None and "properties" in schema:
        t = "object"
    if not isinstance(t, str):
        raise Unsupported
    return t


def _gemma_value(g: _Lark, schema: Any) -> str:
    t = _typed(schema)
    if "enum" in schema:
        vals = schema["enum"]
        if not vals or not all(isinstance(v, str) for v in vals):
            raise Unsupported
        return "(" + " | ".join(g.lit(QUOTE) + " " + json.dumps(v, ensure_ascii=False) + " "
                                + g.lit(QUOTE) for v in vals) + ")"
    if t == "string":
        return f"{g.lit(QUOTE)} {_string_body(schema, '<')} {g.lit(QUOTE)}"
    if t in ("number", "integer", "boolean"):  # written as JSON writes them
        return g.json(schema)
    if t == "null":
        return '"None"'
    if t == "array":
        item = g.rule(_gemma_value(g, schema.get("items", {"type": "string"})))
        return f'"[" ({item} ("," {item})*)? "]"'
    if t == "object":
        return _gemma_object(g, schema)
    raise Unsupported


def _gemma_object(g: _Lark, schema: dict[str, Any]) -> str:
    """{k:v,...} with bare keys in sorted order (the template's dictsort): the required keys
    always, the others optional, a comma between two written."""
    props = schema.get("properties") or {}
    if not props or schema.get("additionalProperties") not in (None, False):
        raise Unsupported
    required = set(schema.get("required") or [])
    items = [(g.rule(json.dumps(k, ensure_ascii=False) + ' ":" ' + _gemma_value(g, v)),
              k in required) for k, v in sorted(props.items())]
    # after(i): the items from i on once one was written (each after a comma);
    # first(i): the items from i on when none was yet
    after = [" ".join(f'"," {r}' if req else f'("," {r})?' for r, req in items[i:])
             for i in range(len(items) + 1)]
    first = ""
    for i in range(len(items) - 1, -1, -1):
        r, req = items[i]
        seq = f"{r} {after[i + 1]}".strip()
        first = g.rule(seq if req else f"({seq} | {first})" if first else f"({seq})?")
    return f'"{{" {first} "}}"'


def _xml_args(g: _Lark, schema: dict[str, Any]) -> str:
    if _typed(schema) != "object":
        raise Unsupported
    props = schema.get("properties") or {}
    if schema.get("additionalProperties") not in (None, False):
        raise Unsupported
    required = set(schema.get("required") or [])
    parts = []
    for k, v in props.items():
        t = _typed(v)
        value = (_string_body(v, "<") if t == "string" and "enum" not in v else
                 "(" + " | ".join(json.dumps(x, ensure_ascii=False) for x in v["enum"]) + ")"
                 if t == "string" else g.json(v))
        if t == "string" and "enum" in v and not all(isinstance(x, str) for x in v["enum"]):
            raise Unsupported
        item = g.rule(f'{g.lit("<arg_key>")} {json.dumps(k, ensure_ascii=False)} '
                      f'{g.lit("</arg_key>")} "\\n" {g.lit("<arg_value>")} {value} '
                      f'{g.lit("</arg_value>")} "\\n"?')
        parts.append(item if k in required else f"{item}?")
    return " ".join(parts)


def _harmony(g: _Lark, chosen: list[dict[str, Any]]) -> str:
    """gpt-oss's call (see the module doc), after an optional analysis message."""
    ctype = g.rule(f'(" " {g.lit(CONSTRAIN)}? "json")?')
    alts = []
    for f in chosen:
        to = f'" to=functions." {json.dumps(f["name"], ensure_ascii=False)}'
        args = g.json(tool_parameters(f))
        alts.append(g.rule(f'(({g.lit(CHANNEL)} "commentary" {to}) | ({to} {g.lit(CHANNEL)} '
                           f'"commentary")) {ctype} {g.lit(MESSAGE)} {args}'))
    return g.text(f"{_harmony_analysis(g)}? ({' | '.join(alts)})")


def _harmony_analysis(g: _Lark) -> str:
    """An analysis message and the next one's start: text without `<|` (no other harmony
    tag: the reader would end the message there), then `<|end|>` (one lexeme with the text,
    ended at the first `<|end|>`; or the control token where it is one)."""
    body = "([^<]|<[^|])*"
    if END in g.special:
        text = f"/{body}/ <[{g.special[END]}]>"
    else:
        text = f"r{len(g.rules)}"
        g.rules.append(f"{text}[lazy]: /{body}<\\|end\\|>/")
    return g.rule(f'{g.lit(CHANNEL)} "analysis" {g.lit(MESSAGE)} {text} {g.lit(START)} '
                  f'"assistant"')


def harmony_final(schema: Any, special: dict[str, int] | None = None) -> tuple[str, Any]:
    """("lark", grammar) of gpt-oss's answer under a response_format: an optional analysis
    message, then `<|channel|>final <|constrain|>json<|message|>` and the JSON (as llama.cpp's
    gpt-oss grammar writes a response format)."""
    g = _Lark(special)
    think = _harmony_analysis(g)
    return "lark", g.text(f'{think}? {g.lit(CHANNEL)} "final" (" " {g.lit(CONSTRAIN)}? "json")? '
                          f'{g.lit(MESSAGE)} {g.json(schema)}')


def call_grammar(tools: list[dict[str, Any]], name: str | None, template: str,
                 close: str = "", special: dict[str, int] | None = None) -> tuple[str, Any]:
    """("json_schema", schema) for the bare JSON form, else ("lark", grammar): one call of
    the tool named name (any of tools for None) in call_form(template)'s form. close: text
    written first (the closing tag of a thought the prompt leaves open, as DeepSeek-R1's
    template opens <think>: the call is the answer, after it). special: control_tags."""
    kind, spec = _call_grammar(tools, name, template, special or {})
    if not close:
        return kind, spec
    g = _Lark(special)
    if kind == "json_schema":
        kind, spec = "lark", g.text(g.json(spec))
    assert spec.startswith("start: ")
    return kind, f"start: {g.lit(close)} " + spec[len("start: "):]


def _call_grammar(tools: list[dict[str, Any]], name: str | None, template: str,
                  special: dict[str, int]) -> tuple[str, Any]:
    schema = call_schema(tools, name)
    form = call_form(template)
    if form == "json":
        return "json_schema", schema
    g = _Lark(special)
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    try:
        if form in ("gemma4", "xml"):
            alts = []
            for f in chosen:
                params = tool_parameters(f)
                if form == "gemma4":
                    args = (_gemma_object(g, params) if params.get("properties")
                            else '"{" "}"')
                    alts.append(g.rule(f'"call:" {json.dumps(f["name"])} {args}'))
                else:
                    alts.append(g.rule(f'{json.dumps(f["name"])} "\\n" {_xml_args(g, params)}'))
            body = " | ".join(alts)
            if form == "gemma4":
                return "lark", g.text(f"{g.lit(G4_OPEN)} ({body}) {g.lit(G4_CLOSE)}")
            return "lark", g.text(f'{g.lit(OPEN)} ({body}) "\\n"? {g.lit(CLOSE)}')
    except Unsupported:
        form, g = "hermes", _Lark(special)
    if form == "harmony":
        return "lark", _harmony(g, chosen)
    if form in ("deepseek-v3.1", "deepseek-v3", "kimi-k2"):
        alts = []
        for f in chosen:
            n, args = json.dumps(f["name"]), g.json(tool_parameters(f))
            if form == "deepseek-v3.1":
                alts.append(g.rule(f"{n} {g.lit(DS_SEP)} {args}"))
            elif form == "deepseek-v3":
                alts.append(g.rule(f'"function" {g.lit(DS_SEP)} {n} "\\n```json\\n" {args} '
                                   f'"\\n```"'))
            else:
                alts.append(g.rule(f'"functions." {n} ":0" {g.lit(KIMI_SEP)} {args}'))
        body = " | ".join(alts)
        if form == "kimi-k2":
            return "lark", g.text(f"{g.lit(KIMI_SECTION)} {g.lit(KIMI_CALL)} ({body}) "
                                  f"{g.lit(KIMI_CALL_END)} {g.lit(KIMI_SECTION_END)}")
        return "lark", g.text(f"{g.lit(DS_SECTION)} {g.lit(DS_CALL)} ({body}) "
                              f"{g.lit(DS_CALL_END)} {g.lit(DS_SECTION_END)}")
    if form == "llama4":
        return "lark", g.text(call_rule(g, chosen))
    call = g.json(schema)
    if form == "hunyuan":
        return "lark", g.text(f'{g.lit(HY_OPEN)} "[" {call} "]" {g.lit(HY_CLOSE)}')
    if form == "granite3":
        return "lark", g.text(f'{g.lit(GRANITE_TAG)} "[" {call} "]"')
    return "lark", g.text(f'{g.lit(OPEN)} "\\n" {call} "\\n" {g.lit(CLOSE)}')


__all__ = ["PRESERVED", "call_form", "call_grammar", "control_tags", "harmony_final"]
