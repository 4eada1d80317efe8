"""Prometheus metrics of the gateway, exposed at GET /metrics.

Label values are bounded: route names from the six routes (or "other"), status
codes, cache results and coercion kinds; never raw paths, ids or tokens. With
``server.workers`` > 1 every process writes its values to files in
``PROMETHEUS_MULTIPROC_DIR`` (set by the supervisor before the workers start) and
/metrics sums them, so the numbers are for the whole gateway.

The per-request series (requests, their durations, cache results, in flight, upstream
calls and their durations, normalising times, coercions) are tallied in plain numbers
on the request path, which then takes no lock and touches no shared file, and handed
over by :meth:`Metrics.flush`: before every scrape, and once a second in every worker
(so a scrape sums the other workers' requests up to a second late). Counters take
their tallies through prometheus-client's ``inc``; the duration histograms are
prometheus-client custom collectors (:class:`Histograms`), which expose the tallied
buckets and sums as they are, so a flush costs the same at any request rate. With
several workers each writes its histograms to a file of its own beside
prometheus-client's, and the collector sums every worker's file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from gateway.errors import StartError
from gateway.ops.files import write_whole
from gateway.ops.traffic import KeySketch, Traffic, traffic_of
from gateway.ops.ttl_advice import Advice, Evidence, Policy, advise, evidence_of

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# finer than the request buckets at the low end: normalising one page is a small part
# of a request's time
_NORMALISE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
)  # fmt: skip
# ages of cached answers when they are replaced: a second to two days, each bound about
# 1.5 times the one before (gateway.ops.ttl_advice reads them back)
AGE_BUCKETS = (
    1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 270, 400, 600, 900, 1350, 2000,
    3000, 4500, 7200, 10800, 16200, 24300, 36000, 54000, 86400, 129600, 172800,
)  # fmt: skip
METRICS_FLUSH_S = 1.0  # how often every process hands its request tallies over
INDEX_SIZE_S = 60.0  # how often every process asks the size of the records' index
CIRCUIT_VALUES = {"closed": 0, "half-open": 1, "open": 2}


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def check_multiprocess_dir() -> None:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set: make the folder when it is missing and
    check that this process can write in it, before any metric does; a StartError
    naming it otherwise (a path under a regular file, a read-only or foreign folder)."""
    directory = multiprocess_dir()
    if directory is None:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        # makedirs says "File exists" of a regular file where the folder should be
        why = "not a folder" if isinstance(exc, FileExistsError) else exc.strerror or exc
        raise StartError(
            f"cannot write the metrics in {directory}: {why} ({MULTIPROC_ENV})", path=directory
        ) from None


class _Timed:
    """Observations of one label set since the last flush: how many fell in each bucket
    of ``bounds`` (one slot past the last for +Inf), and their sum."""

    __slots__ = ("bounds", "buckets", "seconds")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.seconds = 0.0

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def add(self, seconds: float) -> None:
        self.buckets[bisect_left(self.bounds, seconds)] += 1
        self.seconds += seconds


def _made(table: dict[Any, _Timed], key: Any, bounds: tuple[float, ...]) -> _Timed:
    """A new tally for ``key`` in ``table`` (the first observation of a label set)."""
    timed = table[key] = _Timed(bounds)
    return timed


class _Total:
    """One label set's bucket counts (not cumulative, +Inf last) and sum."""

    __slots__ = ("buckets", "seconds")

    def __init__(self, width: int) -> None:
        self.buckets = [0] * width
        self.seconds = 0.0


Totals = dict[tuple[str, ...], _Total]


def _fold(totals: Totals, labels: tuple[str, ...], buckets: list[int], seconds: float) -> None:
    """Add ``buckets`` and ``seconds`` to the total of ``labels`` in ``totals``."""
    total = totals.get(labels)
    if total is None:
        total = totals[labels] = _Total(len(buckets))
    for i, count in enumerate(buckets):
        total.buckets[i] += count
    total.seconds += seconds


