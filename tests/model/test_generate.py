"""Generation on top of the forward pass: sampling, stop conditions, streaming, chat templates,
the low-level run() entry point, the CLI and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch  # noqa: F401  tiny models are built with torch + transformers (test extras)
from oracle_models import build, prompt  # noqa: E402

from colibri.errors import ColibriError, ContextFullError
from colibri.generate import BUILTIN_TEMPLATES, _StopMatcher
from colibri.model import Model
from colibri.sampling import Sampler, SamplingParams


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _, paths = build("qwen3_moe", tmp_path_factory.mktemp("gen"), ("f32",))
    return paths["f32"]


@pytest.fixture(scope="module")
def model(tiny):
    return Model(tiny, threads=2, ctx=256, max_batch=32)


# ---- sampling ----------------------------------------------------------------------------

def test_temperature_zero_and_top_k_one_are_greedy():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == int(np.argmax(logits))
    s = Sampler(SamplingParams(temperature=1.5, top_k=1, seed=3))
    assert all(s.sample(logits) == int(np.argmax(logits)) for _ in range(20))


def test_top_k_candidates_are_the_k_largest_ties_to_lower_ids():
    def _top_k(x, k):
        p = SamplingParams(temperature=1.0, top_k=k, top_p=1.0, min_p=0.0)
        return np.sort(Sampler(p).distribution(x)[0])

    rng = np.random.default_rng(1)
    for trial in range(60):
        n = 262144 if trial % 3 == 0 else int(rng.integers(2, 5000))
        x = rng.standard_normal(n).astype(np.float32)
        if trial % 2:
            x = np.round(x * 2).astype(np.float32)  # many ties at the k-th value
        if trial % 5 == 0:
            x[rng.integers(0, n, size=min(n, 40))] = -np.inf
        k = int(rng.integers(1, min(n, 300)))
        got = _top_k(x, k)
        # reference: a full sort by (value descending, id ascending)
        ref = np.sort(np.lexsort((np.arange(n), -x))[:k])
        assert np.array_equal(got, ref), (trial, n, k)


def test_seeded_sampling_is_reproducible_and_seeds_differ():
    logits = np.random.default_rng(1).standard_normal(500).astype(np.float32)
    a = Sampler(SamplingParams(seed=7, top_k=0, top_p=1.0, min_p=0.0))
    b = Sampler(SamplingParams(seed=7, top_k=0, top_p=1.0, min_p=0.0))
    assert [a.sample(logits) for _ in range(50)] == [b.sample(logits) for _ in range(50)]
    c = Sampler(SamplingParams(seed=8, top_k=0, top_p=1.0, min_p=0.0))
    assert [a.sample(logits) for _ in range(50)] != [c.sample(logits) for _ in range(50)]


def test_filters_keep_only_allowed_tokens():
    # probabilities 0.5, 0.25, 0.125, ... : top_p=0.7 keeps the first two, min_p=0.3 too
    logits = np.log(0.5 ** np.arange(1, 11)).astype(np.float32)
    for params in (SamplingParams(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0, seed=1),
                   SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, seed=1),
                   SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=1)):
        s = Sampler(params)
        seen = {s.sample(logits) for _ in range(300)}
        assert seen == {0, 1}, params


def test_sampling_frequencies_follow_the_temperature():
    logits = np.array([0.0, np.log(3.0)], dtype=np.float32)  # p = 1/4, 3/4 at T=1
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    n1 = sum(s.sample(logits) for _ in range(4000))
    assert abs(n1 / 4000 - 0.75) < 0.03
    s = Sampler(SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    n1 = sum(s.sample(logits) for _ in range(4000))
    want = np.sqrt(3) / (1 + np.sqrt(3))  # p ∝ exp(l / 2)
    assert abs(n1 / 4000 - want) < 0.03


def _full_sort_distribution(x, p):
    """The sampling filters as written in their definition: sort the whole vocabulary, top-k,
    top-p and min-p on the temperature-1 probabilities of the top-k, temperature softmax."""
    n = x.shape[0]
    k = p.top_k if 0 < p.top_k < n else n
    order = np.argsort(-x, kind="stable")[:k]
    lx = x[order].astype(np.float64)
    probs = np.exp(lx - lx[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        order, lx, probs = order[:keep], lx[:keep], probs[:keep]
    if p.min_p > 0.0:
        keep_m = probs >= p.min_p * probs[0]
        order, lx = order[keep_m], lx[keep_m]
    w = np.exp(lx / p.temperature - (lx / p.temperature).max())
    return order, w / w.sum()


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])
@pytest.mark.parametrize("filters", [dict(top_k=40, top_p=0.95, min_p=0.05),
                                     dict(top_k=0, top_p=0.9, min_p=0.0),
                                     dict(top_k=0, top_p=1.0, min_p=0.1),
                                     dict(top_k=0, top_p=1.0, min_p=1e-5),
                                     dict(top_k=0, top_p=0.5, min_p=0.01),
                                     dict(top_k=7, top_p=1.0, min_p=0.0),
                                     dict(top_k=0, top_p=1.0, min_p=0.0)])
def test_distribution_equals_the_full_sort(scale, filters):
    # the thresholded candidates must keep exactly the tokens (and weights) of a full sort:
    # flat logits (scale 0.3: the top-p mass is spread over thousands of tokens), peaked ones
    # (30), ties (rounded values) and banned tokens (-inf)
    rng = np.random.default_rng(int(scale * 10) + len(filters))
    for trial in range(4):
        x = (rng.standard_normal(50_000) * scale).astype(np.float32)
        if trial % 2:
            x = np.round(x)
        x[rng.integers(0, x.size, 100)] = -np.inf
        p = SamplingParams(temperature=0.7, **filters)
        order, w = Sampler(p).distribution(x)
        ref_order, ref_w = _full_sort_distribution(x, p)
        if filters["top_k"] == 0 and filters["top_p"] == 1.0 and filters["min_p"] == 0.0:
            # the whole vocabulary in token order: compare as a distribution over tokens
            full = np.zeros(x.size)
            full[order] = w
            ref = np.zeros(x.size)
            ref[ref_order] = ref_w
            np.testing.assert_allclose(full, ref, rtol=1e-5, atol=1e-12)  # float32 exp
            continue
        assert order.tolist() == ref_order.tolist()
        np.testing.assert_allclose(w, ref_w, rtol=1e-9)


def test_sampling_rejects_non_finite_logits():
    for bad, word in ((np.array([0.0, np.nan], np.float32), "NaN"),
                      (np.array([0.0, np.inf], np.float32), r"\+inf"),
                      (np.array([-np.inf, -np.inf], np.float32), "all -inf"),
                      (np.array([], np.float32), "empty")):
        for t in (0.0, 0.8):
            with pytest.raises(ValueError, match=word):
                Sampler(SamplingParams(temperature=t)).sample(bad)


def test_repeat_penalty_matches_llama_cpp_rule():
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    s = Sampler(SamplingParams(repeat_penalty=2.0))
    out = s.penalise(logits, [0, 1, 1])
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=1.0),
                                 dict(repeat_penalty=0), dict(top_k=-1)])
def test_bad_sampling_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad).validate()


# ---- stop strings ------------------------------------------------------------------------

def test_stop_string_across_pieces_is_held_back_and_cut():
    m = _StopMatcher(["</end>"])
    out = []
    for piece in ["Hello </", "en", "d> world"]:
        text, stopped = m.push(piece)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "Hello " and stopped


def test_text_that_only_looks_like_a_stop_start_is_released():
    m = _StopMatcher(["STOP"])
    a, s1 = m.push("ST")
    b, s2 = m.push("ay")
    assert (a, s1) == ("", False) and (b, s2) == ("STay", False)


# ---- the model ---------------------------------------------------------------------------

def test_greedy_generate_equals_argmax_loop_and_stream_joins_to_it(model):
    ids = prompt(10, seed=4)
    text = model.generate(ids, max_tokens=12, temperature=0)
    seq = model.new_sequence()
    logits = model.eval([seq], tokens=ids)
    got = []
    for _ in range(12):
        got.append(int(np.argmax(logits[-1])))
        logits = model.eval([seq], tokens=[got[-1]])
    model.free_sequence(seq)
    eog = {2}
    if any(t in eog for t in got):
        got = got[: [t in eog for t in got].index(True)]
    assert text == model.detokenize(got)
    assert "".join(model.stream(ids, max_tokens=12, temperature=0)) == text
    assert model.last_stats.generated_tokens == len(got)


def test_seeded_generation_is_reproducible(model):
    ids = prompt(8, seed=5)
    a = model.generate(ids, max_tokens=10, temperature=1.0, seed=11)
    b = model.generate(ids, max_tokens=10, temperature=1.0, seed=11)
    assert a == b


class _CountingForward:
    """A Model's forward context, counting the single-token shortcut's calls."""

    def __init__(self, fw):
        self.fw, self.shortcuts = fw, 0

    def __getattr__(self, name):
        return getattr(self.fw, name)

    def decode_one(self, *args):
        self.shortcuts += 1
        return self.fw.decode_one(*args)


def test_single_token_eval_shortcut_matches_the_general_path(tiny):
    """eval([seq], tokens=[t]) with plain ints takes a shortcut (Model._decode_one: fewer
    Python and numpy calls a decode step); the same steps through the general path (numpy
    ids) give the same logits bit for bit, the same lengths and the same errors."""
    m = Model(tiny, threads=2, ctx=8, max_batch=8)
    m._fw = counting = _CountingForward(m._fw)
    a, b = m.new_sequence(), m.new_sequence()
    ids = prompt(4, seed=3)
    assert np.array_equal(m.eval([a], tokens=ids), m.eval([b], tokens=ids))
    t = 5
    for _ in range(4):  # up to the context's 8 tokens
        fa = m.eval([a], tokens=[t])
        fb = m.eval(np.array([b]), tokens=np.array([t]))
        assert fa.shape == fb.shape == (1, m.n_vocab) and fa.dtype == fb.dtype == np.float32
        assert np.array_equal(fa, fb)
        assert m.sequence_length(a) == m.sequence_length(b)
        t = int(np.argmax(fa[0]))
    assert counting.shortcuts == 4
    with pytest.raises(ColibriError, match="context full"):
        m.eval([a], tokens=[1])
    assert m.sequence_length(a) == 8
    c = m.new_sequence()
    with pytest.raises(ValueError, match="out of the vocabulary"):
        m.eval([c], tokens=[m.n_vocab])
    with pytest.raises(TypeError):
        m.eval([c], tokens=[True])
    errors = []
    for seqs in ([12345], np.array([12345])):  # not a live sequence: the same error both ways
        with pytest.raises(Exception) as e:
            m.eval(seqs, tokens=[1])
        errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1]
    assert m.sequence_length(c) == 0


def test_context_full_is_an_error_or_a_chosen_stop(tiny):
    small = Model(tiny, threads=1, ctx=16, max_batch=16)
    ids = prompt(12, seed=6)
    out = small.generate(ids, max_tokens=10, temperature=0, on_context_full="stop")
    assert small.last_stats.stop_reason == "context_full"
    # 12 + 4 tokens fill the cache, the logits of the last give a 5th
    assert small.last_stats.generated_tokens == 16 - 12 + 1 and out
    # the error keeps what was generated: the same text the chosen stop returns
    with pytest.raises(ContextFullError, match="context full after 5 generated tokens") as e:
        small.generate(ids, max_tokens=10, temperature=0)
    assert isinstance(e.value, ColibriError)
    assert (e.value.text, e.value.generated_tokens, e.value.ctx, e.value.prompt_tokens) == (
        out, 5, 16, 12)
    # a stream yields every piece (the held-back tail included) before the error
    pieces = []
    with pytest.raises(ContextFullError):
        for piece in small.stream(ids, max_tokens=10, temperature=0):
            pieces.append(piece)
    assert "".join(pieces) == out
    with pytest.raises(ContextFullError, match="the prompt has 20 tokens") as e:
        small.generate(prompt(20, seed=1), max_tokens=1)
    assert (e.value.text, e.value.prompt_tokens, e.value.ctx) == ("", 20, 16)
    # the cache is empty again afterwards
    assert small.kv.sequences() == []


def test_cli_run_keeps_what_a_full_context_let_it_generate(tiny):
    """`run --ctx N -n M` past the context prints what it generated and says the context is
    full in the command line's words (--ctx), never a Python argument; a prompt longer than
    the context is a one-line error naming --ctx."""
    text = "hello world"
    n_prompt = len(Model(tiny, threads=1).tokenize(text))
    ctx = n_prompt + 6
    ref = Model(tiny, threads=1, ctx=ctx)
    expected = ref.generate(text, max_tokens=100, temperature=0, on_context_full="stop")
    assert ref.last_stats.stop_reason == "context_full" and expected
    run = subprocess.run([sys.executable, "-m", "colibri", "run", "-m", tiny, "--ctx", str(ctx),
                          "-n", "100", "--temp", "0", "--threads", "1", "-p", text],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected + "\n"
    assert "stopped after 7 generated tokens" in run.stderr
    assert f"--ctx {ctx}" in run.stderr
    assert "Model(" not in run.stderr and "on_context_full" not in run.stderr
    assert "Traceback" not in run.stderr
    long = subprocess.run([sys.executable, "-m", "colibri", "run", "-m", tiny, "--ctx", "8",
                           "-n", "4", "--threads", "1", "-p", "hello world " * 8],
                          capture_output=True, text=True, timeout=300)
    assert long.returncode == 1
    err = long.stderr.strip().splitlines()
    assert len(err) == 1 and "--ctx" in err[0] and "Model(" not in err[0], long.stderr


def test_run_with_embeddings_equals_logits_of_each_sequence(model):
    seqs = [prompt(n, seed=20 + n) for n in (3, 7, 5)]
    emb = np.zeros((3, 7, model.n_embd), dtype=np.float32)
    for i, s in enumerate(seqs):
        emb[i, : len(s)] = model.embed(s)
    out = model.run(emb, [len(s) for s in seqs])
    for i, s in enumerate(seqs):
        ref = model.logits(s)
        assert np.abs(out[i, : len(s)] - ref).max() <= 1e-5 * np.abs(ref).max()
        assert not out[i, len(s):].any()
    with pytest.raises(ValueError):
        model.run(emb, [3, 8, 5])


def test_env_knobs_and_bad_values(tiny, monkeypatch):
    monkeypatch.setenv("COLIBRI_MAX_BATCH", "7")
    monkeypatch.setenv("COLIBRI_KV_CACHE_SIZE", "100")
    monkeypatch.setenv("COLIBRI_ROUTING_THREADS", "1")
    m = Model(tiny)
    assert (m.max_batch, m.ctx, m.threads) == (7, 100, 1)
    assert Model(tiny, max_batch=3).max_batch == 3  # the argument wins
    long = prompt(20, seed=3)  # more than one batch of 7
    assert np.allclose(m.logits(long), Model(tiny, max_batch=32).logits(long), rtol=0, atol=1e-4)
    monkeypatch.setenv("COLIBRI_MAX_BATCH", "many")
    with pytest.raises(ValueError, match="COLIBRI_MAX_BATCH"):
        Model(tiny)


def test_gemma_chat_template_renders_the_published_format():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"}]
    text = env.from_string(BUILTIN_TEMPLATES["gemma"]).render(
        messages=msgs, add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")
    assert text == ("<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
                    "<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n"
                    "<start_of_turn>model\n")


# ---- the command line --------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_run_streams_and_prints_stats(tiny):
    r = _cli("run", "-m", str(tiny), "-p", "hello world", "-n", "6", "--temp", "0",
             "--threads", "1")
    assert r.returncode == 0, r.stderr
    for field in ("load", "prompt", "tok/s", "generated", "ttft", "peak rss", "expert hit rate"):
        assert field in r.stderr, field


def test_cli_errors_are_one_line(tmp_path):
    r = _cli("run", "-m", str(tmp_path / "missing.gguf"), "-p", "x")
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    r = _cli("run", "-m", str(bad), "-p", "x")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    from gguf_util import write_gguf

    odd = tmp_path / "odd.gguf"
    write_gguf(odd, "mamba", {}, {"token_embd.weight": np.zeros((4, 32), np.float32)})
    r = _cli("run", "-m", str(odd), "-p", "x")
    assert r.returncode == 1 and "mamba" in r.stderr and "gemma3" in r.stderr
    assert "Traceback" not in r.stderr


def test_two_threads_generating_at_once_get_what_each_gets_alone(model):
    import threading

    prompts = [prompt(9, seed=40), prompt(6, seed=41)]
    alone = [model.generate(p, max_tokens=10, temperature=0) for p in prompts]
    out: list[str | None] = [None, None]

    def work(i: int) -> None:
        out[i] = model.generate(prompts[i], max_tokens=10, temperature=0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out == alone
