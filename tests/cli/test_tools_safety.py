"""Nothing lost, nothing hangs (issue 44), for the tools and the command line:

- `colibri make-bench-model` and colibri.tools.make_bench_model.write follow the output rules of
  `convert` (colibri.output_file): an existing file or link only with --force (a link itself,
  never its target), a FIFO, device or directory never; no temporary left after an error,
  SIGTERM or (on the next run) SIGKILL; a size line and a free-space check before writing;
  its own --help; never a file named after an option;
- `colibri plan` and `colibri convert` refuse a FIFO as input at once (they waited forever);
- `colibri bench` says what is wrong with its options or its model in one line, before any
  benchmark process starts, and a failed benchmark process in one line too;
- every option of every subcommand has a help text, its default shown.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colibri import bench, cli
from colibri.errors import ColibriError
from colibri.tools import make_bench_model as mbm

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(n_layers=1, shape="tiny", routing="raw")  # written in well under a second
TINY_ARGS = ["--shape", "tiny", "--layers", "1", "--routing", "raw"]


def _tmps(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".tmp"))


def _is_gguf(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def _err_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"colibri {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---- make-bench-model: the output rules of convert ----

def test_write_refuses_an_existing_file_without_force(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"precious")
    with pytest.raises(ValueError, match=r"m\.gguf already exists.*--force"):
        mbm.write(out, **TINY)
    assert out.read_bytes() == b"precious" and _tmps(tmp_path) == []
    assert mbm.write(out, force=True, **TINY) == str(out)
    assert _is_gguf(out) and _tmps(tmp_path) == []


def test_write_replaces_a_link_itself_never_its_target(tmp_path):
    target = tmp_path / "target.bin"
    target.write_bytes(b"the link's target")
    link = tmp_path / "link.gguf"
    os.symlink(target, link)
    with pytest.raises(ValueError, match="symbolic link"):
        mbm.write(link, **TINY)
    assert os.path.islink(link)
    mbm.write(link, force=True, **TINY)
    assert not os.path.islink(link) and _is_gguf(link)
    assert target.read_bytes() == b"the link's target" and _tmps(tmp_path) == []


@pytest.mark.parametrize("force", [False, True])
def test_write_never_replaces_a_fifo_or_a_directory(tmp_path, force):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is a FIFO"):
        mbm.write(fifo, force=force, **TINY)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    d = tmp_path / "d.gguf"
    d.mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        mbm.write(d, force=force, **TINY)
    assert os.listdir(d) == [] and _tmps(tmp_path) == []


def test_cli_refuses_an_existing_file_and_force_replaces_it(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"precious")
    assert cli.main(["make-bench-model", str(out), *TINY_ARGS]) == 1
    assert "already exists" in _err_line(capsys, "make-bench-model")
    assert out.read_bytes() == b"precious"
    assert cli.main(["make-bench-model", str(out), *TINY_ARGS, "--force"]) == 0
    assert _is_gguf(out) and _tmps(tmp_path) == []


def test_a_failed_write_leaves_no_temporary(tmp_path, monkeypatch):
    def fail(tmp, *a, **k):
        Path(tmp).write_bytes(b"half a model")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(mbm, "_write", fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        mbm.write(tmp_path / "m.gguf", **TINY)
    assert os.listdir(tmp_path) == []


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_a_killed_writer_are_removed(tmp_path):
    dead = _dead_pid()
    stale = tmp_path / f".m.gguf.colibri-tmp-{dead}-abc123.tmp"
    stale.write_bytes(b"x" * 1000)
    mbm.write(tmp_path / "m.gguf", **TINY)
    assert not stale.exists() and _tmps(tmp_path) == []


def test_sigterm_removes_the_temporary(tmp_path):
    # a tiny model of many layers: long enough to be caught writing
    p = subprocess.Popen([sys.executable, "-m", "colibri.tools.make_bench_model", "big.gguf",
                          "--shape", "tiny", "--layers", "400", "--routing", "raw"],
                         cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        t0 = time.time()
        while not _tmps(tmp_path) and p.poll() is None and time.time() - t0 < 60:
            time.sleep(0.01)
        assert _tmps(tmp_path), "no temporary appeared"
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM
    assert os.listdir(tmp_path) == []


def test_short_disk_space_is_refused_before_writing(tmp_path, monkeypatch):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: real(p)._replace(free=mbm.file_size(1, "q4_k_m", "tiny") // 2))
    with pytest.raises(OSError, match="not enough free disk space"):
        mbm.write(tmp_path / "m.gguf", **TINY)
    assert os.listdir(tmp_path) == []


def test_size_line_before_writing_and_the_size_is_right(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert cli.main(["make-bench-model", str(out), *TINY_ARGS]) == 0
    err = capsys.readouterr().err
    first = err.lstrip().splitlines()[0]
    assert first.startswith(f"colibri make-bench-model: writing {out}: ") and "free" in first
    assert abs(mbm.file_size(1, "q4_k_m", "tiny") - out.stat().st_size) < 16 << 10
    # the default shape: ~5 GiB for 12 layers, said before a byte is written
    assert 4.5 * 2**30 < mbm.file_size() < 5.5 * 2**30


def test_help_is_the_tools_own(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["make-bench-model", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--layers", "--type", "--shape", "--routing", "--force"):
        assert opt in out, opt
    with pytest.raises(SystemExit):
        cli.main(["make-bench-model", "-h"])
    assert "--layers" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--", "--help"], ["--", "-x"], ["--layers", "1", "--", "-h"]])
def test_no_file_named_after_an_option(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)

    def must_not_write(*a, **k):
        raise AssertionError(f"would write {a[0]!r}")

    monkeypatch.setattr(mbm, "write", must_not_write)
    try:
        code = cli.main(["make-bench-model", *argv])
    except SystemExit as e:  # argparse's own help or error: also nothing written
        code = e.code
    assert code != 0 or "usage" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


# ---- plan and convert on a FIFO ----

def test_plan_and_convert_refuse_a_fifo_at_once(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    for args in (["plan", "-m", str(fifo)], ["convert", str(fifo), str(tmp_path / "o.colibri")]):
        p = subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1, (args, p.stderr)
        assert p.stderr.strip() == f"colibri {args[0]}: error: {'model' if args[0] == 'plan' else 'input'} " \
                                   f"file {fifo} is a FIFO, not a regular file", p.stderr
    code = ("import sys; from colibri.plan import make_plan; from colibri.container import "
            "convert, is_container, open_model_file\n"
            "assert is_container(sys.argv[1]) is False\n"
            "for f in (lambda: make_plan(sys.argv[1]), lambda: open_model_file(sys.argv[1]),\n"
            "          lambda: convert(sys.argv[1], sys.argv[1] + '.colibri', progress=False)):\n"
            "    try:\n        f()\n    except ValueError as e:\n        print(e)\n")
    p = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("is a FIFO, not a regular file") == 3, p.stdout


# ---- bench ----

@pytest.fixture
def no_benchmark(monkeypatch):
    """Any benchmark process, or the default model's assembly, fails the test."""
    def started(*a, **k):
        raise AssertionError("a benchmark process started")

    def assembled(*a, **k):
        raise AssertionError("the default model was assembled")

    monkeypatch.setattr(bench, "in_subprocess", started)
    monkeypatch.setattr("colibri.model.default_model_path", assembled)


