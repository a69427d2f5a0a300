"""Every `COLIBRI_*` setting in one place: name, type, default, parser and help.

`Model` arguments, the command line and `colibri doctor` read settings through `resolve()`:
the argument when given (checked by the same parser, the error naming the argument), else the
environment variable (the error naming the variable), else the default. README.md's table of
environment knobs is checked against `VARIABLES` by the test suite, so the two cannot drift.

Build-time variables (read by setup.py, which cannot import the package it builds) are listed
here too, with `build=True`, so that the documentation and `colibri doctor` know them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A setting (a Model argument or a COLIBRI_* variable) has a value colibri cannot use."""


_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 10**6, "MB": 10**6, "G": 10**9,
          "GB": 10**9, "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40}


def positive_int(value: Any) -> int:
    """A positive integer: an int (not a bool or a float) or, from the environment, digits."""
    import numbers

    if isinstance(value, str):
        digits = value.strip().lstrip("+")
        if not digits.isdigit():
            raise ValueError("expected a positive integer")
        value = int(digits)
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"expected a positive integer, got {type(value).__name__}")
    if int(value) <= 0:
        raise ValueError("expected a positive integer")
    return int(value)


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1 or 0 (true/false, yes/no, on/off)")


def thread_count(value: Any) -> int:
    """A number of compute threads: a positive integer no larger than the thread pool's limit
    (CB_THREADPOOL_MAX_THREADS), checked before anything is loaded."""
    from colibri._core._quant import THREADPOOL_MAX_THREADS

    n = positive_int(value)
    if n > THREADPOOL_MAX_THREADS:
        raise ValueError(f"{n} threads: at most {THREADPOOL_MAX_THREADS} (this machine has "
                         f"{os.cpu_count() or 1} cores)")
    return n


def choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower() if isinstance(value, str) else value
        if text not in options:
            raise ValueError("expected one of " + ", ".join(repr(o) for o in options))
        return str(text)

    parse.__doc__ = "one of " + ", ".join(options)
    return parse


BUDGET_FORMS = ("bytes with a unit (4GB, 512MiB), a whole number of bytes (4000000000), a "
                "fraction of the experts' size in (0, 1] such as 0.5, or auto")