class HistogramTotals:
    """One histogram's totals since start, by label values."""

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = bounds
        self.totals: Totals = {}

    def add(self, labels: tuple[str, ...], timed: _Timed) -> None:
        """Add a flushed tally of ``labels``."""
        _fold(self.totals, labels, timed.buckets, timed.seconds)

    def family(self, totals: Totals) -> Any:
        """The metric family of ``totals`` (this histogram's, or several workers' summed)."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        bounds = [*(_bound(b) for b in self.bounds), "+Inf"]
        for labels, total in sorted(totals.items()):
            cumulative, running = [], 0
            for bound, count in zip(bounds, total.buckets, strict=True):
                running += count
                cumulative.append((bound, running))
            family.add_metric(list(labels), cumulative, total.seconds)
        return family


def _bound(value: float) -> str:
    """A bucket bound as prometheus-client's own histograms write it, for the bounds
    used here (``0.005``, ``1.0``; tests/ops/test_metrics.py compares the two)."""
    return repr(float(value))


class Histograms(Collector):
    """The gateway's duration histograms as a prometheus-client custom collector.

    In one process it exposes its own totals. With several workers (``directory``, the
    multiprocess folder), :meth:`write` puts this worker's totals in a file of its own
    there at each flush, and :meth:`collect` sums every worker's file: a worker that has
    exited keeps what it counted, as prometheus-client keeps a dead worker's counters.
    """

    def __init__(self, histograms: list[HistogramTotals], directory: str | None) -> None:
        self.histograms = {histogram.name: histogram for histogram in histograms}
        self._directory = directory
        self._path = (
            None
            if directory is None
            else Path(directory) / f"gateway_histograms_{os.getpid()}.json"
        )

    def write(self) -> None:
        """Write this worker's totals to its file (replaced whole, never half-written)."""
        if self._path is None:
            return
        data = {
            name: [
                [list(labels), total.buckets, total.seconds] for labels, total in h.totals.items()
            ]
            for name, h in self.histograms.items()
        }
        write_whole(self._path, orjson.dumps(data))

    def collect(self) -> Iterator[Any]:
        if self._directory is None:
            for histogram in self.histograms.values():
                yield histogram.family(histogram.totals)
            return
        summed: dict[str, Totals] = {name: {} for name in self.histograms}
        for path in sorted(Path(self._directory).glob("gateway_histograms_*.json")):
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                for name, series in orjson.loads(path.read_bytes()).items():
                    if name not in summed:
                        continue
                    width = len(self.histograms[name].bounds) + 1
                    for labels, buckets, seconds in series:
                        if len(buckets) != width:  # written with other buckets
                            continue
                        _fold(summed[name], tuple(labels), buckets, seconds)
        for name, histogram in self.histograms.items():
            yield histogram.family(summed[name])


