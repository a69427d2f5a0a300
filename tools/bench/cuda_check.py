#!/usr/bin/env python3
"""One-call check of colibri's CUDA kernels on a lent GPU: build, verify, time.

    python tools/bench/cuda_check.py            # on the GPU machine (device tool), ~3-6 min
    python tools/bench/cuda_check.py --cpu-only # here: the CPU reference path, no GPU needed
    python tools/bench/cuda_check.py --small --runs 1   # a quick smoke run of the GPU path

The command line of colibri.tools.cuda_check (its docstring lists the steps; --help prints it),
run from this checkout: PyCUDA's carried wheels and the cubin cache are under its build/.
"""

import sys
from pathlib import Path

from colibri.tools.cuda_check import main

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    sys.exit(main(root=ROOT))
