"""Structured output: llguidance grammars over colibri's tokenizer vocabulary.

`GrammarFactory(model)` describes the model's vocabulary to llguidance once (every token id's
bytes, control tokens marked as llguidance expects, the end-of-generation ids);
`factory.json_schema(schema)` / `factory.lark(text)` then give a fresh `GrammarConstraint` per
request, the object `Engine.submit(constraint=...)` calls on the engine thread: `mask(logits)`
sets every token the grammar does not allow next to -inf, `advance(token)` moves the parser,
`finished()` says the grammar admits nothing more. The time spent computing masks is kept in
`MaskStats` (the server's /metrics and the serve benchmark report it).
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

    def __init__(self, matcher: Any, n_vocab: int, stats: MaskStats) -> None:
        self._m = matcher
        self._n = n_vocab
        self._stats = stats

    def mask(self, logits: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        if self._m.is_error():
            raise ValueError(f"grammar: {self._m.get_error()}")
        n = logits.shape[0]
        allowed = np.unpackbits(bits, bitorder="little", count=min(n, bits.size * 8)).astype(bool)
        out = np.full(n, -np.inf, dtype=np.float32)
        out[: allowed.size][allowed] = np.asarray(logits, dtype=np.float32)[: allowed.size][allowed]
        self._stats.add(time.perf_counter() - t0)
        return out

    def advance(self, token_id: int) -> None:
        if not self._m.consume_token(int(token_id)):
            raise ValueError(f"grammar: token {token_id} rejected: {self._m.get_error()}")

    def finished(self) -> bool:
        return bool(self._m.is_stopped())

    def copy(self) -> GrammarConstraint:
        """A fresh constraint in this one's state (no grammar compilation)."""
        return GrammarConstraint(self._m.deep_copy(), self._n, self._stats)


class GrammarFactory:
    """llguidance's view of a Model's tokenizer, built once (about 2 s for a 262k vocabulary);
    makes GrammarConstraints."""

    def __init__(self, model: Model) -> None:
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

    def _make(self, grammar: str) -> GrammarConstraint:
        m = self._llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"invalid grammar: {m.get_error()}")
        return GrammarConstraint(m, self.n_vocab, self.stats)

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
        return self._make(grammar)

    def lark(self, text: str) -> GrammarConstraint:
        return self._make(self._llg.LLMatcher.grammar_from_lark(text))


__all__ = ["GrammarConstraint", "GrammarFactory", "MaskStats"]
