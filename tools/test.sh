#!/usr/bin/env bash
# Install colibri with its test dependencies, then run every check the project has:
# ruff and mypy, the C unit tests under ASan/UBSan (and a -Wall -Wextra -Werror build),
# nvcc compilation of every cuda/*.cu for sm_80 and sm_90, and pytest.
# Usage: bash tools/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "== install"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"

echo "== ruff"
"$PY" -m ruff check colibri tests tools
echo "== mypy"
"$PY" -m mypy

echo "== C unit tests (ASan/UBSan)"
make -s -C tests/c

echo "== CUDA kernels (nvcc)"
bash tools/build_cuda.sh

echo "== pytest"
"$PY" -m pytest -q "$@"
