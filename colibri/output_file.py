"""What a colibri writer may do to the output path it is given, in one place for every writer
(`colibri convert`, `colibri make-bench-model` and colibri.tools.make_bench_model.write):

- absent: written;
- an existing regular file or a symbolic link: replaced only with force (the link itself is
  replaced, its target is never written: rename(2) does not follow the last component);
- anything else - a device such as /dev/null, a FIFO, a socket, a directory: never, force or not.

The data goes to a temporary in the output's directory first; publish() moves the finished
temporary to the output: without force through link(2), which fails when any file appeared
under the name meanwhile (a concurrent writer's), so nothing is ever overwritten unasked.
"""

from __future__ import annotations

import errno
import os
import stat

from colibri.inputs import file_kind


def check_output(dst: str | os.PathLike[str], force: bool,
                 error: type[Exception] = ValueError) -> None:
    """Refuse an output name that is not safe to replace (the rules above), raising `error`
    with a message naming the path and what it is."""
    dst = os.fspath(dst)
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        return
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        if not force:
            raise error(f"output {dst} is a symbolic link (to {os.readlink(dst)!r}); refusing "
                        "to replace it without --force (force replaces the link itself, not "
                        "its target)")
        return
    if stat.S_ISDIR(mode):
        raise error(f"output {dst} is a directory")
    if not stat.S_ISREG(mode):
        raise error(f"output {dst} exists and is {file_kind(mode)}; refusing to replace it "
                    "(even with --force): give a regular file's path")
    if not force:
        raise error(f"output {dst} already exists; refusing to overwrite it without --force")


def publish(tmp: str, dst: str, force: bool, error: type[Exception] = ValueError,
            doing: str = "writing") -> None:
    """Move the finished temporary tmp to dst (same directory). Without force: link(2), which
    fails if anything exists under dst by now, then unlink the temporary (a filesystem without
    hard links: check once more, then rename). With force: rename(2) over a regular file or a
    link, after checking the name again right before."""
    if not force:
        try:
            os.link(tmp, dst)
        except FileExistsError:
            raise error(f"output {dst} appeared while {doing} (another writer?); not "
                        "overwritten (use --force to replace it)") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                               errno.EMLINK):
                raise
            check_output(dst, False, error)
            os.replace(tmp, dst)
            return
        os.unlink(tmp)
        return
    check_output(dst, True, error)
    os.replace(tmp, dst)
