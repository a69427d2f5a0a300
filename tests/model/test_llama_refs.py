"""The real pretrained model (Gemma 3 270M, Q4_K_M) against llama.cpp: outputs recorded with
tools/record_llama_refs.py (llama-cpp-python) and checked here without it, over three prompts
of 200+ tokens.

Two comparisons, because of what 8-bit activations do to this model:
- The same weights dequantized to F32 (no activation rounding in either engine): colibri and
  llama.cpp compute the same function, so teacher-forced top-1 agreement must be at least 99%
  (measured: 100%), mean KL below 0.001 (measured < 1e-5), and the greedy continuation of every
  prompt identical for its first 32 tokens.
- The Q4_K_M file as it is (both engines quantize activations to 8 bits, as llama.cpp does):
  mean KL below 0.01 nats per token (measured 0.009), top-1 agreement at least 95% (measured
  96.5%) AND no more than one point below llama.cpp's agreement with itself, and greedy
  continuations that reproduce llama.cpp's at least as far as llama.cpp's own second path
  does (see the greedy test). llama.cpp's agreement with itself is
  recorded too: the same prompts fed one token at a time (its decode kernels, a different
  rounding order of the same 8-bit arithmetic) agree with its batched logits on only 96.4% of
  positions (mean KL 0.0072). The 99% top-1 of the issue is therefore below llama.cpp's own
  reproducibility on this file: with 8-bit activations Gemma 3's rounding is chaotic -
  perturbing the input embeddings by one part in a million makes colibri disagree with ITSELF
  on 6% of positions - and the kernels are shown equal to ggml's own vec_dot per block type
  elsewhere (2.5e-7 relative for the K-quants; 1e-4 for Q8_0 activations, whose scale ggml
  stores in f16).

KL(llama.cpp || colibri) is computed over llama.cpp's 256 most likely tokens plus one bucket
for the rest of the vocabulary (a lower bound of the full KL by the data-processing
inequality; the 256 tokens hold almost all of the mass)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.model import Model
from colibri.tools.refs import kl_top, log_softmax, matched

REFS = Path(__file__).resolve().parents[1] / "data" / "llama_refs" / "gemma3_270m.npz"


@pytest.fixture(scope="module")
def refs():
    return np.load(REFS)


@pytest.fixture(scope="module", params=[("f32_", "f32"), ("f32_", "f16"), ("", "f32")],
                ids=["dequantized-f32", "dequantized-f32-kv-f16", "q4_k_m"])
def case(request):
    """(key prefix, model, thresholds) for the dequantized and the quantized comparison; the
    dequantized one also with colibri's f16 KV cache (llama.cpp recorded its default f16 cache:
    the same limits hold, through the f16 attention kernels, cb_*_rows_multi_f16)."""
    prefix, kv = request.param
    model = Model(None, threads=2, ctx=4096, max_batch=512, dequantize=prefix == "f32_",
                  kv_dtype=kv)
    limits = {"top1": 0.99, "kl": 1e-3, "greedy": 32} if prefix else {"top1": 0.95, "kl": 0.01}
    yield prefix, model, limits
    model.close()


@pytest.mark.slow
def test_teacher_forced_agreement_and_kl(refs, case):
    prefix, model, limits = case
    agree, total, kls = 0, 0, []
    for i in range(int(refs["n_prompts"])):
        ids = refs[f"{prefix}ids_{i}"]
        assert len(ids) >= 200
        lp = log_softmax(model.logits(ids.tolist()))
        top_ids = refs[f"{prefix}top_ids_{i}"]
        agree += int((lp.argmax(axis=1) == top_ids[:, 0]).sum())
        total += len(ids)
        kls.append(kl_top(top_ids, refs[f"{prefix}top_logprobs_{i}"], lp))
    kl = float(np.concatenate(kls).mean())
    assert agree / total >= limits["top1"], (agree, total)
    assert kl < limits["kl"], kl
    if not prefix:
        # llama.cpp against itself: batched vs one token at a time, same file
        n = int(refs["n_prompts"])
        self_agree = sum(int((refs[f"decode_top1_{i}"] == refs[f"top_ids_{i}"][:, 0]).sum())
                         for i in range(n)) / total
        assert 0.5 < self_agree < 1.0, self_agree  # the recording holds a real second path
        assert agree / total >= self_agree - 0.01, (agree / total, self_agree)


@pytest.mark.slow
def test_greedy_continuation_matches_llama_cpp(refs, case):
    """Dequantized: every prompt's 32 greedy tokens identical. Q4_K_M: on near-ties a greedy
    continuation follows the rounding, and llama.cpp's own single-token path reproduces its
    batched continuation for only 4, 32 and 13 tokens of the three prompts; colibri must
    reproduce llama.cpp's at least as far in total, and every prompt for 4 tokens."""
    prefix, model, limits = case
    ours, llama_self = [], []
    for i in range(int(refs["n_prompts"])):
        ids = refs[f"{prefix}ids_{i}"].tolist()
        want = refs[f"{prefix}greedy_{i}"].tolist()
        seq = model.new_sequence()
        logits = model.eval([seq], tokens=ids, logits=[False] * (len(ids) - 1) + [True])
        got = []
        for _ in range(len(want)):
            got.append(int(np.argmax(logits[-1])))
            logits = model.eval([seq], tokens=[got[-1]])
        model.free_sequence(seq)
        ours.append(matched(got, want))
        if not prefix:
            llama_self.append(matched(refs[f"decode_greedy_{i}"].tolist(), want))
    if prefix:
        assert min(ours) >= limits["greedy"], ours
    else:
        assert min(ours) >= 4 and sum(ours) >= sum(llama_self), (ours, llama_self)
