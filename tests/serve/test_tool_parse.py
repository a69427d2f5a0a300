"""The streaming tool-call parser (colibri.serve.tool_parse): generated outputs in the Hermes /
Qwen `<tool_call>` form and Llama 3's JSON form, and in the forms of issue 48's families, fed
whole, a character at a time and split at random boundaries (hypothesis); the pieces must
rebuild the calls exactly, as OpenAI's streaming shape has them (first piece: index, id, name,
arguments ""; then arguments text only).

The families' forms: where the published template writes an assistant's tool calls itself
(Gemma 4, Ling / Bailing's GLM-style XML, Granite 4.0's Hermes form), the text parsed is what
transformers renders with that template (tests/data/chat_templates) for the generated calls,
so the parser reads what the model was trained to write. Granite 3.3's template only tells the
model the form (`<|tool_call|>` then a JSON list; it renders past calls as their content), so
the text is that instruction followed literally. Hunyuan-A13B's `<tool_calls>[...]</tool_calls>`
is its model card's / vLLM's hunyuan_a13b parser's form (its template is not among the ones
here). Templates with no tool support: Phi-3.5, Gemma 2, ERNIE 4.5 (the PT models' template);
nothing to parse there."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colibri.serve.tool_parse import (
    CLOSE,
    G4_OPEN,
    GRANITE_TAG,
    HY_CLOSE,
    HY_OPEN,
    OPEN,
    PYTHON_TAG,
    ToolCallDelta,
    ToolStreamParser,
    parse_tool_calls,
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

NAMES = {"get_weather", "add", "search_web"}
TRICKY = ["}", "{", '"', "\\", "</tool", "</tool_call", "<tool_call>", "]", ",", ":", "é",
          "😀", "\n", "\t", "\u2028", "<|python_tag|>", "'"]

texts = st.one_of(st.text(max_size=12), st.sampled_from(TRICKY),
                  st.lists(st.sampled_from(TRICKY), max_size=4).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False), texts)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)), max_leaves=8)
arguments = st.dictionaries(texts, values, max_size=4)
dump_styles = st.sampled_from([{}, {"ensure_ascii": False}, {"separators": (",", ":")},
                               {"indent": 1}, {"ensure_ascii": False, "separators": (",", ": ")}])


def run(text: str, cuts: list[int], strings: dict | None = None,
        ) -> tuple[ToolStreamParser, list]:
    """Feed text split at cuts (sorted positions), then finish; the parser and its events."""
    p = ToolStreamParser(NAMES, strings)
    events: list = []
    last = 0
    for c in [*cuts, len(text)]:
        events += p.feed(text[last:c])
        last = c
    events += p.finish()
    return p, events


def rebuild(events: list) -> tuple[str, list[dict]]:
    """Content and calls from the events, checking OpenAI's streaming shape on the way."""
    content, calls = "", []
    for e in events:
        if isinstance(e, str):
            content += e
            continue
        assert isinstance(e, ToolCallDelta)
        oa = e.openai()
        assert oa["index"] == e.index
        if e.id is not None:  # a call's first piece: index, id, type, name, no arguments yet
            assert e.index == len(calls), "calls get indices 0, 1, ... in order"
            assert oa["type"] == "function" and oa["id"].startswith("call_")
            assert oa["function"] == {"name": e.name, "arguments": ""}
            calls.append({"id": e.id, "name": e.name, "arguments": "", "pieces": 0})
        else:
            assert set(oa) == {"index", "function"} and set(oa["function"]) == {"arguments"}
            assert e.index == len(calls) - 1, "a call's pieces come before the next call"
            calls[e.index]["arguments"] += e.arguments
            calls[e.index]["pieces"] += 1
    assert len({c["id"] for c in calls}) == len(calls)
    return content, calls


