"""The code's layout stays one concern per module (docs/ARCHITECTURE.md, "Layout"): no C or CUDA
file over 1,100 lines, no Python file over 700 (tests and tools included), one native extension
module, and no test importing a script from tools/ (a test runs a tool as a subprocess; code
that tests need lives in the package, colibri/tools/)."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("colibri", "tests", "tools", "cuda", "include")
SKIP = {"build", "__pycache__", ".venv", "venv"}
LIMITS = {".c": 1100, ".h": 1100, ".cu": 1100, ".cuh": 1100, ".py": 700, ".pyx": 700,
          ".pxi": 700, ".pyi": 700}


def _sources():
    for d in DIRS:
        for p in (ROOT / d).rglob("*"):
            if p.suffix in LIMITS and p.is_file() and not SKIP & set(p.relative_to(ROOT).parts):
                yield p


def test_no_file_over_its_limit():
    files = list(_sources())
    assert len(files) > 100, "the walk found too few sources: wrong root?"
    over = {str(p.relative_to(ROOT)): n for p in files
            if (n := len(p.read_text(errors="replace").splitlines())) > LIMITS[p.suffix]}
    assert not over, f"files over their line limit (C 1,100, Python 700): {over}"


def test_limits_catch_a_long_file(tmp_path):
    long = tmp_path / "x.py"
    long.write_text("x = 1\n" * 701)
    assert len(long.read_text().splitlines()) > LIMITS[".py"]


def test_one_extension_module():
    pyx = sorted(p.name for p in (ROOT / "colibri" / "_core").glob("*.pyx"))
    assert pyx == ["_native.pyx"]


IMPORTS_TOOLS = re.compile(
    r"sys\.path\.(?:insert|append)\([^)]*[\"']tools[\"']"        # tools/ put on the path
    r"|spec_from_file_location\([^)]*[\"']tools[\"']"            # a script loaded by path
    r"|^\s*(?:from|import)\s+tools\b", re.M)                     # tools as a package


def test_no_test_imports_a_script():
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
             if p != Path(__file__).resolve() and IMPORTS_TOOLS.search(p.read_text())]
    assert not found, f"tests importing scripts from tools/ (run them as subprocesses): {found}"
    bad = 'sys.path.insert(0, os.path.join(ROOT, "tools", "fuzz"))\nimport seeds\n'
    assert IMPORTS_TOOLS.search(bad)
    assert IMPORTS_TOOLS.search('spec = spec_from_file_location("x", ROOT / "tools" / "x.py")')
    assert not IMPORTS_TOOLS.search('subprocess.run([sys.executable, ROOT / "tools" / "x.py"])')


# Names the dependencies import when they find them (transformers' optional integrations among
# them): a script beside a file of that name, run as `python tools/bench/x.py`, has its folder
# first on sys.path, so the dependency imports the script instead (transformers 5.25 imports
# `kernels`, HF's kernel hub, and failed on tools/bench/kernels.py, now quant_kernels.py).
OPTIONAL_IMPORTS = {"kernels", "accelerate", "peft", "safetensors", "tokenizers", "datasets",
                    "triton", "bitsandbytes", "optimum", "sentencepiece", "torchvision", "jinja2"}


def _shadowed(names: set[str]) -> set[str]:
    """The names a stdlib, installed or optionally imported module already has."""
    taken = set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())
    return names & (taken | OPTIONAL_IMPORTS)


def test_no_script_shadows_a_module():
    scripts = {p.stem: str(p.relative_to(ROOT)) for p in (ROOT / "tools").rglob("*.py")
               if not SKIP & set(p.relative_to(ROOT).parts)}
    assert len(scripts) > 20, "the walk found too few scripts: wrong root?"
    bad = sorted(scripts[n] for n in _shadowed(set(scripts)))
    assert not bad, f"scripts named like a module a dependency imports (rename them): {bad}"
    assert _shadowed({"kernels", "json", "numpy"}) == {"kernels", "json", "numpy"}