def budget(value: Any) -> str | float | int:
    """An expert budget, one syntax for Model arguments, COLIBRI_*_BUDGET variables and the
    command line: "auto"; bytes with a unit ("4GB", "1.5GiB", "512MiB"); a whole number of
    bytes (an int, "4000000000", "4e9"); or a fraction in (0, 1] of the experts' size (a float,
    or a string with a decimal point and no unit: "0.5", "1.0"). Anything else is an error
    naming these forms: "2.0" (a point and above 1: a fraction out of range, not 2 bytes),
    "1e-9" (not a whole number of bytes), 2.0 (a float is a fraction). Returns "auto", a float
    fraction or an int number of bytes."""
    import decimal
    import numbers

    if isinstance(value, bool):
        raise ValueError(f"expected {BUDGET_FORMS}")
    if isinstance(value, numbers.Integral):
        if int(value) <= 0:
            raise ValueError(f"bytes must be positive; expected {BUDGET_FORMS}")
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        if not (math.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError(f"a float is a fraction of the experts' size and must be in (0, 1]; "
                             f"expected {BUDGET_FORMS}")
        return v
    text = str(value).strip().upper().replace(" ", "")
    if text == "AUTO":
        return "auto"
    num = text.rstrip("KMGTIB")
    unit = text[len(num):]
    try:
        number = decimal.Decimal(num)
    except decimal.InvalidOperation:
        raise ValueError(f"expected {BUDGET_FORMS}") from None
    if unit not in _UNITS or not number.is_finite() or number <= 0 or "_" in num:
        raise ValueError(f"expected {BUDGET_FORMS}")
    if unit == "" and "." in num:  # a fraction
        if number > 1:
            raise ValueError(f"a number with a decimal point and no unit is a fraction of the "
                             f"experts' size and must be in (0, 1]; expected {BUDGET_FORMS}")
        return float(number)
    if number.adjusted() > 30:  # ~1e30 and up: no machine's memory (and no Decimal overflow)
        raise ValueError("larger than any machine's memory")
    total = number * _UNITS[unit]
    if total != total.to_integral_value():
        raise ValueError(f"not a whole number of bytes; expected {BUDGET_FORMS}")
    if total >= 2**63:
        raise ValueError("larger than any machine's memory")
    return int(total)


def text(value: Any) -> str:
    return str(value)


@dataclass(frozen=True)
class Variable:
    name: str            # the environment variable
    argument: str | None  # the Model argument (None: no Model argument)
    kind: str            # the kind of value, in words
    default: Any         # None: no default (or computed: see default_help)
    parse: Callable[[Any], Any]
    help: str
    default_help: str = ""
    build: bool = False  # read by setup.py at build time
    secret: bool = False  # its value is never shown (colibri doctor)

    def describe_default(self) -> str:
        return self.default_help or ("none" if self.default is None else str(self.default))


VARIABLES: dict[str, Variable] = {v.name: v for v in [
    Variable("COLIBRI_MAX_BATCH", "max_batch", "positive integer", 512, positive_int,
             "tokens per forward batch"),
    Variable("COLIBRI_KV_CACHE_SIZE", "ctx", "positive integer", 4096, positive_int,
             "KV cache size in tokens, shared by live sequences"),
    Variable("COLIBRI_ROUTING_THREADS", "threads", "positive integer", None, thread_count,
             "threads for the matmuls, attention, routing and experts",
             default_help="all cores"),
    Variable("COLIBRI_EXPERT_MODE", "expert_mode", "mapped | cache | mmap", None,
             choice("mapped", "cache", "mmap"),
             "where routed experts come from: `mapped` (the file mapping, the full-RAM path), "
             "`cache` (a slot pool of the budget, filled with reads) or `mmap` (the mapping "
             "trimmed to the budget)",
             default_help="mapped without a budget or with one that holds every expert, cache "
                          "with a smaller one"),
    Variable("COLIBRI_EXPERT_BUDGET", "expert_budget", "size, fraction or auto", None, budget,
             "bytes of experts kept resident: `4GB`, `512MiB`, a whole number of bytes, a "
             "fraction of the experts' size in (0, 1] such as `0.5`, or `auto`",
             default_help="no budget: every expert mapped"),
    Variable("COLIBRI_DENSE_WEIGHTS", "dense_weights", "copy | mapped", "copy",
             choice("copy", "mapped"),
             "dense matrices (attention, head, dense FFN): `copy` to anonymous memory on huge "
             "pages at load (faster decode), `mapped` read through the file mapping (shared by "
             "processes running the same file)"),
    Variable("COLIBRI_EXPERT_PREFETCH", "prefetch", "boolean", False, boolean,
             "`1`/`0`: prefetch the next layer's predicted experts"),
    Variable("COLIBRI_EXPERT_DIRECT_IO", None, "auto | on | off", "auto",
             choice("auto", "on", "off"),
             "how the cache store reads misses: `auto` with O_DIRECT (past the page cache) "
             "where the file system allows it and experts are large enough (~400 KiB+) for "
             "the 4 KiB alignment to cost little, `on` whatever their size, `off` never"),
    Variable("COLIBRI_EXPERT_USAGE", "expert_usage", "boolean", True, boolean,
             "`1`/`0`: keep a per-model record of expert use (added to at close) and pin the "
             "hottest experts of a budgeted store at load"),
    Variable("COLIBRI_USAGE_DIR", None, "folder", None, text,
             "folder of the expert usage records", default_help="~/.cache/colibri/usage"),
    Variable("COLIBRI_MODELS_DIR", None, "folder", None, text,
             "folder of the model cache (`colibri pull`, `colibri list`, `-m NAME`)",
             default_help="~/.cache/colibri/models"),
    Variable("COLIBRI_CUDA_EXPERT_BUDGET", "cuda_expert_budget", "size or fraction", None, budget,
             "device bytes for routed experts with device=\"cuda\" (`8GB` or a fraction)",
             default_help="every expert on the device"),
    Variable("COLIBRI_CUDA_GEMM_PIPELINE", None, "cp | regs", None, choice("cp", "regs"),
             "the CUDA expert GEMMs: `cp` (cp.async pipeline, sm_80+) or `regs` "
             "(register prefetch)", default_help="cp where the device allows it"),
    Variable("COLIBRI_CUDA_DIR", None, "folder", None, text,
             "folder of the `.cu` kernel sources", default_help="the ones shipped in the package"),
    Variable("COLIBRI_CUDA_CACHE", None, "folder", None, text,
             "folder of compiled kernels (cubins)", default_help="~/.cache/colibri/cuda"),
    Variable("COLIBRI_API_KEY", None, "text", None, text,
             "the API key `colibri serve` requires (`Authorization: Bearer KEY`) when neither "
             "`--api-key` nor `--api-key-file` is given", default_help="no key", secret=True),
    Variable("COLIBRI_PORTABLE", None, "boolean", False, boolean,
             "build for generic x86-64 (SIMD kernels still chosen at run time)", build=True),
    Variable("COLIBRI_DEBUG", None, "boolean", False, boolean, "build `-O0 -g`", build=True),
    Variable("COLIBRI_BUILD_JOBS", None, "positive integer", None, positive_int,
             "compilers run in parallel by the build", default_help="all cores", build=True),
]}


def _variable(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"unknown colibri setting {name!r}") from None


def from_env(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of a COLIBRI_* variable, or its default when unset or empty."""
    var = _variable(name)
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return var.default
    try:
        return var.parse(raw)
    except ValueError as e:
        raise ConfigError(f"{name}={raw!r}: {e}") from None


def resolve(name: str, argument: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """The argument when given (not None), checked by the variable's parser; else the
    environment variable; else the default."""
    var = _variable(name)
    if argument is None:
        return from_env(name, environ)
    label = var.argument or name
    if isinstance(argument, str) and var.kind in ("positive integer", "boolean"):
        # text is the environment's form; a Python argument is the value itself
        raise ConfigError(f"{label}={argument!r}: expected a {var.kind}, not a string")
    try:
        return var.parse(argument)
    except ValueError as e:
        raise ConfigError(f"{label}={argument!r}: {e}") from None


def settings(environ: Mapping[str, str] | None = None) -> list[tuple[Variable, str | None, str]]:
    """(variable, raw value or None, what it means now or the error) for every variable: what
    `colibri doctor` prints (a secret one shown as "<hidden>"). Never raises."""
    env = os.environ if environ is None else environ
    out: list[tuple[Variable, str | None, str]] = []
    for var in VARIABLES.values():
        raw = env.get(var.name)
        if var.secret and raw:
            out.append((var, "<hidden>", "set (hidden)"))
            continue
        try:
            value = from_env(var.name, env)
            shown = var.describe_default() if value is None or raw in (None, "") else repr(value)
        except ConfigError as e:
            shown = f"error: {e}"
        out.append((var, raw, shown))
    return out


__all__ = ["VARIABLES", "ConfigError", "Variable", "budget", "from_env", "resolve", "settings"]
