"""KV memory policies on a seeded synthetic serving trace, in one run.

    python tools/bench/kv_arena.py [--seed 0] [--arena-mib 256] [--steps 3000] ...

Trace: Poisson arrivals (rate --rate per decode step), log-normal prompt and output lengths,
each request capped by the context limit (--context, default 4096). A fixed KV budget
(--arena-mib) is shared by the running sequences; every step each running sequence decodes
one token. Admission is FIFO while the policy can allocate the prompt (keeping a watermark of
--watermark of the budget free for growth; the arena policies also admit only while the
largest free block is at least --contig tokens, default half the context, so that a long
sequence that must move still finds a contiguous block); when a sequence cannot grow, the most
recently admitted sequence is preempted (freed and requeued, recompute-style, as vLLM does).

Policies, all replaying the same trace:
  arena         colibri.KVArena (exact mode), one block per sequence, grown by --chunk tokens
                with KVArena.grow (in place or moved) - the design under test;
  arena-pow2    the same with KVArena(exact=False): the classic power-of-two buddy, shown to
                explain why the arena returns the tail of each buddy block;
  static        max-context allocation per sequence (context * token bytes);
  paged-16      a paged allocator with 16-token pages (a Python free list).

Reported per policy: peak concurrent sequences, mean concurrency over the second half, waste
at the peak (allocated - bytes holding tokens, % of the budget) and the largest waste over the
trace, median/p99 latency of alloc, grow and free (the real KVArena calls for the arena
policies; Python list operations for the peers), moves and preemptions. Validation (before any
figure is trusted): every arena block carries a tag written at admission that must survive every
grow/move until it is freed, KVArena.check() passes periodically, and the allocator's used
bytes equal the bench's own bookkeeping every step.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from colibri import KVArena


@dataclass
class Trace:
    arrival: np.ndarray  # step of arrival per request
    prompt: np.ndarray  # prompt tokens
    output: np.ndarray  # tokens to generate


def make_trace(seed: int, steps: int, rate: float, context: int, prompt_median: float,
               prompt_sigma: float, output_median: float, output_sigma: float) -> Trace:
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rate, size=steps)
    arrival = np.repeat(np.arange(steps), counts)
    n = arrival.size
    prompt = np.exp(rng.normal(np.log(prompt_median), prompt_sigma, n)).astype(np.int64)
    output = np.exp(rng.normal(np.log(output_median), output_sigma, n)).astype(np.int64)
    prompt = np.clip(prompt, 1, context - 1)
    output = np.clip(output, 1, context - prompt)
    return Trace(arrival, prompt, output)


def pct(xs: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) / 1000.0 if xs else float("nan")


@dataclass
class Lat:
    alloc: list[int] = field(default_factory=list)
    grow: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)


class ArenaPolicy:
    """One KVArena block per sequence, grown chunk by chunk."""

    def __init__(self, budget: int, stride: int, chunk: int, exact: bool, min_block: int,
                 contig: int) -> None:
        self.arena = KVArena(budget, min_block=min_block, hugepages="auto", exact=exact)
        self.contig = contig  # admit only while the largest free block has this many bytes
        self.budget = self.arena.capacity
        self.stride, self.chunk = stride, chunk
        self.blocks: dict[int, tuple[int, int]] = {}  # rid -> (offset, capacity tokens)
        self.lat = Lat()
        self.moves = 0
        self.block_bytes = 0  # bench-side bookkeeping, compared with the arena's stats

    def _round(self, tokens: int) -> int:
        return -(-tokens // self.chunk) * self.chunk

    def _tag(self, off: int, rid: int) -> None:
        self.arena.view(off, 8)[:] = rid.to_bytes(8, "little")

    def _check_tag(self, off: int, rid: int) -> None:
        if int.from_bytes(self.arena.view(off, 8), "little") != rid:
            raise AssertionError(f"sequence {rid}: data lost at offset {off}")

    def free_bytes(self) -> int:
        return self.budget - self.block_bytes

    def admit(self, rid: int, tokens: int, watermark: int) -> bool:
        cap = self._round(tokens)
        if self.free_bytes() - cap * self.stride < watermark:
            return False
        if self.arena.stats()["largest_free"] < self.contig:
            return False
        t0 = time.perf_counter_ns()
        try:
            off = self.arena.alloc(cap * self.stride)
        except MemoryError:
            return False
        self.lat.alloc.append(time.perf_counter_ns() - t0)
        self.blocks[rid] = (off, cap)
        self.block_bytes += self.arena.block_info(off)[1]
        self._tag(off, rid)
        return True

    def ensure(self, rid: int, tokens: int) -> bool:
        off, cap = self.blocks[rid]
        if tokens <= cap:
            return True
        new_cap = self._round(tokens)
        old_block = self.arena.block_info(off)[1]
        t0 = time.perf_counter_ns()
        try:
            new = self.arena.grow(off, new_cap * self.stride)
        except MemoryError:
            return False
        self.lat.grow.append(time.perf_counter_ns() - t0)
        if new != off:
            self.moves += 1
            self._check_tag(new, rid)
        self.blocks[rid] = (new, new_cap)
        self.block_bytes += self.arena.block_info(new)[1] - old_block
        return True

    def release(self, rid: int) -> None:
        off, _ = self.blocks.pop(rid)
        self._check_tag(off, rid)
        self.block_bytes -= self.arena.block_info(off)[1]
        t0 = time.perf_counter_ns()
        self.arena.free(off)
        self.lat.free.append(time.perf_counter_ns() - t0)

    def allocated(self) -> int:
        return self.block_bytes

    def validate(self, full: bool) -> None:
        s = self.arena.stats()
        if s["used"] != self.block_bytes or s["n_blocks"] != len(self.blocks):
            raise AssertionError(f"arena used {s['used']} != bookkeeping {self.block_bytes}")
        if full:
            self.arena.check()


class StaticPolicy:
    """A max-context slot per sequence."""

    def __init__(self, budget: int, stride: int, context: int) -> None:
        self.slot = context * stride
        self.budget = budget
        self.slots = list(range(budget // self.slot))[::-1]
        self.held: dict[int, int] = {}
        self.lat = Lat()
        self.moves = 0

    def admit(self, rid: int, tokens: int, watermark: int) -> bool:
        t0 = time.perf_counter_ns()
        if not self.slots:
            return False
        self.held[rid] = self.slots.pop()
        self.lat.alloc.append(time.perf_counter_ns() - t0)
        return True

    def ensure(self, rid: int, tokens: int) -> bool:
        return True  # the context limit caps every request

    def release(self, rid: int) -> None:
        t0 = time.perf_counter_ns()
        self.slots.append(self.held.pop(rid))
        self.lat.free.append(time.perf_counter_ns() - t0)

    def allocated(self) -> int:
        return len(self.held) * self.slot

    def validate(self, full: bool) -> None:
        if len(set(self.held.values())) != len(self.held):
            raise AssertionError("static: a slot is held twice")


class PagedPolicy:
    """Fixed pages of page_tokens tokens from a free list; a sequence holds a page list."""

    def __init__(self, budget: int, stride: int, page_tokens: int) -> None:
        self.page_tokens = page_tokens
        self.page = page_tokens * stride
        self.budget = budget
        self.free_pages = list(range(budget // self.page))[::-1]
        self.pages: dict[int, list[int]] = {}
        self.lat = Lat()
        self.moves = 0
        self.n_pages = len(self.free_pages)

    def _take(self, n: int) -> list[int] | None:
        if n > len(self.free_pages):
            return None
        got = self.free_pages[-n:]
        del self.free_pages[-n:]
        return got

    def admit(self, rid: int, tokens: int, watermark: int) -> bool:
        n = -(-tokens // self.page_tokens)
        if (len(self.free_pages) - n) * self.page < watermark:
            return False
        t0 = time.perf_counter_ns()
        got = self._take(n)
        if got is None:
            return False
        self.pages[rid] = got
        self.lat.alloc.append(time.perf_counter_ns() - t0)
        return True

    def ensure(self, rid: int, tokens: int) -> bool:
        held = self.pages[rid]
        if tokens <= len(held) * self.page_tokens:
            return True
        t0 = time.perf_counter_ns()
        got = self._take(1)
        if got is None:
            return False
        held.extend(got)
        self.lat.grow.append(time.perf_counter_ns() - t0)
        return True

    def release(self, rid: int) -> None:
        t0 = time.perf_counter_ns()
        self.free_pages.extend(self.pages.pop(rid))
        self.lat.free.append(time.perf_counter_ns() - t0)

    def allocated(self) -> int:
        return (self.n_pages - len(self.free_pages)) * self.page

    def validate(self, full: bool) -> None:
        held = sum(len(p) for p in self.pages.values())
        if held + len(self.free_pages) != self.n_pages:
            raise AssertionError("paged: pages lost")


@dataclass
class Result:
    name: str
    peak: int = 0
    peak_step: int = 0
    waste_at_peak: float = 0.0
    max_waste: float = 0.0
    mean_conc_2nd_half: float = 0.0
    completed: int = 0
    preemptions: int = 0
    moves: int = 0
    lat: Lat = field(default_factory=Lat)


def replay(name: str, policy, trace: Trace, steps: int, stride: int, budget: int,
           watermark_frac: float) -> Result:
    res = Result(name)
    watermark = int(watermark_frac * budget)
    waiting: deque[int] = deque()
    running: OrderedDict[int, int] = OrderedDict()  # rid -> tokens held, admission order
    tokens_total = 0
    next_req = 0
    n_req = trace.arrival.size
    conc_2nd: list[int] = []
    for step in range(steps):
        while next_req < n_req and trace.arrival[next_req] == step:
            waiting.append(next_req)
            next_req += 1
        for rid in list(running):
            if rid not in running:
                continue  # preempted earlier in this step
            new_len = running[rid] + 1
            if new_len > trace.prompt[rid] + trace.output[rid]:
                policy.release(rid)
                tokens_total -= running.pop(rid)
                res.completed += 1
                continue
            while not policy.ensure(rid, new_len):
                victim = next(reversed(running))
                policy.release(victim)
                tokens_total -= running.pop(victim)
                waiting.appendleft(victim)
                res.preemptions += 1
                if victim == rid:
                    break
            else:
                running[rid] = new_len
                tokens_total += 1
        while waiting:
            rid = waiting[0]
            need = int(trace.prompt[rid]) + 1
            if not policy.admit(rid, need, watermark):
                break
            waiting.popleft()
            running[rid] = need
            tokens_total += need
        waste = (policy.allocated() - tokens_total * stride) / budget
        if len(running) > res.peak:
            res.peak, res.peak_step, res.waste_at_peak = len(running), step, waste
        res.max_waste = max(res.max_waste, waste)
        if step >= steps // 2:
            conc_2nd.append(len(running))
        policy.validate(full=step % 500 == 0)
    policy.validate(full=True)
    res.mean_conc_2nd_half = float(np.mean(conc_2nd))
    res.moves = policy.moves
    res.lat = policy.lat
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3000, help="decode steps replayed")
    ap.add_argument("--rate", type=float, default=0.6, help="mean arrivals per step (Poisson)")
    ap.add_argument("--context", type=int, default=4096, help="context limit (tokens)")
    ap.add_argument("--prompt-median", type=float, default=256)
    ap.add_argument("--prompt-sigma", type=float, default=1.0)
    ap.add_argument("--output-median", type=float, default=200)
    ap.add_argument("--output-sigma", type=float, default=0.8)
    ap.add_argument("--arena-mib", type=int, default=256, help="KV budget in MiB")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--elt", type=int, default=2, help="bytes per element (2 = f16)")
    ap.add_argument("--chunk", type=int, default=16, help="arena growth step in tokens")
    ap.add_argument("--min-block", type=int, default=4096)
    ap.add_argument("--watermark", type=float, default=0.05, help="budget fraction kept free at admission")
    ap.add_argument("--contig", type=int, default=None,
                    help="arena admission: largest free block >= this many tokens (default context/2; 0 = off)")
    args = ap.parse_args(argv)

    stride = args.layers * 2 * args.kv_heads * args.head_dim * args.elt
    budget = args.arena_mib << 20
    contig = (args.context // 2 if args.contig is None else args.contig) * stride
    trace = make_trace(args.seed, args.steps, args.rate, args.context, args.prompt_median,
                       args.prompt_sigma, args.output_median, args.output_sigma)
    total = trace.prompt + trace.output
    print(f"trace: seed {args.seed}, {trace.arrival.size} requests over {args.steps} steps, "
          f"prompt median {int(np.median(trace.prompt))} / p99 {int(np.percentile(trace.prompt, 99))}, "
          f"output median {int(np.median(trace.output))} / p99 {int(np.percentile(trace.output, 99))}, "
          f"total capped at {args.context} (max {int(total.max())})")
    print(f"budget {args.arena_mib} MiB, {stride} bytes/token "
          f"({args.layers} layers x 2 x {args.kv_heads} kv heads x {args.head_dim} x {args.elt} B), "
          f"{budget // stride} tokens; arena growth step {args.chunk} tokens, min_block {args.min_block}, "
          f"admission: {100 * args.watermark:.0f}% free, arena largest free block >= {contig >> 20} MiB")

    policies = [
        ("arena", lambda: ArenaPolicy(budget, stride, args.chunk, True, args.min_block, contig)),
        ("arena-pow2", lambda: ArenaPolicy(budget, stride, args.chunk, False, args.min_block, contig)),
        ("static", lambda: StaticPolicy(budget, stride, args.context)),
        ("paged-16", lambda: PagedPolicy(budget, stride, 16)),
    ]
    results = []
    backing = ""
    for name, make in policies:
        t0 = time.perf_counter()
        pol = make()
        if isinstance(pol, ArenaPolicy) and not backing:
            s = pol.arena.stats()
            backing = f"{s['backing']}" + (f" ({s['backing_note']})" if s["backing_note"] else "")
        res = replay(name, pol, trace, args.steps, stride, budget, args.watermark)
        if isinstance(pol, ArenaPolicy):
            pol.arena.close()
        results.append(res)
        print(f"  replayed {name} in {time.perf_counter() - t0:.1f} s (validated)", file=sys.stderr)
    print(f"arena backing: {backing}")

    hdr = (f"{'policy':<11} {'peak seqs':>9} {'mean 2nd half':>13} {'waste@peak':>10} {'max waste':>9} "
           f"{'alloc p50/p99 us':>17} {'grow p50/p99 us':>16} {'free p50/p99 us':>16} "
           f"{'moves':>6} {'preempt':>7} {'done':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        lat = r.lat

        def pp(xs: list[int]) -> str:
            return f"{pct(xs, 50):.2f}/{pct(xs, 99):.2f}" if xs else "-"

        print(f"{r.name:<11} {r.peak:>9} {r.mean_conc_2nd_half:>13.1f} {100 * r.waste_at_peak:>9.1f}% "
              f"{100 * r.max_waste:>8.1f}% {pp(lat.alloc):>17} {pp(lat.grow):>16} {pp(lat.free):>16} "
              f"{r.moves:>6} {r.preemptions:>7} {r.completed:>5}")
    print("(latencies: arena rows time the real KVArena.alloc/grow/free calls from Python; "
          "static and paged rows time their Python list operations)")

    by = {r.name: r for r in results}
    a, s, p = by["arena"], by["static"], by["paged-16"]
    ratio = a.peak / s.peak
    ratio_mean = a.mean_conc_2nd_half / s.mean_conc_2nd_half
    ok_c, ok_w = ratio >= 2.8, a.waste_at_peak <= 0.15
    print(f"arena vs static: peak concurrency {ratio:.2f}x (mean over 2nd half {ratio_mean:.2f}x); "
          f"arena vs paged-16: peak {a.peak / p.peak:.2f}x")
    print(f"RESULT: concurrency {ratio:.2f}x static (target >= 2.8x: {'met' if ok_c else 'NOT met'}), "
          f"waste at peak {100 * a.waste_at_peak:.1f}% of the arena (target <= 15%: "
          f"{'met' if ok_w else 'NOT met'}), max waste {100 * a.max_waste:.1f}%")
    return 0 if ok_c and ok_w else 1


if __name__ == "__main__":
    sys.exit(main())
