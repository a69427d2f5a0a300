"""A server's memory at its start: `prefault(model)` touches, before /health turns ready, what
the first requests would otherwise fault in under load (`colibri serve --no-prefault` skips it):

- the weights: every page of the mapped file (Model.prefault), except, when the experts are
  streamed (expert_mode "cache" or "mmap": a model larger than RAM), the routed experts'
  tensors, which the store reads or maps as they are routed to; only the dense weights then;
- the expert store's slot pool (cache mode): populated with MADV_POPULATE_WRITE, which keeps
  its contents (pinned experts may already be there); skipped where the kernel lacks it;
- the KV arena: every free block allocated, one byte per page written, freed again. The
  arena never gives pages back, so its whole capacity stays resident from then on. Only
  before the engine starts: the arena must hold no live sequence but the cache's own;
- the forward pass's scratch: one batch of max_batch tokens run in a scratch sequence and
  dropped, with logits for as many rows as the engine decodes at once (prefault_forward).

`tune_malloc()` (the serve process, at its start): glibc's malloc raises its mmap threshold
to the largest block freed so far (up to 32 MiB), after which the engine's per-step arrays
(logits rows of n_vocab floats) are carved from the heap and their memory parked there when
freed: RSS then climbs by tens of MiB under load and stays. A fixed threshold of 4 MiB keeps
blocks above it mapped and returned when freed, so RSS follows what is in use.
"""

from __future__ import annotations

import ctypes
import logging
import re
from typing import TYPE_CHECKING

import numpy as np

from colibri.engine.core import PAGE, prefault_arena

if TYPE_CHECKING:
    from colibri.model import Model

log = logging.getLogger("colibri")

MADV_POPULATE_WRITE = 23  # Linux 5.14
M_MMAP_THRESHOLD = -3     # mallopt
MMAP_THRESHOLD = 4 << 20
_EXPERT_TENSOR = re.compile(r"\.ffn_[a-z_]*_exps\.")


def prefault_weights(model: Model) -> int:
    """Touch the model's weights (see the module doc); the bytes touched."""
    store = model.experts
    if store is None or store.mode == "mapped":
        return int(model.prefault())
    total = 0
    for name, t in model.gguf.tensors.items():
        if _EXPERT_TENSOR.search(name):
            continue
        view = model.gguf.data(name)
        if view.size:
            rows = view.reshape(1, -1) if view.ndim == 1 else view
            int(rows[:, ::PAGE].sum(dtype=np.uint64))
            total += int(t.nbytes)
    return total


def prefault_pool(model: Model) -> int:
    """Populate the expert store's slot pool, contents kept; the bytes (0: no pool, or a kernel
    without MADV_POPULATE_WRITE)."""
    store = model.experts
    if store is None or store.mode != "cache":
        return 0
    p = store.pool()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = int(p["address"]) & ~(PAGE - 1)
    size = int(p["address"]) + int(p["bytes"]) - base
    if libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(size), MADV_POPULATE_WRITE) != 0:
        log.info("prefault: the expert pool is left to fill as experts load "
                 "(madvise(MADV_POPULATE_WRITE): errno %d)", ctypes.get_errno())
        return 0
    return int(p["bytes"])


def prefault_forward(model: Model, rows: int) -> int:
    """One forward batch of max_batch tokens (at most the context) in a scratch sequence, the
    last `rows` of them with logits; the tokens run. The batch is one token repeated: a MoE
    model routes it to the same few experts in every layer (little expert I/O, the largest
    per-expert batch), and its route counts are kept out of the expert usage record."""
    n = min(int(model.max_batch), int(model.ctx))
    if n <= 0:
        return 0
    ids = model.tokenize("The", add_special=False)
    want = np.zeros(n, dtype=bool)
    want[n - max(1, min(rows, n)):] = True
    moe = [i for i, L in enumerate(model.desc.layers) if L.n_expert] if model.desc.is_moe else []
    before = {i: np.asarray(model.route_counts(i), dtype=np.uint64).copy() for i in moe}
    seq = model.new_sequence()
    try:
        model.eval([seq], tokens=[ids[0] if ids else 0] * n, logits=want)
    finally:
        model.free_sequence(seq)
    # Model.save_expert_usage records the counts above its baseline: the warm-up's counts
    # join the baseline, as if already recorded
    base = model._usage_base
    for i in moe:
        added = np.asarray(model.route_counts(i), dtype=np.uint64) - before[i]
        base[i] = base.get(i, np.zeros_like(added)) + added
    return n


def prefault(model: Model, rows: int) -> dict[str, int]:
    """Weights, expert pool and KV arena touched, then the forward's scratch (rows: the most
    sequences decoded at once); the bytes of each, and the forward's tokens."""
    out = {"weights": prefault_weights(model), "expert_pool": prefault_pool(model),
           "kv_arena": prefault_arena(model.arena)}
    out["forward_tokens"] = prefault_forward(model, rows)
    return out


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold (see the module doc); False where there is no mallopt."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


__all__ = ["prefault", "prefault_arena", "prefault_forward", "prefault_pool",
           "prefault_weights", "tune_malloc"]

