"""Readiness: what recent traffic says about the upstream and the cache, plus a
rate-limited check when traffic says nothing new.

Components are ``ok``, ``degraded`` or ``down`` (the cache may also be ``disabled``).
The gateway is ready (200) while it can serve: a cache that is down only degrades
it, since requests fall through to the upstream. It is not ready (503) when the
upstream is down and there is no cache to serve from.

The cache is judged by the outcomes of its real reads and writes over the breaker's
window (source ``traffic`` when there were any), and by its own rate-limited probe, one
real read and one real write, when none of them passed (source ``check`` when there
were none): ``degraded`` while the circuit is not closed or while reads or writes fail
at least :data:`DEGRADED_SHARE` of the time, ``down`` when the probe fails and no read
or write passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

OK = "ok"
DEGRADED = "degraded"
DOWN = "down"
DISABLED = "disabled"
# not known yet: no traffic and no check since the start (in the fleet's summaries)
UNKNOWN = "unknown"

# the share of failed reads (or of failed writes) over the window from which the
# cache is degraded: one blip among thousands of calls is not, a failing write is
DEGRADED_SHARE = 0.1


class TrafficHealth(Protocol):
    """What recent traffic says about a component (``gateway.upstream.health``)."""

    last_error: str | None

    def status(self) -> str | None:
        """ok or down by the latest outcome; None when there was no traffic yet."""
        ...

    def age(self) -> float | None:
        """Seconds since the latest outcome; None when there was none."""
        ...


@dataclass(frozen=True, slots=True)
class Tally:
    """Calls of one kind that passed and failed over a window."""

    ok: int
    failed: int

    @property
    def calls(self) -> int:
        return self.ok + self.failed

    def failing(self) -> bool:
        """Whether at least DEGRADED_SHARE of these calls failed."""
        return self.failed > 0 and self.failed / self.calls >= DEGRADED_SHARE

    def report(self) -> dict[str, int]:
        return {"ok": self.ok, "failed": self.failed}


@dataclass(frozen=True, slots=True)
class CacheOutcomes:
    """What the cache's recent calls say (``gateway.cache.breaker.GuardedCache``)."""

    circuit: str  # closed, open or half-open
    last_error: str | None
    reads: Tally
    writes: Tally
    probes: Tally


@dataclass(slots=True)
class _Check:
    """A check that runs at most once per interval; callers in between share its result."""

    run: Callable[[], Awaitable[None]]
    interval_s: float
    monotonic: Callable[[], float] = time.monotonic
    last_at: float | None = None
    last_error: str | None = None
    running: asyncio.Task[None] | None = None

    async def result(self, now: float) -> str | None:
        """None when the check passed, else the error."""
        if self.last_at is not None and now - self.last_at < self.interval_s:
            return self.last_error
        if self.running is None:
            self.running = asyncio.ensure_future(self.run())
            self.running.add_done_callback(self._finished)
        # A caller that goes away leaves the check running for the next one; the
        # result is recorded when the check itself finishes, not when a caller does.
        await asyncio.wait([self.running])
        return self.last_error

    def _finished(self, task: asyncio.Task[None]) -> None:
        if self.running is task:
            self.running = None
        if task.cancelled():
            return
        error = task.exception()
        self.last_error = None if error is None else (str(error) or type(error).__name__)
        self.last_at = self.monotonic()


