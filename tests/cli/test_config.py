"""colibri.config, unit by unit: each parser's accepted forms and exact values (from the units'
definitions: K = 1000, KiB = 1024, ...), the boundaries of each range, and the precedence
argument > variable > default with errors naming the argument or the variable."""

from __future__ import annotations

import pytest

from colibri import config as C
from colibri.config import ConfigError


@pytest.mark.parametrize("value,want", [
    (1, 1), (7, 7), ("1", 1), (" 12 ", 12), ("+3", 3), (2**40, 2**40)])
def test_positive_int_accepts(value, want):
    got = C.positive_int(value)
    assert got == want and type(got) is int


@pytest.mark.parametrize("value", [0, -1, "0", "-1", "", "1.5", "x", 1.0, True, False, None,
                                   "1e3"])
def test_positive_int_refuses(value):
    with pytest.raises(ValueError, match="expected a positive integer"):
        C.positive_int(value)


@pytest.mark.parametrize("value,want", [
    (True, True), (False, False), ("1", True), (" TRUE ", True), ("yes", True), ("On", True),
    ("0", False), ("false", False), ("no", False), ("OFF", False), ("", False), ("  ", False)])
def test_boolean_forms(value, want):
    assert C.boolean(value) is want


@pytest.mark.parametrize("value", ["2", "y", "enable", "none"])
def test_boolean_refuses(value):
    with pytest.raises(ValueError, match=r"expected 1 or 0 \(true/false, yes/no, on/off\)"):
        C.boolean(value)


def test_thread_count_limit():
    from colibri._core._quant import THREADPOOL_MAX_THREADS as MAX

    assert C.thread_count(MAX) == MAX and C.thread_count("1") == 1
    with pytest.raises(ValueError, match=f"^{MAX + 1} threads: at most {MAX} "):
        C.thread_count(MAX + 1)
    with pytest.raises(ValueError):
        C.thread_count(0)


def test_choice():
    p = C.choice("cp", "regs")
    assert p(" CP ") == "cp" and p("regs") == "regs" and p.__doc__ == "one of cp, regs"
    for bad in ("c", "", 1, None):
        with pytest.raises(ValueError, match=r"^expected one of 'cp', 'regs'$"):
            p(bad)


@pytest.mark.parametrize("value,want", [
    ("auto", "auto"), (" Auto ", "auto"), (1, 1), (4_000_000_000, 4_000_000_000),
    ("4GB", 4 * 10**9), ("4 gb", 4 * 10**9), ("4G", 4 * 10**9), ("1.5GiB", 3 * 2**29),
    ("512MiB", 512 * 2**20), ("2KiB", 2048), ("3K", 3000), ("3KB", 3000), ("1M", 10**6),
    ("1MB", 10**6), ("2T", 2 * 10**12), ("2TB", 2 * 10**12), ("1TiB", 2**40), ("7B", 7),
    ("7", 7), ("4e9", 4 * 10**9), ("4000000000", 4 * 10**9), ("0.5", 0.5), ("1.0", 1.0),
    ("1.", 1.0), (0.25, 0.25), (1.0, 1.0), ("9223372036854775807", 2**63 - 1),
    ("1e30", None)])
def test_budget_forms(value, want):
    if want is None:  # 1e30 bytes: above 2^63
        with pytest.raises(ValueError, match="larger than any machine's memory"):
            C.budget(value)
        return
    got = C.budget(value)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("value,match", [
    (0, "bytes must be positive"), (-5, "bytes must be positive"), (True, "expected bytes"),
    (0.0, "must be in \\(0, 1\\]"), (1.5, "must be in \\(0, 1\\]"), (2.0, "must be in"),
    (float("nan"), "must be in"), (float("inf"), "must be in"),
    ("2.0", "decimal point and no unit is a fraction"), ("1.0000001", "fraction"),
    ("1e-9", "not a whole number of bytes"), ("0.5B", "not a whole number of bytes"),
    ("0", "expected bytes"), ("-1GB", "expected bytes"), ("4XB", "expected bytes"),
    ("GB", "expected bytes"), ("", "expected bytes"), ("1_000", "expected bytes"),
    ("nan", "expected bytes"), ("inf", "expected bytes"), ("1e31", "larger than any"),
    ("9223372036854775808", "larger than any"), ("8EiB", "expected bytes")])
