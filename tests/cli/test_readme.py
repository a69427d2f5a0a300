"""The README is a test: every Python code block and every `colibri ...` command line of
README.md (and the Python examples of docs/*.md) runs here, as written, from a directory
outside the checkout, with the default model unless it names another. A renamed function, a
missing export or a changed flag then fails the suite.

Exempt, by the explicit lists below: the install and test commands themselves (whose
`colibri ...` part still runs), commands that need a GPU, and benchmarks against a peer.
Inline `colibri ...` mentions in the prose are parsed by the real argument parser (not run).
The table of environment variables is checked against colibri.config.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# command lines that are not run as they are, and why
EXEMPT = {
    'pip install ".[demo]" && colibri run -p "The history of the Roman Empire" -n 64':
        "the install command (its colibri part runs below)",
    "bash tools/test.sh": "the test command itself",
    'pip install "colibri-moe[serve]"': "the install command (the serve stack is in the test extra)",
}
# a command line with one of these is not run (each needs hardware or a peer CI lacks)
EXEMPT_IF_CONTAINS = {
    "--device cuda": "needs an NVIDIA GPU",
    "--vs-llama-cpp": "benchmarks against llama.cpp (tools/bench runs it by hand)",
    "tools/dev/device_check.sh": "runs on a lent GPU machine",
    "tools/dev/fetch_pycuda.sh": "needs the network",
    "colibri serve": "a server runs until stopped (the README's Python example and "
                     "tests/serve/test_serve.py run it)",
}

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            if m.group(1) == lang:
                line = text[: m.start()].count("\n") + 1
                out.append((doc.name, line, m.group(2)))
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed package, not the checkout
    # `colibri` and `python` of the interpreter running the tests (a venv need not be active)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("COLIBRI_ROUTING_THREADS", "2")
    return env


def _run(cmd: list[str] | str, cwd: Path, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout,
                       shell=isinstance(cmd, str), **kw)
    assert p.returncode == 0, (f"{cmd!r} exited {p.returncode}\n--- stdout\n{p.stdout[-3000:]}"
                               f"\n--- stderr\n{p.stderr[-3000:]}")
    return p


PY_BLOCKS = _blocks("python")
SH_LINES = [(doc, line + 1 + i, cmd) for doc, line, body in _blocks("sh")
            for i, cmd in enumerate(body.splitlines()) if cmd.strip()]


def test_the_readme_has_examples():
    assert len(PY_BLOCKS) >= 2 and len(SH_LINES) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("doc,line,code", PY_BLOCKS, ids=[f"{d}:{n}" for d, n, _ in PY_BLOCKS])
def test_python_block(doc, line, code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    assert not str(tmp_path).startswith(str(ROOT))
    p = _run([sys.executable, str(script)], tmp_path)
    assert "Traceback" not in p.stderr


def _runnable(cmd: str) -> str | None:
    """The part of a command line to run, or None when it is exempt."""
    if cmd in EXEMPT:
        _, _, rest = cmd.partition("&& ")
        return rest if rest.startswith("colibri ") else None
    if any(k in cmd for k in EXEMPT_IF_CONTAINS):
        return None
    return cmd


@pytest.mark.slow
@pytest.mark.parametrize("doc,line,cmd", SH_LINES, ids=[f"{d}:{n}" for d, n, _ in SH_LINES])
def test_command_line(doc, line, cmd, tmp_path):
    run = _runnable(cmd)
    if run is None:
        # exempt by the lists above: that is the check, nothing to run
        assert cmd in EXEMPT or any(k in cmd for k in EXEMPT_IF_CONTAINS)
        return
    assert "colibri" in run, f"{doc}:{line}: a command line that is not colibri's: {cmd}"
    p = _run(["bash", "-o", "pipefail", "-ec", run], tmp_path)
    assert "Traceback" not in p.stderr, p.stderr


def test_exempt_lines_exist():
    """The exemption list names only lines the README has (a stale entry hides nothing)."""
    lines = {cmd for _, _, cmd in SH_LINES}
    for cmd in EXEMPT:
        assert cmd in lines, f"EXEMPT names a line the README no longer has: {cmd}"


def _inline_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for m in re.finditer(r"`(colibri [^`]+)`", doc.read_text()):
            out.append((doc.name, m.group(1)))
    return out


@pytest.mark.parametrize("doc,cmd", _inline_commands())
def test_inline_command_parses(doc, cmd):
    """Every `colibri ...` mentioned in the prose names a command of the CLI and only options
    that command has."""
    from colibri.cli import _build_parser

    words = [w for w in shlex.split(cmd.replace("[", " ").replace("]", " ")) if w != "|"]
    words = words[1:]
    # alternatives written a|b|c: take the first
    words = [w.split("|")[0] if w.startswith("--") or "|" in w else w for w in words]
    if words and words[0] == "make-bench-model":
        return  # its own parser: checked by test_make_bench_model_cli
    parser = _build_parser()
    commands = next(a.choices for a in parser._actions if a.dest == "command")
    assert words and words[0] in commands, f"{doc}: `{cmd}` names no colibri command"
    sub = commands[words[0]]
    known = {o for a in sub._actions for o in a.option_strings}
    for w in words[1:]:
        for opt in w.split("/"):
            opt = opt.split("=")[0]
            if opt.startswith("-"):
                assert opt in known, f"{doc}: `{cmd}`: colibri {words[0]} has no option {opt}"


def _tables(header: str) -> list[tuple[str, str, str]]:
    rows = []
    text = (ROOT / "README.md").read_text()
    for block in text.split(header)[1:]:
        for line in block.splitlines()[2:]:
            if not line.startswith("|"):
                break
            cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_settings_table_matches_config():
    from colibri import config

    rows = _tables("| variable | Model argument | meaning |")
    named = {r[0] for r in rows}
    assert named == set(config.VARIABLES), (
        f"README table vs colibri.config: missing {set(config.VARIABLES) - named}, "
        f"unknown {named - set(config.VARIABLES)}")
    for name, arg, _ in rows:
        assert arg == (config.VARIABLES[name].argument or "-"), name
    text = (ROOT / "README.md").read_text()
    building = text[text.index("## Building"):]
    for var in config.VARIABLES.values():
        assert (f"`{var.name}`" in building) == var.build, var.name


def test_make_bench_model_cli(tmp_path):
    """`colibri make-bench-model` and `python -m colibri.tools.make_bench_model` both write a
    model that loads."""
    import colibri

    _run([sys.executable, "-m", "colibri.tools.make_bench_model", "a.gguf", "--shape", "tiny",
          "--layers", "1"], tmp_path)
    from colibri.cli import main

    assert main(["make-bench-model", str(tmp_path / "b.gguf"), "--shape", "tiny", "--layers",
                 "1", "--routing", "raw"]) == 0
    for name in ("a.gguf", "b.gguf"):
        with colibri.Model(tmp_path / name, verbose=False) as m:
            assert m.architecture == "qwen3moe" and m.desc.n_layer == 1
