"""Token sampling, vectorised in numpy, in llama.cpp's default order:
repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw.

temperature == 0 is greedy (the argmax of the penalised logits). A seeded sampler draws the same
tokens run to run (numpy's PCG64 generator).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def validate(self) -> None:
        """Each field of the right type and range; a ValueError naming the field otherwise
        (a string, a bool or a NaN is never coerced)."""
        self.temperature = _real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        self.top_p = _real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.min_p = _real("min_p", self.min_p)
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        self.repeat_penalty = _real("repeat_penalty", self.repeat_penalty)
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        self.repeat_last_n = _integer("repeat_last_n", self.repeat_last_n)
        if self.repeat_last_n < 0:
            raise ValueError(f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if self.seed < 0:
                raise ValueError(f"seed must be >= 0, got {self.seed}")


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return v


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


class Sampler:
    """Draws next tokens from logits under SamplingParams; keeps its own random generator."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def penalise(self, logits: np.ndarray, history: Iterable[int]) -> np.ndarray:
        """llama.cpp's repeat penalty: logits of tokens in the recent history are divided by the
        penalty when positive and multiplied by it when negative."""
        if self.p.repeat_penalty == 1.0 or self.p.repeat_last_n == 0:
            return logits
        hist = list(history)[-self.p.repeat_last_n :]
        if not hist:
            return logits
        ids = np.unique(np.asarray(hist, dtype=np.int64))
        out = logits.copy()
        v = out[ids]
        out[ids] = np.where(v > 0, v / self.p.repeat_penalty, v * self.p.repeat_penalty)
        return out

    def sample(self, logits: np.ndarray, history: Iterable[int] = ()) -> int:
        x = self.penalise(np.asarray(logits, dtype=np.float32), history)
        if x.size == 0 or not np.isfinite(x).any() or np.isnan(x).any() or np.isposinf(x).any():
            # NaN or +inf logits come from a broken model (non-finite weights or norms):
            # there is nothing to sample, and argmax would pick an arbitrary token
            bad = "empty" if x.size == 0 else "NaN" if np.isnan(x).any() else (
                "+inf" if np.isposinf(x).any() else "all -inf")
            raise ValueError(f"the model produced {bad} logits (non-finite weights or "
                             "metadata in the model file?): cannot sample a token")
        if self.p.temperature == 0.0:
            return int(np.argmax(x))
        n = x.shape[0]
        k = self.p.top_k if 0 < self.p.top_k < n else n
        if k < n:
            cand = np.argpartition(-x, k - 1)[:k]
        else:
            cand = np.arange(n)
        order = cand[np.argsort(-x[cand], kind="stable")]
        lx = x[order].astype(np.float64)
        probs = np.exp(lx - lx[0])
        probs /= probs.sum()
        if self.p.top_p < 1.0:
            cum = np.cumsum(probs)
            keep = int(np.searchsorted(cum, self.p.top_p) + 1)
            order, lx, probs = order[:keep], lx[:keep], probs[:keep]
        if self.p.min_p > 0.0:
            keep = probs >= self.p.min_p * probs[0]
            order, lx = order[keep], lx[keep]
        t = lx / self.p.temperature
        w = np.exp(t - t.max())
        w /= w.sum()
        return int(order[self.rng.choice(len(order), p=w)])
