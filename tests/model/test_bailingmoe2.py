"""bailingmoe2 (Ling/Ring 2.0) against llama.cpp, its only reference (transformers has no
BailingMoeV2 class): tests/oracle_models.build_bailingmoe2 writes a seeded tiny checkpoint and
converts it as llama.cpp's converter would; tools/record_bailingmoe2_refs.py recorded llama.cpp's
top-32 log-probabilities at every position of a 40-token prompt and its greedy continuation, for
the f32 and q8_0 files, with each file's SHA-256 (a changed builder fails here, loudly).

Measured (llama-cpp-python 0.3.36): f32 top-1 40/40, largest logit difference 2.1e-4 of the
range; greedy 16/16. The model routes with expert groups (16 experts, 4 groups, 2 compete):
without them the logits move by 0.21 of the range, so the test sees the grouping. Also: the
expert store at a 25% budget gives the full-RAM logits bit for bit, and a batch of sequences of
different lengths gives each one's logits alone."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from oracle_models import build_bailingmoe2

from colibri.model import Model

REFS = Path(__file__).resolve().parents[1] / "data" / "llama_refs" / "bailingmoe2.npz"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    paths = build_bailingmoe2(tmp_path_factory.mktemp("bailing"), ("f32", "q8_0"))
    return {o: str(p) for o, p in paths.items()}


@pytest.fixture(scope="module")
def refs():
    return np.load(REFS)


def _logprobs(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def _greedy(model: Model, start: list[int], n: int) -> list[int]:
    seq = model.new_sequence()
    lg = model.eval([seq], tokens=start)
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(lg[-1])))
        lg = model.eval([seq], tokens=[out[-1]])
    model.free_sequence(seq)
    return out


@pytest.mark.parametrize("outtype, top1_min, kl_max", [("f32", 1.0, 1e-6), ("q8_0", 0.95, 5e-3)])
def test_agrees_with_llama_cpp(files, refs, outtype, top1_min, kl_max):
    path = files[outtype]
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == str(refs[f"{outtype}_sha256"]), \
        "the builder's file differs from the one llama.cpp's outputs were recorded on: rerun " \
        "tools/record_bailingmoe2_refs.py"
    m = Model(path, threads=2, ctx=256, tokenizer=False)
    assert m.desc.expert_groups == 4 and m.desc.expert_groups_used == 2
    assert [L.n_expert for L in m.desc.layers] == [0, 16, 16, 16]
    lp = _logprobs(m.logits(refs["ids"].tolist()))
    top_ids, top_lp = refs[f"{outtype}_top_ids"], refs[f"{outtype}_top_logprobs"]
    top1 = float((lp.argmax(1) == top_ids[:, 0]).mean())
    # KL(llama.cpp || colibri) over llama.cpp's top 32 (their mass, renormalised)
    p = np.exp(top_lp.astype(np.float64))
    p /= p.sum(1, keepdims=True)
    q = np.take_along_axis(lp, top_ids, 1)
    kl = float((p * (np.log(p) - q + np.log(np.exp(q).sum(1, keepdims=True)))).sum(1).mean())
    assert top1 >= top1_min and kl <= kl_max, (top1, kl)
    got = _greedy(m, refs["start"].tolist(), len(refs[f"{outtype}_greedy"]))
    same = sum(a == b for a, b in zip(got, refs[f"{outtype}_greedy"].tolist(), strict=True))
    assert same >= (16 if outtype == "f32" else 14), (got, refs[f"{outtype}_greedy"])


def test_expert_budget_and_batching_change_nothing(files):
    ids = list(range(3, 40))
    full = Model(files["f32"], threads=2, ctx=256, tokenizer=False)
    want = full.logits(ids)
    for mode in ("cache", "mmap"):
        m = Model(files["f32"], threads=2, ctx=256, tokenizer=False, expert_mode=mode,
                  expert_budget=0.25)
        np.testing.assert_array_equal(m.logits(ids), want)
    prompts = [ids[:n] for n in (5, 17, 11)]
    alone = [full.logits(p)[-1] for p in prompts]
    seqs = [full.new_sequence() for _ in prompts]
    toks = [t for p in prompts for t in p]
    sq = [s for s, p in zip(seqs, prompts, strict=True) for _ in p]
    out = full.eval(sq, tokens=toks)
    ends = np.cumsum([len(p) for p in prompts]) - 1
    for i, e in enumerate(ends):
        np.testing.assert_array_equal(out[e], alone[i])
