"""What the converter may do to its output path (colibri/container/writer.py: _check_output, _publish,
clean_stale_temporaries): never replace a device, FIFO, socket or directory; an existing file
or symbolic link only with --force (and then the link itself, never its target); its stale
temporaries cleaned when their writer is dead, never a live converter's; two converters of one
output at once leave one complete, valid file."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from colibri import cli
from colibri.container import ContainerError, ContainerFile, convert, is_container
from colibri.tools.fuzz.seeds import qwen3moe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return qwen3moe(str(tmp_path_factory.mktemp("src") / "m.gguf"))


def _tmps(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".tmp"))


def _special_nodes(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    nodes = {"a FIFO": fifo}
    sock_path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    nodes["a socket"] = sock_path
    if os.geteuid() == 0:  # a private /dev/null look-alike (never the real one)
        dev = tmp_path / "null"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        nodes["a character device"] = dev
    return nodes, s


@pytest.mark.parametrize("force", [False, True])
def test_special_files_are_refused_and_untouched(src, tmp_path, capsys, force):
    nodes, s = _special_nodes(tmp_path)
    try:
        for kind, node in nodes.items():
            before = os.lstat(node)
            with pytest.raises(ContainerError, match=f"{node}.*{kind}"):
                convert(src, node, progress=False, force=force)
            args = ["convert", src, str(node), "-q"] + (["--force"] if force else [])
            assert cli.main(args) == 1
            err = capsys.readouterr().err
            assert str(node) in err and kind in err and "Traceback" not in err
            after = os.lstat(node)
            assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode)
            assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
        assert _tmps(tmp_path) == []
    finally:
        s.close()


def test_directory_is_refused_even_with_force(src, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for force in (False, True):
        with pytest.raises(ContainerError, match="is a directory"):
            convert(src, d, progress=False, force=force)
    assert os.listdir(d) == []


def test_existing_file_needs_force(src, tmp_path, capsys):
    out = tmp_path / "o.colibri"
    out.write_bytes(b"precious")
    with pytest.raises(ContainerError, match="already exists.*--force"):
        convert(src, out, progress=False)
    assert out.read_bytes() == b"precious"
    assert cli.main(["convert", src, str(out), "-q"]) == 1
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == b"precious"
    assert cli.main(["convert", src, str(out), "-q", "--force"]) == 0
    assert is_container(out) and _tmps(tmp_path) == []
    with ContainerFile(out) as c:
        assert c.architecture == "qwen3moe"


def test_symlink_needs_force_and_only_the_link_is_replaced(src, tmp_path):
    target = tmp_path / "target.bin"
    target.write_bytes(b"the link's target")
    link = tmp_path / "link.colibri"
    os.symlink(target, link)
    with pytest.raises(ContainerError, match="symbolic link"):
        convert(src, link, progress=False)
    assert os.path.islink(link) and target.read_bytes() == b"the link's target"
    convert(src, link, progress=False, force=True)
    assert not os.path.islink(link) and is_container(link)
    assert target.read_bytes() == b"the link's target"
    # a link to a FIFO: replaced with force, the FIFO stays a FIFO
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link2 = tmp_path / "link2.colibri"
    os.symlink(fifo, link2)
    convert(src, link2, progress=False, force=True)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and is_container(link2)
    # a dangling link: refused without force too (it names a place we did not expect)
    dangling = tmp_path / "dangling.colibri"
    os.symlink(tmp_path / "nowhere", dangling)
    with pytest.raises(ContainerError, match="symbolic link"):
        convert(src, dangling, progress=False)
    assert not (tmp_path / "nowhere").exists()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_are_removed_and_reported(src, tmp_path, capsys):
    out = tmp_path / "m.colibri"
    dead = _dead_pid()
    stale = tmp_path / f".m.colibri.colibri-tmp-{dead}-abc123.tmp"
    stale.write_bytes(b"x" * 100_000)
    live_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".m.colibri.colibri-tmp-{live_proc.pid}-def456.tmp"
        live.write_bytes(b"y" * 10)
        other = tmp_path / ".m.colibri.abcdefgh.tmp"   # not ours by name: left alone
        other.write_bytes(b"z")
        other_out = tmp_path / f".n.colibri.colibri-tmp-{dead}-abc123.tmp"  # another output's
        other_out.write_bytes(b"w")
        lines: list[str] = []
        summary = convert(src, out, progress=lines.append)
        assert not stale.exists() and live.exists() and other.exists() and other_out.exists()
        said = [s for s in lines if "stale temporary" in s]
        assert len(said) == 1 and str(stale) in said[0] and str(dead) in said[0]
        assert [p for p, _ in summary["removed_temporaries"]] == [str(stale)]
        assert summary["removed_temporaries"][0][1] >= 100_000
        # the CLI says it on stderr even when quiet
        stale.write_bytes(b"x" * 10)
        assert cli.main(["convert", src, str(out), "-q", "--force"]) == 0
        err = capsys.readouterr().err
        assert "removed stale temporary" in err and str(stale) in err and not stale.exists()
        assert live.exists()
    finally:
        live_proc.kill()
        live_proc.wait()


_CHILD = textwrap.dedent("""
    import os, sys, time
    from colibri.container import convert
    src, dst, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    def progress(msg):
        if msg.startswith("layer 0"):
            if mode == "hang":
                print("HANG", flush=True)
                time.sleep(120)
            else:  # barrier: every converter has started writing before any publishes
                open(dst + ".ready-" + mode, "w").close()
                t0 = time.time()
                while sum(n.startswith(os.path.basename(dst) + ".ready-")
                          for n in os.listdir(os.path.dirname(dst))) < 2:
                    if time.time() - t0 > 60:
                        raise SystemExit("barrier timeout")
                    time.sleep(0.01)
    force = os.environ.get("FORCE") == "1"
    try:
        convert(src, dst, progress=progress, force=force)
    except ValueError as e:
        print("REFUSED", e, flush=True)
        sys.exit(1)
    print("OK", flush=True)