@pytest.mark.parametrize("args,says", [
    (["--prompt-tokens", "0"], "--prompt-tokens must be an integer of at least 1, got 0"),
    (["--prompt-tokens", "100000"], "--ctx to at least 100032"),
    (["--gen-tokens", "-1"], "--gen-tokens must be an integer of at least 1, got -1"),
    (["--gen-tokens", "0"], "--gen-tokens must be"),
    (["--threads", "0"], "--threads must be"),
    (["--ctx", "0"], "--ctx must be"),
])
def test_bench_bad_counts_are_one_line(no_benchmark, capsys, args, says):
    assert cli.main(["bench", *args]) == 1
    assert says in _err_line(capsys, "bench")


def test_bench_bad_model_is_one_line(no_benchmark, tmp_path, capsys):
    assert cli.main(["bench", "-m", str(tmp_path / "missing.gguf")]) == 1
    assert "not found" in _err_line(capsys, "bench")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model, just some text" * 10)
    assert cli.main(["bench", "-m", str(junk)]) == 1
    assert str(junk) in _err_line(capsys, "bench")
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    assert cli.main(["bench", "-m", str(fifo)]) == 1
    assert "FIFO" in _err_line(capsys, "bench")


def test_a_failed_benchmark_process_is_one_line(tmp_path, monkeypatch, capsys):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ColibriError) as e:
        bench.in_subprocess("colibri", path=str(junk), threads=1, prompt_tokens=4,
                            gen_tokens=1, ctx=16)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    assert msg.startswith("the colibri benchmark failed: ") and str(junk) in msg, msg
    # and through the command line, when the check before it is bypassed
    monkeypatch.setattr(bench, "check_model", lambda path: None)
    assert cli.main(["bench", "-m", str(junk), "--prompt-tokens", "4", "--gen-tokens", "1",
                     "--ctx", "16", "--threads", "1"]) == 1
    assert "benchmark failed" in _err_line(capsys, "bench")


# ---- help texts ----

def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    raise AssertionError("no subcommands")


def test_every_option_has_a_help_text_with_its_default():
    parser = cli._build_parser()
    subs = _subparsers(parser)
    assert {"run", "chat", "bench", "plan", "convert", "make-bench-model", "serve"} <= set(subs)
    missing, no_default = [], []
    for name, sp in [("colibri", parser), *subs.items()]:
        fmt = sp._get_formatter()
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction | argparse._SubParsersAction):
                continue
            what = f"{name} {'/'.join(a.option_strings) or a.dest}"
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(what)
                continue
            if a.option_strings and a.default not in (None, False, argparse.SUPPRESS):
                if "default" not in fmt._expand_help(a):
                    no_default.append(what)
    assert missing == [], f"options without a help text: {missing}"
    assert no_default == [], f"options whose help does not show the default: {no_default}"
