"""Structured output: llguidance grammars over colibri's tokenizer vocabulary.

`GrammarFactory(model)` describes the model's vocabulary to llguidance once (every token id's
bytes, control tokens marked as llguidance expects, the end-of-generation ids);
`factory.json_schema(schema)` / `factory.lark(text)` then give a fresh `GrammarConstraint` per
request, the object `Engine.submit(constraint=...)` calls on the engine thread: `mask(logits)`
sets every token the grammar does not allow next to -inf, `advance(token)` moves the parser,
`finished()` says the grammar admits nothing more. The time spent computing masks is kept in
`MaskStats` (the server's /metrics and the serve benchmark report it).

Two rules on top of the schema:
- JSON numbers are at most MAX_NUMBER_CHARS characters. llguidance's JSON options
  (`x-guidance`: separators, whitespace, oneOf coercion, escapes) have no bound on a number's
  length, so a small model may write digits until max_tokens (`{"temp": 14.3625150262577...`).
  `_NumberBound` follows the output's JSON lexically (in a string or not, the length of the
  number being written) and, after llguidance's mask, also masks every token that would make a
  number longer than the bound or leave one unfinishable within it (a number ending in `.`,
  `e` or a sign needs one more character). Where that leaves no token at all (a schema whose
  numbers need more digits, e.g. a minimum of 1e40) the grammar's own mask applies.
- `strict_schema(schema)`: OpenAI's strict mode (`"strict": true` on a json_schema response
  format or a function tool): every object gets `additionalProperties: false` and all its
  properties required, nested ones included.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.generate import stop_token_ids

if TYPE_CHECKING:
    from colibri.model import Model

# JSON as compact as the schema allows: no free whitespace between tokens (a small model given
# free whitespace can emit newlines until max_tokens)
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}

# the most characters a JSON number may have under a grammar (sign, digits, point and exponent
# included): 17 significant digits hold any float64 exactly, and 32 leaves room for a sign,
# a point and an exponent
MAX_NUMBER_CHARS = 32

# keywords whose value is a schema, a list of schemas, or a map of name -> schema
_SUB_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else",
            "propertyNames", "unevaluatedItems")
_SUB_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUB_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def _is_object_schema(s: dict[str, Any]) -> bool:
    t = s.get("type")
    return t == "object" or (isinstance(t, list) and "object" in t) or "properties" in s


def strict_schema(schema: Any) -> Any:
    """schema as OpenAI's strict mode constrains it: every object schema (one with type
    "object" or properties), wherever it is nested (properties, items, prefixItems,
    anyOf/oneOf/allOf, $defs/definitions, ...), gets additionalProperties false and every one
    of its properties required. Returns a new schema; the one given is not changed."""
    if isinstance(schema, list):
        return [strict_schema(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = dict(schema)
    for k in _SUB_ONE:
        if isinstance(out.get(k), dict):
            out[k] = strict_schema(out[k])
    for k in _SUB_LIST:
        if isinstance(out.get(k), list):
            out[k] = [strict_schema(x) for x in out[k]]
    for k in _SUB_MAP:
        if isinstance(out.get(k), dict):
            out[k] = {name: strict_schema(v) for name, v in out[k].items()}
    if _is_object_schema(out):
        out["additionalProperties"] = False
        props = out.get("properties")
        if isinstance(props, dict):
            out["required"] = list(props)
    return out


# lexical states of JSON output, as _NumberBound follows it
_OUT, _NUM, _STR, _ESC = range(4)
# byte classes: 1 starts or continues a number (digit, -), 2 only continues one (+ . e E),
# 3 a quote, 4 a backslash
_CLS = np.zeros(256, dtype=np.int8)
_CLS[list(b"0123456789-")] = 1
_CLS[list(b"+.eE")] = 2
_CLS[ord('"')] = 3
_CLS[ord("\\")] = 4
# a number ending in one of these needs one more character
_INCOMPLETE = np.zeros(256, dtype=bool)
_INCOMPLETE[list(b"-+.eE")] = True


def _token_tables(tokens: list[bytes], limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(need, ok), each [4 start states, tokens]: from a start state, a token is allowed when
    ok (every number that starts inside it is at most limit characters, and one it leaves
    unfinished at most limit - 1) and the number being written when it comes (0 characters
    outside one) plus need (the characters the token adds to it, one more when it leaves it
    unfinished) is at most limit."""
    n = len(tokens)
    need = np.zeros((4, n), dtype=np.int32)
    ok = np.ones((4, n), dtype=bool)
    lens = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=n)
    edges = [0, 8, 16, 64, int(lens.max(initial=0)) + 1]
    for lo, hi in zip(edges, edges[1:], strict=False):
        idx = np.nonzero((lens > lo) & (lens <= hi))[0]
        if idx.size == 0:
            continue
        width = int(lens[idx].max())
        mat = np.frombuffer(b"".join(tokens[i].ljust(width, b"\0") for i in idx),
                            dtype=np.uint8).reshape(idx.size, width)
        ln = lens[idx]
        for s0 in range(4):
            st = np.full(idx.size, s0, dtype=np.int8)
            run = np.zeros(idx.size, dtype=np.int32)
            lead = np.zeros(idx.size, dtype=np.int32)
            is_lead = np.full(idx.size, s0 in (_OUT, _NUM))
            good = np.ones(idx.size, dtype=bool)
            last_inc = np.zeros(idx.size, dtype=bool)
            for j in range(width):
                c = mat[:, j]
                k = _CLS[c]
                act = ln > j
                in_str, in_esc = act & (st == _STR), act & (st == _ESC)
                in_out, in_num = act & (st == _OUT), act & (st == _NUM)
                start = in_out & (k == 1)
                cont = in_num & ((k == 1) | (k == 2))
                end = in_num & ~cont
                good &= ~(end & ~is_lead & (run > limit))
                nst = st.copy()
                nst[in_esc] = _STR
                nst[in_str & (k == 4)] = _ESC
                nst[in_str & (k == 3)] = _OUT
                nst[in_out & (k == 3)] = _STR
                nst[start] = _NUM
                nst[end] = np.where(k[end] == 3, _STR, _OUT)
                st = nst
                grow = start | cont
                run[start] = 0
                run[grow] += 1
                run[end] = 0
                lead[grow & is_lead] += 1
                last_inc[grow] = _INCOMPLETE[c[grow]]
                is_lead &= ~((in_out & ~start) | end)
            open_num = st == _NUM
            good &= ~(open_num & ~is_lead & (run + last_inc > limit))
            need[s0, idx] = lead + (open_num & is_lead & last_inc)
            ok[s0, idx] = good
    return need, ok


