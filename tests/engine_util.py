"""The reference a batched engine is held to: one sequence alone, greedy, through Model.eval."""

from __future__ import annotations

import numpy as np

import colibri
from colibri.generate import stop_token_ids


def greedy_alone(m: colibri.Model, ids: list[int], n: int) -> list[int]:
    """Model.generate's greedy path on one sequence: up to n ids, stopping before an
    end-of-generation id."""
    stops = stop_token_ids(m)
    s = m.new_sequence()
    try:
        lg = m.eval([s], ids, logits=[False] * (len(ids) - 1) + [True])[-1]
        out: list[int] = []
        for _ in range(n):
            t = int(np.argmax(lg))
            if t in stops:
                break
            out.append(t)
            lg = m.eval([s], [t])[-1]
        return out
    finally:
        m.free_sequence(s)


def chunked_logits(m: colibri.Model, ids: list[int], chunk: int) -> np.ndarray:
    """A new sequence's logits for ids, evaluated `chunk` tokens at a time (freed after)."""
    s = m.new_sequence()
    try:
        return np.concatenate([m.eval([s], ids[i:i + chunk]) for i in range(0, len(ids), chunk)])
    finally:
        m.free_sequence(s)