class Readiness:
    """Puts together the readiness report of /readyz."""

    def __init__(
        self,
        *,
        upstream: TrafficHealth,
        upstream_check: Callable[[], Awaitable[None]],
        cache_state: Callable[[], CacheOutcomes],
        cache_check: Callable[[], Awaitable[None]] | None,
        interval_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        fleet: Callable[[], dict[str, Any]] | None = None,
        upstream_circuit: Callable[[], str] | None = None,
        workers: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """``fleet``: the fleet component (``gateway.cache.fleet.Fleet.report``), when
        instances share a cache; a fleet that disagrees degrades the gateway.
        ``upstream_circuit``: the state of the upstream's circuit breaker (closed, open,
        half-open), reported with the upstream. ``workers``: the workers component
        (``gateway.ops.siblings.Siblings.report``) of a gateway with several; workers
        that run different configurations degrade it."""
        self._fleet = fleet
        self._workers = workers
        self._upstream_circuit = upstream_circuit
        self._upstream = upstream
        self._upstream_check = _Check(upstream_check, interval_s, monotonic)
        self._cache_state = cache_state
        self._cache_check = (
            None if cache_check is None else _Check(cache_check, interval_s, monotonic)
        )
        self._monotonic = monotonic
        self.interval_s = interval_s

    @property
    def interval_s(self) -> float:
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        """The least time between two checks of one component (live tunable)."""
        self._interval_s = value
        self._upstream_check.interval_s = value
        if self._cache_check is not None:
            self._cache_check.interval_s = value

    async def report(self) -> tuple[int, dict[str, Any]]:
        now = self._monotonic()
        upstream = await self._upstream_component(now)
        cache = await self._cache_component(now)
        components = {"upstream": upstream, "cache": cache}
        fleet_degraded = False
        if self._fleet is not None:
            components["fleet"] = fleet = self._fleet()
            fleet_degraded = fleet["status"] == DEGRADED
        if self._workers is not None:
            components["workers"] = workers = self._workers()
            fleet_degraded = fleet_degraded or workers["status"] == DEGRADED
        overall = _overall(upstream["status"], cache["status"], fleet_degraded)
        return 503 if overall == DOWN else 200, {"status": overall, "components": components}

    def summary(self) -> dict[str, Any]:
        """The report in short, as an instance announces it to the fleet: the status,
        each component's, the upstream's circuit. Read from what traffic and the last
        checks said, never running a check (an idle instance calls nothing for it)."""
        components = {"upstream": self._upstream_seen(), "cache": self._cache_seen()}
        degraded = False
        for name, part in (("fleet", self._fleet), ("workers", self._workers)):
            if part is not None:
                components[name] = part()["status"]
                degraded = degraded or components[name] == DEGRADED
        return {
            "status": _overall(components["upstream"], components["cache"], degraded),
            "components": components,
            "circuit": None if self._upstream_circuit is None else self._upstream_circuit(),
        }

    def _upstream_seen(self) -> str:
        age, status = self._upstream.age(), self._upstream.status()
        if status is not None and age is not None and age <= self._interval_s:
            return status
        check = self._upstream_check
        if check.last_at is None:
            return UNKNOWN
        return OK if check.last_error is None else DOWN

    def _cache_seen(self) -> str:
        if self._cache_check is None:
            return DISABLED
        seen = self._cache_state()
        if seen.reads.ok + seen.writes.ok == 0 and seen.reads.calls + seen.writes.calls > 0:
            return DOWN
        if seen.circuit != "closed" or seen.reads.failing() or seen.writes.failing():
            return DEGRADED
        return OK

    async def _upstream_component(self, now: float) -> dict[str, Any]:
        component = await self._upstream_outcome(now)
        if self._upstream_circuit is not None:
            component["circuit"] = self._upstream_circuit()
        return component

    async def _upstream_outcome(self, now: float) -> dict[str, Any]:
        age = self._upstream.age()
        status = self._upstream.status()
        if status is None or age is None or age > self._interval_s:
            # (while the upstream's circuit is open the check fails at once, without
            # calling it; once a trial is due, the check may be that trial)
            error = await self._upstream_check.result(now)
            if error is None:
                return {"status": OK, "lastError": self._upstream.last_error, "source": "check"}
            return {"status": DOWN, "lastError": error, "source": "check"}
        return {"status": status, "lastError": self._upstream.last_error, "source": "traffic"}

    async def _cache_component(self, now: float) -> dict[str, Any]:
        if self._cache_check is None:
            return {"status": DISABLED, "lastError": None}
        seen = self._cache_state()
        check_error: str | None = None
        if seen.reads.ok + seen.writes.ok == 0:
            # no read or write passed in the window: the probe tells down from degraded
            # (and, as the breaker's trial, may close it)
            check_error = await self._cache_check.result(now)
            seen = self._cache_state()
        error: str | None
        if check_error is not None and seen.reads.ok + seen.writes.ok == 0:
            status, error = DOWN, check_error
        elif seen.circuit != "closed" or seen.reads.failing() or seen.writes.failing():
            status, error = DEGRADED, seen.last_error
        else:
            status, error = OK, seen.last_error
        return {
            "status": status,
            "lastError": error,
            "source": "traffic" if seen.reads.calls + seen.writes.calls else "check",
            "circuit": seen.circuit,
            "reads": seen.reads.report(),
            "writes": seen.writes.report(),
            "probes": seen.probes.report(),
        }


def _overall(upstream: str, cache: str, degraded: bool) -> str:
    """The gateway's status from its parts': down when nothing can be served; unknown
    while nothing says how the upstream is (the fleet's summaries only)."""
    if upstream == DOWN and cache in (DOWN, DISABLED):
        return DOWN
    if upstream == DOWN or cache in (DOWN, DEGRADED) or degraded:
        return DEGRADED
    return UNKNOWN if upstream == UNKNOWN else OK
