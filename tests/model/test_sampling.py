"""The sampler and the stop-string matcher over generated inputs (hypothesis), pinned against
references written from their definitions: llama.cpp's penalties sampler (repeat penalty divides
a positive logit and multiplies a negative one; frequency * count + presence subtracted, over the
last repeat_last_n tokens), the filters of a full sort, numpy's PCG64 inverse-CDF draw. The
edge shapes are in the strategies: histories longer and shorter than the window, a window of 0,
stop strings split at every character, a stop string at the very start or end."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from colibri.generate import _StopMatcher
from colibri.sampling import Sampler, SamplingParams

# derandomize: the same examples every run (the mutation slice of tools/test.sh counts on it)
SET = settings(max_examples=150, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])

# ---- penalties ---------------------------------------------------------------------------


def penalised_reference(logits, history, rp, last_n, freq, pres, bias):
    """llama.cpp's order and rule, one token at a time in float32."""
    out = [np.float32(v) for v in logits]
    for t, b in (bias or {}).items():
        out[t] = np.float32(out[t] + np.float32(b))
    window = list(history)[len(history) - last_n:] if 0 < last_n < len(history) else \
        (list(history) if last_n else [])
    for t, c in Counter(window).items():
        v = out[t]
        if rp != 1.0:
            v = np.float32(v / np.float32(rp)) if v > 0 else np.float32(v * np.float32(rp))
        out[t] = np.float32(v - np.float32(freq * c + pres))
    return np.array(out, dtype=np.float32)


@SET
@given(n=st.integers(1, 12), data=st.data(),
       rp=st.sampled_from([1.0, 0.5, 1.3, 2.0]), last_n=st.integers(0, 30),
       freq=st.sampled_from([0.0, 0.5, -0.25]), pres=st.sampled_from([0.0, 1.0, -0.5]))
def test_penalties_over_windows_longer_and_shorter_than_the_history(n, data, rp, last_n,
                                                                    freq, pres):
    logits = np.array(data.draw(st.lists(st.sampled_from([-3.0, -1.5, -0.0, 0.0, 0.75, 2.0]),
                                         min_size=n, max_size=n)), dtype=np.float32)
    history = data.draw(st.lists(st.integers(0, n - 1), max_size=25))
    bias = data.draw(st.none() | st.dictionaries(st.integers(0, n - 1),
                                                 st.sampled_from([-1.0, 0.5, -math.inf]),
                                                 max_size=3))
    before = logits.copy()
    s = Sampler(SamplingParams(repeat_penalty=rp, repeat_last_n=last_n, frequency_penalty=freq,
                               presence_penalty=pres, logit_bias=bias))
    got = s.penalise(logits, iter(history))  # any iterable, consumed once
    want = penalised_reference(before, history, rp, last_n, freq, pres, bias)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(logits, before)  # the caller's logits are never changed
    if not bias and (last_n == 0 or (rp == 1.0 and freq == 0.0 and pres == 0.0)):
        assert got is logits  # nothing to do: no copy


def test_penalty_window_counts_only_the_last_tokens():
    # the window holds the last 3 tokens [2, 2, 1]: token 0 (seen 4 times before) is untouched
    s = Sampler(SamplingParams(repeat_last_n=3, frequency_penalty=1.0, presence_penalty=0.5))
    out = s.penalise(np.zeros(3, np.float32), [0, 0, 0, 0, 2, 2, 1])
    assert out.tolist() == [0.0, -1.5, -2.5]


def test_greedy_takes_the_argmax_after_penalties_and_bias():
    logits = np.array([3.0, 2.0, 1.0], np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0))
    assert s.sample(logits, [0]) == 1  # 3 / 2 < 2
    assert s.sample(logits) == 0
    b = Sampler(SamplingParams(temperature=0, logit_bias={0: -math.inf, 1: -1.5}))
    assert b.sample(logits) == 2


def test_logit_bias_outside_the_vocabulary_is_an_error():
    s = Sampler(SamplingParams(logit_bias={3: 1.0}))
    with pytest.raises(ValueError, match=r"token id 3 is out of the vocabulary \[0, 3\)"):
        s.penalise(np.zeros(3, np.float32), [])
    assert s.penalise(np.zeros(4, np.float32), []).tolist() == [0, 0, 0, 1.0]


# ---- parameters --------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("temperature", -1e-9), ("temperature", math.nan), ("temperature", math.inf),
    ("temperature", "1"), ("temperature", True), ("top_k", -1), ("top_k", 1.0),
    ("top_k", False), ("top_p", 0.0), ("top_p", 1.0 + 1e-9), ("top_p", -0.5),
    ("min_p", 1.0), ("min_p", -1e-9), ("repeat_penalty", 0.0), ("repeat_penalty", -1.0),
    ("repeat_last_n", -1), ("repeat_last_n", 2.0), ("seed", -1), ("seed", 1.5),
    ("seed", True), ("frequency_penalty", math.nan), ("presence_penalty", "x"),
    ("logit_bias", [1, 2]), ("logit_bias", {-1: 1.0}), ("logit_bias", {1: math.nan}),
    ("logit_bias", {1: True}), ("logit_bias", {1: "1"}), ("logit_bias", {"1": 1.0}),
    ("logit_bias", {True: 1.0})])
