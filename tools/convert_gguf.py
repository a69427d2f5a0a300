#!/usr/bin/env python3
"""Convert a GGUF model to a colibri container (the same as `colibri convert`).

    python tools/convert_gguf.py IN.gguf OUT.colibri [--quant keep|q8_0|q4_0|int4-g128] [-q] [--force]

The container keeps the GGUF's metadata and tensors, lays every routed expert's gate, up and
down out adjacent at a 2 MiB-aligned offset (one read fetches one expert), and records a crc32
per expert and for the dense tensors. The write is atomic: a temporary file beside OUT,
fsync, rename; an existing OUT is replaced only with --force (never a device, FIFO or
directory). See colibri/container/ and docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import argparse
import sys

from colibri.cli import add_convert_args, run_convert


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="convert_gguf.py", description=__doc__.split("\n")[0])
    add_convert_args(p)
    args = p.parse_args(argv)
    try:
        return run_convert(args)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError) as e:
        print(f"convert_gguf.py: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
