#!/usr/bin/env python3
"""Convert a Hugging Face checkpoint to GGUF: see colibri/tools/convert_hf.py.

    python tools/convert_hf.py MODEL_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0] [--pre NAME]

Kept as a path for scripts; the converter ships in the package (`python -m
colibri.tools.convert_hf`), where the oracle tests and tools/bench/learned_moe.py import it.
"""

import sys

from colibri.tools.convert_hf import main

if __name__ == "__main__":
    sys.exit(main())