def check(text: str, cuts: list[int], want_content: str | None, want: list[tuple[str, dict]],
          strings: dict | None = None):
    p, events = run(text, cuts, strings)
    content, calls = rebuild(events)
    assert content == (want_content or ""), (text, cuts)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == want, (text, cuts)
    # the pieces concatenate to the final arguments exactly, as the whole-output parse has them
    assert [c["arguments"] for c in calls] == [c.arguments for c in p.calls]
    whole_content, whole = parse_tool_calls(text, NAMES, strings)
    assert whole_content == want_content
    assert [(c.name, c.arguments) for c in whole] == [(c["name"], c["arguments"]) for c in calls]
    return calls


def hermes(calls: list[tuple[str, dict]], style: dict, pre: str, gap: str) -> str:
    return pre + gap.join(f"{OPEN}\n{json.dumps({'name': n, 'arguments': a}, **style)}\n{CLOSE}"
                          for n, a in calls)


calls_st = st.lists(st.tuples(st.sampled_from(sorted(NAMES)), arguments), min_size=1,
                    max_size=3)
# content around calls: never the opening tag itself, not starting like the JSON form
content_st = texts.filter(lambda t: OPEN not in t).map(lambda t: "x" + t)
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(calls_st, dump_styles, content_st, st.sampled_from(["", "\n", " and "]), st.data())
def test_hermes_calls_split_anywhere(calls, style, pre, gap, data):
    text = hermes(calls, style, pre, gap)
    want_content = pre + gap * (len(calls) - 1)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=len(text) // 3 + 1)))
    got = check(text, cuts, want_content, calls)
    # a character at a time: every call's arguments come in pieces, about one per character
    # (fewer only where something could have been </tool_call>)
    got = check(text, list(range(1, len(text))), want_content, calls)
    for g in got:
        held = sum(g["arguments"].count(t) for t in ("</", "<"))
        assert g["pieces"] >= len(g["arguments"]) - 11 * held


@SETTINGS
@given(calls_st, dump_styles, st.sampled_from(["", " ", "\n", PYTHON_TAG, PYTHON_TAG + " "]),
       st.sampled_from(["parameters", "arguments"]), st.sampled_from(["list", "one", ";"]),
       st.data())
def test_llama3_json_calls_split_anywhere(calls, style, pre, key, shape, data):
    objs = [json.dumps({"name": n, key: a}, **style) for n, a in calls]
    if shape == "one":
        calls = calls[:1]
        text = pre + objs[0]
    elif shape == "list":
        text = pre + "[" + ", ".join(objs) + "]"
    else:
        text = pre + "; ".join(objs)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=len(text) // 3 + 1)))
    check(text, cuts, None, calls)
    check(text, list(range(1, len(text))), None, calls)


def test_the_name_comes_first_and_arguments_as_they_arrive():
    text = f'Sure.{OPEN}{{"name": "add", "arguments": {{"a": 12, "b": "x}}y"}}}}{CLOSE}'
    p = ToolStreamParser(NAMES)
    seen: list = []
    for i, ch in enumerate(text):
        seen.append((i, p.feed(ch)))
    name_at = text.index('"arguments"') - 2  # the comma after the name completes it
    first = next((i, ev) for i, ev in seen if any(isinstance(e, ToolCallDelta) for e in ev))
    assert first[0] == name_at and first[1][0].name == "add"
    args = "".join(e.arguments for _, ev in seen for e in ev if isinstance(e, ToolCallDelta))
    # everything of the arguments shown before </tool_call> arrives: nothing held that could
    # not be the closing tag
    assert args == '{"a": 12, "b": "x}y"}'
    assert p.finish() == [] and p.calls[0].arguments == args


def test_only_a_possible_closing_tag_is_held_back():
    p = ToolStreamParser(NAMES)
    p.feed(OPEN + '{"name": "add", "arguments": ')
    assert [e.arguments for e in p.feed('{"s": "a</to')] == ['{"s": "a']  # maybe </tool_call>
    assert [e.arguments for e in p.feed("y")] == ["</toy"]                 # it was not
    # a call the model never closes ends at </tool_call>, its arguments as written
    assert [e.arguments for e in p.feed("b" + CLOSE + "after")[:1]] == ["b"]
    assert p.finish() == [] and p.calls[0].arguments == '{"s": "a</toyb'


