#!/usr/bin/env python3
"""Decode against the memory roofline, colibri and llama.cpp in one run (the code and its
description: colibri/tools/roofline.py).

    python tools/bench/roofline.py [-m MODEL ...] [--moe [PATH]] [--threads 1,2] [--tokens N]
                                   [--ctx-pos P] [--rounds 3] [--no-llama-cpp] [--json OUT]

Like every tool here it imports the installed colibri (from a checkout: PYTHONPATH=.).
"""

import sys

from colibri.tools.roofline import main

if __name__ == "__main__":
    sys.exit(main())
