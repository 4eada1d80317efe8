"""Filling a key's entry: the lease, the coalescing of misses, the upstream call,
normalising, storing, what a refusal removes, and the offer to the shadow traffic.

Misses for one key in one process make one upstream call (a :class:`Flight` in the
process's coalescer); with a cache shared by several instances, the instance that
takes the key's lease makes the fleet's one call, and the others serve their stale
entry or wait for the filled one (:meth:`Filler.fill`).

Refusals: an upstream 401 or 403 to any fetch of a key removes that key's entry, which
is one token's, for every instance; a 404 removes it too, or replaces it with a
negative entry (a single record's, for ``cache.negative_ttl_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.cache.backend import EVERY_CALLER, OWN_LEASE
from gateway.cache.breaker import GuardedCache
from gateway.cache.clock import Clock
from gateway.cache.coding import stored_body
from gateway.cache.entry import (
    IDENTITY,
    CacheEntry,
    CacheKey,
    Generations,
    Lookup,
    etag_of,
)
from gateway.comparison.shadow import Shadow
from gateway.errors import (
    CacheUnavailable,
    UpstreamCircuitOpen,
    UpstreamError,
    UpstreamRejected,
)
from gateway.normalise.normaliser import Normaliser
from gateway.ops.metrics import Metrics
from gateway.records.coalesce import Coalescer
from gateway.records.credentials import Credentials
from gateway.records.keys import caller_of
from gateway.records.policy import CachePolicy
from gateway.records.routes import RecordQuery
from gateway.upstream.client import UpstreamClient, UpstreamReply

log = logging.getLogger("gateway.pipeline")

# the upstream's refusals after which a key's entry is not served again: the token is
# refused (401, 403) or the record is gone (404)
_DROPPED_ON = frozenset({401, 403, 404})

# How often a process waiting for another instance's fill looks for its entry: soon
# at first (a fast upstream answers within milliseconds), then at most every 50 ms.
_FIRST_POLL_S = 0.005
_POLL_LIMIT_S = 0.05


class FillJob(NamedTuple):
    """One read, as the upstream fetch and the store need it; ``replaced``, the cached
    answer its fetch replaces (expired, or asked past with ``no-cache``), whose ETag and
    age are the evidence of how often the route's answers change."""

    key: CacheKey
    query: RecordQuery
    credentials: Credentials
    request_id: str
    ttl: int
    replaced: CacheEntry | None = None


@dataclass(frozen=True, slots=True)
class Filled:
    """The outcome of one fill, shared by every request of the process that waited
    for it: this process's upstream call (stored or not), or the entry another
    instance filled (``collapsed``), or a stale entry while another instance fills
    (``stale``). ``plain`` is the identity body when this process made the entry."""

    entry: CacheEntry
    stored: bool
    collapsed: bool = False
    stale: bool = False
    plain: bytes | None = None


class Flight(NamedTuple):
    """What a fill in this process is for: a key, under the purge generations its
    read saw (None: the cache could not say)."""

    key: str
    generations: Generations | None

    def joins(self, other: object) -> bool:
        """Whether a request of this flight may take ``other``'s result: the same
        key, and no purge between them that both could see (a request whose cache
        read failed, or a fill begun without the cache, knows of none)."""
        if not isinstance(other, Flight) or other.key != self.key:
            return False
        mine, theirs = self.generations, other.generations
        return mine is None or theirs is None or mine == theirs