def test_arguments_written_as_a_string_are_decoded_as_they_arrive():
    inner = {"q": "caf\u00e9 \U0001f600 \"quoted\" \\ back"}
    obj = json.dumps({"name": "search_web", "arguments": json.dumps(inner)})
    for cuts in ([], list(range(1, len(obj)))):
        p, events = run(obj, cuts)
        content, calls = rebuild(events)
        assert content == "" and json.loads(calls[0]["arguments"]) == inner
        assert calls[0]["arguments"] == json.dumps(inner)
    # decoded a piece at a time, an escape never cut
    _, events = run(obj, list(range(1, len(obj))))
    assert sum(1 for e in events if isinstance(e, ToolCallDelta) and e.id is None) > 10


def test_the_name_after_the_arguments():
    text = OPEN + '{"arguments": {"a": [1, 2]}, "name": "add"}' + CLOSE
    for cuts in ([], list(range(1, len(text)))):
        _, events = run(text, cuts)
        content, calls = rebuild(events)
        assert content == "" and [(c["name"], c["arguments"]) for c in calls] == \
            [("add", '{"a": [1, 2]}')]


def test_calls_without_arguments_and_cut_short():
    for text, args in ((OPEN + '{"name": "add"}' + CLOSE, "{}"), ('{"name": "add"}', "{}"),
                       (OPEN + '{"name": "add", "arguments": {"a": 1', '{"a": 1'),
                       ('{"name": "add", "parameters": {"a": "b', '{"a": "b'),
                       (OPEN + '{"name": "add", "arguments": {"a": 1}', '{"a": 1}')):
        for cuts in ([], list(range(1, len(text)))):
            _, events = run(text, cuts)
            content, calls = rebuild(events)
            assert content == "" and [c["arguments"] for c in calls] == [args], text


def test_what_is_not_a_call_stays_content():
    for t in ('{"name": "rm", "parameters": {}}', OPEN + '{"name": "add"', "just text",
              '{"a": 1}', OPEN + "{oops}" + CLOSE, "[]", "[", "{", ' {"name": 5}',
              OPEN + '{"name": "rm", "arguments": {}}' + CLOSE + " after",
              '[{"a": 1}]', PYTHON_TAG + "print(1)", "<|python", "< tool_call>"):
        for cuts in ([], list(range(1, len(t)))):
            _, events = run(t, cuts)
            content, calls = rebuild(events)
            assert calls == [] and content == t, (t, cuts)
    # text after a Llama 3 call is content; whitespace after it is dropped
    _, events = run('{"name": "add", "parameters": {}}\n\n', [])
    assert rebuild(events)[0] == ""
    _, events = run('{"name": "add", "parameters": {}} and then', [5])
    content, calls = rebuild(events)
    assert content == " and then" and len(calls) == 1
    # a second <tool_call> naming no tool is content between the calls' indices
    text = (OPEN + '{"name": "add", "arguments": {}}' + CLOSE + OPEN + '{"name": "x"}' + CLOSE
            + OPEN + '{"name": "add", "arguments": {"b": 2}}' + CLOSE)
    _, events = run(text, list(range(1, len(text))))
    content, calls = rebuild(events)
    assert content == OPEN + '{"name": "x"}' + CLOSE
    assert [c["arguments"] for c in calls] == ["{}", '{"b": 2}']


def test_plain_text_streams_as_it_comes():
    p = ToolStreamParser(NAMES)
    assert p.feed("Hello there") == ["Hello there"]
    assert p.feed(" <tool") == [" "]  # a possible tag is held back
    assert p.feed("kit>") == ["<toolkit>"]
    p = ToolStreamParser(NAMES)
    assert p.feed("  ") == [] and p.feed("Hi") == ["  Hi"]


# ---- the forms of issue 48's families ----

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
idents = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True)


