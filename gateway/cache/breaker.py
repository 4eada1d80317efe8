"""Cache faults never fail a request: the guarded cache behind its circuit breaker
(:class:`gateway.ops.circuit.CircuitBreaker`).

Every backend call is bounded in time by the backend itself; :class:`GuardedCache`
turns a failure into "no cache for this request". The breaker skips the backend for
``reset_s`` seconds (closed -> open) after ``failures`` failures in a row, or when over
the last ``window_s`` seconds at least ``min_calls`` calls were made and at least
``failure_share`` of them failed (a Redis that refuses every write while reads pass
never fails ``failures`` times in a row); then one call tries it (half-open), whose
success closes the circuit with a fresh window and whose failure opens it again.
State changes are logged once each, not once per request; failures are counted.

The guarded cache also keeps, per kind (reads, writes, its own probes) and over the
same window, how many calls passed and failed: what readiness reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from gateway.cache.backend import OWN_LEASE, CacheBackend, Noted
from gateway.cache.entry import CacheEntry, CacheKey, Lookup
from gateway.errors import CacheUnavailable
from gateway.ops.circuit import CircuitBreaker, CircuitState, OutcomeWindow
from gateway.ops.health import CacheOutcomes

T = TypeVar("T")
_CLOSED = CircuitState.CLOSED


class GuardedCache:
    """A backend behind the breaker: reads, writes and fill leases that never raise,
    and what their recent outcomes say (:meth:`outcomes`). Purges go to the backend
    itself (their failure is the caller's answer) and are not counted here."""

    def __init__(
        self,
        backend: CacheBackend,
        breaker: CircuitBreaker,
        *,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.breaker = breaker
        self.errors = 0
        self.last_error: str | None = None
        self._on_error = on_error
        # whether the backend is shared: what this process holds (fresh) is then
        # apart from what get reads
        self.shared = backend.capabilities.shared
        self._monotonic = breaker.monotonic
        self._reads = OutcomeWindow(breaker.window_s)
        self._writes = OutcomeWindow(breaker.window_s)
        self._probes = OutcomeWindow(breaker.window_s)

    async def get(self, key: CacheKey, *, held_probed: bool = False) -> Lookup | None:
        """The lookup, or None when the cache cannot be used now (a miss). For a shared
        backend, a fresh entry held in this process (its near cache) answers first,
        while the circuit is closed, and is not counted: it says nothing of the backend
        (a near-cache hit taken for a Redis success would close a half-open circuit or
        dilute the failure share). ``held_probed``: the caller already asked
        :meth:`fresh` for ``key`` and found nothing, so it is not asked again. A backend
        that is not shared (memory) is the process's own: its read is the one probe."""
        breaker = self.breaker
        if not held_probed and self.shared and breaker.state is _CLOSED:
            held = self.backend.fresh(key)
            if held is not None:
                return Lookup(held, held.generations)
        if not breaker.allow():
            return None
        try:
            lookup = await self.backend.get(key)
        except CacheUnavailable as exc:
            self._failed(self._reads, exc)
            breaker.failed(str(exc))
            return None
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        breaker.succeeded()
        self._reads.add(self._monotonic(), False)
        return lookup

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        """A fresh entry held in this process (see CacheBackend.fresh), only while the
        circuit is closed: a hit from here is neither a trial nor a success."""
        if self.breaker.state is not _CLOSED:
            return None
        return self.backend.fresh(key)

    def read_held(self, key: CacheKey) -> CacheEntry | Lookup | None:
        """The read of ``key`` from a backend that holds every entry in this process
        (CacheBackend.read_held: a fresh entry, or the lookup), made now, only while
        the circuit is closed; None otherwise, or when the backend's reads are
        :meth:`get`'s (a shared one). Not counted: the caller that takes it as a request's read,
        where :meth:`get` would have been called, says so with :meth:`read_taken`; a
        fresh entry served is counted no more than :meth:`fresh`'s."""
        if self.breaker.state is not _CLOSED:
            return None
        return self.backend.read_held(key)

    def read_taken(self) -> None:
        """A :meth:`read_held` taken as a request's read: counted as :meth:`get`
        counts a read that passed."""
        self.breaker.succeeded()
        self._reads.add(self._monotonic(), False)

    async def set(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str] | None = None,
        since: int | None = None,
    ) -> bool:
        """Store; False when the cache could not take it. ``held``: the records the
        entry holds, noted when the backend purges by record (``set_holding``, with
        ``since`` from :meth:`purge_sequence`; False too when a purge of one of them
        came after it)."""
        backend = self.backend
        noted = held is not None and backend.capabilities.purges_records
        if noted and since is None:
            return False  # the purge number could not be read: not stored
        breaker = self.breaker
        if not breaker.allow():
            return False
        try:
            if noted and held is not None and since is not None:
                if not await backend.set_holding(key, entry, lifetime_s, held, since):
                    breaker.succeeded()
                    return False
            else:
                await backend.set(key, entry, lifetime_s)
        except CacheUnavailable as exc:
            self._failed(self._writes, exc)
            breaker.failed(str(exc))
            return False
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        breaker.succeeded()
        self._writes.add(self._monotonic(), False)
        return True

    async def set_consistent(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int | None,
        scope: str,
    ) -> Noted | None:
        """Store, keeping one version of each record in ``scope``
        (``CacheBackend.set_consistent``); None when the cache could not take it (or
        ``since`` could not be read): then the answer is not known to be older than
        one served, nor newer."""
        if since is None:
            return None
        backend = self.backend

        async def store() -> Noted | None:
            return await backend.set_consistent(key, entry, lifetime_s, held, since, scope)

        return await self._guarded(self._writes, store, None)

    async def purge_sequence(self) -> int | None:
        """The number of the latest purge by record (``CacheBackend.purge_sequence``),
        for a backend that purges by record; None when there is none or the cache
        cannot be used now. The first step of a store: a failure counts as a failed
        write, and a success proves only that the store answers (the write that
        follows is what counts; a half-open circuit closes on probation)."""
        backend = self.backend
        if not backend.capabilities.purges_records:
            return None
        return await self._guarded(self._writes, backend.purge_sequence, None, conclusive=False)

    async def remove(self, key: CacheKey) -> bool:
        """Remove the entry under ``key`` for every instance (CacheBackend.remove);
        False when there was none or the cache cannot be used now (then no request
        reads it either until the circuit closes). Counted as a write."""
        return await self._guarded(self._writes, lambda: self.backend.remove(key), False)

    async def check(self) -> None:
        """The readiness check: one real read and one real write (``backend.probe``),
        never a PING; a failure raises CacheUnavailable. Its outcome counts among the
        probes of :meth:`outcomes`. It reaches the breaker only as a call the breaker
        allows: an ordinary one while closed, the trial once the open circuit's reset
        time has passed; otherwise (open, or a trial already running) it leaves the
        breaker as it is."""
        breaker = self.breaker
        counted = breaker.allow()
        try:
            await self.backend.probe()
        except CacheUnavailable as exc:
            self._failed(self._probes, exc)
            if counted:
                breaker.failed(str(exc))
            raise
        except asyncio.CancelledError:
            if counted:
                breaker.abandoned()
            raise
        self._probes.add(self._monotonic(), False)
        if counted:
            breaker.succeeded()

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        """The fill lease of ``key`` (CacheBackend.take_lease); OWN_LEASE, "fill it
        yourself", when the cache cannot be used now. Counted as a write."""
        return await self._guarded(
            self._writes, lambda: self.backend.take_lease(key, milliseconds), OWN_LEASE
        )

    async def leased(self, key: CacheKey) -> bool:
        """Whether some instance holds the fill lease of ``key``; False when the cache
        cannot be used now. Counted as a read."""
        return await self._guarded(self._reads, lambda: self.backend.leased(key), False)

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        """Give the lease back (a lease the cache could not take, or not give back now,
        expires by itself). Counted as a write."""
        if token != OWN_LEASE:
            await self._guarded(self._writes, lambda: self.backend.drop_lease(key, token), None)

    async def _guarded(
        self,
        window: OutcomeWindow,
        call: Callable[[], Awaitable[T]],
        fallback: T,
        *,
        conclusive: bool = True,
    ) -> T:
        """``call()`` through the breaker, its failure counted in ``window``; its
        success too, unless it is not ``conclusive`` (it proves the store answers, not
        that the call it stands for works)."""
        breaker = self.breaker
        if not breaker.allow():
            return fallback
        try:
            result = await call()
        except CacheUnavailable as exc:
            self._failed(window, exc)
            breaker.failed(str(exc))
            return fallback
        except asyncio.CancelledError:
            breaker.abandoned()
            raise
        breaker.succeeded(conclusive=conclusive)
        if conclusive:
            window.add(self._monotonic(), False)
        return result

    def outcomes(self) -> CacheOutcomes:
        """The breaker's state and the reads, writes and probes that passed and
        failed over the window, with the latest error."""
        now = self._monotonic()
        return CacheOutcomes(
            circuit=self.breaker.state.value,
            last_error=self.last_error,
            reads=self._reads.tally(now),
            writes=self._writes.tally(now),
            probes=self._probes.tally(now),
        )

    def _failed(self, window: OutcomeWindow, exc: CacheUnavailable) -> None:
        self.errors += 1
        self.last_error = str(exc)
        window.add(self._monotonic(), True)
        if self._on_error is not None:
            self._on_error()
