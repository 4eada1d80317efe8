"""Prometheus metrics of the gateway, exposed at GET /metrics.

Label values are bounded: route names from the six routes (or "other"), status
codes, cache results and coercion kinds; never raw paths, ids or tokens. With
``server.workers`` > 1 every process writes its values to files in
``PROMETHEUS_MULTIPROC_DIR`` (set by the supervisor before the workers start) and
/metrics sums them, so the numbers are for the whole gateway.
"""

from __future__ import annotations

import os
from collections import Counter as Tally
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
CIRCUIT_VALUES = {"closed": 0, "half-open": 1, "open": 2}


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class Metrics:
    """Every metric of one gateway process, registered in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gateway_requests_total",
            "Requests answered, by route, status and cache result",
            ["route", "status", "cache"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "gateway_request_duration_seconds",
            "Time to answer a request, by route and cache result",
            ["route", "cache"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_requests = Counter(
            "gateway_upstream_requests_total",
            "Requests sent to the upstream, by route and upstream status (or error kind)",
            ["route", "status"],
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "gateway_upstream_duration_seconds",
            "Time of upstream calls, by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_results = Counter(
            "gateway_cache_results_total",
            "Cache results by route: hit, miss, stale, bypass",
            ["route", "result"],
            registry=r,
        )
        self.coalesced = Counter(
            "gateway_coalesced_requests_total",
            "Requests that waited on another request's upstream call instead of making one",
            ["route"],
            registry=r,
        )
        self.cache_errors = Counter(
            "gateway_cache_errors_total",
            "Cache backend calls that failed or timed out",
            ["backend"],
            registry=r,
        )
        self.circuit_state = Gauge(
            "gateway_cache_circuit_state",
            "Cache circuit breaker: 0 closed, 1 half-open, 2 open",
            ["backend"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.coercions = Counter(
            "gateway_normaliser_coercions_total",
            "Coercions the normaliser performed, by field and kind",
            ["field", "kind"],
            registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight",
            "Requests being handled now",
            registry=r,
            multiprocess_mode="livesum",
        )

        # label children by label values: the hot path skips prometheus' own lookup
        self._answered: dict[tuple[str, int, str], tuple[Any, Any, Any]] = {}

    def answered(self, route: str, status: int, cache: str, seconds: float) -> None:
        """Count one answered request (cache is "hit", "miss", ..., or "none")."""
        children = self._answered.get((route, status, cache))
        if children is None:
            children = (
                self.requests.labels(route, str(status), cache),
                self.request_seconds.labels(route, cache),
                None if cache == "none" else self.cache_results.labels(route, cache),
            )
            self._answered[(route, status, cache)] = children
        requests, duration, results = children
        requests.inc()
        duration.observe(seconds)
        if results is not None:
            results.inc()

    def add_coercions(self, counts: Tally[tuple[str, str]]) -> None:
        for (field, kind), count in counts.items():
            self.coercions.labels(field, kind).inc(count)

    def circuit_changed(self, backend: str, state: str) -> None:
        self.circuit_state.labels(backend).set(CIRCUIT_VALUES[state])

    def exposition(self) -> bytes:
        """The text exposition: this process's registry, or every worker's sum."""
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
