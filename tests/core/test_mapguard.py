"""A model file truncated while it is mapped (include/colibri/mapguard.h, colibri.gguf's
guard_mapping and check_unchanged): a forward pass after the truncation is an OSError naming
the file; a read of the mapping past the new end dies of SIGBUS with one line naming the file
instead of a bare "Bus error". Run in subprocesses: the failure mode is the death of the
process."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from colibri._core import _mapguard
from colibri.gguf import GGUFFile
from colibri.tools.fuzz.seeds import qwen3moe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def model(tmp_path):
    return qwen3moe(str(tmp_path / "m.gguf"))


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_read_of_a_truncated_mapping_names_the_file(model):
    r = _run("""
        import os, sys
        from colibri.gguf import GGUFFile
        g = GGUFFile(sys.argv[1])
        t = max(g.tensors.values(), key=lambda t: t.offset)
        assert t.offset > 16384
        os.truncate(sys.argv[1], 4096)
        print("reading", flush=True)
        print(int(g.data(t.name).sum()))
    """, model)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)
    assert "reading" in r.stdout
    assert (f"colibri: fatal: bus error (SIGBUS) reading the mapped model file {model} at byte"
            in r.stderr), r.stderr
    assert "truncated or rewritten in place while in use" in r.stderr


def test_forward_after_truncation_is_an_oserror(model):
    r = _run("""
        import os, sys
        from colibri.model import Model
        m = Model(sys.argv[1], threads=1, ctx=32, max_batch=4)
        m.generate("hello", max_tokens=2, temperature=0)
        os.truncate(sys.argv[1], 4096)
        try:
            m.generate("hello", max_tokens=2, temperature=0)
        except OSError as e:
            print("OSError:", e)
    """, model)
    assert r.returncode == 0, r.stderr
    assert f"OSError: {model}: the model file was truncated from" in r.stdout
    assert "to 4096 bytes while in use" in r.stdout


def test_replaced_by_rename_is_fine(model, tmp_path):
    from colibri.model import Model

    m = Model(model, threads=1, ctx=32, max_batch=4)
    want = m.generate("hello", max_tokens=2, temperature=0)
    new = tmp_path / "new.gguf"
    new.write_bytes(b"not a model")
    os.replace(new, model)  # the mapping keeps the old inode
    m.gguf.check_unchanged()
    assert m.generate("hello", max_tokens=2, temperature=0) == want
    os.unlink(model)
    m.gguf.check_unchanged()
    m.close()


def test_registration_follows_the_mapping(model):
    gc.collect()
    n0 = _mapguard.count()
    g = GGUFFile(model)
    assert _mapguard.count() == n0 + 1
    t = next(iter(g.tensors.values()))
    view = g.data(t.name)
    addr = int(view.ctypes.data)
    msg = _mapguard.message(addr)
    assert f"mapped model file {os.path.abspath(model)} at byte {t.offset} of " in msg
    g.close()
    assert _mapguard.count() == n0 + 1  # a view still holds the mapping
    del view
    gc.collect()
    assert _mapguard.count() == n0
    assert _mapguard.message(addr) == ""
