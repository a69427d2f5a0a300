#!/usr/bin/env python3
"""Read throughput of a file against queue depth (tools/bench/diskqd.c, compiled here): blocks of
one size at random block-aligned offsets, each read once, with QD reads in flight, three ways:
buffered pread threads (the page cache dropped first), O_DIRECT pread threads, and io_uring
with O_DIRECT. The expert store's reads are the use case: pass its part size as --block.

    python tools/bench/disk.py FILE [--block BYTES] [--seconds S] [--modes pread,direct,uring]
                               [--qds 1,2,4,8,16] [--repeat 3] [--json OUT]

Each (mode, QD) cell is the median of --repeat runs, interleaved (the machine is shared). The
best cell is the disk's bandwidth for tools/bench/experts.py's disk bound. FILE should be
larger than a few seconds of reads (a run stops at the end of the file; its rate still counts
only what it read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("pread", "direct", "uring")


def _build() -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise SystemExit("tools/bench/disk.py: no C compiler (cc/gcc) to build diskqd.c")
    exe = os.path.join(tempfile.gettempdir(), f"colibri_diskqd_{os.getpid()}")
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-pthread", str(HERE / "diskqd.c"), "-o", exe],
                   check=True)
    return exe


def measure(path: str, block: int, seconds: float = 1.0, modes: tuple[str, ...] = MODES,
            qds: tuple[int, ...] = (1, 2, 4, 8, 16), repeat: int = 3) -> dict[str, dict[int, float]]:
    """MB/s per mode and queue depth: the median of `repeat` interleaved passes. A mode the file
    system refuses (O_DIRECT on tmpfs, io_uring disabled) reads NaN."""
    block = max(4096, block // 4096 * 4096)
    exe = _build()
    runs: dict[str, dict[int, list[float]]] = {m: {q: [] for q in qds} for m in modes}
    try:
        for _ in range(repeat):
            p = subprocess.run([exe, path, str(block), str(seconds), ",".join(modes),
                                ",".join(map(str, qds))], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"diskqd failed: {p.stderr.strip()}")
            for line in p.stdout.splitlines():
                m, q, mbs, _n = line.split()
                runs[m][int(q)].append(float(mbs))
    finally:
        os.unlink(exe)
    return {m: {q: statistics.median(v) for q, v in per.items()} for m, per in runs.items()}


def best(table: dict[str, dict[int, float]]) -> tuple[str, int, float]:
    """(mode, qd, MB/s) of the fastest cell."""
    cells = [(mbs, m, q) for m, per in table.items() for q, mbs in per.items() if mbs == mbs]
    if not cells:
        raise SystemExit("diskqd: no mode could read the file")
    mbs, m, q = max(cells)
    return m, q, mbs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--block", type=int, default=1 << 20, help="bytes per read (default 1 MiB)")
    ap.add_argument("--seconds", type=float, default=1.0, help="per (mode, QD) run")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--qds", default="1,2,4,8,16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    modes = tuple(a.modes.split(","))
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {', '.join(MODES)}")
    qds = tuple(int(q) for q in a.qds.split(","))
    t = measure(a.file, a.block, a.seconds, modes, qds, a.repeat)
    print(f"{a.file}: {a.block} B reads, MB/s (median of {a.repeat})")
    print(f"{'QD':>4} " + " ".join(f"{m:>8}" for m in modes))
    for q in qds:
        print(f"{q:4d} " + " ".join(f"{t[m][q]:8.0f}" for m in modes))
    m, q, mbs = best(t)
    print(f"best: {m} at QD {q}: {mbs:.0f} MB/s")
    if a.json:
        Path(a.json).write_text(json.dumps({"block": a.block, "table": t,
                                            "best": [m, q, mbs]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