""")


def _child(src, dst, mode, force=False):
    env = dict(os.environ, FORCE="1" if force else "0", PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-c", _CHILD, src, str(dst), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)


def test_sigkilled_converter_leaves_a_temporary_the_next_run_removes(src, tmp_path, capsys):
    out = tmp_path / "k.colibri"
    p = _child(src, out, "hang")
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "HANG"
    left = _tmps(tmp_path)
    assert len(left) == 1 and f"-{p.pid}-" in left[0]
    p.kill()  # SIGKILL: no handler runs
    p.wait()
    assert _tmps(tmp_path) == left and not out.exists()
    assert cli.main(["convert", src, str(out), "-q"]) == 0
    err = capsys.readouterr().err
    assert f"removed stale temporary {tmp_path / left[0]}" in err and "MiB" in err
    assert _tmps(tmp_path) == [] and is_container(out)


@pytest.mark.parametrize("force", [False, True])
def test_two_converters_of_one_output(src, tmp_path, force):
    out = tmp_path / "c.colibri"
    procs = [_child(src, out, str(i), force) for i in range(2)]
    res = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    if force:
        assert codes == [0, 0], res
    else:
        assert codes == [0, 1], res
        failed = next(r for p, r in zip(procs, res, strict=True) if p.returncode == 1)
        assert "appeared while converting" in failed[0], failed
    assert _tmps(tmp_path) == []
    with ContainerFile(out, verify=True) as c:  # complete, every checksum right
        assert c.architecture == "qwen3moe" and len(c.groups) == 2


def test_killed_mid_write_never_leaves_a_partial_output(src, tmp_path):
    out = tmp_path / "p.colibri"
    p = _child(src, out, "hang")
    assert p.stdout is not None and p.stdout.readline().strip() == "HANG"
    p.kill()
    p.wait()
    time.sleep(0.05)
    assert not out.exists()
