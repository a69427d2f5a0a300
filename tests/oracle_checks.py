"""The checks the per-family oracle tests share (tests/model/test_deepseek2.py,
test_gpt_oss.py, test_llama4.py): colibri's logits against transformers' in one batch and token
by token, greedy continuations in f32 and Q8_0, and sequences batched together equal to each
alone, bit for bit."""

from __future__ import annotations

import numpy as np
from oracle_models import hf_greedy, hf_logits, prompt

from colibri.model import Model


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def open_model(path, **kw) -> Model:
    return Model(path, threads=2, ctx=256, max_batch=64, **kw)


def batch_and_steps(model: Model, hf, ids: list[int]) -> np.ndarray:
    """Logits of ids in one batch (within 1e-4 of transformers') and token by token through
    the KV cache (within 1e-5 of the batch); returns the batch's."""
    batch = model.logits(ids)
    assert rel_err(batch, hf_logits(hf, ids)) < 1e-4
    seq = model.new_sequence()
    steps = np.concatenate([model.eval([seq], tokens=[t]) for t in ids])
    model.free_sequence(seq)
    assert rel_err(steps, batch) < 1e-5
    return batch


def greedy(model: Model, start: list[int], n: int) -> list[int]:
    s = model.new_sequence()
    lg = model.eval([s], tokens=start)
    got: list[int] = []
    for _ in range(n):
        got.append(int(np.argmax(lg[-1])))
        lg = model.eval([s], tokens=[got[-1]])
    model.free_sequence(s)
    return got


def greedy_f32_and_q8_0(hf, paths, n: int = 24, q8_need: int = 22) -> None:
    """transformers' greedy continuation: all n tokens from the f32 file, q8_need of them
    from the Q8_0 one."""
    start = prompt(12, seed=2)
    want = hf_greedy(hf, start, n)
    for path, need in ((paths["f32"], n), (paths["q8_0"], q8_need)):
        got = greedy(open_model(path), start, n)
        assert sum(a == b for a, b in zip(got, want, strict=True)) >= need, (path, got, want)


def batched_equal_alone(model: Model, seed: int) -> None:
    """Three sequences of 5, 17 and 11 tokens interleaved in one batch, each at its own
    positions, give each one's logits alone, bit for bit (batch invariance)."""
    prompts = [prompt(n, seed=seed + n) for n in (5, 17, 11)]
    alone = [model.logits(p) for p in prompts]
    seqs = [model.new_sequence() for _ in prompts]
    order = [(i, t) for t in range(17) for i, p in enumerate(prompts) if t < len(p)]
    out = model.eval([seqs[i] for i, _ in order], tokens=[prompts[i][t] for i, t in order])
    for row, (i, t) in enumerate(order):
        assert np.array_equal(out[row], alone[i][t]), (i, t)
    for s in seqs:
        model.free_sequence(s)
