"""The `colibri` command line."""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="colibri", description="Run Mixture-of-Experts language models from GGUF files."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("doctor", help="report what this machine offers colibri and what to fix")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "doctor":
            from colibri.doctor import run

            return run()
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, MemoryError) as e:
        print(f"colibri {args.command}: error: {e}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
