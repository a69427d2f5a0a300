"""Mutation testing of colibri: one command over the areas of tools/mutation/areas.py.

    python tools/mutation/run.py --area sampling --area arena --report docs/MUTATION.md
    python tools/mutation/run.py --slice      # tools/test.sh: a fixed sample, fails below its
                                              # recorded score (tools/mutation/slice_score.txt)

Python areas run under mutmut (3.x) in a copy of the tree (/tmp/colibri-mutation/<area>, the
built extension copied with it, so the tests import the mutated package); C areas under
colibri/tools/cmutate.py (a seeded sample of --sample mutants per file). Score = killed /
(all - listed equivalent), timeouts counting as killed; mutants no test reaches count as
survivors; C mutants that do not compile are stillborn (reported, not counted).
tools/mutation/equivalent.txt lists the equivalent mutants, one a line: the mutant id, then why
it cannot change behaviour. Every run is niced (nice -n 15): it shares the machine."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import areas as A  # noqa: E402

sys.path.insert(0, str(ROOT))  # the checkout's colibri (the mutation code lives in the package)
from colibri.tools import cmutate as cmut  # noqa: E402
from colibri.tools import mutation_report as report  # noqa: E402

# what the tests read besides the package and tests/ (README examples, docs, tools' entry points)
EXTRA = ("README.md", "MANIFEST.in", "setup.py", "docs", "tools", "include", "cuda")
SCRATCH = Path(os.environ.get("COLIBRI_MUTATION_DIR", "/tmp/colibri-mutation"))


def _mutmut_toml(area: A.PyArea) -> str:
    q = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    return ("\n[tool.mutmut]\n"
            'source_paths = ["colibri"]\n'
            # fork from a process that ran no test: the suite leaves threads behind (engines,
            # torch's pools) and a child forked from it can block on a lock held by one
            'process_isolation = "forkserver"\n'
            f"only_mutate = {q(area.files)}\n"
            f"pytest_add_cli_args_test_selection = {q(area.tests)}\n"
            f"also_copy = {q(EXTRA)}\n"
            "pytest_add_cli_args = "
            f"{q(['-p', 'no:cacheprovider', '-q', '-x'] + [f'--deselect={t}' for t in area.deselect])}\n")


def _py_tree(area: A.PyArea) -> Path:
    """A copy of the checkout's package, tests and pyproject.toml (with the area's mutmut
    section) in SCRATCH/<area>."""
    d = SCRATCH / area.name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "bin")
    shutil.copytree(ROOT / "colibri", d / "colibri", ignore=skip)
    shutil.copytree(ROOT / "tests", d / "tests", ignore=skip)
    for x in EXTRA:
        if (ROOT / x).is_dir():
            shutil.copytree(ROOT / x, d / x, ignore=skip)
        else:
            shutil.copy2(ROOT / x, d / x)
    toml = (ROOT / "pyproject.toml").read_text()
    toml = re.sub(r"\n\[tool\.mutmut\].*?(?=\n\[|\Z)", "", toml, flags=re.S)
    (d / "pyproject.toml").write_text(toml + _mutmut_toml(area))
    if not list((d / "colibri/_core").glob("_native*.so")):
        raise SystemExit("tools/mutation: build the extension first "
                         "(python setup.py build_ext --inplace)")
    return d


_GEN = ("import mutmut.__main__ as M\n"
        "from mutmut.configuration import config\n"
        "M.set_mutant_under_test('mutant_generation')\n"
        "M.makedirs('mutants', exist_ok=True)\n"
        "M.copy_src_dir(); M.copy_also_copy_files(); M.setup_source_paths()\n"
        "M.create_mutants(1)\n")


def _mutmut(d: Path, args: list[str], log, wall_s: float) -> set[str]:
    """Runs mutmut in d; returns the mutants stopped by the wall-clock guard. mutmut's own
    timeout is a CPU-time limit, which a test blocked on a lock, a pipe or an event never
    reaches: a mutant process (titled "mutmut: NAME") running past wall_s is killed and
    counted as a timeout."""
    import psutil

    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = ["nice", "-n", "15", sys.executable, "-m", "mutmut", *args]
    stopped: set[str] = set()
    with subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as p:
        done = threading.Event()

        def guard() -> None:
            me = psutil.Process(p.pid)
            while not done.wait(2.0):
                try:
                    kids = me.children(recursive=True)
                except psutil.NoSuchProcess:
                    return
                for k in kids:
                    try:
                        title = " ".join(k.cmdline())
                        if title.startswith("mutmut: ") and \
                                time.time() - k.create_time() > wall_s:
                            stopped.add(title.split()[1])
                            k.kill()
                    except psutil.Error:
                        pass

        t = threading.Thread(target=guard, daemon=True)
        t.start()
        out = p.stdout.read() if p.stdout else ""
        p.wait()
        done.set()
        t.join()
    r = subprocess.CompletedProcess(cmd, p.returncode, out, "")
    if r.returncode != 0:
        log((r.stdout + r.stderr)[-3000:])
        raise SystemExit(f"tools/mutation: mutmut {args[:1]} failed in {d}")
    return stopped


def _metas(d: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for meta in (d / "mutants").rglob("*.meta"):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def run_py(area: A.PyArea, sample: int, seed: int, log, collect: bool = False) -> dict:
    """mutmut over the area in SCRATCH/<area> (collect: only read what a run there, finished
    or not, has recorded so far; mutants it has not reached are reported as not run)."""
    from mutmut.stats import status_by_exit_code

    t0 = time.monotonic()
    d = SCRATCH / area.name if collect else _py_tree(area)
    names: list[str] = []
    hung: set[str] = set()
    if sample:
        if not collect:
            r = subprocess.run(["nice", "-n", "15", sys.executable, "-c", _GEN], cwd=d,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"tools/mutation: mutant generation failed:\n{r.stderr[-2000:]}")
        every = sorted(_metas(d))
        if sample < len(every):
            names = sorted(random.Random(seed).sample(every, sample))
    if not collect:
        hung = _mutmut(d, ["run", "--max-children", "1", *names], log, area.wall_s)
    results = []
    for name, code in sorted(_metas(d).items()):
        if names and name not in names:
            continue
        status = "timeout" if name in hung else status_by_exit_code[code]
        status = {"killed": "killed", "timeout": "timeout", "survived": "survived",
                  "no tests": "no tests", "segfault": "killed",
                  "not checked": "not run"}.get(status, status)
        diff = ""
        if status not in ("killed", "timeout", "not run"):
            s = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=d,
                               capture_output=True, text=True)
            diff = "\n".join(ln for ln in s.stdout.splitlines()
                             if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))
        results.append({"id": name, "status": status, "diff": diff})
    return {"area": area.name, "kind": "python", "files": list(area.files),
            "tests": list(area.tests), "sample": sample, "seed": seed,
            "results": results, "seconds": round(time.monotonic() - t0, 1)}


def run_c(area: A.CArea, sample: int, seed: int, log) -> dict:
    res, n_sites, secs = cmut.run_area(ROOT, SCRATCH / f"c-{area.name}", area.files,
                                       area.ctests, sample, seed, log)
    return {"area": area.name, "kind": "c", "files": list(area.files),
            "tests": [f"tests/c/{t}.c" for t in area.ctests], "sample": sample, "seed": seed,
            "sites": n_sites,
            "results": [{"id": r.mutant.id, "status": r.status, "detail": r.detail,
                         "diff": f"- {r.mutant.text}\n+ {r.mutant.mutated}"}
                        for r in res],
            "seconds": round(secs, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--area", action="append", default=[],
                    help="an area of tools/mutation/areas.py (repeatable; glob; default all)")
    ap.add_argument("--sample", type=int, default=None,
                    help="mutants per area (Python) or per file (C), seeded; 0: all "
                         "(default: all Python, 200 C)")
    ap.add_argument("--seed", type=int, default=49)
    ap.add_argument("--tests", nargs="+", help="pytest paths instead of the area's (Python "
                    "areas: e.g. to measure the suite as it was before new tests)")
    ap.add_argument("--results", type=Path, default=SCRATCH / "results",
                    help="where each area's results (JSON) are written")
    ap.add_argument("--report", type=Path, help="markdown report to (re)write")
    ap.add_argument("--collect", action="store_true",
                    help="Python areas: report what the run in the scratch folder has recorded "
                         "so far (finished or not; with the same --sample/--seed/--tests)")
    ap.add_argument("--slice", action="store_true",
                    help="the bounded slice of tools/test.sh: fails below its recorded score")
    a = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    every = [*A.PY_AREAS, *A.C_AREAS]
    if a.slice:
        chosen = [*A.SLICE_PY, *A.SLICE_C]
    else:
        chosen = [n for n in every if not a.area or any(fnmatch.fnmatch(n, p) for p in a.area)]
        if not chosen:
            raise SystemExit(f"tools/mutation: no area matches {a.area}; areas: {every}")
    equivalents = report.load_equivalents(HERE / "equivalent.txt")
    a.results.mkdir(parents=True, exist_ok=True)
    summaries = []
    for name in chosen:
        log(f"== mutation: {name}")
        if name in A.PY_AREAS:
            area = A.PY_AREAS[name]
            n = a.sample or 0
            if a.slice:
                tests, n = A.SLICE_PY[name]
                area = dataclasses.replace(area, tests=tests)
            elif a.tests:
                area = dataclasses.replace(area, tests=tuple(a.tests))
            r = run_py(area, n, A.SLICE_SEED if a.slice else a.seed, log, a.collect)
        else:
            c_area = A.C_AREAS[name]
            n = 200 if a.sample is None else a.sample
            if a.slice:
                ctests, n = A.SLICE_C[name]
                c_area = dataclasses.replace(c_area, ctests=ctests)
            r = run_c(c_area, n, A.SLICE_SEED if a.slice else a.seed, log)
        (a.results / f"{name}.json").write_text(json.dumps(r, indent=1))
        s = report.summary(r, equivalents)
        summaries.append(s)
        log(report.line(s))
    if a.report:
        report.write(a.report, a.results, equivalents)
    if a.slice:
        floor = float((HERE / "slice_score.txt").read_text().split()[0])
        killed = sum(s["killed"] for s in summaries)
        counted = sum(s["counted"] for s in summaries)
        score = 100.0 * killed / max(counted, 1)
        log(f"mutation slice: {killed}/{counted} = {score:.1f}% (recorded {floor:.1f}%)")
        if score + 1e-9 < floor:
            log("tools/mutation: the slice's score fell below its recorded value: a test "
                "no longer kills a mutant it killed (see the survivors above)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
