"""The op x backend table (issue 19; the role of llama.cpp's test-backend-ops).

One row (:class:`Op`) per op: its inputs (a generator over shapes and types), its reference
(numpy float64, gguf's dequantizers, colibri._cuda_ref), its tolerance with the reason for it,
and one entry per backend column (:data:`BACKENDS`): the callable that runs the op there, or a
:class:`Missing` saying why that backend has no version of it. tests/core/test_backend_ops.py
runs every (op, backend, level) cell that exists: the CPU at every SIMD level this machine
supports (colibri.simd), the CUDA kernels on the CPU emulator (tests/cuda_emu) and on a real
device through PyCUDA.

The rows live in backend_ops_cpu.py (colibri._core's float and quantized ops) and
backend_ops_cuda.py (cuda/*.cu); :func:`table` joins them.

Print the coverage matrix: ``python tests/backend_ops.py --ops-matrix``.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import colibri.simd as simd

ROOT = Path(__file__).resolve().parents[1]

# The columns. "cpu" runs at each SIMD level of CPU_LEVELS (one column each); "cuda-emu" is
# cuda/*.cu compiled with g++ against tests/cuda_emu/cuda_emu.h under ASan/UBSan; "cuda" is a
# real device through PyCUDA (colibri.cuda.CudaRuntime).
BACKENDS = ("cpu", "cuda-emu", "cuda")
# Levels above the CPU's cannot run natively (capping there would run the CPU's own level
# again), so they generate no cell.
CPU_LEVELS = tuple(simd.LEVELS[: simd.LEVELS.index(simd.detected()) + 1])

Case = dict[str, Any]
Runner = Callable[[Any, Case], Any]


@dataclass(frozen=True)
class Missing:
    """A backend that implements no version of the op, and why (shown in the matrix)."""

    reason: str


@dataclass(frozen=True)
class Op:
    """One row of the table.

    cases(rng): the inputs, a list of dicts with a "label" (the shape/type/variant, named in a
    failure); ref(case): the reference result; check(got, want, case): raises AssertionError
    when got is out of tolerance; tol: the tolerance and the reason for it; impl: backend ->
    runner(ctx, case) (ctx: the backend's fixture value) or Missing; api: the colibri._core
    functions the CPU runner covers; kernels: the cuda/*.cu kernels the CUDA runners launch.
    """

    name: str
    cases: Callable[[np.random.Generator], list[Case]]
    ref: Callable[[Case], Any]
    check: Callable[[Any, Any, Case], None]
    tol: str
    impl: dict[str, Runner | Missing]
    api: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if set(self.impl) != set(BACKENDS):
            raise ValueError(f"{self.name}: impl must name every backend {BACKENDS}")
        for b, v in self.impl.items():
            if not (callable(v) or isinstance(v, Missing)):
                raise ValueError(f"{self.name}/{b}: a runner or Missing, got {v!r}")
        if callable(self.impl["cpu"]) != bool(self.api):
            raise ValueError(f"{self.name}: a CPU runner names its api, and only it")
        cuda = callable(self.impl["cuda"]) or callable(self.impl["cuda-emu"])
        if cuda != bool(self.kernels):
            raise ValueError(f"{self.name}: CUDA runners name their kernels, and only they")

    def runs_on(self, backend: str) -> bool:
        return callable(self.impl[backend])

    def rng(self) -> np.random.Generator:
        """The same inputs for every backend and level: seeded by the op's name."""
        return np.random.default_rng(zlib.crc32(self.name.encode()))


def levels(backend: str) -> tuple[str, ...]:
    return CPU_LEVELS if backend == "cpu" else ("emu",) if backend == "cuda-emu" else ("device",)


def table() -> list[Op]:
    import backend_ops_cpu
    import backend_ops_cuda

    rows = backend_ops_cpu.ROWS + backend_ops_cuda.ROWS
    names = [op.name for op in rows]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"op names used twice: {sorted(dup)}")
    return rows


def cells(rows: list[Op]) -> list[tuple[Op, str, str]]:
    """Every (op, backend, level) that exists; a Missing entry generates none."""
    return [(op, b, lv) for op in rows for b in BACKENDS if op.runs_on(b) for lv in levels(b)]


def matrix(rows: list[Op]) -> str:
    """The coverage matrix as text: one line per op, one column per backend level; 'x' runs,
    '-' is Missing (the reasons follow, numbered)."""
    cols = [(b, lv) for b in BACKENDS for lv in levels(b)]
    heads = [lv if b == "cpu" else b for b, lv in cols]
    w = max(len(op.name) for op in rows)
    reasons: list[str] = []
    lines = [" " * w + "  " + " ".join(f"{h:>10}" for h in heads)]
    for op in rows:
        marks = []
        for b, _ in cols:
            v = op.impl[b]
            if isinstance(v, Missing):
                if v.reason not in reasons:
                    reasons.append(v.reason)
                marks.append(f"-{reasons.index(v.reason) + 1}")
            else:
                marks.append("x")
        lines.append(f"{op.name:<{w}}  " + " ".join(f"{m:>10}" for m in marks))
    lines.append("")
    lines += [f"-{i + 1}: {r}" for i, r in enumerate(reasons)]
    lines.append(f"{len(cells(rows))} cells here (CPU levels: {', '.join(CPU_LEVELS)})")
    return "\n".join(lines)


def close(got: Any, want: Any, rtol: float, atol: float) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--ops-matrix"]):
        sys.exit("usage: python tests/backend_ops.py [--ops-matrix]")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import backend_ops  # the rows' module (this file runs as __main__, a second copy)

    print(backend_ops.matrix(backend_ops.table()))
