"""tools/bench/cuda_check.py --cpu-only: the GPU check script's reference path (routing and
the NumPy emulation of the kernels' data flow against the float64 references) runs here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cuda_check_cpu_only(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench" / "cuda_check.py"), "--cpu-only"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OUT": str(tmp_path)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu-only self-check passed" in r.stdout
    assert "FAIL" not in r.stdout
    assert (tmp_path / "cuda_check.json").is_file()