def test_budget_refuses(value, match):
    with pytest.raises(ValueError, match=match):
        C.budget(value)


def test_precedence_and_errors_name_the_argument_or_the_variable():
    env = {"COLIBRI_MAX_BATCH": "64", "COLIBRI_EXPERT_PREFETCH": "yes"}
    assert C.resolve("COLIBRI_MAX_BATCH", None, env) == 64
    assert C.resolve("COLIBRI_MAX_BATCH", 8, env) == 8
    assert C.resolve("COLIBRI_MAX_BATCH", None, {}) == 512
    assert C.resolve("COLIBRI_MAX_BATCH", None, {"COLIBRI_MAX_BATCH": "  "}) == 512
    assert C.resolve("COLIBRI_EXPERT_PREFETCH", None, env) is True
    assert C.resolve("COLIBRI_EXPERT_PREFETCH", False, env) is False
    assert C.resolve("COLIBRI_EXPERT_BUDGET", "auto", {}) == "auto"
    with pytest.raises(ConfigError, match=r"^max_batch='8': expected a positive integer, "
                                          r"not a string$"):
        C.resolve("COLIBRI_MAX_BATCH", "8", env)
    with pytest.raises(ConfigError, match=r"^prefetch='1': expected a boolean, not a string$"):
        C.resolve("COLIBRI_EXPERT_PREFETCH", "1", {})
    with pytest.raises(ConfigError, match=r"^max_batch=0: expected a positive integer$"):
        C.resolve("COLIBRI_MAX_BATCH", 0, {})
    with pytest.raises(ConfigError, match=r"^COLIBRI_MAX_BATCH='0': expected a positive "
                                          r"integer$"):
        C.resolve("COLIBRI_MAX_BATCH", None, {"COLIBRI_MAX_BATCH": "0"})
    with pytest.raises(ConfigError, match=r"^COLIBRI_EXPERT_DIRECT_IO=1: expected one of"):
        C.resolve("COLIBRI_EXPERT_DIRECT_IO", 1, {})  # no argument name: the variable's
    with pytest.raises(KeyError, match="unknown colibri setting 'COLIBRI_NOPE'"):
        C.resolve("COLIBRI_NOPE")


def test_from_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("COLIBRI_KV_CACHE_SIZE", "123")
    assert C.from_env("COLIBRI_KV_CACHE_SIZE") == 123
    monkeypatch.delenv("COLIBRI_KV_CACHE_SIZE")
    assert C.from_env("COLIBRI_KV_CACHE_SIZE") == 4096


def test_settings_show_values_defaults_errors_and_hide_secrets():
    env = {"COLIBRI_MAX_BATCH": "64", "COLIBRI_KV_CACHE_SIZE": "x", "COLIBRI_API_KEY": "s3cret",
           "COLIBRI_EXPERT_MODE": "", "COLIBRI_DENSE_WEIGHTS": ""}
    rows = {v.name: (raw, shown) for v, raw, shown in C.settings(env)}
    assert list(rows) == list(C.VARIABLES)
    assert rows["COLIBRI_MAX_BATCH"] == ("64", "64")
    assert rows["COLIBRI_KV_CACHE_SIZE"] == (
        "x", "error: COLIBRI_KV_CACHE_SIZE='x': expected a positive integer")
    assert rows["COLIBRI_API_KEY"] == ("<hidden>", "set (hidden)")
    assert rows["COLIBRI_EXPERT_MODE"] == ("", C.VARIABLES["COLIBRI_EXPERT_MODE"].default_help)
    assert rows["COLIBRI_DENSE_WEIGHTS"] == ("", "copy")  # empty: the default, described
    assert rows["COLIBRI_EXPERT_DIRECT_IO"] == (None, "auto")
    assert rows["COLIBRI_EXPERT_BUDGET"] == (None, "no budget: every expert mapped")
    assert rows["COLIBRI_EXPERT_USAGE"] == (None, "True")
    assert rows["COLIBRI_USAGE_DIR"][1] == "~/.cache/colibri/usage"
    assert C.Variable("X", None, "text", None, C.text, "h").describe_default() == "none"
    assert C.settings({"COLIBRI_API_KEY": ""})[
        list(C.VARIABLES).index("COLIBRI_API_KEY")][1:] == ("", "no key")
