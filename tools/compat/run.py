#!/usr/bin/env python3
"""llama.cpp's Responses and Anthropic Messages compatibility tests, ported, run against
`colibri serve`: see colibri/tools/compat.py (the harness and the cases live in the package,
so the tests import them; this is the path for scripts).

    python tools/compat/run.py [--model GGUF] [--url http://HOST:PORT] [--case NAME] [--json OUT]
"""

import sys

from colibri.tools.compat import main

if __name__ == "__main__":
    sys.exit(main())