class Filler:
    """Fills entries from the upstream for one pipeline (its collaborators passed in)."""

    def __init__(
        self,
        *,
        upstream: UpstreamClient,
        normaliser: Normaliser,
        cache: GuardedCache | None,
        policy: CachePolicy,
        clock: Clock,
        metrics: Metrics | None = None,
        shadow: Shadow | None = None,
    ) -> None:
        self._upstream = upstream
        self._normaliser = normaliser
        self._cache = cache
        self.policy = policy
        self._clock = clock
        self._metrics = metrics
        self._shadow = shadow
        self._flights: Coalescer[Filled] = Coalescer()

    @property
    def flights(self) -> Coalescer[Filled]:
        """The fills and background refreshes of this process, by :class:`Flight`."""
        return self._flights

    async def close(self) -> None:
        """Cancel background refreshes and fills still in flight."""
        await self._flights.close()

    def flight(self, key: CacheKey, generations: Generations | None) -> Flight:
        """The flight a read of ``key`` under ``generations`` joins: one in progress
        that it may join, or its own."""
        flight = Flight(key.text, generations)
        flights = self._flights
        if flight not in flights:
            for other in flights.flights():
                if isinstance(other, Flight) and flight.joins(other):
                    return other
        return flight

    async def fill(
        self, job: FillJob, generations: Generations | None, stale: CacheEntry | None
    ) -> tuple[Filled, bool]:
        """The process's one fill of ``job``'s key, and whether this request joined
        another's. With ``stale`` and a breaker, raises UpstreamCircuitOpen as soon
        as the circuit opens rather than wait on the call."""
        flight = self.flight(job.key, generations)
        run = self._flights.run(flight, job.key.text, lambda: self._fill(job, generations, stale))
        if stale is not None and self._upstream.breaker is not None:
            return await self._unless_circuit_opens(run, f"GET {job.query.route.template}")
        return await run

    async def refetch(self, job: FillJob) -> Filled:
        """One upstream call for ``job`` stored over its entry (one that did not
        decode), under the generations current now."""
        assert self._cache is not None
        lookup = await self._cache.get(job.key)
        return await self.fetch(job, None if lookup is None else lookup.generations)

    def refresh(self, job: FillJob, generations: Generations) -> None:
        """One background refresh of ``job``'s entry (the read's decision says when:
        never while the upstream's circuit is open with no trial due)."""

        async def refresh() -> Filled:
            try:
                return await self._fill(job, generations, None)
            except UpstreamCircuitOpen:
                raise  # another call became the trial first: nothing new to say
            except UpstreamError as exc:
                if exc.upstream_status not in _DROPPED_ON:
                    log.info(
                        "background refresh failed; the stale entry stays",
                        extra={"route": job.query.route.template, "error": exc.detail},
                    )
                raise

        self._flights.start(Flight(job.key.text, generations), job.key.text, refresh)

    async def _fill(
        self, job: FillJob, generations: Generations | None, stale: CacheEntry | None
    ) -> Filled:
        """This process's one fill of a missing entry; with a cache shared by several
        instances, one instance's of the whole fleet.

        The instance that takes the key's lease in the cache (for as long as an
        upstream call may last) calls the upstream and stores the entry; the others
        serve ``stale`` when they have it, or look for the filled entry (soon at first,
        then every 50 ms) until it is there. They call the upstream themselves when the
        lease is gone without an entry (the holder's call failed, or a purge came in
        between; each of them then makes one call rather than wait for each other's in
        turn), when the upstream timeout has passed since they began waiting (a holder
        that died), or when the cache fails.
        """
        cache = self._cache
        if cache is None or generations is None:
            return await self.fetch(job, generations)
        key = job.key
        timeout_s = self._upstream.timeout_s
        token = await cache.take_lease(key, int(timeout_s * 1000))
        if token is not None:
            try:
                if token != OWN_LEASE:
                    # another instance may have filled it and given the lease back since
                    # this one read the cache
                    # the store only: another instance's fill is not held here
                    lookup = await cache.get(key, held_probed=True)
                    filled = self._filled(lookup)
                    if filled is not None:
                        return filled
                    if lookup is not None:
                        generations = lookup.generations  # a purge in between
                return await self.fetch(job, generations)
            finally:
                await cache.drop_lease(key, token)
        if stale is not None:
            return Filled(stale, stored=False, stale=True)
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_POLL_S
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_LIMIT_S)
            # the lease first: a holder stores its entry before it gives the lease back
            held = await cache.leased(key)
            lookup = await cache.get(key)
            if lookup is None:
                return await self.fetch(job, None)
            filled = self._filled(lookup)
            if filled is not None:
                return filled
            generations = lookup.generations
            if not held:
                break
        return await self.fetch(job, generations)

    def _filled(self, lookup: Lookup | None) -> Filled | None:
        """The entry another instance filled, if ``lookup`` found one still fresh."""
        if lookup is None or lookup.entry is None or not lookup.entry.is_fresh(self._clock()):
            return None
        return Filled(lookup.entry, stored=False, collapsed=True)

    async def fetch(
        self, job: FillJob, generations: Generations | None, *, compress: bool = True
    ) -> Filled:
        """One upstream call for ``job``, not coalesced: upstream, normalise, and store
        when ``generations`` says the cache is usable.
        The body is compressed for the store, or else only when ``compress`` (a bypass
        whose one caller accepts gzip): a bypass for an identity caller, such as every
        request with ``cache.backend = "none"``, does not pay for a compression.

        With ``cache.record_consistency`` on, an answer the cache refuses as possibly
        older than one already served (a fill that began later noted another version
        of one of its records, or one was purged after this call began) is asked for
        once more, and that second answer is the one returned."""
        upstream = self._upstream

        def ask() -> Awaitable[UpstreamReply]:
            return upstream.fetch(
                job.query, authorization=job.credentials.authorization, request_id=job.request_id
            )

        try:
            filled, older, fetched = await self._fetch_once(job, generations, compress, ask)
            if older is not None:
                if self._metrics is not None:
                    self._metrics.consistency_refetched(job.key.route)
                filled, older, fetched = await self._fetch_once(job, generations, compress, ask)
                if older is not None:
                    await self._purge_unordered(job, older)
        except UpstreamRejected as exc:
            self._offer(job, exc.upstream_status or 0, None, ask)
            raise
        # once stored: a comparison is not begun before what its caller waits for is done
        self._offer(job, fetched.status, fetched.body, ask, published=filled.plain)
        return filled

    async def _fetch_once(
        self,
        job: FillJob,
        generations: Generations | None,
        compress: bool,
        ask: Callable[[], Awaitable[UpstreamReply]],
    ) -> tuple[Filled, Sequence[str] | None, UpstreamReply]:
        """One upstream call, normalised and stored: what :meth:`fetch` returns, the
        records it holds when the cache refused it as possibly older than an answer
        served (consistency; otherwise None), and the upstream's reply."""
        key, query, _, _, ttl, replaced = job
        cache = self._cache
        policy = self.policy
        # what a purge by record after this point must not miss (read before asking)
        since = None if cache is None or generations is None else await cache.purge_sequence()
        try:
            fetched = await ask()
        except UpstreamRejected as exc:
            await self._refused(job, exc, generations)
            raise
        started = time.perf_counter()
        stores = generations is not None and cache is not None and ttl > 0
        consistent = stores and policy.record_consistency != "off"
        held: dict[str, str] | None = None
        if stores:
            body, held = self._normaliser.normalise_held(query, fetched.body, versions=consistent)
        else:
            body = self._normaliser.normalise(query, fetched.body)
        etag = etag_of(body)
        metrics = self._metrics
        if metrics is not None:
            metrics.normalised(query.route.name, time.perf_counter() - started, key.text)
            if replaced is not None:
                age = replaced.age(self._clock())
                metrics.refreshed(query.route.name, replaced.etag != etag, age)
        coded, coding = stored_body(body) if stores or compress else (body, IDENTITY)
        entry = CacheEntry(
            body=coded,
            etag=etag,
            stored_at=self._clock(),
            ttl_s=ttl,
            generations=generations or Generations(),
            coding=coding,
        )
        stored = False
        older: Sequence[str] | None = None
        if consistent and cache is not None and held is not None:
            scope = EVERY_CALLER if policy.record_consistency == "all" else caller_of(key)
            lifetime_s = policy.lifetime_s(ttl)
            noted = await cache.set_consistent(key, entry, lifetime_s, held, since, scope)
            if noted is not None:
                stored = noted.stored
                older = None if stored else list(held)
                if metrics is not None and noted.invalidated:
                    metrics.consistency_invalidated(
                        (other.route for other in noted.invalidated), noted.confirmed
                    )
        elif stores and cache is not None:
            stored = await cache.set(key, entry, policy.lifetime_s(ttl), held=held, since=since)
        return Filled(entry, stored, plain=body), older, fetched

    async def _purge_unordered(self, job: FillJob, records: Sequence[str]) -> None:
        """An answer asked for twice and refused twice (each time a fill of another
        version overlapped it): which version is the newer cannot be known, and this
        one goes to its caller; every entry holding its records is purged (for every
        caller), so that the next reads fetch them anew, newer than both."""
        cache = self._cache
        if cache is None:
            return
        with contextlib.suppress(CacheUnavailable):
            await cache.backend.purge_records(records, soft=False)
            log.info(
                "consistency: an answer refused twice; its records purged",
                extra={"route": job.query.route.template, "records": len(records)},
            )

    async def _refused(
        self, job: FillJob, exc: UpstreamRejected, generations: Generations | None
    ) -> None:
        """What the cache keeps of ``job``'s key once the upstream refused its caller:
        after a 401 or 403, nothing (the token's entry is removed for every instance,
        so that no stale answer outlives the refusal); after a 404, nothing, or the
        negative entry (``cache.negative_ttl_s``) of a single record. A 429 says
        nothing about the entry, which stays."""
        cache = self._cache
        status = exc.upstream_status
        if cache is None or job.ttl == 0 or status not in _DROPPED_ON:
            return
        negative_ttl_s = self.policy.negative_ttl_s
        if (
            status == 404
            and not job.query.route.is_list
            and negative_ttl_s > 0
            and generations is not None
        ):
            negative = CacheEntry(
                body=exc.detail.encode(),
                etag="",
                stored_at=self._clock(),
                ttl_s=negative_ttl_s,
                status=404,
                generations=generations,
            )
            if await cache.set(job.key, negative, negative_ttl_s):
                return
        if await cache.remove(job.key):
            log.info(
                "the upstream refused a cached answer's caller; the entry is removed",
                extra={"route": job.query.route.template, "upstream_status": status},
            )

    def _offer(
        self,
        job: FillJob,
        status: int,
        body: bytes | None,
        again: Callable[[], Awaitable[UpstreamReply]],
        *,
        published: bytes | None = None,
    ) -> None:
        """Offer an upstream answer (and ``published``, the bytes this fetch made of it)
        to the shadow traffic, which samples, and compares once this request's caller
        has its answer."""
        shadow = self._shadow
        if shadow is not None and shadow.enabled:
            shadow.offer(
                job.query,
                authorization=job.credentials.authorization,
                request_id=job.request_id,
                status=status,
                body=body,
                again=again,
                published=published,
            )

    async def _unless_circuit_opens(
        self, fill: Coroutine[Any, Any, tuple[Filled, bool]], what: str
    ) -> tuple[Filled, bool]:
        """The outcome of ``fill``, for a request holding a stale answer: raises
        UpstreamCircuitOpen as soon as the upstream's circuit opens, instead of waiting
        for a call the circuit says will fail (the fill goes on for whoever shares it)."""
        breaker = self._upstream.breaker
        assert breaker is not None
        task = asyncio.ensure_future(fill)
        opening = breaker.opening()
        try:
            try:
                await asyncio.wait((task, opening), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()
                raise
            if task.done():
                return task.result()
            task.add_done_callback(_outcome_taken)
        finally:
            # a failed task holds its exception, whose traceback holds this frame: no
            # cycle may keep them (and the upstream's body) until the collector runs
            del task
        raise self._upstream.circuit_open(what)


def _outcome_taken(task: asyncio.Future[Any]) -> None:
    """Take the outcome of a fill nobody waits for any more (its failure was logged
    where it happened; asyncio would report it again as never retrieved)."""
    if not task.cancelled():
        task.exception()
