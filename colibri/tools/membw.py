"""The machine's streaming read bandwidth: tools/bench/membw.c (a plain multi-threaded read of a
large buffer, the peer of the decode kernels) compiled once per process and run.

Used by tools/bench/quant_kernels.py and colibri.tools.roofline. The C source lives in the checkout
(tools/bench/membw.c), not in the installed package: these benchmarks run from a checkout, and a
C compiler (cc or gcc) is needed.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "tools" / "bench" / "membw.c"
_exe: str | None = None


def _build(source: Path) -> str:
    global _exe
    if _exe is not None and os.path.exists(_exe):
        return _exe
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("a C compiler (cc or gcc) is needed for the bandwidth probe")
    if not source.is_file():
        raise RuntimeError(f"{source} not found: the bandwidth probe runs from a checkout")
    tmp = tempfile.mkdtemp(prefix="colibri_membw_")
    atexit.register(shutil.rmtree, tmp, True)
    exe = os.path.join(tmp, "membw")
    subprocess.run([cc, "-O2", "-march=native", "-pthread", str(source), "-o", exe], check=True)
    _exe = exe
    return exe


def membw(threads: int, mib: int, passes: int = 8, source: Path = SOURCE) -> float:
    """The best GB/s (1e9 bytes/s) of `passes` reads of a `mib` MiB buffer by `threads`
    threads (make the buffer several times the last-level cache)."""
    return membw_rates(threads, mib, passes, source)[0]


def membw_rates(threads: int, mib: int, passes: int = 8,
                source: Path = SOURCE) -> tuple[float, float]:
    """(best, sustained) GB/s of `passes` reads of a `mib` MiB buffer by `threads` threads: the
    best pass, and the bytes of passes 2.. over their total time (the first pass warms up)."""
    if threads < 1 or mib < 1 or passes < 1:
        raise ValueError(f"threads, mib and passes must be positive: {threads}, {mib}, {passes}")
    out = subprocess.run([_build(source), str(mib), str(threads), str(passes)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), float(out[2])


def l3_bytes() -> int:
    """The last-level cache of cpu0 in bytes (32 MiB when sysfs does not say)."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            s = f.read().strip()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
        return int(s.rstrip("KM")) * mult
    except (OSError, ValueError):
        return 32 << 20
