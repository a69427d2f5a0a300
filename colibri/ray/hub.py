"""The hub: a small named Ray actor where each replica reports, every second, its Prometheus
metrics and its load; the ingress reads it for /metrics (every replica's series, labelled
replica="NAME") and /health. A replica that stops reporting (dead, or scaled down) drops out
after STALE_S seconds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

NAMESPACE = "colibri"
STALE_S = 5.0
FRESH_WAIT_S = 3.0


class Hub:
    """Reports stamped with the hub's own clock (hosts' clocks may differ)."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, bytes, dict[str, Any]]] = {}

    async def put(self, replica: str, metrics: bytes, load: dict[str, Any]) -> None:
        self._reports[replica] = (time.monotonic(), metrics, load)

    async def snapshot(self, fresh: bool = True) -> dict[str, tuple[bytes, dict[str, Any]]]:
        """The live replicas' last reports: {name: (metrics text, load)}; fresh: each made
        after this call began (at most FRESH_WAIT_S of waiting), so that a scrape counts every
        request that ended before it."""
        t0 = time.monotonic()
        while fresh and time.monotonic() - t0 < FRESH_WAIT_S and any(
                t < t0 for t, _, _ in self._live().values()):
            await asyncio.sleep(0.02)
        return {k: (v[1], v[2]) for k, v in self._live().items()}

    def _live(self) -> dict[str, tuple[float, bytes, dict[str, Any]]]:
        now = time.monotonic()
        self._reports = {k: v for k, v in self._reports.items() if now - v[0] < STALE_S}
        return self._reports


def connect(name: str) -> Any:
    """The hub named name (made on first use: detached, no CPU, in the colibri namespace, so
    that a replica that dies does not take it along); colibri.ray.app's ingress removes it."""
    import ray

    return ray.remote(num_cpus=0)(Hub).options(
        name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
        max_restarts=-1).remote()


def relabel(reports: dict[str, tuple[bytes, dict[str, Any]]], own: bytes = b"") -> bytes:
    """The replicas' Prometheus texts as one exposition: each sample labelled with its
    replica (replica="NAME"), each family once; own (the ingress's exposition) first, as it
    is, its families taking the place of the replicas' (their HTTP counts: the ingress's)."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Any] = {}
    mine = {f.name for f in text_string_to_metric_families(own.decode())}
    for name in sorted(reports):
        for fam in text_string_to_metric_families(reports[name][0].decode()):
            if fam.name in mine:
                continue
            have = families.setdefault(fam.name, fam)
            tagged = [Sample(s.name, {**s.labels, "replica": name}, s.value, s.timestamp,
                             s.exemplar) for s in fam.samples]
            if have is fam:
                fam.samples = tagged
            else:
                have.samples.extend(tagged)

    class _Collected:
        def collect(self) -> Any:
            return iter(families.values())

    return own + generate_latest(_Collected())  # type: ignore[arg-type]
