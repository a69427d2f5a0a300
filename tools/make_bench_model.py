#!/usr/bin/env python3
"""Write a benchmark MoE GGUF with random weights: see colibri/tools/make_bench_model.py.

Kept as a path for scripts; the tool ships in the package, so an installed colibri runs it as
`python -m colibri.tools.make_bench_model OUT.gguf` (or `colibri make-bench-model OUT.gguf`).
"""

import sys

from colibri.tools.make_bench_model import main

if __name__ == "__main__":
    sys.exit(main())
