"""Temporaries that carry their writer's pid, and the removal of those whose writer is dead.

Every file colibri publishes atomically (a converted container, the assembled default model, a
pulled model) is first written to a temporary in the destination's directory named
`.<name>.colibri-tmp-<pid>-<random>.tmp`, then renamed into place. A writer killed with SIGKILL
(or by a power cut) cannot remove its temporary; the next writer of the same destination finds
it by name, sees that the pid no longer runs, and removes it. A live writer's temporary is
never touched."""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable

_log = logging.getLogger("colibri")

TMP_TAG = ".colibri-tmp-"


def tmp_prefix(dst: str | os.PathLike[str]) -> str:
    """The name prefix of this process's temporaries for dst: hidden, colibri-specific, and
    carrying the writer's pid, so that a later run can tell a dead writer's leftover from a
    live one's (mkstemp adds a random part and the suffix)."""
    return "." + os.path.basename(os.fspath(dst)) + TMP_TAG + f"{os.getpid()}-"


def mkstemp_for(dst: str | os.PathLike[str]) -> tuple[int, str]:
    """(fd, path) of a new temporary for dst in dst's directory (mode 0600)."""
    dst = os.fspath(dst)
    return tempfile.mkstemp(prefix=tmp_prefix(dst), suffix=".tmp",
                            dir=os.path.dirname(os.path.abspath(dst)))


def mkdtemp_for(dst: str | os.PathLike[str]) -> str:
    """A new temporary folder for dst's download in dst's directory (found and removed by
    clean_stale_temporaries(dst, dirs=True) once its writer is dead)."""
    dst = os.fspath(dst)
    return tempfile.mkdtemp(prefix=tmp_prefix(dst), suffix=".tmp",
                            dir=os.path.dirname(os.path.abspath(dst)))


def current_umask() -> int:
    """The process's umask, read without changing it (os.umask(0) then back would, for an
    instant, let every other thread create world-writable files): /proc/self/status's Umask
    line on Linux, else 022."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def chmod_as_new_file(fd: int) -> None:
    """Give a mkstemp temporary (0600) the mode a file created by open() would have: a model
    file is as readable as any other."""
    os.fchmod(fd, 0o666 & ~current_umask())


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we wrote: never treat it as dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    except OSError:
        return True
    return True


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def stale_temporaries(dst: str | os.PathLike[str],
                      dirs: bool = False) -> list[tuple[str, int, int]]:
    """colibri's temporaries for destination dst in its directory: [(path, writer pid, bytes)],
    regular files only (never followed through a link), and folders too with dirs=True."""
    dst = os.fspath(dst)
    dirname = os.path.dirname(os.path.abspath(dst))
    pat = re.compile(re.escape("." + os.path.basename(dst) + TMP_TAG) +
                     r"(\d+)-[A-Za-z0-9_]+\.tmp")
    out = []
    try:
        names = os.listdir(dirname)
    except OSError:
        return []
    for name in names:
        m = pat.fullmatch(name)
        if m is None:
            continue
        path = os.path.join(dirname, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((path, int(m.group(1)), st.st_blocks * 512))
        elif dirs and stat.S_ISDIR(st.st_mode):
            out.append((path, int(m.group(1)), _tree_bytes(path)))
    return sorted(out)


def _warn(msg: str) -> None:
    _log.warning("%s", msg)


def clean_stale_temporaries(dst: str | os.PathLike[str], say: Callable[[str], None] = _warn,
                            writer: str = "writer", dirs: bool = False) -> list[tuple[str, int]]:
    """Remove colibri's temporaries for destination dst whose writer process no longer exists
    (a writer killed with SIGKILL cannot remove its own). A temporary of a live process - a
    concurrent writer of the same destination - is kept. Each removal is reported through say
    with its size on disk, naming the writer ("converter", ...); returns [(path, bytes)]."""
    removed = []
    for path, pid, nbytes in stale_temporaries(dst, dirs):
        if pid == os.getpid() or pid_alive(pid):
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            continue  # another writer cleaned it first
        except OSError as e:
            say(f"cannot remove stale temporary {path} ({e})")
            continue
        removed.append((path, nbytes))
        say(f"removed stale temporary {path} ({nbytes / 2**20:.1f} MiB) left by {writer} "
            f"process {pid}, which no longer runs")
    return removed
