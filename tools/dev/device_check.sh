#!/usr/bin/env bash
# The one command to run on a lent GPU machine (the device tool), from a bare machine:
#   1. gguf (the one runtime dependency the machine's image lacks) installed offline from the
#      carried wheels into build/pycuda_site;
#   2. colibri's C core and Cython extensions built in place (the image has cython, numpy,
#      setuptools and a compiler; its python3 is not this machine's, so nothing built here
#      travels);
#   3. PyCUDA built from the carried sdist (colibri.tools.cuda_check.pycuda_build);
#   4. the GPU tests (tests/cuda/test_cuda_gpu.py: kernels, Model(device="cuda") against the
#      CPU forward, the staged path), at most GPU_TEST_SECONDS (default 200), then the command
#      line a user runs (`colibri run --device cuda` on a tiny bench model);
#   5. tools/bench/cuda_check.py in the time left: checks routing, both GEMM pipelines and the
#      staged path against the CPU references (a failed check is reported and the others still
#      run), and times the grouped FFN against the device's matmul rate, its copy bandwidth
#      and PyTorch.
# Correctness first: on a machine that has never run the kernels, the tests say most.
# Every step's time and output go to $OUT (device_check.log, build_colibri.log, pytest_gpu.log,
# cli_cuda.log, cuda_check.log, cuda_check.json, ptxas.txt), which the device tool brings back
# (at most 8 files).
#
# Here, once: bash tools/dev/fetch_pycuda.sh   (build/pycuda_wheels: PyCUDA sdist, wheels, gguf)
# Then one device call: command "bash tools/dev/device_check.sh", carry ["build/pycuda_wheels"],
# timeout_s 600. DEVICE_CHECK_SECONDS (default 540) is when everything must have ended;
# PYTHON (default python3) the interpreter; extra arguments go to cuda_check.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
OUT=${OUT:-build/device_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LIMIT=${DEVICE_CHECK_SECONDS:-540}
TESTS_LIMIT=${GPU_TEST_SECONDS:-200}
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((LIMIT - $(elapsed))); }
log() { echo "[device_check +$(elapsed)s] $*" | tee -a "$OUT/device_check.log"; }
fail() {
    log "FAILED: $*"
    exit 1
}
status=0

log "$(uname -m), $("$PY" --version 2>&1), $(nproc) cpus, nvcc: $(command -v nvcc || echo none)"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap \
        --format=csv,noheader 2>&1 | tee -a "$OUT/device_check.log"
fi
log "libcuda: $(ldconfig -p 2>/dev/null | grep -o '/\S*libcuda\.so[.0-9]*' | tr '\n' ' ')" \
    "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

# 1. gguf from the carried wheel, where the image lacks it
site="$PWD/build/pycuda_site"
mkdir -p "$site"
# the checkout (built in place below: the tools import the colibri on the path) and the site
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import gguf" 2>/dev/null; then
    whl=$(ls build/pycuda_wheels/gguf-*.whl 2>/dev/null | tail -1)
    [ -n "$whl" ] || fail "gguf is not importable and no gguf wheel in build/pycuda_wheels (run tools/dev/fetch_pycuda.sh here and carry build/pycuda_wheels)"
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --disable-pip-version-check --no-index \
        --no-deps --target "$site" "$whl" || fail "installing $whl"
    log "gguf installed from $whl"
fi

# 2. colibri in place
t=$(date +%s)
if ! "$PY" setup.py -q build_ext --inplace -j "$(nproc)" >"$OUT/build_colibri.log" 2>&1; then
    tail -40 "$OUT/build_colibri.log"
    fail "building colibri (build_colibri.log)"
fi
"$PY" -c "import colibri" || fail "import colibri after the build"
log "colibri built in place in $(($(date +%s) - t)) s"

# 3. PyCUDA, then on the path for the tests and the command line
"$PY" -c "
from pathlib import Path
from colibri.tools.cuda_check.pycuda_build import ensure_pycuda
s = ensure_pycuda(Path('.').resolve())
print('PyCUDA', 'already importable' if s is None else f'built in {s:.1f} s')
" 2>&1 | tee -a "$OUT/device_check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "PyCUDA"
for d in "$PWD"/build/pycuda_src/pycuda-*; do
    [ -d "$d" ] && export PYTHONPATH="$d:$PYTHONPATH"
done
export COLIBRI_CUDA_CACHE="$PWD/build/cuda_cache"
"$PY" -c "import colibri.cuda as c; r = c.unavailable_reason(); print('colibri.cuda:', r or 'available'); raise SystemExit(1 if r else 0)" \
    2>&1 | tee -a "$OUT/device_check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "colibri.cuda is unavailable"

# 4. the GPU tests, then the command line
budget=$(( $(left) < TESTS_LIMIT ? $(left) : TESTS_LIMIT ))
log "GPU tests (at most ${budget} s)"
timeout "$budget" "$PY" -m pytest -q -p no:cacheprovider -rs --durations=8 \
    tests/cuda/test_cuda_gpu.py >"$OUT/pytest_gpu.log" 2>&1
prc=$?
tail -40 "$OUT/pytest_gpu.log"
log "GPU tests exit status $prc$([ $prc -eq 124 ] && echo ' (out of time)')"
[ $prc -eq 0 ] || status=1
m="$PWD/build/device_bench_tiny.gguf"
{
    "$PY" -m colibri make-bench-model "$m" --shape tiny --layers 2 &&
        timeout 120 "$PY" -m colibri run -m "$m" --device cuda -n 8 -p "hello" --seed 1
} >"$OUT/cli_cuda.log" 2>&1
crc=$?
tail -5 "$OUT/cli_cuda.log"
log "colibri run --device cuda exit status $crc"
[ $crc -eq 0 ] || status=1

# registers, spills and shared memory of every kernel as this machine's nvcc builds them
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
if command -v nvcc >/dev/null && [ -n "$cc" ]; then
    for f in routing moe_gemm; do
        nvcc -cubin -arch="sm_$cc" -std=c++17 -O3 -Icuda -Xptxas -v -o /dev/null "cuda/$f.cu" \
            >>"$OUT/ptxas.txt" 2>&1
    done
    log "ptxas resource usage for sm_$cc in ptxas.txt"
fi

# 5. the check and the timings, in the time left
budget=$(left)
if [ "$budget" -gt 30 ]; then
    log "cuda_check.py (at most ${budget} s)"
    timeout "$budget" "$PY" tools/bench/cuda_check.py "$@" 2>&1 | tee "$OUT/cuda_check.log"
    rc=${PIPESTATUS[0]}
    log "cuda_check.py exit status $rc$([ $rc -eq 124 ] && echo ' (out of time)')"
    [ $rc -eq 0 ] || status=1
else
    log "cuda_check.py skipped: ${budget} s left"
    status=1
fi
log "done (exit status $status)"
exit "$status"
