"""The two bench parts that are not throughput: coalescing and the memory bound.

coalesce
    500 requests at once for one key nobody asked for yet; the gateway should call the
    upstream once. Counted from the gateway's own ``gateway_upstream_requests_total``
    before and after.
soak
    Many more distinct keys than ``cache.memory_max_bytes`` holds, as fast as a few
    dozen concurrent callers go, while the gateway's RSS is sampled; the memory
    backend's bound plus 60 MiB of interpreter and libraries should hold it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from servers import AUTH, rss_bytes

MIB = 1024 * 1024


def counter_sums(exposition: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every ``<family>_total`` sample of a Prometheus text exposition, by its labels."""
    sums: dict[tuple[tuple[str, str], ...], float] = collections.defaultdict(float)
    for metric in text_string_to_metric_families(exposition):
        if metric.name != family.removesuffix("_total"):
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                sums[tuple(sorted(sample.labels.items()))] += sample.value
    return dict(sums)


def histogram_mean(exposition: str, family: str) -> tuple[int, float]:
    """(observations, mean) of a histogram over every label set of ``family``."""
    count = total = 0.0
    for metric in text_string_to_metric_families(exposition):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if sample.name == family + "_count":
                count += sample.value
            elif sample.name == family + "_sum":
                total += sample.value
    return int(count), (total / count if count else 0.0)


def counter_total(exposition: str, family: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(
        value for key, value in counter_sums(exposition, family).items() if wanted <= set(key)
    )


def by_label(exposition: str, family: str, label: str) -> dict[str, float]:
    totals: dict[str, float] = collections.defaultdict(float)
    for key, value in counter_sums(exposition, family).items():
        totals[dict(key).get(label, "")] += value
    return dict(totals)


def _session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        timeout=aiohttp.ClientTimeout(total=60),
    )


async def _metrics(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(base + "/metrics") as response:
        return await response.text()


@dataclass(slots=True)
class CoalesceResult:
    path: str
    requests: int
    upstream_calls: int
    statuses: dict[int, int]
    distinct_bodies: int
    x_cache: dict[str, int]
    coalesced: int
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "requests": self.requests,
            "upstream_calls": self.upstream_calls,
            "statuses": {str(code): count for code, count in sorted(self.statuses.items())},
            "distinct_bodies": self.distinct_bodies,
            "x_cache": dict(sorted(self.x_cache.items())),
            "coalesced_requests_metric": self.coalesced,
            "seconds": round(self.seconds, 3),
        }


async def coalesce(base: str, path: str, requests: int) -> CoalesceResult:
    """``requests`` concurrent GETs of one cold key; upstream calls from /metrics."""
    async with _session() as session:
        # Open every connection first (keep-alive): the reads then arrive together
        # instead of trickling in behind 500 TCP handshakes.
        await asyncio.gather(*(_drain(session, base + "/healthz") for _ in range(requests)))
        before = await _metrics(session, base)

        async def one() -> tuple[int, str, bytes]:
            async with session.get(base + path, headers=AUTH) as response:
                return response.status, response.headers.get("X-Cache", "-"), await response.read()

        started = time.perf_counter()
        answers = await asyncio.gather(*(one() for _ in range(requests)))
        seconds = time.perf_counter() - started
        after = await _metrics(session, base)
    family = "gateway_upstream_requests_total"
    calls = counter_total(after, family) - counter_total(before, family)
    waits = "gateway_coalesced_requests_total"
    return CoalesceResult(
        path=path,
        requests=requests,
        upstream_calls=round(calls),
        statuses=dict(collections.Counter(status for status, _, _ in answers)),
        distinct_bodies=len({body for _, _, body in answers}),
        x_cache=dict(collections.Counter(x_cache for _, x_cache, _ in answers)),
        coalesced=round(counter_total(after, waits) - counter_total(before, waits)),
        seconds=seconds,
    )


async def _drain(session: aiohttp.ClientSession, url: str) -> None:
    async with session.get(url) as response:
        await response.read()