class Metrics:
    """Every metric of one gateway process, registered in its own registry."""

    def __init__(
        self,
        *,
        coercions: Callable[[], Mapping[tuple[str, str], int]] | None = None,
        ttl_policy: Callable[[], tuple[Policy, Mapping[str, int]]] | None = None,
    ) -> None:
        """``coercions`` hands over the normaliser's coercions since it was last asked
        (``CoercionCounts.take``), by (field, kind); each flush asks it. ``ttl_policy``
        says what the TTL advice aims at and each route's TTL now (live settings)."""
        self._take_coercions = coercions
        self._ttl_policy = ttl_policy
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gateway_requests_total",
            "Requests answered, by route, status and cache result",
            ["route", "status", "cache"],
            registry=r,
        )
        self.request_seconds = HistogramTotals(
            "gateway_request_duration_seconds",
            "Time to answer a request, by route and cache result",
            ("route", "cache"),
            LATENCY_BUCKETS,
        )
        self.upstream_requests = Counter(
            "gateway_upstream_requests_total",
            "Requests sent to the upstream, by route and upstream status (or error kind)",
            ["route", "status"],
            registry=r,
        )
        self.upstream_seconds = HistogramTotals(
            "gateway_upstream_duration_seconds",
            "Time of upstream calls, by route",
            ("route",),
            LATENCY_BUCKETS,
        )
        self.normalise_seconds = HistogramTotals(
            "gateway_normalise_duration_seconds",
            "Time to normalise each upstream answer (misses, bypasses, refreshes), by route;"
            " answers that break the contract are not counted",
            ("route",),
            _NORMALISE_BUCKETS,
        )
        self.refresh_ages = HistogramTotals(
            "gateway_refresh_age_seconds",
            "Age of cached answers when the upstream replaced them (a refresh, a miss after"
            " expiry, a caller's no-cache), by route and whether the answer had changed",
            ("route", "changed"),
            AGE_BUCKETS,
        )
        self.record_purge_seconds = HistogramTotals(
            "gateway_cache_record_purge_duration_seconds",
            "Time to purge by record, from the admin request to every instance's"
            " confirmation, by mode (hard, soft)",
            ("mode",),
            LATENCY_BUCKETS,
        )
        self.histograms = Histograms(
            [
                self.request_seconds,
                self.upstream_seconds,
                self.normalise_seconds,
                self.refresh_ages,
                self.record_purge_seconds,
            ],
            multiprocess_dir(),
        )
        r.register(self.histograms)
        self.cache_results = Counter(
            "gateway_cache_results_total",
            "Cache results by route: hit, miss, stale, bypass",
            ["route", "result"],
            registry=r,
        )
        self.distinct_keys = Counter(
            "gateway_cache_distinct_keys_total",
            "Distinct keys of each route fetched from the upstream, each process's estimate"
            " (a sketch's, within a few per cent) added up: the floor of its misses, what"
            " the hit ratio could reach at best",
            ["route"],
            registry=r,
        )
        self.coalesced = Counter(
            "gateway_coalesced_requests_total",
            "Requests answered by another request's upstream call instead of making one:"
            " in this process, or across the fleet (another instance's fill in Redis)",
            ["route", "kind"],
            registry=r,
        )
        self.identity_decompressions = Counter(
            "gateway_identity_decompressions_total",
            "Gzip entries decompressed for a caller that does not accept gzip, because the"
            " memo of decompressed bodies (cache.identity_memo_max_bytes) did not hold them",
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
        self.upstream_circuit_state = Gauge(
            "gateway_upstream_circuit_state",
            "Upstream circuit breaker: 0 closed, 1 half-open, 2 open (open: the upstream is"
            " not called; stale entries are served, other requests get 503)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.upstream_circuit_changes = Counter(
            "gateway_upstream_circuit_changes_total",
            "Changes of the upstream circuit breaker, by the state it went to",
            ["state"],
            registry=r,
        )
        self.upstream_switches = Counter(
            "gateway_upstream_switches_total",
            "Reloads that pointed the gateway at another upstream.base_url",
            registry=r,
        )
        self.upstream_retries = Counter(
            "gateway_upstream_retries_total",
            "Upstream requests sent again on a new connection because the pooled one"
            " they went out on was closed before any byte of the answer, or reset before"
            " its head was complete",
            ["route"],
            registry=r,
        )
        self.coercions = Counter(
            "gateway_normaliser_coercions_total",
            "Coercions the normaliser performed, by field and kind",
            ["field", "kind"],
            registry=r,
        )
        self.fleet_configurations = Gauge(
            "gateway_fleet_configurations",
            "Distinct cache configurations (TTLs, windows, namespace) among the live"
            " instances sharing this Redis, as this one last read them; more than 1:"
            " the fleet disagrees",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.shadow_requests = Counter(
            "gateway_shadow_requests_total",
            "Requests of the shadow traffic, by route and outcome: identical, different,"
            " noise (only fields known as noise differ), candidate_error (no answer to"
            " compare), skipped (too many candidate calls under way)",
            ["route", "outcome"],
            registry=r,
        )
        self.shadow_differences = Counter(
            "gateway_shadow_field_differences_total",
            "Fields of the candidate's answers that differ from the primary's (noise not"
            " counted), by route, field path of the published schema and kind (value,"
            " type, missing, extra, order, length)",
            ["route", "field", "kind"],
            registry=r,
        )
        self.refreshes = Counter(
            "gateway_refreshes_total",
            "Cached answers the upstream replaced, by route and whether the answer had"
            " changed (ETag compared)",
            ["route", "changed"],
            registry=r,
        )
        self.record_purges = Counter(
            "gateway_cache_record_purges_total",
            "Purges by record, by mode (hard, soft) and outcome (done, unknown: the cache"
            " did not confirm it)",
            ["mode", "outcome"],
            registry=r,
        )
        self.record_purged_entries = Counter(
            "gateway_cache_record_purged_entries_total",
            "Entries that purges by record removed (hard) or marked stale (soft)",
            ["mode"],
            registry=r,
        )
        self.consistency_invalidations = Counter(
            "gateway_consistency_invalidations_total",
            "Entries removed because a fetch brought another version of a record they"
            " hold (cache.record_consistency), by the removed entry's route",
            ["route"],
            registry=r,
        )
        self.consistency_unconfirmed = Counter(
            "gateway_consistency_unconfirmed_total",
            "Such removals that a process keeping copies did not confirm in time (its"
            " copies may be served until their freshness ends)",
            registry=r,
        )
        self.consistency_refetches = Counter(
            "gateway_consistency_refetches_total",
            "Upstream calls made again because the first answer may have been older"
            " than one already served (cache.record_consistency), by route",
            ["route"],
            registry=r,
        )
        self.record_index_keys = Gauge(
            "gateway_cache_record_index_keys",
            "Keys of the records' index (docs/purging.md): with Redis, each record's set"
            " and hash of versions, as one instance measured them last (every 5 minutes)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.record_index_bytes = Gauge(
            "gateway_cache_record_index_bytes",
            "Bytes of the records' index: with Redis, estimated from the MEMORY USAGE of a"
            " sample of its keys; in memory, what it is charged against memory_max_bytes",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.change_notices = Counter(
            "gateway_change_notices_total",
            "Change notices (POST /admin/records/changed) by outcome: purged; unknown (the"
            " purge, or the check against replays, was not confirmed); replayed (a signed"
            " notice sent again); unauthenticated; invalid (refused before any purge)",
            ["outcome"],
            registry=r,
        )
        self.ttls = Gauge(
            "gateway_ttl_seconds",
            "The TTL of each route's answers now (cache.ttl_s)",
            ["route"],
            registry=r,
            multiprocess_mode="livemax",
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
        self._refreshed: dict[tuple[str, str], _Timed] = {}  # by (route, changed)
        self._keys_seen: dict[str, KeySketch] = {}
        self.busy = 0  # requests being handled now; the in-flight gauge at each flush

    def count_answer(self, route: str, status: int, cache: str, seconds: float) -> None:
        """Count one answered request (cache is "hit", "miss", ..., or "none")."""
        key = (route, status, cache)
        answers = self._answers.get(key) or _made(self._answers, key, LATENCY_BUCKETS)
        answers.add(seconds)

    def upstream_called(self, route: str, outcome: str, seconds: float) -> None:
        """Count one upstream call of ``route`` that ended in ``outcome``."""
        key = (route, outcome)
        calls = self._upstream.get(key) or _made(self._upstream, key, LATENCY_BUCKETS)
        calls.add(seconds)

    def normalised(self, route: str, seconds: float, key: str | None = None) -> None:
        """Time one normalised answer of ``route``; with the ``key`` it was fetched for,
        note the key too (:meth:`fetched_key`)."""
        if key is not None:
            self.fetched_key(route, key)
        timed = self._normalised.get(route) or _made(self._normalised, route, _NORMALISE_BUCKETS)
        timed.add(seconds)

    def refreshed(self, route: str, changed: bool, age_s: float) -> None:
        """Count one cached answer of ``route`` replaced from the upstream at ``age_s``,
        ``changed`` or not (the evidence of gateway.ops.ttl_advice)."""
        key = (route, "true" if changed else "false")
        timed = self._refreshed.get(key) or _made(self._refreshed, key, AGE_BUCKETS)
        timed.add(max(age_s, 0.0))

    def fetched_key(self, route: str, key: str) -> None:
        """Note one key of ``route`` fetched from the upstream; counted once per process
        (``gateway_cache_distinct_keys_total``), as far as the sketch can tell."""
        sketch = self._keys_seen.get(route)
        if sketch is None:
            sketch = self._keys_seen[route] = KeySketch()
        grown = sketch.add(key)
        if grown:
            self.distinct_keys.labels(route).inc(grown)

    def flush(self) -> None:
        """Hand the tallies over (a scrape sees everything before it). The histograms
        go first: a scrape of another worker never sees a request counted that its
        duration histogram lacks."""
        upstream, self._upstream = self._upstream, {}
        normalised, self._normalised = self._normalised, {}
        refreshed, self._refreshed = self._refreshed, {}
        answers, self._answers = self._answers, {}
        for (route, _outcome), calls in upstream.items():
            self.upstream_seconds.add((route,), calls)
        for route, timed in normalised.items():
            self.normalise_seconds.add((route,), timed)
        for (route, _status, cache), tally in answers.items():
            self.request_seconds.add((route, cache), tally)
        for key, ages in refreshed.items():
            self.refresh_ages.add(key, ages)
        self.histograms.write()
        self.in_flight.set(self.busy)
        if self._take_coercions is not None:
            for (name, kind), count in self._take_coercions().items():
                self.coercions.labels(name, kind).inc(count)
        for (route, outcome), calls in upstream.items():
            self.upstream_requests.labels(route, outcome).inc(calls.count)
        for (route, status, cache), tally in answers.items():
            self.requests.labels(route, str(status), cache).inc(tally.count)
            if cache != "none":
                self.cache_results.labels(route, cache).inc(tally.count)
        for (route, changed), ages in refreshed.items():
            self.refreshes.labels(route, changed).inc(ages.count)

    def purged_records(self, mode: str, entries: int | None, seconds: float) -> None:
        """Count one purge by record in ``mode`` that reached ``entries`` (None: its
        outcome is unknown) in ``seconds``."""
        self.record_purges.labels(mode, "unknown" if entries is None else "done").inc()
        if entries is None:
            return
        self.record_purged_entries.labels(mode).inc(entries)
        timed = _Timed(LATENCY_BUCKETS)
        timed.add(seconds)
        self.record_purge_seconds.add((mode,), timed)

    def consistency_invalidated(self, routes: Iterable[str], confirmed: bool) -> None:
        """Count the entries (by their routes) a fetch removed for holding another
        version of a record; ``confirmed``: every process dropped its copies."""
        for route in routes:
            self.consistency_invalidations.labels(route).inc()
        if not confirmed:
            self.consistency_unconfirmed.inc()

    def record_index(self, keys: int, size_bytes: int) -> None:
        """The records' index's size, as the cache backend last gave it."""
        self.record_index_keys.set(keys)
        self.record_index_bytes.set(size_bytes)

    def consistency_refetched(self, route: str) -> None:
        self.consistency_refetches.labels(route).inc()

    def change_notice(self, outcome: str) -> None:
        """Count one change notice by its outcome."""
        self.change_notices.labels(outcome).inc()

    def circuit_changed(self, backend: str, state: str) -> None:
        self.circuit_state.labels(backend).set(CIRCUIT_VALUES[state])

    def upstream_circuit_changed(self, state: str) -> None:
        """The upstream circuit went to ``state`` (closed, half-open or open)."""
        self.upstream_circuit_state.set(CIRCUIT_VALUES[state])
        self.upstream_circuit_changes.labels(state).inc()

    def upstream_switched(self) -> None:
        """A reload pointed the gateway at another upstream, whose circuit starts closed."""
        self.upstream_switches.inc()
        self.upstream_circuit_state.set(CIRCUIT_VALUES["closed"])

    def ttls_configured(self, ttls: Mapping[str, int]) -> None:
        """The TTL of each route now (at start and at every reload)."""
        for route, ttl in ttls.items():
            self.ttls.labels(route).set(ttl)

    def families(self) -> list[Any]:
        """Every metric family as a scrape sees it: this process's, or every worker's
        summed (after a flush)."""
        self.flush()
        directory = multiprocess_dir()
        if directory is None:
            return list(self.registry.collect())
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        registry.register(self.histograms)
        return list(registry.collect())

    def ttl_advice(self) -> tuple[Policy, list[Advice], Mapping[str, Traffic]]:
        """The TTL policy, the advice of every route from the evidence every worker
        counted (gateway.ops.ttl_advice), and each route's traffic (gateway.ops.traffic)."""
        policy, ttls = self._policy()
        families = self.families()
        return policy, advice_from(families, policy, ttls), traffic_of(families)

    def _policy(self) -> tuple[Policy, Mapping[str, int]]:
        if self._ttl_policy is None:
            return Policy(max_stale_share=0.05, min_ttl_s=5, max_ttl_s=3600), {}
        return self._ttl_policy()

    def exposition(self) -> bytes:
        """The text exposition: this process's registry, or every worker's sum, with
        the advised TTL and the change rate of each route as gauges."""
        families = self.families()
        policy, ttls = self._policy()
        families += advice_families(advice_from(families, policy, ttls))
        return generate_latest(_Families(families))


class _Families(Collector):
    """Metric families already collected, as a collector ``generate_latest`` reads."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Iterator[Any]:
        return iter(self._families)


def advice_from(families: list[Any], policy: Policy, ttls: Mapping[str, int]) -> list[Advice]:
    """The advice of every route of ``ttls`` from the evidence in ``families``."""
    evidence = evidence_of(families)
    return [
        advise(route, ttl, evidence.get(route, Evidence()), policy) for route, ttl in ttls.items()
    ]


def advice_families(advice: list[Advice]) -> list[Any]:
    """``gateway_ttl_advised_seconds`` and ``gateway_answer_changes_per_hour`` of each
    route that has advice (a route without enough evidence has no sample)."""
    advised = GaugeMetricFamily(
        "gateway_ttl_advised_seconds",
        "The TTL advised for each route from how often its answers change and"
        " cache.max_stale_share (no sample: not enough evidence); never applied by itself",
        labels=["route"],
    )
    rate = GaugeMetricFamily(
        "gateway_answer_changes_per_hour",
        "How many times an hour each route's answers change, as estimated from the"
        " answers the upstream replaced (no sample: not enough evidence)",
        labels=["route"],
    )
    for item in advice:
        if item.advised_ttl_s is not None:
            advised.add_metric([item.route], item.advised_ttl_s)
        if item.changes_per_hour is not None:
            rate.add_metric([item.route], item.changes_per_hour)
    return [advised, rate]
