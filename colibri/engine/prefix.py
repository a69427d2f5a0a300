"""The engine's prefix cache: a chained-hash index of PREFIX_BLOCK-token blocks of running and
finished sequences' tokens, and finished sequences' KV kept in the arena (least recently used
first out) while nothing else needs the room. `_PrefixCache` is the part of `Engine` that
keeps it (engine thread only; its counters are read under `_cv` by `Engine.stats`)."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from colibri.engine.request import _Seq

if TYPE_CHECKING:
    from colibri.model import Model

log = logging.getLogger("colibri")

PREFIX_BLOCK = 16      # tokens per hashed block of the prefix index
PREFIX_CACHE_MAX = 256  # most finished sequences kept as prefix cache
STATE_SNAPS_MAX = 8     # recurrent-state snapshots kept per sequence (the latest)


def _block_hashes(tokens: Sequence[int], n_blocks: int, start: int = 0,
                  prev: int = 0) -> list[int]:
    """Chained hashes of blocks [start, n_blocks) of tokens (prev: the hash of block
    start - 1, 0 for none): block i's hash covers tokens [0, (i + 1) * PREFIX_BLOCK)."""
    out: list[int] = []
    h = prev
    for i in range(start, n_blocks):
        h = hash((h, tuple(tokens[i * PREFIX_BLOCK:(i + 1) * PREFIX_BLOCK])))
        out.append(h)
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most limit."""
    n = min(len(a), len(b), limit)
    i = 0
    while i + 64 <= n and a[i:i + 64] == b[i:i + 64]:
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)
class _Cached:
    """A finished request's KV kept as prefix cache: tokens[:n_kv] are in sequence seq."""

    seq: int
    tokens: list[int]
    n_kv: int
    hashes: list[int] = field(default_factory=list)
    snaps: dict[int, bytes] = field(default_factory=dict)  # see _Seq.snaps

    def kv_tokens(self) -> list[int]:
        return self.tokens



class _PrefixCache:
    """The prefix-cache half of Engine's engine-thread state (the attributes are set by
    Engine.__init__)."""

    model: Model
    prefix_cache: bool
    _cv: threading.Condition
    _running: list[_Seq]
    _index: dict[int, dict[_Seq | _Cached, None]]
    _cache: collections.OrderedDict[int, _Cached]
    _pc_hits: int
    _pc_tokens_saved: int
    _pc_evictions: int
    _pc_tokens: int

    def _lookup(self, s: _Seq) -> tuple[_Seq | _Cached | None, int]:
        """The running or cached sequence holding the longest prefix of s's tokens (but its
        last: that one's logits are needed) and how many tokens of it to copy."""
        if not self.prefix_cache or not self._index:
            return None, 0
        toks = s.tokens()
        limit = len(toks) - 1
        best: _Seq | _Cached | None = None
        h = 0
        for i in range(limit // PREFIX_BLOCK):
            h = _block_hashes(toks, i + 1, i, h)[0]
            owners = self._index.get(h)
            if not owners:
                break
            best = next(iter(owners))
        if best is None:
            return None, 0
        n = _common_prefix(toks, best.kv_tokens(), min(limit, best.n_kv))  # hashes may collide
        if self.model.kv.state_bytes and n != best.n_kv:
            # a recurrent state exists only where it was kept: the owner's end, or a snapshot
            n = max((k for k in best.snaps if k <= n), default=0)
        return (best, n) if n >= PREFIX_BLOCK else (None, 0)

    def _snapshot(self, s: _Seq) -> None:
        """Keep s's recurrent state after its prompt's first n_kv tokens (a block boundary)
        for the prefix cache (recurrent-state models; the latest STATE_SNAPS_MAX)."""
        if not (self.prefix_cache and self.model.kv.state_bytes) or s.seq is None \
                or s.n_kv % PREFIX_BLOCK or s.n_kv > len(s.prompt):
            return
        s.snaps[s.n_kv] = self.model.kv.get_state(s.seq)
        while len(s.snaps) > STATE_SNAPS_MAX:
            del s.snaps[min(s.snaps)]

    def _shares_pending(self, s: _Seq) -> bool:
        """Whether a running request still prefilling will hold at least a block more of s's
        prompt than the index holds now (s then waits for it rather than recompute it)."""
        if not self.prefix_cache:
            return False
        toks = s.tokens()
        have = -1
        for x in self._running:
            if x.decoding() or x.n_kv >= len(x.prompt):
                continue
            c = _common_prefix(toks, x.prompt, len(toks) - 1)
            if c >= PREFIX_BLOCK and x.n_kv + PREFIX_BLOCK <= c:
                if have < 0:
                    have = self._lookup(s)[1]
                if c >= have + PREFIX_BLOCK:
                    return True
        return False

    def _index_add(self, owner: _Seq | _Cached, hashes: list[int]) -> None:
        for h in hashes:
            self._index.setdefault(h, {})[owner] = None
        owner.hashes.extend(hashes)

    def _unindex(self, owner: _Seq | _Cached) -> None:
        for h in owner.hashes:
            owners = self._index.get(h)
            if owners is not None:
                owners.pop(owner, None)
                if not owners:
                    del self._index[h]
        owner.hashes = []

    def _index_running(self, s: _Seq) -> None:
        """Index the blocks of s whose KV is now complete."""
        if not self.prefix_cache:
            return
        n = s.n_kv // PREFIX_BLOCK
        k = len(s.hashes)
        if n > k:
            self._index_add(s, _block_hashes(s.tokens(), n, k, s.hashes[-1] if k else 0))

    def _to_cache(self, s: _Seq) -> None:
        """Move finished s's sequence into the cache (s.seq becomes None)."""
        assert s.seq is not None
        c = _Cached(seq=s.seq, tokens=s.tokens()[: s.n_kv], n_kv=s.n_kv, snaps=s.snaps)
        s.snaps = {}
        self._index_add(c, _block_hashes(c.tokens, c.n_kv // PREFIX_BLOCK))
        self._cache[c.seq] = c
        s.seq = None
        with self._cv:
            self._pc_tokens += c.n_kv
        while len(self._cache) > PREFIX_CACHE_MAX:
            self._evict_one()

    def _evict(self, c: _Cached) -> None:
        self._unindex(c)
        del self._cache[c.seq]
        try:
            if not self.model.closed:
                self.model.free_sequence(c.seq)
        except Exception:  # the KV is gone with its model
            log.exception("engine: freeing a cached sequence failed")
        with self._cv:
            self._pc_tokens -= c.n_kv
            self._pc_evictions += 1

    def _evict_one(self, keep: _Cached | None = None) -> bool:
        """Evict the least recently used cached sequence other than keep; False if none."""
        for c in self._cache.values():
            if c is not keep:
                self._evict(c)
                return True
        return False

    def _clear_cache(self) -> None:
        while self._cache:
            self._evict(next(iter(self._cache.values())))
        self._index.clear()
