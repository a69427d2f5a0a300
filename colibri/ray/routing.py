"""Routing that knows colibri, for Ray Serve.

`PrefixRouter` (a Ray Serve RequestRouter): a request whose prompt starts with blocks another
request already sent to a replica goes to that replica (its engine's prefix cache holds them:
the hashes are the engine's own block hashes, colibri.engine.prefix), as long as it has room;
else to the least-loaded replica (the fewest requests in flight). The router remembers the
last LRU_ENTRIES block hashes it routed and forgets those of a replica that died.

`autoscale`: the autoscaling policy, reading what each replica reports (Replica.
record_autoscaling_stats): requests running and waiting per --max-seqs, and the KV arena's
use; enough replicas that each carries at most one engine batch and keeps its KV under
KV_HIGH."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

LRU_ENTRIES = 65536
KV_HIGH = 0.85


def _prefix(pending: PendingRequest | None) -> list[int]:
    if pending is None or not pending.args:
        return []
    return list(getattr(pending.args[0], "prefix", None) or [])


class PrefixRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._owner: OrderedDict[int, ReplicaID] = OrderedDict()
        self._max = int(kwargs.get("lru_entries", LRU_ENTRIES))
        self.affinity_hits = 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id: r for r in candidate_replicas}
        room = {r.replica_id for r in self.select_available_replicas(candidate_replicas)}
        for h in reversed(_prefix(pending_request)):  # the longest shared prefix first
            rid = self._owner.get(h)
            if rid is not None and rid in by_id and rid in room:
                self.affinity_hits += 1
                rest = [r for r in candidate_replicas if r.replica_id != rid]
                return [[by_id[rid]], rest] if rest else [[by_id[rid]]]
        # no replica holds it: the least loaded of all (the base class picks the replica with
        # the shortest queue within a rank)
        return [candidate_replicas]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        for h in _prefix(pending_request):
            self._owner[h] = replica_id
            self._owner.move_to_end(h)
        while len(self._owner) > self._max:
            self._owner.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._owner = OrderedDict((h, r) for h, r in self._owner.items() if r != replica_id)


def desired_replicas(demand: list[float], kv_used: list[float], current: int) -> int:
    """Replicas wanted for these per-replica reports (demand: requests in flight per
    --max-seqs; kv_used: the KV arena's use, 0..1): the total demand in whole engine batches,
    and one more than now when any replica's KV is above KV_HIGH."""
    want = math.ceil(sum(demand) - 1e-9) if demand else current
    if any(k > KV_HIGH for k in kv_used):
        want = max(want, current + 1)
    return max(1, want)


def autoscale(ctx: Any) -> tuple[int, dict[str, Any]]:
    """Ray Serve's custom autoscaling policy (AutoscalingPolicy(policy_function=
    "colibri.ray.routing:autoscale")); Serve applies min/max replicas and the delays."""
    metrics = ctx.aggregated_metrics or {}
    demand = list((metrics.get("demand") or {}).values())
    kv = list((metrics.get("kv_used") or {}).values())
    if not demand:  # no reports yet: Serve's own count of requests in flight
        per = max(1.0, float(getattr(ctx.config, "target_ongoing_requests", 1) or 1))
        return max(1, math.ceil(ctx.total_num_requests / per)), {}
    want = desired_replicas(demand, kv, ctx.current_num_replicas)
    return min(max(want, ctx.capacity_adjusted_min_replicas),
               ctx.capacity_adjusted_max_replicas), {}