def rendered_calls(family: str, calls: list[tuple[str, dict]], start: str, end: str,
                   content: str | None = "", as_text: dict | None = None,
                   tools: bool = False, stop: str | None = None) -> str:
    """The assistant turn's calls as transformers renders them with the family's published
    template: the text from the first `start` to the last `end` (after the prompt). as_text:
    the arguments given as JSON text (json.dumps with these options), not as an object;
    tools: the request has tools (a template that writes calls only then); stop: the end of
    generation, where the text ends when the template writes it amid the calls."""
    from transformers.utils.chat_template_utils import render_jinja_template

    msgs = [{"role": "user", "content": "¶go¶"},
            {"role": "assistant", "content": content, "tool_calls": [
                {"type": "function", "id": f"call_{i}", "function": {"name": n, "arguments": (
                    a if as_text is None else json.dumps(a, **as_text))}}
                for i, (n, a) in enumerate(calls)]}]
    specs = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in sorted(NAMES)] if tools else None
    out, _ = render_jinja_template(conversations=[msgs], chat_template=(
        TEMPLATES / f"{family}.jinja").read_text(), bos_token="<bos>", eos_token="<eos>",
        tools=specs)
    text = out[0][out[0].rindex("¶go¶"):]
    text = text[text.index(start):]
    if stop is not None and stop in text:
        return text[:text.index(stop)]
    return text[: text.rindex(end) + len(end)]


def draw_cuts(data, text: str) -> list[int]:
    return sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=len(text) // 3 + 1)))


# Gemma 4 writes strings between <|"|> marks, raw, and keys bare: a key is a name, a string
# anything without the mark
g4_texts = texts.filter(lambda t: '<|"|>' not in t)
g4_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
              st.floats(allow_nan=False, allow_infinity=False), g4_texts),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(idents, inner, max_size=3)), max_leaves=8)
g4_calls = st.lists(st.tuples(st.sampled_from(sorted(NAMES)),
                              st.dictionaries(idents, g4_values, max_size=4)),
                    min_size=1, max_size=3)


@SETTINGS
@given(g4_calls, st.sampled_from(["", "Let me look.", "x<|tool"]), st.data())
def test_gemma4_calls_as_its_template_writes_them(calls, pre, data):
    text = pre + rendered_calls("gemma4", calls, G4_OPEN, "<tool_call|>")
    check(text, draw_cuts(data, text), pre or None, calls)
    check(text, list(range(1, len(text))), pre or None, calls)


# Ling's XML form writes a string argument raw, anything else as JSON; the tool's schema says
# which arguments are strings (here: the keys starting with "s")
xml_texts = texts.filter(lambda t: "</arg_value>" not in t and CLOSE not in t)
xml_args = st.dictionaries(idents, st.one_of(xml_texts, values), max_size=4).map(
    lambda a: {("s" if isinstance(v, str) else "v") + k: v for k, v in a.items()}).filter(
    lambda a: not any(t in json.dumps(v, ensure_ascii=False) for v in a.values()
                      for t in (CLOSE, "</arg_value>")))  # the form cannot hold these
xml_calls = st.lists(st.tuples(st.sampled_from(sorted(NAMES)), xml_args), min_size=1,
                     max_size=3)


@SETTINGS
@given(xml_calls, st.sampled_from(["", "Sure.\n"]), st.data())
def test_ling_xml_calls_as_its_template_writes_them(calls, pre, data):
    text = pre + rendered_calls("ling3", calls, OPEN, CLOSE)
    strings = {n: {k for _, a in calls for k in a if k.startswith("s")} for n in NAMES}
    want = pre + "\n" * (len(calls) - 1) or None  # the template's newline between calls
    check(text, draw_cuts(data, text), want, calls, strings)
    check(text, list(range(1, len(text))), want, calls, strings)


@SETTINGS
@given(calls_st, st.data())
def test_granite4_hermes_calls_as_its_template_writes_them(calls, data):
    text = rendered_calls("granite4.0", calls, OPEN, CLOSE)
    check(text, draw_cuts(data, text), "\n" * (len(calls) - 1) or None, calls)


