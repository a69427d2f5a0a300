#!/usr/bin/env bash
# Install colibri with its test dependencies, then run every check the project has:
# ruff and mypy, the C unit tests under ASan/UBSan (and a -Wall -Wextra -Werror build; SIMDe,
# Debian's libsimde-dev, is installed first where missing: it emulates the AVX-512 kernels),
# nvcc compilation of every cuda/*.cu for sm_80 and sm_90, the sdist + wheel built and installed
# in a fresh venv (tools/check_wheel.sh), pytest (which runs every README example), and a bounded
# slice of the mutation run (tools/mutation/run.py --slice; the full run stays a tool).
# Usage: bash tools/test.sh [pytest args...]
#
# The tests run in a virtual environment of their own, .venv in the checkout (git ignores it;
# reused by the next run): the editable install they need points at this checkout, and left in
# a shared interpreter it would break `import colibri` there (ModuleNotFoundError) once the
# checkout moves or is deleted. Once every check has passed, python3 (the interpreter that runs
# this, an activated venv's included) gets what the README's first command installs, a copy of
# this checkout with the demo extra (`pip install ".[demo]"`, not editable: it survives the
# checkout), so that the README's Python examples run with it from any directory.
# PYTHON=/path/to/python runs everything with that interpreter instead (it gets the editable
# install, and nothing else is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
else
    PY=.venv/bin/python
    if ! "$PY" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)" 2>/dev/null; then
        echo "== virtual environment (.venv)"
        rm -rf .venv
        python3 -m venv .venv
    fi
fi

echo "== install"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"

echo "== ruff"
"$PY" -m ruff check colibri tests tools
echo "== mypy"
"$PY" -m mypy

echo "== C unit tests (ASan/UBSan)"
# tests/c/test_quant_avx512.c emulates the AVX-512 kernels with SIMDe (Debian: libsimde-dev)
if [ ! -f /usr/include/simde/x86/avx512.h ]; then
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libsimde-dev ||
        { echo "tools/test.sh: cannot install libsimde-dev (SIMDe), needed by the C tests" >&2; exit 1; }
fi
make -s -j"$(nproc)" -C tests/c

echo "== CUDA kernels (nvcc)"
bash tools/build_cuda.sh

echo "== wheel (sdist, wheel, fresh venv, README outside the checkout)"
PYTHON="$PY" bash tools/check_wheel.sh

echo "== pytest"
"$PY" -m pytest -q "$@"

echo "== mutation slice (tools/mutation/run.py --slice: a fixed sample, fails below its recorded score)"
"$PY" tools/mutation/run.py --slice

if [ -z "${PYTHON:-}" ]; then
    echo "== install for the README's examples (python3: $(command -v python3))"
    if python3 -m pip install -q --disable-pip-version-check ".[demo]"; then
        (cd / && python3 -c "import colibri")
    else
        echo "tools/test.sh: python3 refused the install (an externally managed interpreter?):" \
             "run the README's Python examples with $(pwd)/.venv/bin/python" >&2
    fi
fi