class _NumberBound:
    """Follows JSON output lexically (in a string or not, the characters of the number being
    written) and masks the tokens that would make a number longer than the limit (see the
    module doc). State per request; the tables are shared."""

    def __init__(self, tokens: list[bytes], need: np.ndarray, ok: np.ndarray,
                 limit: int) -> None:
        self._tokens = tokens
        self._need = need
        self._ok = ok
        self.limit = limit
        self.state = _OUT
        self.run = 0  # characters of the number being written (0 outside one)

    def allowed(self) -> np.ndarray:
        """The tokens that keep every number within the limit, from the current state."""
        return self._ok[self.state] & (self._need[self.state] <= self.limit - self.run)

    def advance(self, token_id: int) -> None:
        if not 0 <= token_id < len(self._tokens):
            return
        st, run = self.state, self.run
        for c in self._tokens[token_id]:
            k = int(_CLS[c])
            if st == _STR:
                st = _ESC if k == 4 else _OUT if k == 3 else _STR
            elif st == _ESC:
                st = _STR
            elif st == _OUT:
                if k == 1:
                    st, run = _NUM, 1
                elif k == 3:
                    st = _STR
            elif k in (1, 2):
                run += 1
            else:
                st, run = (_STR if k == 3 else _OUT), 0
        self.state, self.run = st, run

    def copy(self) -> _NumberBound:
        c = _NumberBound(self._tokens, self._need, self._ok, self.limit)
        c.state, c.run = self.state, self.run
        return c


