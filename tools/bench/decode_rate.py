"""Greedy decode rate of the colibri on PYTHONPATH, for A/B runs of two builds.

    PYTHONPATH=BUILD_A python tools/bench/decode_rate.py [MODEL|default] [N] [THREADS]

Loads the model (ctx 512, no tokenizer), prefaults it, evaluates a 16-token prompt and 4
untimed steps, then times N single-token greedy steps and prints steps/s and the colibri it
used. Run the builds alternately in fresh processes and compare medians.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def main() -> None:
    import colibri
    from colibri.model import Model, default_model_path

    args = sys.argv[1:]
    path = args[0] if args and args[0] != "default" else default_model_path(progress=False)
    n = int(args[1]) if len(args) > 1 else 64
    threads = int(args[2]) if len(args) > 2 else 1
    m = Model(path, threads=threads, ctx=512, tokenizer=False)
    m.prefault()
    seq = m.new_sequence()
    t = int(np.argmax(m.eval([seq], tokens=list(range(2, 18)))[-1]))
    for _ in range(4):
        t = int(np.argmax(m.eval([seq], tokens=[t])[-1]))
    t0 = time.perf_counter()
    for _ in range(n):
        t = int(np.argmax(m.eval([seq], tokens=[t])[-1]))
    print(f"{n / (time.perf_counter() - t0):.2f}", colibri.__file__)


if __name__ == "__main__":
    main()
