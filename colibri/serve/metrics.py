"""The server's Prometheus metrics (prometheus-client), in a registry of its own per app.

Counted as requests go: HTTP requests by endpoint and status, prompt and generated tokens,
time to first token and inter-token latency (the engine's own measurements, from submission),
grammar mask time. Read from the engine and the model at each scrape: running and waiting
requests, KV arena bytes, prefix-cache hits and tokens saved, and for MoE models the expert
store's hit rate and bytes read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
                   2.0, 3.0, 5.0, 10.0, 20.0, 60.0)


class _Live:
    """Collector of the values read at scrape time from the engine and model."""

    def __init__(self, source: Callable[[], tuple[Any, Any, Any]]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # no description at registration: collect() runs only at scrapes

    def collect(self) -> Iterator[Metric]:
        engine, model, masks = self._source()
        if engine is None or engine.closed:
            return
        st = engine.stats()
        yield GaugeMetricFamily("colibri_requests_running",
                                "Requests holding KV and decoding or prefilling", st["running"])
        yield GaugeMetricFamily("colibri_requests_waiting", "Requests queued in the engine",
                                st["waiting"])
        kv = st.get("kv") or {}
        if kv:
            yield GaugeMetricFamily("colibri_kv_used_bytes",
                                    "Bytes of the KV arena in use (running requests and the "
                                    "prefix cache)", kv["used"])
            yield GaugeMetricFamily("colibri_kv_capacity_bytes", "Bytes of the KV arena",
                                    kv["capacity"])
            yield GaugeMetricFamily("colibri_kv_usage_ratio", "KV arena bytes in use / capacity",
                                    kv["used"] / kv["capacity"] if kv["capacity"] else 0.0)
        pc = st["prefix_cache"]
        yield CounterMetricFamily("colibri_prefix_cache_hits",
                                  "Requests that reused a cached or running prompt prefix",
                                  pc["hits"])
        yield CounterMetricFamily("colibri_prefix_cache_tokens_saved",
                                  "Prompt tokens not prefilled thanks to the prefix cache",
                                  pc["tokens_saved"])
        yield GaugeMetricFamily("colibri_prefix_cache_tokens",
                                "Tokens of finished requests kept in the KV arena as prefix cache",
                                pc["cached_tokens"])
        if model is not None and not model.closed:
            ex = model.expert_stats()
            if ex:  # MoE models: the expert store
                acq = ex.get("acquired", 0.0)
                yield GaugeMetricFamily("colibri_expert_cache_hit_rate",
                                        "Expert store: acquired experts already resident / acquired",
                                        ex.get("hits", 0.0) / acq if acq else 0.0)
                yield CounterMetricFamily("colibri_expert_bytes_read",
                                          "Expert store: bytes of experts read from the file",
                                          ex.get("bytes_read", 0.0))
        if masks is not None:
            n, secs = masks.snapshot()
            yield CounterMetricFamily("colibri_grammar_masks",
                                      "Structured output: token masks computed", n)
            yield CounterMetricFamily("colibri_grammar_mask_seconds",
                                      "Structured output: seconds spent computing token masks",
                                      secs)


class Metrics:
    def __init__(self, source: Callable[[], tuple[Any, Any, Any]]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("colibri_http_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("colibri_prompt_tokens", "Prompt tokens of completed "
                                     "generations", registry=r)
        self.generation_tokens = Counter("colibri_generation_tokens", "Tokens generated",
                                         registry=r)
        self.ttft = Histogram("colibri_time_to_first_token_seconds", "Time from submission to "
                              "the first generated token", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("colibri_inter_token_latency_seconds", "Time between consecutive "
                             "generated tokens of a request", buckets=LATENCY_BUCKETS, registry=r)
        r.register(_Live(source))  # type: ignore[arg-type]

    def observe(self, stats: dict[str, Any]) -> None:
        """A finished engine request's statistics (Request.stats())."""
        self.prompt_tokens.inc(stats.get("prompt_tokens") or 0)
        self.generation_tokens.inc(stats.get("generated_tokens") or 0)
        if stats.get("ttft_s") is not None:
            self.ttft.observe(stats["ttft_s"])
        for x in stats.get("itl_s") or ():
            self.itl.observe(x)

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["Metrics"]
