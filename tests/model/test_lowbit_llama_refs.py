"""Issue 45's end-to-end check: the low-bit files llama.cpp's own `llama-quantize` makes (with
an importance matrix from `llama-imatrix` where the type needs one), against llama.cpp's outputs
on them. tools/quantize_lowbit_refs.py made the files (tests/data/lowbit/*.gguf, the MoE bench
model of shape tiny-lowbit: colibri/tools/lowbit_refs.py) and recorded llama-cpp-python 0.3.36's
logits in tests/data/llama_refs/lowbit.npz; this checks colibri against the recording without
llama.cpp:
- the files are the recorded ones (SHA-256) and hold the types llama.cpp's recipes give this
  shape (EXPECTED, read from llama.cpp's llama-quant.cpp of that release), and colibri's model
  description reads every matrix in the file's type: a change of the tool cannot silently test
  Q4_0 or Q8_0 instead;
- teacher-forced top-1 agreement on every position of both prompts, mean KL(llama.cpp ||
  colibri) over llama.cpp's top 64 tokens plus a bucket for the rest, and all 16 greedy tokens
  of both prompts (THRESHOLDS: from the values measured at recording);
- the expert store under a 25% budget gives the full-RAM logits bit for bit;
- batch invariance on the IQ2_XXS and Q3_K_M files (and the others).
A missing file or recording fails: nothing here is skipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.gguf import GGUFFile
from colibri.model import Model
from colibri.tools import lowbit_refs as lr

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = DATA / "lowbit"
REFS = DATA / "llama_refs" / "lowbit.npz"

# the types llama-quantize (llama-cpp-python 0.3.36's llama.cpp, src/llama-quant.cpp) gives this
# one-layer model of 4 experts and 2 KV-head groups (n_gqa 2), per tensor:
# (token_embd, attn_q, attn_k, attn_v, attn_output, ffn_gate_exps, ffn_up_exps, ffn_down_exps,
#  output); norms and the router stay F32
ROLES = ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
         "blk.0.attn_output.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
         "blk.0.ffn_down_exps.weight", "output.weight")
EXPECTED: dict[str, tuple[str, ...]] = {}

_refs: dict[str, object] = {}


def refs():
    if "r" not in _refs:
        _refs["r"] = np.load(REFS)
    return _refs["r"]


def path(name: str) -> Path:
    p = FILES / f"{name}.gguf"
    assert p.is_file(), f"{p} is missing: rerun tools/quantize_lowbit_refs.py"
    return p


def test_the_recording_covers_every_recipe():
    r = refs()
    assert r["names"].tolist() == lr.NAMES
    assert int(r["top_k"]) == lr.TOP_K
    assert str(r["llama_cpp_version"]) == "0.3.36"
    assert lr.sha256(FILES / "imatrix.txt") == str(r["imatrix_text_sha256"])
    total = sum(path(n).stat().st_size for n in lr.NAMES)
    assert total < 8 << 20, total  # the committed files stay small


@pytest.mark.parametrize("name", lr.NAMES)
def test_files_hold_llama_cpps_types(name):
    r = refs()
    p = path(name)
    assert lr.sha256(p) == str(r[f"{name}__sha256"]), (
        f"{p} is not the recorded file: rerun tools/quantize_lowbit_refs.py")
    names = r[f"{name}__tensor_names"].tolist()
    types = dict(zip(names, r[f"{name}__tensor_types"].tolist(), strict=True))
    f = GGUFFile(str(p))
    try:
        assert {n: t.type_name for n, t in f.tensors.items()} == types
    finally:
        f.close()
    assert tuple(types[n] for n in ROLES) == EXPECTED[name], {n: types[n] for n in ROLES}
    assert all(t == "F32" for n, t in types.items() if n not in ROLES)
    import gguf

    want = {k: int(gguf.GGMLQuantizationType[types[n]]) for k, n in
            (("tok_embd", ROLES[0]), ("output", ROLES[8]))}
    lwant = {k: int(gguf.GGMLQuantizationType[types[n]]) for k, n in
             zip(("wq", "wk", "wv", "wo", "exp_gate", "exp_up", "exp_down"), ROLES[1:8],
                 strict=True)}
    with Model(str(p), threads=1, ctx=64, tokenizer=False, verbose=False) as m:
        got = {k: v.type for k, v in m.desc.c_fields().items() if k in want}
        lgot = {k: v.type for k, v in m.desc.layers[0].c_fields().items() if k in lwant}
    assert got == want and lgot == lwant, (got, lgot)


# measured at recording (colibri at the commit that added this file)
TOP1 = 1.0
KL_MEAN = 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", lr.NAMES)
def test_agreement_with_llama_cpp(name):
    r = lr.compare(path(name), refs(), name)
    print(name, r)
    assert r["top1"] >= TOP1 and r["kl_mean"] < KL_MEAN, r
    assert r["greedy"] == [lr.N_GREEDY] * len(lr.prompts()), r


def _run(p: Path, **kw) -> tuple[np.ndarray, list[int], dict, dict]:
    """Teacher-forced logits of both prompts, the first prompt's greedy tokens, the expert
    store's statistics and description."""
    with Model(str(p), threads=2, ctx=256, max_batch=1, tokenizer=False, verbose=False,
               expert_usage=False, **kw) as m:
        ps = lr.prompts()
        logits = np.concatenate([m.logits(ids) for ids in ps])
        tokens = lr.greedy(m, ps[0], lr.N_GREEDY)
        stats, info = m.expert_stats(), m.expert_info()
    return logits, tokens, stats, info


@pytest.mark.parametrize("name", lr.NAMES)
def test_expert_budget_gives_the_full_ram_logits(name):
    """A 25% budget (1 of the 4 experts, raised to the 2 one decode token routes to: the
    store's floor at max_batch 1) evicts on most tokens; the logits and greedy tokens are the
    mapped store's bit for bit."""
    full, tokens, _, info = _run(path(name))
    assert info["mode"] == "mapped"
    for kw in (dict(expert_budget=0.25), dict(expert_budget=0.25, expert_mode="mmap")):
        got, got_tokens, stats, info = _run(path(name), **kw)
        assert np.array_equal(got, full), (name, kw)
        assert got_tokens == tokens, (name, kw)
        if info["mode"] == "cache":
            assert info["n_slots"] == 2, info
            # the budget is real: most of the 160 tokens' experts had to be read again
            assert stats["misses"] > 100 and stats["evictions"] > 100, stats


@pytest.mark.parametrize("name", lr.NAMES)
def test_batch_invariance(name):
    """A sequence's logits are bit-identical whether its tokens run alone, in chunks or one by
    one (each chunk size picks another kernel path)."""
    with Model(str(path(name)), threads=2, ctx=256, max_batch=64, tokenizer=False,
               verbose=False) as m:
        ids = lr.prompts()[1][:40]

        def run(chunk: int) -> np.ndarray:
            s = m.new_sequence()
            out = [m.eval([s], ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
            m.free_sequence(s)
            return np.concatenate(out)

        whole = run(len(ids))
        for chunk in (1, 3, 5, 16):
            assert np.array_equal(run(chunk), whole), (name, chunk)
