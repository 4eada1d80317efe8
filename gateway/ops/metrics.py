"""Prometheus metrics of the gateway, exposed at GET /metrics.

Label values are bounded: route names from the six routes (or "other"), status
codes, cache results and coercion kinds; never raw paths, ids or tokens. With
``server.workers`` > 1 every process writes its values to files in
``PROMETHEUS_MULTIPROC_DIR`` (set by the supervisor before the workers start) and
/metrics sums them, so the numbers are for the whole gateway.

The per-request series (requests, their durations, cache results, in flight, upstream
calls and their durations, normalising times, coercions) are tallied in plain numbers
on the request path and handed to prometheus-client's public ``inc`` and ``observe`` by
:meth:`Metrics.flush`: before every scrape, and once a second in every worker (so a
scrape sums the other workers' requests up to a second late). The request path then
takes no lock and touches no shared memory file.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from collections.abc import Callable, Mapping
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
# finer than the request buckets at the low end: normalising one page is a small part
# of a request's time
_NORMALISE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
)  # fmt: skip
METRICS_FLUSH_S = 1.0  # how often every process hands its request tallies over
CIRCUIT_VALUES = {"closed": 0, "half-open": 1, "open": 2}


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class _Timed:
    """Observations of one label set since the last flush: how many fell in each bucket
    of ``bounds`` (one slot past the last for +Inf), and their sum per bucket."""

    __slots__ = ("bounds", "buckets", "sums")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.sums = [0.0] * (len(bounds) + 1)

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def add(self, seconds: float) -> None:
        i = bisect_left(self.bounds, seconds)
        self.buckets[i] += 1
        self.sums[i] += seconds


def _made(table: dict[Any, _Timed], key: Any, bounds: tuple[float, ...]) -> _Timed:
    """A new tally for ``key`` in ``table`` (the first observation of a label set)."""
    timed = table[key] = _Timed(bounds)
    return timed


def observe_many(histogram: Any, timed: _Timed) -> None:
    """Hand ``timed`` to a histogram child through its public ``observe``: the
    observations of each bucket as that many observations of their mean, which lies in
    the same bucket. Every bucket's count and the sum come out as the observations'
    own (the sum to a float's rounding)."""
    bounds = timed.bounds
    for i, count in enumerate(timed.buckets):
        if not count:
            continue
        mean = timed.sums[i] / count
        if i < len(bounds):
            mean = min(mean, bounds[i])
        if i > 0:
            mean = max(mean, math.nextafter(bounds[i - 1], math.inf))
        observe = histogram.observe
        for _ in range(count):
            observe(mean)


class Metrics:
    """Every metric of one gateway process, registered in its own registry."""

    def __init__(
        self, *, coercions: Callable[[], Mapping[tuple[str, str], int]] | None = None
    ) -> None:
        """``coercions`` hands over the normaliser's coercions since it was last asked
        (``CoercionCounts.take``), by (field, kind); each flush asks it."""
        self._take_coercions = coercions
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
        self.normalise_seconds = Histogram(
            "gateway_normalise_duration_seconds",
            "Time to normalise each upstream answer (misses, bypasses, refreshes), by route;"
            " answers that break the contract are not counted",
            ["route"],
            buckets=_NORMALISE_BUCKETS,
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

        self._answers: dict[tuple[str, int, str], _Timed] = {}
        self._upstream: dict[tuple[str, str], _Timed] = {}  # by (route, outcome)
        self._normalised: dict[str, _Timed] = {}  # by route
        self.busy = 0  # requests being handled now; the in-flight gauge at each flush

    def answered(self, route: str, status: int, cache: str, seconds: float) -> None:
        """Count one answered request (cache is "hit", "miss", ..., or "none")."""
        key = (route, status, cache)
        answers = self._answers.get(key) or _made(self._answers, key, _LATENCY_BUCKETS)
        answers.add(seconds)

    def upstream_called(self, route: str, outcome: str, seconds: float) -> None:
        """Count one upstream call of ``route`` that ended in ``outcome``."""
        key = (route, outcome)
        calls = self._upstream.get(key) or _made(self._upstream, key, _LATENCY_BUCKETS)
        calls.add(seconds)

    def normalised(self, route: str, seconds: float) -> None:
        """Time one normalised answer of ``route``."""
        timed = self._normalised.get(route) or _made(self._normalised, route, _NORMALISE_BUCKETS)
        timed.add(seconds)

    def flush(self) -> None:
        """Hand the tallies to prometheus-client (a scrape sees everything before it)."""
        self.in_flight.set(self.busy)
        if self._take_coercions is not None:
            for (name, kind), count in self._take_coercions().items():
                self.coercions.labels(name, kind).inc(count)
        upstream, self._upstream = self._upstream, {}
        for (route, outcome), calls in upstream.items():
            self.upstream_requests.labels(route, outcome).inc(calls.count)
            observe_many(self.upstream_seconds.labels(route), calls)
        normalised, self._normalised = self._normalised, {}
        for route, timed in normalised.items():
            observe_many(self.normalise_seconds.labels(route), timed)
        answers, self._answers = self._answers, {}
        for (route, status, cache), tally in answers.items():
            self.requests.labels(route, str(status), cache).inc(tally.count)
            observe_many(self.request_seconds.labels(route, cache), tally)
            if cache != "none":
                self.cache_results.labels(route, cache).inc(tally.count)

    def circuit_changed(self, backend: str, state: str) -> None:
        self.circuit_state.labels(backend).set(CIRCUIT_VALUES[state])

    def exposition(self) -> bytes:
        """The text exposition: this process's registry, or every worker's sum."""
        self.flush()
        directory = multiprocess_dir()
        if directory is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
