"""The expert usage record: how often each routed expert of a model was chosen, kept across runs.

A MoE model's routing is skewed: some experts are chosen far more often than others, and which
ones depends on the model (and a little on the workload), not on the run. colibri keeps a count
per (layer, expert) for each model in a cache folder, adds every run's route counts to it when
the model closes, and uses it at the next start:

- a budgeted expert store (expert_mode "cache" or "mmap") pins the hottest experts at load
  (up to PIN_SHARE of the slots the batch minimum leaves free), so they are resident from the
  first token and never evicted by a burst of cold ones;
- `colibri plan` reports the share of routings that the hottest experts fitting the budget
  carried: the hit rate of a cache that holds exactly those.

The record is keyed by the file's content (size and hashes of its first and last 1 MiB), not
its path, so copies share it and a rewritten file starts afresh. It lives in
COLIBRI_USAGE_DIR (default ~/.cache/colibri/usage) as `<key>.npy` (uint64 [layers, experts]).
Many processes may update it at once: an update holds an exclusive lock on `<key>.lock`,
re-reads the record, adds, writes a unique temporary and renames it over the record, so no
update is lost and a reader never sees a partial file. A record that cannot be read (corrupt,
another shape) is ignored with a warning and replaced at the next update.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger("colibri")

PIN_SHARE = 0.5  # most of the free slots that pins from the record may take
_EDGE = 1 << 20  # bytes hashed at each end of the file for its key


def usage_dir() -> Path:
    env = os.environ.get("COLIBRI_USAGE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "colibri" / "usage"


def record_key(path: str | os.PathLike[str]) -> str:
    """The record's name for a model file: its size and the SHA-256 of its first and last
    MiB (the header, metadata and tensor table, and the end of the data)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(size.to_bytes(8, "little"))
        h.update(f.read(_EDGE))
        if size > 2 * _EDGE:
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()[:32]


def _record_path(path: str | os.PathLike[str], folder: Path | None) -> Path:
    return (folder if folder is not None else usage_dir()) / f"{record_key(path)}.npy"


def _read(rec: Path, shape: tuple[int, int]) -> np.ndarray | None:
    try:
        with open(rec, "rb") as f:
            a = np.load(f, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as e:
        log.warning("colibri: ignoring the expert usage record %s: %s", rec, e)
        return None
    if a.dtype != np.uint64 or a.shape != shape:
        log.warning("colibri: ignoring the expert usage record %s: %s %s, expected uint64 %s",
                    rec, a.dtype, a.shape, shape)
        return None
    return a


def load_usage(path: str | os.PathLike[str], shape: tuple[int, int],
               folder: Path | None = None) -> np.ndarray | None:
    """The record of a model file (uint64 [n_layers, n_expert]; dense layers' rows are zero),
    or None when there is none (or it is unreadable)."""
    return _read(_record_path(path, folder), shape)


def add_usage(path: str | os.PathLike[str], counts: np.ndarray,
              folder: Path | None = None) -> Path:
    """Add counts (uint64 [n_layers, n_expert]) to the model file's record, atomically with
    respect to other processes doing the same. Returns the record's path."""
    counts = np.asarray(counts, dtype=np.uint64)
    rec = _record_path(path, folder)
    rec.parent.mkdir(parents=True, exist_ok=True)
    with open(rec.with_suffix(".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = _read(rec, counts.shape)
            total = counts if old is None else old + counts
            fd, tmp = tempfile.mkstemp(prefix=f".{rec.name}.", dir=rec.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    np.save(f, total, allow_pickle=False)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, rec)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return rec


def hottest(counts: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The n most used (layer, expert) pairs of a record, by their share of their layer's
    routings (each MoE layer routes every token, so shares compare across layers); experts
    never chosen are not returned. Ties go to the lower layer, then the lower expert id."""
    c = np.asarray(counts, dtype=np.float64)
    totals = c.sum(axis=1, keepdims=True)
    share = np.divide(c, totals, out=np.zeros_like(c), where=totals > 0)
    flat = share.ravel()
    order = np.lexsort((np.arange(flat.size), -flat))  # by share, then by position
    n_expert = c.shape[1]
    return [(int(i) // n_expert, int(i) % n_expert) for i in order[: max(n, 0)] if flat[i] > 0]


def hit_share(counts: np.ndarray, slots: int) -> float:
    """The share of all routings that the `slots` hottest experts carried (0 for an empty
    record): the hit rate of a cache holding exactly those experts, on the recorded load."""
    c = np.asarray(counts, dtype=np.float64)
    total = float(c.sum())
    if total == 0:
        return 0.0
    return float(sum(c[layer, e] for layer, e in hottest(c, slots)) / total)


__all__ = ["PIN_SHARE", "add_usage", "hit_share", "hottest", "load_usage", "record_key",
           "usage_dir"]