class MaskStats:
    """Masks computed and the seconds they took (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0

    def add(self, dt: float) -> None:
        with self._lock:
            self.count += 1
            self.seconds += dt

    def snapshot(self) -> tuple[int, float]:
        with self._lock:
            return self.count, self.seconds


class GrammarConstraint:
    """One request's grammar state (an llguidance LLMatcher); see the module doc."""

    def __init__(self, matcher: Any, n_vocab: int, stats: MaskStats,
                 bound: _NumberBound | None = None, grammar: str = "") -> None:
        self.grammar = grammar  # llguidance's grammar text: what another process compiles again
        self._m = matcher
        self._n = n_vocab
        self._stats = stats
        self._bound = bound

    def mask(self, logits: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        if self._m.is_error():
            raise ValueError(f"grammar: {self._m.get_error()}")
        n = logits.shape[0]
        allowed = np.unpackbits(bits, bitorder="little", count=min(n, bits.size * 8)).astype(bool)
        if self._bound is not None:
            b = self._bound.allowed()
            m = min(b.size, allowed.size)
            both = allowed.copy()
            both[:m] &= b[:m]
            if both.any():  # else the grammar needs a longer number: its own mask applies
                allowed = both
        out = np.full(n, -np.inf, dtype=np.float32)
        out[: allowed.size][allowed] = np.asarray(logits, dtype=np.float32)[: allowed.size][allowed]
        self._stats.add(time.perf_counter() - t0)
        return out

    def advance(self, token_id: int) -> None:
        if not self._m.consume_token(int(token_id)):
            raise ValueError(f"grammar: token {token_id} rejected: {self._m.get_error()}")
        if self._bound is not None:
            self._bound.advance(int(token_id))

    def finished(self) -> bool:
        return bool(self._m.is_stopped())

    def copy(self) -> GrammarConstraint:
        """A fresh constraint in this one's state (no grammar compilation)."""
        return GrammarConstraint(self._m.deep_copy(), self._n, self._stats,
                                 None if self._bound is None else self._bound.copy(), self.grammar)


class GrammarFactory:
    """llguidance's view of a Model's tokenizer, built once (about 2 s for a 262k vocabulary);
    makes GrammarConstraints."""

    def __init__(self, model: Model, max_number_chars: int | None = MAX_NUMBER_CHARS) -> None:
        import llguidance

        from colibri.tokenizer import ATTR_CONTROL

        self._llg = llguidance
        tok = model._tok()
        attrs = tok.token_attrs
        tokens: list[bytes] = []
        for i in range(tok.vocab_size):
            piece = tok.token_to_piece(i, special=True)
            # llguidance's convention (as its llama.cpp bridge): a control token's bytes start
            # with 0xff, so that grammars match it only as a special token, never as text
            tokens.append(b"\xff" + piece if int(attrs[i]) & ATTR_CONTROL else piece)
        eos = sorted(stop_token_ids(model))  # Model.eog_ids, the one end-of-generation rule
        if not eos:
            raise ValueError("structured output needs an end-of-generation token; the model's "
                             "vocabulary names none")

        class _Vocab:
            eos_token_id = eos[0]
            bos_token_id = tok.bos_id

            def __init__(self) -> None:
                self.tokens = tokens

            def __call__(self, text: str | bytes) -> list[int]:
                return [int(x) for x in tok.encode(text, add_special=False)]

        self.n_vocab = int(model.n_vocab)
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab()),
                                                n_vocab=self.n_vocab, eos_token=eos)
        self.stats = MaskStats()
        # JSON numbers bounded to max_number_chars (None: unbounded); the tables cover the
        # tokenizer's ids (control tokens never continue a number: their 0xff byte is no
        # number character)
        self.max_number_chars = max_number_chars
        self._tokens = tokens
        self._tables: tuple[np.ndarray, np.ndarray] | None = None
        if max_number_chars is not None:
            if max_number_chars < 2:
                raise ValueError(f"max_number_chars must be >= 2, got {max_number_chars}")
            self._tables = _token_tables(tokens, max_number_chars)

    def from_grammar(self, grammar: str) -> GrammarConstraint:
        """A constraint from llguidance's grammar text (a GrammarConstraint's .grammar, made by
        json_schema() or lark() of a factory on the same vocabulary, in another process)."""
        m = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"invalid grammar: {m.get_error()}")
        bound = None
        if self._tables is not None and self.max_number_chars is not None:
            bound = _NumberBound(self._tokens, *self._tables, self.max_number_chars)
        return GrammarConstraint(m, self.n_vocab, self.stats, bound, grammar)

    def json_schema(self, schema: dict[str, Any] | bool) -> GrammarConstraint:
        """Output constrained to one JSON value valid under schema (a ValueError naming the
        problem for a schema llguidance cannot compile)."""
        if not isinstance(schema, dict | bool):
            raise ValueError("a JSON schema is an object")
        try:
            grammar = self._llg.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), overrides=JSON_OPTIONS)  # type: ignore[arg-type]
        except (ValueError, TypeError) as e:
            raise ValueError(f"invalid JSON schema: {e}") from None
        return self.from_grammar(grammar)

    def lark(self, text: str) -> GrammarConstraint:
        """Output constrained by a lark grammar (the tool-call grammar: JSON inside
        <tool_call> tags, whose numbers are bounded as a schema's are)."""
        return self.from_grammar(self._llg.LLMatcher.grammar_from_lark(text))


__all__ = ["MAX_NUMBER_CHARS", "GrammarConstraint", "GrammarFactory", "MaskStats",
           "strict_schema"]
