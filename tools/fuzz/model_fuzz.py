#!/usr/bin/env python3
"""Fuzzing the whole model path: mutated GGUF files and colibri containers through
`colibri.model.Model(path, ...)` and one short generation each.

    python tools/fuzz/model_fuzz.py --cases 10000 [--seed 0] [--out fuzz-out]
    python tools/fuzz/model_fuzz.py --seconds 600
    python tools/fuzz/model_fuzz.py --replay fuzz-out/crashes/case-123.gguf

The command line of colibri.tools.fuzz.harness (the seeds, mutations and harness live in the
package colibri/tools/fuzz/; its harness.py describes the campaign).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # the checkout's colibri when it is not installed
    sys.path.insert(0, ROOT)

from colibri.tools.fuzz.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