def soak_paths(total_expenses: int, max_limit: int, seed: int = 7) -> list[str]:
    """``/expenses?limit=L&page=P`` for every limit up to ``max_limit`` and every page
    that exists, shuffled (small and large bodies mixed all along the run)."""
    paths = [
        f"/expenses?limit={limit}&page={page}"
        for limit in range(1, max_limit + 1)
        for page in range(1, -(-total_expenses // limit) + 1)
    ]
    random.Random(seed).shuffle(paths)
    return paths


@dataclass(slots=True)
class SoakResult:
    max_bytes: int
    keys: int
    concurrency: int
    requests: int = 0
    body_bytes: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    seconds: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0
    rss_end: int = 0
    rss_by_second: list[tuple[int, int]] = field(default_factory=list)

    @property
    def bound(self) -> int:
        return self.max_bytes + 60 * MIB

    @property
    def passed(self) -> bool:
        return self.rss_peak <= self.bound

    def as_dict(self) -> dict[str, object]:
        return {
            "memory_max_bytes": self.max_bytes,
            "bound_bytes": self.bound,
            "distinct_keys": self.keys,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "body_bytes": self.body_bytes,
            "statuses": {str(code): count for code, count in sorted(self.statuses.items())},
            "errors": self.errors,
            "seconds": round(self.seconds, 1),
            "rss_start_bytes": self.rss_start,
            "rss_peak_bytes": self.rss_peak,
            "rss_end_bytes": self.rss_end,
            "rss_by_second": self.rss_by_second,
            "pass": self.passed,
        }


async def soak(
    base: str,
    pid: int,
    paths: list[str],
    *,
    max_bytes: int,
    concurrency: int,
    duration_s: float,
    passes: int = 2,
) -> SoakResult:
    """Request ``paths`` (``passes`` times over) until done or ``duration_s`` is up,
    sampling the RSS of ``pid`` every quarter second."""
    result = SoakResult(max_bytes=max_bytes, keys=len(paths), concurrency=concurrency)
    result.rss_start = result.rss_peak = rss_bytes(pid)
    statuses: collections.Counter[int] = collections.Counter()
    work: Iterable[str] = (path for _ in range(passes) for path in paths)
    queue = iter(work)
    deadline = time.monotonic() + duration_s

    async def caller(session: aiohttp.ClientSession) -> None:
        for path in queue:
            if time.monotonic() > deadline:
                return
            try:
                async with session.get(base + path, headers=AUTH) as response:
                    body = await response.read()
            except (aiohttp.ClientError, TimeoutError):
                result.errors += 1
                continue
            statuses[response.status] += 1
            result.requests += 1
            result.body_bytes += len(body)

    async def sampler() -> None:
        while True:
            rss = rss_bytes(pid)
            result.rss_peak = max(result.rss_peak, rss)
            second = int(time.monotonic() - started)
            if not result.rss_by_second or result.rss_by_second[-1][0] < second:
                result.rss_by_second.append((second, rss))
            await asyncio.sleep(0.25)

    started = time.monotonic()
    async with _session(limit=concurrency) as session:
        watch = asyncio.create_task(sampler())
        try:
            await asyncio.gather(*(caller(session) for _ in range(concurrency)))
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    result.seconds = time.monotonic() - started
    result.rss_end = rss_bytes(pid)
    result.rss_peak = max(result.rss_peak, result.rss_end)
    result.statuses = dict(statuses)
    return result


@dataclass(slots=True)
class InvalidationResult:
    """How long a purge on one instance took to reach another instance's near cache."""

    trials: int
    milliseconds: list[float] = field(default_factory=list)

    @property
    def worst_ms(self) -> float:
        return max(self.milliseconds) if self.milliseconds else float("inf")

    def as_dict(self) -> dict[str, object]:
        return {
            "trials": self.trials,
            "milliseconds": [round(ms, 2) for ms in self.milliseconds],
            "worst_ms": round(self.worst_ms, 2),
            "pass": self.worst_ms <= 1000.0,
        }


async def invalidation(
    first: str, second: str, path: str, admin_token: str, *, trials: int = 5
) -> InvalidationResult:
    """Prime ``path`` in ``second``'s near cache, purge its route through ``first``, and
    time until ``second`` stops answering from its copy (its first non-HIT answer)."""
    result = InvalidationResult(trials=trials)
    route = path.split("?", 1)[0].strip("/").split("/", 1)[0]
    admin = {"Authorization": f"Bearer {admin_token}"}
    async with _session() as session:
        for _ in range(trials):
            seen = ""
            for _ in range(20):  # a fresh instance may need a few requests to store
                async with session.get(second + path, headers=AUTH) as response:
                    await response.read()
                    seen = f"{response.status} {response.headers.get('Cache-Status')}"
                    if response.headers.get("X-Cache") == "HIT":
                        break
            else:
                raise RuntimeError(f"{second}{path} is not a hit before the purge: {seen}")
            async with session.delete(f"{first}/admin/cache?route={route}", headers=admin) as r:
                await r.read()
                purged = time.monotonic()
                if r.status != 200:
                    raise RuntimeError(f"purge through {first} answered {r.status}")
            while True:
                # the answer that is no longer a hit was looked up just after it was sent:
                # its send time bounds when the copy was dropped
                sent = time.monotonic()
                async with session.get(second + path, headers=AUTH) as response:
                    await response.read()
                    if response.headers.get("X-Cache") != "HIT":
                        break
                if sent - purged > 10:
                    raise RuntimeError("the purge never reached the second instance")
            result.milliseconds.append((sent - purged) * 1000)
    return result
