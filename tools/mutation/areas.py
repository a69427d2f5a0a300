"""The areas of the mutation run (tools/mutation/run.py): each a set of sources and the fast
tests that cover them. A Python area is mutated by mutmut, a C area by colibri/tools/cmutate.py
(operator and boundary swaps, a seeded sample). The test lists are the fast subsets that cover
the area (a mutant run takes seconds); the full suite still runs in CI."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PyArea:
    name: str
    files: tuple[str, ...]  # mutmut's only_mutate globs, relative to the checkout
    tests: tuple[str, ...]  # pytest paths / node ids
    deselect: tuple[str, ...] = ()  # tests that need what a copy of the tree lacks (git)
    wall_s: float = 240.0  # a mutant's tests running longer (wall clock) are a timeout


@dataclass(frozen=True)
class CArea:
    name: str
    files: tuple[str, ...]  # C sources mutated (relative to the checkout)
    ctests: tuple[str, ...]  # tests/c binaries (test_*.c names without .c) built and run
    functions: tuple[str, ...] = field(default=())  # only these functions ((): every one)


_GIT = ("tests/cli/test_front_door.py::test_the_distribution_name_is_ours_everywhere",)

PY_AREAS: dict[str, PyArea] = {a.name: a for a in (
    PyArea("sampling", ("colibri/sampling.py",),
           ("tests/model/test_sampling.py", "tests/model/test_generate.py")),
    PyArea("inputs", ("colibri/inputs.py",),
           ("tests/cli/test_inputs.py", "tests/cli/test_front_door.py",
            "tests/model/test_generate.py"), _GIT),
    PyArea("config", ("colibri/config.py",),
           ("tests/cli/test_config.py", "tests/cli/test_front_door.py",
            "tests/model/test_dense_weights.py"), _GIT),
    PyArea("engine", ("colibri/engine/*",),
           ("tests/model/test_engine_output.py", "tests/model/test_engine.py",
            "tests/model/test_engine_cancel.py", "tests/model/test_engine_cached_tokens.py",
            "tests/model/test_engine_statemachine.py", "tests/model/test_engine_constraint.py")),
)}

C_AREAS: dict[str, CArea] = {a.name: a for a in (
    CArea("arena", ("colibri/_core/arena.c",), ("test_arena", "test_oom")),
    CArea("kvcache", ("colibri/_core/kvcache.c",), ("test_arena", "test_oom")),
    CArea("experts", ("colibri/_core/experts.c",), ("test_experts", "test_experts_faults")),
    CArea("experts_policy", ("colibri/_core/experts_policy.c",), ("test_experts",)),
    CArea("utf8", ("colibri/_core/utf8.c",), ("test_utf8",)),
)}

# The bounded slice tools/test.sh runs (tools/mutation/run.py --slice): fixed seeded samples,
# with the fast tests only, a few minutes on a 2-core machine, and the score the slice must
# keep (tools/mutation/slice_score.txt, recorded from a run: a test removed or weakened so that
# a sampled mutant survives fails the check). area -> (tests, sample size).
SLICE_PY: dict[str, tuple[tuple[str, ...], int]] = {
    "sampling": (("tests/model/test_sampling.py",), 24)}
SLICE_C: dict[str, tuple[tuple[str, ...], int]] = {"arena": (("test_arena",), 4)}
SLICE_SEED = 49
