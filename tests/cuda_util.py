"""Helpers shared by the CUDA tests that run without a GPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cuda_include() -> Path | None:
    """The CUDA toolkit's include folder (holding cuda_fp16.h), or None when absent."""
    cands = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(Path(nvcc).resolve().parent.parent / "include")
    cands += [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include",
              Path("/usr/local/cuda/include")]
    return next((c for c in cands if (c / "cuda_fp16.h").is_file()), None)