def test_each_bad_parameter_is_refused_naming_its_field(field, value):
    name = "logit_bias" if field == "logit_bias" else field
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{field: value}).validate()


def test_the_edges_of_each_range_are_accepted_and_types_normalised():
    p = SamplingParams(temperature=0, top_k=np.int64(0), top_p=1, min_p=0, repeat_penalty=1e-6,
                       repeat_last_n=0, seed=0, frequency_penalty=-2, presence_penalty=np.float32(2),
                       logit_bias={np.int32(5): 1, 0: -math.inf})
    p.validate()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.seed) == (0.0, 0, 1.0, 0.0, 0)
    assert [type(v) for v in (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                              p.repeat_last_n, p.seed, p.frequency_penalty,
                              p.presence_penalty)] == [float, int, float, float, float, int, int,
                                                       float, float]
    assert p.logit_bias == {5: 1.0, 0: -math.inf}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())


# ---- the filters and the draw ------------------------------------------------------------

def full_sort(x, top_k, top_p, min_p, temperature):
    """The definition: sort the whole vocabulary (value descending, ties to the lower id),
    top-k, top-p (the shortest prefix holding top_p of the mass) and min-p on the temperature-1
    probabilities, then the temperature softmax. Returns (ids, weights, ambiguous): ambiguous
    when a float rounding could put a token on either side of a top-p or min-p cut."""
    n = len(x)
    order = sorted(range(n), key=lambda i: (-x[i], i))
    if 0 < top_k < n:
        order = order[:top_k]
    total = sum(math.exp(float(x[i]) - float(x[order[0]])) for i in
                (range(n) if not 0 < top_k < n else order))
    probs = [math.exp(float(x[i]) - float(x[order[0]])) / total for i in order]
    ambiguous = False
    if top_p < 1.0:
        cum, keep = 0.0, len(order)
        for j, pr in enumerate(probs):
            cum += pr
            ambiguous |= abs(cum - top_p) < 1e-6
            if cum >= top_p:
                keep = j + 1
                break
        order, probs = order[:keep], probs[:keep]
    if min_p > 0.0:
        ambiguous |= any(abs(pr / probs[0] - min_p) < 1e-6 for pr in probs)
        kept = [j for j, pr in enumerate(probs) if pr >= min_p * probs[0]]
        order = [order[j] for j in kept]
    t = [float(x[i]) / temperature for i in order]
    w = [math.exp(v - max(t)) for v in t]
    return order, [v / sum(w) for v in w], ambiguous


@SET
@given(data=st.data(), n=st.integers(1, 40), top_k=st.integers(0, 45),
       top_p=st.sampled_from([1.0, 0.999, 0.95, 0.5, 0.1, 1e-3]),
       min_p=st.sampled_from([0.0, 1e-4, 0.05, 0.5, 0.99]),
       temperature=st.sampled_from([0.25, 1.0, 3.0]))
def test_distribution_equals_the_full_sort_on_small_vocabularies(data, n, top_k, top_p, min_p,
                                                                temperature):
    x = np.array(data.draw(st.lists(st.sampled_from([-math.inf, -60.0, -20.0, -5.0, -1.0, 0.0,
                                                     0.5, 1.0, 7.0, 70.0]),
                                    min_size=n, max_size=n)), dtype=np.float32)
    assume(np.isfinite(x).any())
    want_ids, want_w, ambiguous = full_sort(x, top_k, top_p, min_p, temperature)
    assume(not ambiguous)
    s = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
    ids, w = s.distribution(x)
    if top_k in (0,) or top_k >= n:
        if top_p >= 1.0 and min_p == 0.0:  # the whole vocabulary, in token order
            full = np.zeros(n)
            full[ids] = w
            ref = np.zeros(n)
            ref[want_ids] = want_w
            np.testing.assert_allclose(full, ref, rtol=1e-6, atol=1e-300)
            return
    assert ids.tolist() == want_ids
    np.testing.assert_allclose(w, want_w, rtol=1e-9, atol=1e-300)


@SET
@given(seed=st.integers(0, 2**32), n=st.integers(1, 30), data=st.data(),
       top_k=st.sampled_from([0, 1, 3, 40]), temperature=st.sampled_from([0.5, 1.0, 2.0]))
