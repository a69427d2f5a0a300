"""colibri.inputs: what callers pass in, each check with its exact message (the offending
position, byte, range), over every kind of file and generated id lists."""

from __future__ import annotations

import os
import socket
import stat

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colibri import inputs as I


@pytest.mark.parametrize("mode,want", [
    (stat.S_IFREG, "a regular file"), (stat.S_IFDIR, "a directory"),
    (stat.S_IFCHR, "a character device"), (stat.S_IFBLK, "a block device"),
    (stat.S_IFIFO, "a FIFO"), (stat.S_IFSOCK, "a socket"), (stat.S_IFLNK, "a symbolic link"),
    (0, "not a regular file")])
def test_file_kind(mode, want):
    assert I.file_kind(mode | 0o644) == want


def test_regular_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(f)
    assert I.regular_file(f) == str(f) and I.regular_file(link, "model") == str(link)
    with pytest.raises(FileNotFoundError, match=f"^model not found: {tmp_path}/nope$"):
        I.regular_file(tmp_path / "nope", "model")
    with pytest.raises(ValueError, match=f"^input file {tmp_path} is a directory, not a "
                                         "regular file$"):
        I.regular_file(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=f"^model {fifo} is a FIFO, not a regular file$"):
        I.regular_file(fifo, "model")
    with pytest.raises(ValueError, match="^input file /dev/null is a character device"):
        I.regular_file("/dev/null")
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        with pytest.raises(ValueError, match="is a socket, not a regular file$"):
            I.regular_file(sock)


def test_as_text():
    assert I.as_text("héllo") == "héllo"
    for b in (b"h\xc3\xa9", bytearray(b"h\xc3\xa9"), memoryview(b"h\xc3\xa9")):
        assert I.as_text(b) == "hé"
    with pytest.raises(ValueError, match=r"^prompt is not valid UTF-8: byte 0xff at offset 2 "
                                         r"\(invalid start byte\)$"):
        I.as_text(b"ab\xff")
    with pytest.raises(ValueError, match=r"^text is not valid UTF-8: byte 0xc3 at offset 1 "):
        I.as_text(b"a\xc3(", "text")
    with pytest.raises(TypeError, match="^prompt must be str or UTF-8 bytes, got int$"):
        I.as_text(3)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(ids=st.lists(st.integers(-3, 12), max_size=8), n=st.integers(1, 10))
def test_token_ids_over_generated_lists(ids, n):
    bad = [i for i, v in enumerate(ids) if not 0 <= v < n]
    if bad:
        i = bad[0]
        with pytest.raises(ValueError, match=rf"^token ids\[{i}\] = {ids[i]}: out of the "
                                             rf"vocabulary \[0, {n}\)$"):
            I.token_ids(ids, n)
    else:
        got = I.token_ids(np.array(ids, dtype=np.int64) if ids else ids, n)
        assert got == ids and all(type(v) is int for v in got)


@pytest.mark.parametrize("values,match", [
    ([1, True], r"^ids\[1\] = True: must be an integer$"),
    ([1.0], r"^ids\[0\] = 1.0: must be an integer$"),
    (["1"], r"^ids\[0\] = '1': must be an integer$")])
def test_integers_refuse_non_integers(values, match):
    with pytest.raises(TypeError, match=match):
        I.integers(values, 5, "ids", "the range")


@pytest.mark.parametrize("values", ["12", b"12", bytearray(b"1")])
def test_integers_refuse_text(values):
    with pytest.raises(TypeError, match=f"^seqs must be a sequence of integers, got "
                                        f"{type(values).__name__}$"):
        I.integers(values, 5, "seqs", "the sequences")


def test_integers_boundaries():
    assert I.integers([0, 4], 5, "s", "r") == [0, 4]
    assert I.integers(iter([np.int32(2)]), 5, "s", "r") == [2]
    with pytest.raises(ValueError, match=r"^s\[0\] = 5: out of r \[0, 5\)$"):
        I.integers([5], 5, "s", "r")
    with pytest.raises(ValueError, match=r"^s\[1\] = -1: out of r \[0, 5\)$"):
        I.integers([0, -1], 5, "s", "r")