@SETTINGS
@given(calls_st, dump_styles, st.sampled_from(["", " "]), st.data())
def test_granite3_tool_call_tag_then_a_json_list(calls, style, gap, data):
    """Granite 3.3's template: "respond only with <|tool_call|> followed by a JSON list"."""
    text = GRANITE_TAG + gap + json.dumps([{"name": n, "arguments": a} for n, a in calls],
                                          **style)
    check(text, draw_cuts(data, text), None, calls)
    check(text, list(range(1, len(text))), None, calls)


@SETTINGS
@given(calls_st, dump_styles, st.sampled_from(["", "I will call them.\n"]),
       st.sampled_from(["", "\n", "\nDone"]), st.data())
def test_hunyuan_tool_calls_list(calls, style, pre, post, data):
    text = (pre + HY_OPEN + json.dumps([{"name": n, "arguments": a} for n, a in calls], **style)
            + HY_CLOSE + post)
    want = pre + post or None  # text around the tags is content, as around <tool_call>
    check(text, draw_cuts(data, text), want, calls)
    check(text, list(range(1, len(text))), want, calls)


def test_the_families_forms_stay_content_when_no_call():
    for t in (G4_OPEN + "call:rm{a:1}<tool_call|>", G4_OPEN + "oops", G4_OPEN + "call:add",
              "<|tool_call", OPEN + "rm\n<arg_key>a</arg_key><arg_value>1</arg_value>" + CLOSE,
              OPEN + "\n" + CLOSE, OPEN + "<arg_key>" + CLOSE, HY_OPEN + "[]" + HY_CLOSE,
              HY_OPEN + "no",
              GRANITE_TAG + "[1]", GRANITE_TAG, HY_OPEN + '[{"name": "rm"}]' + HY_CLOSE):
        for cuts in ([], list(range(1, len(t)))):
            _, events = run(t, cuts)
            content, calls = rebuild(events)
            assert calls == [] and content == t, (t, cuts)


def test_gemma4_arguments_stream_as_json_as_they_arrive():
    text = G4_OPEN + 'call:search_web{q:<|"|>a "b" <|c<|"|>,n:[1,None]}<tool_call|>after'
    p = ToolStreamParser(NAMES)
    pieces = [e for ch in text for e in p.feed(ch)] + p.finish()
    deltas = [e for e in pieces if isinstance(e, ToolCallDelta)]
    assert deltas[0].name == "search_web" and len(deltas) > 10
    assert json.loads("".join(d.arguments for d in deltas)) == {"q": 'a "b" <|c',
                                                                "n": [1, None]}
    assert "".join(e for e in pieces if isinstance(e, str)) == "after"


def test_xml_arguments_without_a_schema_are_json_when_they_parse():
    text = OPEN + "add\n<arg_key>a</arg_key>\n<arg_value>12</arg_value>\n<arg_key>b</arg_key>\n" \
        "<arg_value>twelve</arg_value>\n" + CLOSE
    _, calls = parse_tool_calls(text, NAMES)
    assert json.loads(calls[0].arguments) == {"a": 12, "b": "twelve"}
    _, calls = parse_tool_calls(text, NAMES, {"add": {"a"}})
    assert json.loads(calls[0].arguments) == {"a": "12", "b": "twelve"}
    _, calls = parse_tool_calls(OPEN + "add\n" + CLOSE, NAMES)
    assert calls[0].arguments == "{}"


# ---- the forms of issue 46's families (and Hunyuan-A13B's template) ----

@SETTINGS
@given(xml_calls, st.sampled_from(["", "Sure.\n"]), st.data())
def test_glm_xml_calls_as_its_template_writes_them(calls, pre, data):
    """GLM-4.6's template (GLM-4.5's family) writes the XML form Ling's does."""
    text = pre + rendered_calls("glm4.6", calls, OPEN, CLOSE)
    strings = {n: {k for _, a in calls for k in a if k.startswith("s")} for n in NAMES}
    want = pre + "\n" * (len(calls) - 1) or None  # the template's newline before a call
    check(text, draw_cuts(data, text), want, calls, strings)
    check(text, list(range(1, len(text))), want, calls, strings)


