"""Checks of what callers pass in: text (str, or strict UTF-8 bytes), integer ids (token ids,
sequence ids), with errors that name the offending position, and input files (a regular file,
never a FIFO or a device that would block or never end)."""

from __future__ import annotations

import numbers
import os
import stat
from typing import Any


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO", "a directory", ...)."""
    return ("a regular file" if stat.S_ISREG(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device"
            if stat.S_ISBLK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a symbolic link" if stat.S_ISLNK(mode)
            else "not a regular file")


def regular_file(path: str | os.PathLike[str], what: str = "input file") -> str:
    """path (as a str) when it names an existing regular file (through symbolic links), else
    FileNotFoundError, or ValueError naming what it is: opening a FIFO waits for a writer that
    may never come, and a device like /dev/zero never ends, so neither is ever opened. Checked
    with stat(2), which does not open the file."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {p}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {p} is {file_kind(st.st_mode)}, not a regular file")
    return p


def as_text(text: str | bytes | bytearray, what: str = "prompt") -> str:
    """Text as given, or bytes decoded as strict UTF-8 (an invalid byte is a ValueError naming
    its offset, never a silent replacement)."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes | bytearray | memoryview):
        try:
            return bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{what} is not valid UTF-8: byte {e.object[e.start]:#04x} at offset "
                             f"{e.start} ({e.reason})") from None
    raise TypeError(f"{what} must be str or UTF-8 bytes, got {type(text).__name__}")


def token_ids(ids: Any, n_vocab: int, what: str = "token ids") -> list[int]:
    """A list of token ids, each an integer (not a bool, a float or a string) in [0, n_vocab)."""
    return integers(ids, n_vocab, what, "the vocabulary")


def integers(values: Any, limit: int, what: str, range_name: str) -> list[int]:
    """values as a list of ints in [0, limit): integers only, never coerced; errors name the
    position (what[i]) and range_name."""
    if isinstance(values, str | bytes | bytearray):
        raise TypeError(f"{what} must be a sequence of integers, got {type(values).__name__}")
    out = []
    for i, t in enumerate(values):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{what}[{i}] = {t!r}: must be an integer")
        v = int(t)
        if not 0 <= v < limit:
            raise ValueError(f"{what}[{i}] = {v}: out of {range_name} [0, {limit})")
        out.append(v)
    return out
