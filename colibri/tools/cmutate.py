"""A small mutation driver for the C core (tools/mutation/run.py): operator and boundary swaps
applied to the source, a fixed seeded sample per area, each mutant rebuilt into the area's C
unit tests (tests/c, with ASan/UBSan, -Werror) and run.

Mutations (outside comments, strings, character constants and preprocessor lines):
`<`/`<=`/`>`/`>=` boundary swaps, `==`<->`!=`, `&&`<->`||`, binary `+`<->`-`, `+=`<->`-=`,
`++`<->`--`, `!x` -> `x`, integer constants 0 -> 1, 1 -> 0, n -> n + 1. A mutant that does not
compile (-Werror included) is stillborn: counted apart, never in the score. A test binary
that fails (exit status, sanitizer report) kills it; one that runs past its time limit is a
timeout (killed)."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    file: str  # relative to the checkout
    line: int  # 1-based
    col: int  # 1-based
    orig: str
    new: str
    start: int  # offset in the file
    text: str  # the source line, stripped
    mutated: str = ""  # the line as mutated, stripped

    @property
    def id(self) -> str:
        return f"{Path(self.file).name}:{self.line}:{self.col}:{self.orig}->{self.new}"


def code_mask(src: str) -> list[bool]:
    """True for each character that is code (not a comment, string or character literal, or a
    preprocessor line)."""
    mask = [True] * len(src)
    i, n = 0, len(src)
    line_start = True
    while i < n:
        c = src[i]
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n and not (src[j] == "\n" and src[j - 1] != "\\"):
                j += 1
            mask[i:j] = [False] * (j - i)
            i = j
            continue
        line_start = c == "\n"
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        mask[i:j] = [False] * (j - i)
        i = j
    return mask


_OPS = re.compile(r"<=|>=|==|!=|&&|\|\||\+\+|--|\+=|-=|<<=?|>>=?|->|<|>|\+|-|!")
_SWAP = {"<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"], "==": ["!="], "!=": ["=="],
         "&&": ["||"], "||": ["&&"], "++": ["--"], "--": ["++"], "+=": ["-="], "-=": ["+="]}
_INT = re.compile(r"(?<![\w.])(\d+)([uUlL]*)(?![\w.])")


def sites(path: Path, rel: str) -> list[Mutant]:
    """Every mutation of the file, in source order."""
    src = path.read_text()
    mask = code_mask(src)
    lines = src.split("\n")
    line_of = []
    for k, ln in enumerate(lines):
        line_of.extend([k] * (len(ln) + 1))
    out: list[Mutant] = []

    def add(start: int, orig: str, new: str) -> None:
        k = line_of[start]
        col = start - (src.rfind("\n", 0, start) + 1)
        ln = lines[k]
        out.append(Mutant(rel, k + 1, col + 1, orig, new, start, ln.strip(),
                          (ln[:col] + new + ln[col + len(orig):]).strip()))

    for m in _OPS.finditer(src):
        s, op = m.start(), m.group()
        if not all(mask[s:m.end()]):
            continue
        if op in _SWAP:
            for new in _SWAP[op]:
                add(s, op, new)
        elif op in "+-":
            prev = src[:s].rstrip()[-1:]
            if prev and (prev.isalnum() or prev in "_)]"):  # binary
                add(s, op, "-" if op == "+" else "+")
        elif op == "!":
            add(s, op, "")
    for m in _INT.finditer(src):
        s = m.start()
        if not all(mask[s:m.end()]):
            continue
        v = int(m.group(1))
        news = ["1"] if v == 0 else ["0"] if v == 1 else [str(v + 1)]
        for new in news:
            add(s, m.group(1), new)
    out.sort(key=lambda x: (x.start, x.new))
    return out


def sample(muts: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """A fixed seeded sample of n mutants (all when there are fewer), in source order."""
    if n <= 0 or n >= len(muts):
        return muts
    rng = random.Random(seed)
    return sorted(rng.sample(muts, n), key=lambda x: (x.start, x.new))


def apply(src: str, m: Mutant) -> str:
    return src[:m.start] + m.new + src[m.start + len(m.orig):]


@dataclass
class CResult:
    mutant: Mutant
    status: str  # killed, timeout, survived, stillborn
    detail: str = ""


def prepare(checkout: Path, scratch: Path) -> Path:
    """A copy of what the C tests build from (include, colibri/_core, cuda headers, tests/c)."""
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "colibri").mkdir(parents=True)
    shutil.copytree(checkout / "include", scratch / "include")
    shutil.copytree(checkout / "colibri/_core", scratch / "colibri/_core",
                    ignore=shutil.ignore_patterns("*.so", "*.pyx", "*.pxi", "*.pxd", "*.py",
                                                  "*.pyi", "__pycache__", "*.cpp"))
    shutil.copytree(checkout / "cuda", scratch / "cuda",
                    ignore=shutil.ignore_patterns("*.cu", "*.o", "*.cubin", "*.ptx"))
    # the sanitized objects of an earlier `make -C tests/c` (tools/test.sh builds them first)
    # come along with their times: only the mutated file is compiled again
    shutil.copytree(checkout / "tests/c", scratch / "tests/c",
                    ignore=shutil.ignore_patterns("test_*", "warn.o"))
    for f in (checkout / "tests/c").glob("test_*.c"):
        shutil.copy2(f, scratch / "tests/c" / f.name)
    return scratch


def _build(scratch: Path, ctests: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nice", "-n", "15", "make", "-s", "-C", str(scratch / "tests/c")]
                          + [f"bin/{t}" for t in ctests], capture_output=True, text=True)


def _run_tests(scratch: Path, ctests: tuple[str, ...], limit: float) -> tuple[str, str]:
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1", "PATH": "/usr/bin:/bin"}
    for t in ctests:
        try:
            r = subprocess.run(["nice", "-n", "15", f"./bin/{t}"], cwd=scratch / "tests/c",
                               env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return "timeout", t
        if r.returncode != 0:
            tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            return "killed", f"{t}: {tail[0][:120]}"
    return "survived", ""


def run_area(checkout: Path, scratch: Path, files: tuple[str, ...], ctests: tuple[str, ...],
             n: int, seed: int, log=print) -> tuple[list[CResult], int, float]:
    """Mutates a seeded sample of n mutants per file; returns the results, the number of
    mutation sites and the run time in seconds."""
    t0 = time.monotonic()
    prepare(checkout, scratch)
    for rel in files:  # never trust an object of a mutated file: compiled again from source
        (scratch / "tests/c/bin/obj" / (Path(rel).stem + ".o")).unlink(missing_ok=True)
    b = _build(scratch, ctests)
    if b.returncode != 0:
        raise RuntimeError(f"the unmutated C tests do not build:\n{b.stdout}{b.stderr}")
    t1 = time.monotonic()
    status, detail = _run_tests(scratch, ctests, 600)
    base_s = time.monotonic() - t1
    if status != "survived":
        raise RuntimeError(f"the unmutated C tests fail: {detail}")
    limit = 3 * base_s + 10
    results: list[CResult] = []
    n_sites = 0
    for rel in files:
        path = scratch / rel
        orig = path.read_text()
        muts = sites(path, rel)
        n_sites += len(muts)
        for i, m in enumerate(sample(muts, n, seed)):
            path.write_text(apply(orig, m))
            b = _build(scratch, ctests)
            if b.returncode != 0:
                r = CResult(m, "stillborn")
            else:
                st, det = _run_tests(scratch, ctests, limit)
                r = CResult(m, st, det)
            results.append(r)
            log(f"  [{i + 1}] {r.status:9} {m.id}  {m.text[:70]}")
        path.write_text(orig)
    b = _build(scratch, ctests)  # the objects left behind are the unmutated ones
    if b.returncode != 0:
        raise RuntimeError(f"the unmutated C tests no longer build:\n{b.stdout}{b.stderr}")
    return results, n_sites, time.monotonic() - t0
