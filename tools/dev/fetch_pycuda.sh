#!/usr/bin/env bash
# Download what building PyCUDA needs on a machine without network (the lent GPU machine):
# the PyCUDA sdist, wheels of its pure-Python dependencies, and binary wheels of the two
# compiled ones (markupsafe for mako, siphash24 for pytools) for CPython 3.10-3.13 on x86-64
# Linux, plus setuptools and wheel for the build, and the gguf wheel (colibri's one runtime
# dependency the GPU machine's image lacks). Everything lands in build/pycuda_wheels (ignored
# by git; hand it to the device tool with carry=["build/pycuda_wheels"]).
# tools/dev/device_check.sh and tools/bench/cuda_check.py install from there offline.
# Usage: bash tools/dev/fetch_pycuda.sh [dest]
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-build/pycuda_wheels}
mkdir -p "$dest"
PIP=(python3 -m pip download --disable-pip-version-check -q --no-deps -d "$dest")
"${PIP[@]}" --no-binary pycuda pycuda
"${PIP[@]}" pytools platformdirs mako typing-extensions setuptools wheel gguf
for v in 3.10 3.11 3.12 3.13; do
  "${PIP[@]}" --only-binary=:all: --python-version "$v" --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 markupsafe siphash24
done
ls -l "$dest"
du -sh "$dest"
