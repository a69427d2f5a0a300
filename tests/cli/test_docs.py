"""The docs stay true to the checkout.

- docs/ARCHITECTURE.md is short enough to read in one sitting (at most 450 lines).
- Every repository path the docs name (`colibri/_core/arena.c`, tools/bench/engine.py, `tests/core/`,
  in backticks or plain text) exists: a file moved without its docs fails here.
- Every `tools/...py` command in the docs uses only flags that script's `--help` lists (each
  script's help is run once, all of them at once, with the interpreter running the tests).
- Every relative link of README.md and docs/*.md resolves, anchors included (GitHub's heading
  slugs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCH = ROOT / "docs" / "ARCHITECTURE.md"
BENCH = ROOT / "docs" / "benchmarks.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_ARCH_LINES = 450

# A repository-relative path: a known top-level folder, then path characters. Not preceded by a
# path character, so `~/.cache/colibri/cuda/...` or `/dev/shm` never match; the trailing
# punctuation of a sentence is dropped. A glob (`colibri/_core/tokenizer*.c`) must match a file; a
# brace list such as `tests/test_{a,b}.py` fails as it should (no such path).
TOP = ("colibri", "tests", "tools", "cuda", "include", "docs", ".ci")
PATH = re.compile(r"(?<![\w./~-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./*-]*)")
# a script of this checkout and what follows it on the same line, up to a shell separator
SCRIPT = re.compile(r"(?<![\w./-])(tools/[\w/.-]+\.py)\b([^`\n;|&#]*)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def repo_paths(text: str) -> set[str]:
    """The repository paths a text names."""
    return {m.group(1).rstrip(".-") for m in PATH.finditer(text)}


def _exists(path: str, root: Path = ROOT) -> bool:
    if "*" in path:
        return next(root.glob(path.rstrip("/")), None) is not None
    return (root / path).exists()


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    return sorted(p for p in repo_paths(text) if not _exists(p, root))


def _snippets(text: str) -> list[str]:
    """Code the text shows: every line of its fenced blocks, then its inline code spans."""
    out = [line for m in FENCE.finditer(text) for line in m.group(1).splitlines()]
    out += [m.group(1).replace("\n", " ") for m in INLINE.finditer(FENCE.sub("", text))]
    return out


def script_commands(text: str) -> list[tuple[str, list[str]]]:
    """(script, flags) for every `tools/....py` command shown as code in the text."""
    out = []
    for snippet in _snippets(text):
        for m in SCRIPT.finditer(snippet):
            # quoted strings are values (`--llama-args "--poll 0"`), brackets mark optional flags
            args = re.sub(r"\"[^\"]*\"|'[^']*'", " ", m.group(2)).replace("[", " ").replace("]", " ")
            flags = [f.split("=")[0] for f in FLAG.findall(args)]
            out.append((m.group(1), flags))
    return out


_HELP: dict[str, str] = {}  # script -> its --help, for the whole session


def _helps(scripts: set[str]) -> dict[str, str]:
    """`--help` of each script, the ones not yet seen run all at once (each imports the colibri
    the tests import)."""
    import colibri

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(colibri.__file__).resolve().parents[1])]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    procs = {s: subprocess.Popen([sys.executable, str(ROOT / s), "--help"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for s in sorted(scripts - _HELP.keys())}
    for s, p in procs.items():
        text, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"{s} --help exited {p.returncode}:\n{text[-2000:]}"
        _HELP[s] = text
    return {s: _HELP[s] for s in scripts}


def help_flags(help_text: str) -> set[str]:
    """The option strings of an argparse help: the invocation column of its options section."""
    head, sep, options = help_text.rpartition("options:")
    if not sep:
        raise AssertionError(f"not an argparse help:\n{help_text[:500]}")
    flags = set()
    for line in options.splitlines():
        m = re.match(r"\s+(-\S.*?)(?:\s{2,}|$)", line)
        if m:
            flags.update(FLAG.findall(m.group(1)))
    return flags


def unknown_flags(text: str) -> list[str]:
    commands = [(s, f) for s, f in script_commands(text) if f]
    helps = _helps({s for s, _ in commands})
    bad = []
    for script, flags in commands:
        known = help_flags(helps[script])
        bad += [f"{script} {f}" for f in flags if f not in known]
    return bad


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub("", md.read_text())
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(md: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", md.read_text())):
        if re.match(r"[a-z][\w+.-]*:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def test_architecture_reads_in_one_sitting():
    n = len(ARCH.read_text().splitlines())
    assert n <= MAX_ARCH_LINES, f"docs/ARCHITECTURE.md has {n} lines (at most {MAX_ARCH_LINES})"


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_named_paths_exist(doc):
    missing = missing_paths(doc.read_text())
    assert not missing, f"{doc.name} names paths the checkout does not have: {missing}"


def test_the_docs_name_paths_at_all():
    """The extractor finds what the docs name (an empty match would pass everything)."""
    assert {"colibri/_core/arena.c", "tools/bench/engine.py"} <= repo_paths(ARCH.read_text()) \
        | repo_paths(BENCH.read_text())
    assert len(script_commands(BENCH.read_text())) >= 10


def test_path_extractor_catches_a_stale_name():
    text = ("the arena (`colibri/_core/arena.c`), tools/bench/engine.py. and "
            "tests/core/, `colibri/_core/kvcache_gone.c`, tests/test_cuda_{a,b}.py, "
            "`colibri/_core/tokenizer*.c`, colibri/_core/*.pyx, tools/bench/*.sh, "
            "~/.cache/colibri/cuda/x, /dev/shm, colibri.cuda, tools/dev/gone_check.sh")
    assert repo_paths(text) == {
        "colibri/_core/arena.c", "tools/bench/engine.py", "tests/core/",
        "colibri/_core/kvcache_gone.c", "tests/test_cuda_", "tools/dev/gone_check.sh",
        "colibri/_core/tokenizer*.c", "colibri/_core/*.pyx", "tools/bench/*.sh"}
    assert missing_paths(text) == ["colibri/_core/kvcache_gone.c", "tests/test_cuda_",
                                   "tools/bench/*.sh", "tools/dev/gone_check.sh"]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_script_flags_exist(doc):
    bad = unknown_flags(doc.read_text())
    assert not bad, f"{doc.name}: flags the scripts' --help does not list: {bad}"


def test_flag_check_catches_an_unknown_flag():
    text = ("`PYTHONPATH=. python tools/bench/engine.py --quick [--streams 1,4] --no-such-flag`\n"
            "`python tools/bench/serve.py --llama-args \"--poll 0\"`\n"
            "```text\npython tools/bench/kv_capacity.py --ctx=128 -z\n```\n")
    assert script_commands(text) == [("tools/bench/kv_capacity.py", ["--ctx", "-z"]),
                                     ("tools/bench/engine.py",
                                      ["--quick", "--streams", "--no-such-flag"]),
                                     ("tools/bench/serve.py", ["--llama-args"])]
    assert unknown_flags(text) == ["tools/bench/kv_capacity.py -z",
                                   "tools/bench/engine.py --no-such-flag"]


@pytest.mark.parametrize("doc", [ROOT / "README.md", *DOCS], ids=lambda d: d.name)
def test_links_resolve(doc):
    bad = broken_links(doc)
    assert not bad, f"{doc.name}: broken links: {bad}"


def test_link_check_catches_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Server (`colibri serve`)\n\n## Server (`colibri serve`)\n")
    md = tmp_path / "b.md"
    md.write_text("[ok](a.md#server-colibri-serve) [ok](a.md#server-colibri-serve-1) "
                  "[web](https://example.org/x) [bad](a.md#serve) [gone](c.md)\n")
    assert broken_links(md) == ["a.md#serve: no heading #serve in a.md", "c.md: no such file"]