@SETTINGS
@given(calls_st, st.sampled_from(["", "Let me look."]), st.sampled_from(["", "\nDone"]),
       st.data())
def test_deepseek_v31_calls_as_its_template_writes_them(calls, pre, post, data):
    text = pre + rendered_calls("deepseek3.1", calls, DS_SECTION, DS_SECTION_END) + post
    check(text, draw_cuts(data, text), pre + post or None, calls)
    check(text, list(range(1, len(text))), pre + post or None, calls)


@SETTINGS
@given(calls_st, dump_styles, st.sampled_from(["", "x"]), st.data())
def test_deepseek_v3_r1_calls_as_their_template_writes_them(calls, style, pre, data):
    """DeepSeek V3 / R1's template: `function<｜tool▁sep｜>NAME` then a ```json block, the
    arguments as given (JSON text), a newline between calls. It closes the section (and the
    turn: <｜end▁of▁sentence｜>, where generation ends) after the second call, and not at all
    after a single one."""
    text = pre + rendered_calls("deepseek-r1", calls, DS_SECTION, DS_CALL_END, content=None,
                                as_text=style, stop="<｜end▁of▁sentence｜>")
    calls = calls[:2]
    assert text.count("```json") == len(calls)
    check(text, draw_cuts(data, text), pre or None, calls)
    check(text, list(range(1, len(text))), pre or None, calls)


@SETTINGS
@given(calls_st, st.sampled_from(["", "On it."]), st.data())
def test_kimi_k2_calls_as_its_template_writes_them(calls, pre, data):
    text = rendered_calls("kimi-k2", calls, KIMI_SECTION, KIMI_SECTION_END, content=pre)
    text = pre + text  # the template writes the content before the section
    assert "functions." + calls[0][0] + ":0" in text
    check(text, draw_cuts(data, text), pre or None, calls)
    check(text, list(range(1, len(text))), pre or None, calls)


@SETTINGS
@given(calls_st, st.data())
def test_hunyuan_calls_as_its_template_writes_them(calls, data):
    text = rendered_calls("hunyuan-a13b", calls, HY_OPEN, HY_CLOSE, tools=True)
    check(text, draw_cuts(data, text), None, calls)
    check(text, list(range(1, len(text))), None, calls)


def test_the_tagged_forms_stay_content_when_no_call():
    for t in (DS_SECTION + DS_CALL + "rm" + DS_SEP + '{"a": 1}' + DS_CALL_END,
              DS_CALL + "function" + DS_SEP + "rm\n```json\n{}\n```" + DS_CALL_END,
              DS_SECTION + "hello", DS_CALL + "add", DS_CALL + "add<",
              KIMI_SECTION + KIMI_CALL + "functions.rm:0" + KIMI_SEP + "{}" + KIMI_CALL_END,
              KIMI_CALL + "functions.add:0", "<|tool_call_begin", "<｜tool▁call"):
        for cuts in ([], list(range(1, len(t)))):
            _, events = run(t, cuts)
            content, calls = rebuild(events)
            assert calls == [] and content == t, (t, cuts)


def test_tagged_arguments_stream_and_a_string_is_decoded():
    text = KIMI_CALL + "functions.add:3" + KIMI_SEP + '{"a": [1, 2], "b": "x"}' + KIMI_CALL_END
    p = ToolStreamParser(NAMES)
    pieces = [e for ch in text for e in p.feed(ch)] + p.finish()
    deltas = [e for e in pieces if isinstance(e, ToolCallDelta)]
    assert deltas[0].name == "add" and len(deltas) > 10
    assert "".join(d.arguments for d in deltas) == '{"a": [1, 2], "b": "x"}'
    # arguments given as a JSON string (DeepSeek V3.1's template given text writes them so)
    text = DS_CALL + "add" + DS_SEP + json.dumps('{"a": 1}') + DS_CALL_END + "ok"
    assert parse_tool_calls(text, NAMES)[0] == "ok"
    assert json.loads(parse_tool_calls(text, NAMES)[1][0].arguments) == {"a": 1}
