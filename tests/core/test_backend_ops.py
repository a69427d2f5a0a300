"""Every op on every backend and SIMD level against its reference: the cells of the table in
tests/backend_ops.py (rows in backend_ops_cpu.py and backend_ops_cuda.py), one test per
(op, backend, level) that exists. A backend with no version of an op is a Missing entry in the
table and generates no test; without a CUDA device or PyCUDA the "cuda" cells are skipped.

The coverage tests below keep the table whole: every op colibri._core exports, every block
type the CPU supports, and every kernel in cuda/*.cu has a row (print the matrix with
``python tests/backend_ops.py --ops-matrix``).
"""

from __future__ import annotations

import re
import shutil
from contextlib import nullcontext
from typing import Any

import pytest
from backend_ops import BACKENDS, CPU_LEVELS, ROOT, Missing, Op, cells, levels, matrix, table
from backend_ops_cpu import NOT_OPS, QUANT_TYPES
from backend_ops_cuda import EmuContext, build_emu
from cuda_util import cuda_include

import colibri._core._ops as core_ops
import colibri._core._quant as core_quant
import colibri.simd as simd

TABLE = table()
_refs: dict[str, list[tuple[dict, Any]]] = {}


def _cases(op: Op) -> list[tuple[dict, Any]]:
    """The op's cases with their references, computed once for all its cells."""
    if op.name not in _refs:
        _refs[op.name] = [(c, op.ref(c)) for c in op.cases(op.rng())]
    return _refs[op.name]


@pytest.fixture(scope="session")
def cpu_ctx() -> None:
    return None


@pytest.fixture(scope="session")
def emu_ctx(tmp_path_factory: pytest.TempPathFactory) -> EmuContext:
    inc = cuda_include()
    if inc is None or shutil.which("g++") is None:
        pytest.fail("the CUDA emulator needs g++ and the CUDA toolkit headers (cuda_fp16.h)")
    folder = tmp_path_factory.mktemp("backend_ops_emu")
    return EmuContext(build_emu(folder, inc, "address,undefined"), folder)


@pytest.fixture(scope="session")
def gpu_ctx() -> Any:
    import colibri.cuda as cuda

    reason = cuda.unavailable_reason()
    if reason is not None:
        pytest.skip(f"no CUDA device / PyCUDA not installed: {reason}")
    return cuda.get_runtime()


FIXTURE = {"cpu": "cpu_ctx", "cuda-emu": "emu_ctx", "cuda": "gpu_ctx"}
MARKS = {"cpu": [], "cuda-emu": [pytest.mark.slow], "cuda": [pytest.mark.gpu]}


@pytest.mark.parametrize("op,backend,level", [
    pytest.param(op, b, lv, id=f"{op.name}-{b}-{lv}", marks=MARKS[b])
    for op, b, lv in cells(TABLE)])
def test_op(op: Op, backend: str, level: str, request: pytest.FixtureRequest) -> None:
    ctx = request.getfixturevalue(FIXTURE[backend])
    run = op.impl[backend]
    assert callable(run)
    for case, want in _cases(op):
        with simd.max_simd(level) if backend == "cpu" else nullcontext():
            got = run(ctx, case)
        try:
            op.check(got, want, case)
        except AssertionError as e:
            raise AssertionError(f"{op.name} on {backend}/{level}, {case['label']} "
                                 f"(tolerance: {op.tol}):\n{e}") from None


# ---------------------------------------------------------------- coverage of the table


def test_cpu_levels_are_the_machines():
    assert CPU_LEVELS[0] == "scalar" and CPU_LEVELS[-1] == simd.detected()
    n_cpu = sum(1 for _, b, _ in cells(TABLE) if b == "cpu")
    assert n_cpu == len(CPU_LEVELS) * sum(op.runs_on("cpu") for op in TABLE)


def test_every_core_op_has_a_row():
    """Each function colibri._core._ops / _quant export is run by a row, or is listed as not an
    op (constants, enums, the type table) with where it is tested; no stale names."""
    exported = set(core_ops.__all__) | set(core_quant.__all__)
    covered = {a for op in TABLE for a in op.api}
    assert not exported - covered - set(NOT_OPS), "ops without a row"
    assert not set(NOT_OPS) - exported, "stale NOT_OPS names"
    assert not covered & set(NOT_OPS)
    assert not covered - exported - {"cb_route_token"}, "rows naming no export"


def test_every_cpu_type_has_its_rows():
    assert set(QUANT_TYPES) == set(core_quant.SUPPORTED)
    names = {op.name for op in TABLE}
    for t in core_quant.SUPPORTED:
        for kind in ("dequantize", "get_rows", "matmul"):
            assert f"{kind}.{t}" in names


def _cuda_kernels() -> set[str]:
    """Every kernel defined in cuda/*.cu: extern "C" __global__ functions and the instances of
    the GEMM kernel macros."""
    found = set()
    for src in sorted((ROOT / "cuda").glob("*.cu")):
        text = src.read_text()
        found |= set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?"
                                r"(cb_\w+)\s*\(", text))
        found |= set(re.findall(r"^CB_MOE_GEMM(?:_CP)?_KERNEL\((cb_\w+),", text, re.M))
    return found


def test_every_cuda_kernel_has_a_row():
    kernels = _cuda_kernels()
    assert {"cb_route_topk", "cb_moe_combine", "cb_moe_down_i4_m64",
            "cb_moe_gate_up_f16_m16_cp"} <= kernels  # the parser sees both kinds
    claimed = [k for op in TABLE for k in op.kernels]
    assert sorted(set(claimed)) == sorted(kernels), "kernels without a row, or stale names"


def test_no_hole_between_cpu_and_cuda():
    """A kernel that runs on a device also runs on the emulator (the emulator is the only CUDA
    column without a GPU); an op both sides implement has both columns."""
    for op in TABLE:
        assert op.runs_on("cuda") == op.runs_on("cuda-emu"), op.name
        assert op.tol, op.name
        for b in BACKENDS:
            v = op.impl[b]
            assert callable(v) or (isinstance(v, Missing) and v.reason), (op.name, b)


def test_matrix_lists_every_op():
    text = matrix(TABLE)
    for op in TABLE:
        assert re.search(rf"^{re.escape(op.name)}\s", text, re.M), op.name
    assert f"{len(cells(TABLE))} cells" in text
    n_missing = sum(isinstance(op.impl[b], Missing) for op in TABLE for b in BACKENDS)
    n_cols = sum(len(levels(b)) for b in BACKENDS)
    marks = [m for line in text.splitlines()[1 : len(TABLE) + 1] for m in line.split()[1:]]
    assert len(marks) == len(TABLE) * n_cols
    assert sum(m.startswith("-") for m in marks) == sum(
        len(levels(b)) for op in TABLE for b in BACKENDS if isinstance(op.impl[b], Missing))
    assert n_missing and marks.count("x") == len(cells(TABLE))
