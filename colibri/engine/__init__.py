"""`colibri.Engine`: many requests at once on one Model (continuous batching).

One background thread runs steps. A step is one forward batch (one `Model.eval`) holding one
decode token of every running sequence (decode tokens go first) and, with what is left of
`max_batch`, at most `prefill_chunk` tokens of waiting prompts (chunked prefill). Requests join
and leave between steps.

Memory: every sequence's KV is reserved before the step runs (`KVCache.reserve`); a
`MemoryError` there means the arena is full, and the youngest admitted request is preempted:
its KV is freed and it goes back to the waiting queue, to recompute its prompt and the tokens it
generated so far when memory allows (its caller sees only latency; its sampler keeps its random
state). Older requests are never failed for memory and the oldest always progresses, so the
engine cannot deadlock: a sequence alone always fits (prompts longer than the context fail at
submission, and a sequence stops at the context).

Latency: the Engine touches the KV arena's free pages once when it starts (`prefault_kv`), and
grows sequences' KV blocks ahead of need, one sequence a step, while the arena has room
(scheduler.py, KV_GROW_*): a block that moves is copied into resident pages, and sequences
decoding in step do not all move their blocks in the same step. The prefill chunk follows a
fit of the measured step times; a burst of prompts is read in whole steps (scheduler.py).

Prefix reuse: the KV of running and finished requests is indexed by chained hashes of
PREFIX_BLOCK-token blocks of their tokens; finished requests' KV stays in the arena as a cache
(least recently used first out) while nothing else needs the room. A new request whose tokens
start with a cached or running sequence's copies those K/V rows (`KVCache.copy_prefix`) and
prefills only the rest; a request whose prompt shares more with a request still prefilling waits
for that prefill (so n submissions of one prompt, `submit_n`, prefill it once). The cache never
fails a request: a reserve or an admission that does not fit evicts cached sequences before
anything is preempted.

Threads: callers submit from any thread or event loop; only the engine thread touches the
model's sequences. A Request is a thread-safe queue of Deltas, read with `for` (blocking) or
`async for` (woken through `loop.call_soon_threadsafe`, never blocking the event loop).

Cancellation: `Request.cancel()` ends a request still queued at once (finish_reason "cancelled";
it never takes a place, KV or a prefill) and a running one within one step (its KV freed). The
engine holds a request's state (`_Stream`), never the `Request` its caller holds: a Request
dropped unfinished (a `for` loop left with break) is collected and a finalizer cancels it, and
cancelling the asyncio task blocked in `async for` over a Request cancels it too.

The package, by concern: request.py (Request, Delta, TokenLogprob; the engine thread's _Seq),
core.py (Engine: construction and the public API), scheduler.py (the step loop, admission,
preemption, the adaptive prefill chunk), prefix.py (the prefix cache), output.py (sampling
results into Deltas, finishing and preempting sequences).
"""

from __future__ import annotations

from colibri.engine.core import FINISHED_KEEP, Engine
from colibri.engine.prefix import PREFIX_BLOCK, PREFIX_CACHE_MAX
from colibri.engine.request import Delta, Request, TokenLogprob
from colibri.engine.scheduler import (
    CHUNK_STEP_RATIO,
    DEFAULT_PREFILL_CHUNK,
    KV_GROW_AHEAD,
    KV_GROW_FRACTION,
    MIN_PREFILL_CHUNK,
    SOLO_PREFILL_CHUNK,
)

__all__ = ["CHUNK_STEP_RATIO", "DEFAULT_PREFILL_CHUNK", "FINISHED_KEEP", "KV_GROW_AHEAD",
           "KV_GROW_FRACTION", "MIN_PREFILL_CHUNK",
           "PREFIX_BLOCK", "PREFIX_CACHE_MAX", "SOLO_PREFILL_CHUNK", "Delta", "Engine", "Request",
           "TokenLogprob"]