def test_the_draw_is_the_inverse_cdf_of_one_pcg64_uniform(seed, n, data, top_k, temperature):
    x = np.array(data.draw(st.lists(st.floats(-8, 8, width=32), min_size=n, max_size=n)),
                 dtype=np.float32)
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=1.0, min_p=0.0, seed=seed)
    ids, w = Sampler(p).distribution(x)
    rng = np.random.default_rng(seed)
    s = Sampler(p)
    for _ in range(3):
        cdf = np.cumsum(w)
        i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        assert s.sample(x) == int(ids[min(i, len(ids) - 1)])


# ---- stop strings ------------------------------------------------------------------------

def feed(stops, pieces):
    m = _StopMatcher(stops)
    out = []
    for piece in pieces:
        text, stopped = m.push(piece)
        out.append(text)
        if stopped:
            return "".join(out), True, out
    return "".join(out) + m.flush(), False, out


@SET
@given(text=st.text(alphabet="ab<>/é", max_size=14), stop=st.text(alphabet="ab<>/é", min_size=1,
                                                                    max_size=4),
       extra=st.lists(st.text(alphabet="ab<>/é", min_size=1, max_size=3), max_size=2))
def test_stop_strings_split_at_every_character(text, stop, extra):
    stops = [stop, *extra]
    # every split into single characters, and every split of the text in two
    cuts = [list(text)] + [[text[:k], text[k:]] for k in range(len(text) + 1)]
    for pieces in cuts:
        # the definition: generation stops after the first piece that completes a stop
        # string; the answer is the text before the earliest stop string in what came so far
        want, hit, seen = text, False, ""
        for piece in pieces:
            seen += piece
            found = [seen.find(s) for s in stops if s in seen]
            if found:
                want, hit = seen[:min(found)], True
                break
        got, stopped, out = feed(stops, pieces)
        assert (got, stopped) == (want, hit), pieces
        # what was released before the end is a prefix of the answer
        released = "".join(out)
        assert want.startswith(released)


def test_no_stop_strings_release_everything_at_once():
    m = _StopMatcher(["", ""])
    assert m.push("abc") == ("abc", False) and m.flush() == ""


@pytest.mark.parametrize("logits,word", [
    ([], "empty"), ([0.0, math.nan, 1.0], "NaN"), ([-math.inf, math.inf, math.nan], "NaN"),
    ([0.0, math.inf], "+inf"), ([-math.inf, -math.inf], "all -inf"), ([-math.inf], "all -inf")])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_are_refused_with_the_exact_reason(logits, word, temperature):
    want = (f"the model produced {word} logits (non-finite weights or metadata in the model "
            "file?): cannot sample a token")
    with pytest.raises(ValueError) as e:
        Sampler(SamplingParams(temperature=temperature)).sample(np.array(logits, np.float32))
    assert str(e.value) == want


def test_a_draw_at_the_top_of_the_cdf_takes_the_last_candidate():
    class Top:  # a uniform draw of exactly 1.0 (rounding can bring u * total there)
        def random(self) -> float:
            return 1.0

    x = np.array([0.0, 1.0, 2.0, -1.0], np.float32)
    s = Sampler(SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0))
    s.rng = Top()  # type: ignore[assignment]
    assert s.sample(x) == 0  # the candidates are 2, 1, 0 (most likely first)


@pytest.mark.parametrize("temperature,want", [(1.0, [0.25, 0.75]), (2.0, [1 / (1 + 3 ** 0.5),
                                                                         3 ** 0.5 / (1 + 3 ** 0.5)]),
                                              (0.5, [0.1, 0.9])])
def test_the_whole_vocabulary_is_the_temperature_softmax(temperature, want):
    # no filter: every token, in token order, p proportional to exp(logit / T)
    x = np.array([0.0, math.log(3.0)], np.float32)
    s = Sampler(SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0))
    ids, w = s.distribution(x)
    assert ids.tolist() == [0, 1]
    np.testing.assert_allclose(w, want, rtol=1e-6)
    x4 = np.array([5.0, -60.0, 5.0, 4.0], np.float32)
    ids, w = Sampler(SamplingParams(temperature=1.0, top_k=9, top_p=1.0,
                                    min_p=0.0)).distribution(x4)
    e = np.exp(np.array([0.0, -65.0, 0.0, -1.0]))
    assert ids.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(w, e / e.sum(), rtol=1e-6)


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repeat_penalty",
                                   "frequency_penalty", "presence_penalty"])
def test_a_real_field_of_another_type_is_refused_by_its_exact_name(field):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: "0.5"}).validate()
    assert str(e.value) == f"{field} must be a number, got '0.5'"
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: math.inf}).validate()
    assert str(e.value) == f"{field} must be finite, got inf"


@pytest.mark.parametrize("field", ["top_k", "repeat_last_n", "seed"])
def test_an_integer_field_of_another_type_is_refused_by_its_exact_name(field):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: 2.0}).validate()
    assert str(e.value) == f"{field} must be an integer, got 2.0"
