"""The request line of one record read, after validation:

    cache key -> cache (hit: bytes out) -> upstream -> normalise -> cache store -> reply

:class:`RecordPipeline` knows nothing of aiohttp's web layer; the HTTP edge hands it
a validated :class:`RecordQuery`, the caller's credentials and cache directives, and
turns the :class:`Reply`, or the GatewayError it raises, into a response.

Freshness: an entry is fresh for its route's TTL. Within ``stale_while_revalidate_s``
after that it is served at once while one background refresh runs; within
``stale_if_error_s`` it is served instead of an upstream failure (5xx, timeout,
unreachable). Misses for one key in one process make one upstream call.

A read gathers what is known (``gateway.records.decision.Facts``), asks
:func:`~gateway.records.decision.decide` for its one outcome, and acts on it: serve the
entry, fill it (``gateway.records.fill.Filler``), or fail; its reply is labelled by
``gateway.records.cache_status``.

Refusals: an upstream 401 or 403 to any fetch of a key (a miss, a background refresh,
a fetch for ``no-cache`` or ``no-store``) removes that key's entry, which is one
token's, for every instance; a 404 removes it too, or replaces it with a negative
entry. The next request of that token for that key is the upstream's to answer: no
stale answer outlives a refusal. Stale answers are for outages only.

While the upstream's circuit is open (``UpstreamClient.available`` is false), nothing
waits for it: an entry within ``stale_if_error_s`` is served at once, and a request
without one fails at once (UpstreamCircuitOpen, a 503). When the circuit's trial is
due, a request with such an entry is still served it at once, and the trial runs as
its background refresh: no caller waits on an upstream that may still be down.

Representations: an entry's body is compressed once, when the fill makes it
(``gateway.cache.coding``). A reply is made for the representation the caller gets:
the stored gzip bytes for a caller that accepts gzip, the identity body otherwise
(from this fill, or the process's memo of decompressed bodies). Every way a hit is
answered makes its reply with :meth:`RecordPipeline.represent` and :func:`hit_reply`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from gateway.cache.breaker import GuardedCache
from gateway.cache.clock import Clock
from gateway.cache.coding import IdentityBodies, Representation
from gateway.cache.entry import IDENTITY, CacheCorrupt, CacheEntry, CacheKey, Lookup
from gateway.comparison.shadow import Shadow
from gateway.errors import UpstreamCircuitOpen, UpstreamError, UpstreamRejected
from gateway.normalise.normaliser import Normaliser
from gateway.ops.circuit import CircuitState
from gateway.ops.metrics import Metrics
from gateway.ops.trace import CACHE_LOOKUP, cache_read
from gateway.records.cache_status import HIT, hit_label, label
from gateway.records.cache_status import hit_status as hit_status
from gateway.records.credentials import Credentials
from gateway.records.decision import Circuit, EntryState, Facts, Outcome, decide, entry_state
from gateway.records.fill import Filled, Filler, FillJob
from gateway.records.keys import Keyer
from gateway.records.policy import CachePolicy as CachePolicy
from gateway.records.routes import RecordQuery
from gateway.upstream.client import UpstreamClient, is_outage

log = logging.getLogger("gateway.pipeline")
_CLOSED = CircuitState.CLOSED
_LOOKUP = Outcome.LOOKUP
_HIT = Outcome.HIT
_FRESH = EntryState.FRESH
_SERVES_STALE = frozenset(
    {Outcome.STALE_REFRESH, Outcome.STALE_CIRCUIT_TRIAL, Outcome.STALE_CIRCUIT_OPEN}
)
_REFRESHES = frozenset({Outcome.STALE_REFRESH, Outcome.STALE_CIRCUIT_TRIAL})
# the facts of a read without directives of a cached route, before and after a read
# that found its entry fresh
_PLAIN_UNREAD = Facts(caches=True, no_store=False, no_cache=False)
_PLAIN_FRESH = _PLAIN_UNREAD._replace(state=EntryState.FRESH)


@dataclass(frozen=True, slots=True)
class Directives:
    """The caller's ``Cache-Control`` request directives that the gateway honours."""

    no_cache: bool = False
    no_store: bool = False


NO_DIRECTIVES = Directives()


class Reply(NamedTuple):
    """What the gateway serves for one read, with what the cache did (a named tuple:
    one is made on every request): the bytes of one representation, its ETag and its
    content coding (``gzip``, or ``identity`` for none)."""

    body: bytes
    etag: str
    x_cache: str
    cache_status: str
    age_s: int = 0
    max_age_s: int = 0
    coding: str = IDENTITY


class StoredRead(NamedTuple):
    """One read of the cache for one request (``RecordPipeline.stored_fresh``, or
    ``RecordPipeline.held``): the entry when it is a plain fresh hit, the key's text,
    the lookup as read (None: the cache could not be used), and for a read of this
    process's own store, how many fills had ended when it was made (a fill that ends
    after it makes it stale: ``read`` then reads again)."""

    fresh: CacheEntry | None
    key_text: str
    lookup: Lookup | None
    fills_ended: int | None = None


class RecordPipeline:
    """Serves validated record reads from the cache or the upstream, normalised."""

    def __init__(
        self,
        *,
        upstream: UpstreamClient,
        normaliser: Normaliser,
        cache: GuardedCache | None,
        keyer: Keyer,
        policy: CachePolicy,
        clock: Clock,
        bodies: IdentityBodies,
        metrics: Metrics | None = None,
        shadow: Shadow | None = None,
    ) -> None:
        """``shadow``: where the answers of upstream calls are offered to be compared
        with a candidate's (gateway.comparison.shadow)."""
        self._metrics = metrics
        self._bodies = bodies
        self._upstream = upstream
        self._cache = cache
        self._keyer = keyer
        self._policy = policy
        self._clock = clock
        self._filler = Filler(
            upstream=upstream,
            normaliser=normaliser,
            cache=cache,
            policy=policy,
            clock=clock,
            metrics=metrics,
            shadow=shadow,
        )
        # reads in progress (read, stored_fresh), and the future of quiet() while
        # someone waits for them to end
        self._reads = 0
        self._quiet: asyncio.Future[None] | None = None

    @property
    def policy(self) -> CachePolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: CachePolicy) -> None:
        self._policy = self._filler.policy = policy

    @property
    def keyer(self) -> Keyer:
        return self._keyer

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def upstream(self) -> UpstreamClient:
        return self._upstream

    @property
    def identity_bodies(self) -> IdentityBodies:
        """The process's memo of decompressed bodies."""
        return self._bodies

    @property
    def in_flight(self) -> int:
        """Upstream fetches and background refreshes running now."""
        return len(self._filler.flights)

    @property
    def reads_in_progress(self) -> int:
        """Calls of :meth:`read` and :meth:`stored_fresh` that have not returned yet."""
        return self._reads

    async def quiet(self) -> None:
        """Return once no read of this pipeline is in progress (at once when none is).
        A read counts from its first step: at once for a call awaited where it is
        made, as the handlers make theirs; from the task's first step for one made a
        task (the fast path's ``stored_fresh``), which comes before the first step of
        any task created after it."""
        while self._reads:
            if self._quiet is None:
                self._quiet = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._quiet)

    def _read_ended(self) -> None:
        self._reads -= 1
        quiet = self._quiet
        if not self._reads and quiet is not None:
            self._quiet = None
            if not quiet.done():
                quiet.set_result(None)

    async def close(self) -> None:
        """Cancel background refreshes and fetches still in flight."""
        await self._filler.close()

    @property
    def caches(self) -> bool:
        """Whether answers are cached at all (not with ``cache.backend = "none"``)."""
        return self._cache is not None

    def held(self, key: CacheKey) -> CacheEntry | StoredRead | None:
        """What this process holds for ``key``, read with no I/O and no waiting: the
        entry ``read`` would serve as a plain HIT for a request without cache
        directives (its reply at a moment is :func:`hit_reply` of its
        :meth:`represent`). Otherwise, when the backend holds every entry in this
        process (not shared), that one read as a :class:`StoredRead` (stale and
        negative entries too), for ``read`` of the same request to take as its own
        (``prior``), counted as ``read``'s own read would be; otherwise None: the
        shared store is :meth:`stored_fresh`'s to read, or ``read`` decides."""
        cache = self._cache
        if cache is None or not self.policy.ttl_s.get(key.route):
            return None
        if cache.shared:
            entry = cache.fresh(key)
            return entry if entry is not None and entry.status == 200 else None
        found = cache.read_held(key)
        if found is None:
            return None  # the circuit is not closed, or reads are get's: read decides
        if isinstance(found, CacheEntry):  # fresh
            if found.status == 200:
                return found
            # held, so no purge came after it: its generations are the current ones
            found = Lookup(found, found.generations)
        cache.read_taken()
        return StoredRead(None, key.text, found, self._filler.flights.ended)

    @property
    def shares_entries(self) -> bool:
        """Whether entries this process does not hold may be in a cache it shares
        (Redis): then :meth:`stored_fresh` is worth asking when :meth:`held` has
        nothing. With the memory backend, what this process holds is all there is."""
        cache = self._cache
        return cache is not None and cache.backend.capabilities.shared

    async def stored_fresh(self, key: CacheKey) -> StoredRead:
        """What ``read`` would find for a request without cache directives, read from
        the shared store once :meth:`held` found nothing held in this process (it is
        not asked again), through the breaker: its entry when it is a plain HIT; otherwise the
        lookup, for ``read`` of the same request to take as its own (``prior``), so
        that a request reads the cache once whichever way it is answered (twice would
        double Redis's load for misses and skew the breaker's share of failures)."""
        cache = self._cache
        if cache is None or not self.policy.ttl_s.get(key.route):
            return StoredRead(None, key.text, None)
        self._reads += 1
        try:
            # held was asked first and had nothing: not asked again
            lookup = await cache.get(key, held_probed=True)
        finally:
            self._read_ended()
        entry = None if lookup is None else lookup.entry
        if entry is not None and entry.status == 200 and entry.is_fresh(self._clock()):
            return StoredRead(entry, key.text, lookup)
        return StoredRead(None, key.text, lookup)

    def represent(self, entry: CacheEntry, gzip: bool) -> Representation:
        """What a caller that accepts gzip (``gzip``), or not, is sent of ``entry``: the
        stored bytes, or the identity body (decompressed through the process's memo).
        Raises CacheCorrupt when a stored gzip body does not decompress."""
        return self._bodies.represent(entry, gzip)

    def _represent_fill(self, fetched: Filled, gzip: bool) -> Representation:
        """The representation of a fill's entry: its identity body as this process
        made it, when the caller gets identity and there is one."""
        plain = fetched.plain
        entry = fetched.entry
        if plain is not None and (not gzip or entry.coding == IDENTITY):
            return Representation(plain, entry.etag, IDENTITY)
        return self._bodies.represent(entry, gzip)

    async def read(
        self,
        query: RecordQuery,
        credentials: Credentials,
        request_id: str,
        directives: Directives = NO_DIRECTIVES,
        key: CacheKey | None = None,
        gzip: bool = False,
        prior: StoredRead | None = None,
    ) -> Reply:
        """Serve ``query`` for ``credentials`` in the representation a caller that
        accepts gzip (``gzip``), or not, gets; ``key``, when the caller has it, is
        ``keyer.key(query, credentials)``; ``prior``, this request's read of the
        cache already made (:meth:`stored_fresh`), is taken instead of reading again.

        A stored gzip body that does not decompress is a cache fault, never the
        caller's: the answer is fetched again and stored over it."""
        ttl = self._policy.ttl_s.get(query.route.name, 0)
        if key is None:
            key = self._keyer.key(query, credentials)
        job = FillJob(key, query, credentials, request_id, ttl)
        self._reads += 1
        try:
            return await self._read(job, directives, gzip, prior)
        except CacheCorrupt as exc:
            log.warning(
                "a cached entry does not decompress; answered from the upstream",
                extra={"route": query.route.template, "error": str(exc)},
            )
            fetched = await self._filler.refetch(job)
            x_cache, status = label(Outcome.FILL, stored=fetched.stored)
            representation = self._represent_fill(fetched, gzip)
            return _served(fetched.entry, representation, x_cache, status, left=ttl)
        finally:
            self._read_ended()

    async def _read(
        self, job: FillJob, directives: Directives, gzip: bool, prior: StoredRead | None
    ) -> Reply:
        """Gather the facts, decide, act."""
        caches = self._cache is not None and job.ttl > 0
        no_cache = directives.no_cache and self._policy.honor_client_no_cache
        if caches and not no_cache and not directives.no_store:
            facts = _PLAIN_UNREAD  # most reads: made once, not per read
        else:
            facts = Facts(caches, directives.no_store, no_cache)
        outcome = decide(facts)
        if outcome is not _LOOKUP:
            return await self._past_cache(job, outcome, gzip)
        lookup, ended = await self._look_up(job.key, prior)
        now = self._clock()
        if lookup is None:
            state = EntryState.UNAVAILABLE
        else:
            policy = self._policy
            state = entry_state(
                lookup.entry, now, policy.stale_while_revalidate_s, policy.stale_if_error_s
            )
        if state is _FRESH:
            # a fresh entry is a hit whatever else is known (decide's rule 4)
            facts = _PLAIN_FRESH
        else:
            joins = ended is not None and self._filler.flight(
                job.key, None if lookup is None else lookup.generations
            ).joins(ended[0])
            facts = Facts(True, False, False, state, self._circuit(), joins)
        outcome = decide(facts)
        entry = None if lookup is None else lookup.entry
        if outcome is _HIT and entry is not None:
            return hit_reply(entry, now, self._bodies.represent(entry, gzip))
        if entry is not None and _holds_answer(entry):
            job = job._replace(replaced=entry)
        if outcome in _SERVES_STALE and lookup is not None and entry is not None:
            if outcome in _REFRESHES:
                self._filler.refresh(job, lookup.generations)
            x_cache, status = label(outcome, left=entry.left(now))
            return _served(
                entry, self._bodies.represent(entry, gzip), x_cache, status, age=entry.age(now)
            )
        if outcome is Outcome.FAIL_CIRCUIT_OPEN:
            raise self._upstream.circuit_open(f"GET {job.query.route.template}")
        return await self._fill(job, outcome, lookup, ended, gzip)

    def _circuit(self) -> Circuit:
        """The upstream's circuit as this read sees it."""
        upstream = self._upstream
        breaker = upstream.breaker
        if breaker is None or breaker.state is _CLOSED:
            return Circuit.CLOSED
        return Circuit.TRIAL_DUE if upstream.available else Circuit.HELD

    async def _look_up(
        self, key: CacheKey, prior: StoredRead | None
    ) -> tuple[Lookup | None, tuple[Hashable, Filled] | None]:
        """This request's read of the cache (``prior``'s when it made one, unless it
        read this process's own store and a fill has ended since), and a fill of the
        key that ended while it read."""
        assert self._cache is not None
        flights = self._filler.flights
        ticket = flights.reading(key.text)
        try:
            with cache_read() as span:
                if (
                    prior is not None
                    and prior.key_text == key.text
                    and prior.fills_ended in (None, flights.ended)
                ):
                    lookup = prior.lookup  # made before this request's trace began
                else:
                    lookup = await self._cache.get(key)
                span.set(
                    CACHE_LOOKUP,
                    "unavailable"
                    if lookup is None
                    else ("absent" if lookup.entry is None else "found"),
                )
        finally:
            ended = flights.done_reading(key.text, ticket)
        return lookup, ended

    async def _past_cache(self, job: FillJob, outcome: Outcome, gzip: bool) -> Reply:
        """A read decided before the cache is read: a bypass (nothing stored; the
        body compressed only for a caller that accepts gzip), or the caller's
        ``no-cache`` (fetched and stored over the entry, which it replaces)."""
        if outcome is not Outcome.REVALIDATE:
            fetched = await self._filler.fetch(job, None, compress=gzip)
            x_cache, status = label(outcome)
            return _served(fetched.entry, self._represent_fill(fetched, gzip), x_cache, status)
        assert self._cache is not None
        current = await self._cache.get(job.key)
        if current is not None and _holds_answer(current.entry):
            job = job._replace(replaced=current.entry)
        generations = None if current is None else current.generations
        fetched = await self._filler.fetch(job, generations)
        x_cache, status = label(outcome, stored=fetched.stored)
        representation = self._represent_fill(fetched, gzip)
        return _served(fetched.entry, representation, x_cache, status, left=job.ttl)

    async def _fill(
        self,
        job: FillJob,
        outcome: Outcome,
        lookup: Lookup | None,
        ended: tuple[Hashable, Filled] | None,
        gzip: bool,
    ) -> Reply:
        """A read decided as a fill (FILL, FILL_OR_STALE, TAKE_ENDED_FILL)."""
        generations = None if lookup is None else lookup.generations
        stale = lookup.entry if lookup is not None and outcome is Outcome.FILL_OR_STALE else None
        if outcome is Outcome.TAKE_ENDED_FILL and ended is not None:
            fetched, joined = ended[1], True
        else:
            try:
                fetched, joined = await self._filler.fill(job, generations, stale)
            except UpstreamError as exc:
                # raised here, not by a callee holding it (its frame would keep the
                # error and the upstream's body in a cycle until the collector runs)
                instead = None if stale is None else self._stale_instead(job, stale, exc, gzip)
                if instead is None:
                    raise
                return instead
        if self._metrics is not None and (joined or fetched.collapsed or fetched.stale):
            kind = "process" if joined else "fleet"
            self._metrics.coalesced.labels(job.query.route.name, kind).inc()
        representation = self._represent_fill(fetched, gzip)
        x_cache, status = label(
            outcome,
            stored=fetched.stored,
            collapsed=fetched.collapsed,
            stale=fetched.stale,
            cache_available=generations is not None,
        )
        entry = fetched.entry
        if fetched.stale or fetched.collapsed:
            now = self._clock()
            left = 0 if fetched.stale else max(0, int(entry.left(now)))
            return _served(entry, representation, x_cache, status, age=entry.age(now), left=left)
        return _served(entry, representation, x_cache, status, left=job.ttl)

    def _stale_instead(
        self, job: FillJob, stale: CacheEntry, exc: UpstreamError, gzip: bool
    ) -> Reply | None:
        """``stale`` served instead of a fill that failed: at once when the circuit
        opened, or for an outage (5xx, timeout, unreachable); None for a refusal, which
        the upstream's answer stands for."""
        now = self._clock()
        if isinstance(exc, UpstreamCircuitOpen):
            x_cache, status = label(Outcome.STALE_CIRCUIT_OPEN, left=stale.left(now))
        elif is_outage(exc):
            log.info(
                "serving stale entry instead of an upstream failure",
                extra={"route": job.query.route.template, "error": exc.detail},
            )
            x_cache, status = label(
                Outcome.FILL_OR_STALE, stale=True, failed_status=exc.upstream_status or 0
            )
        else:
            return None
        representation = self._bodies.represent(stale, gzip)
        return _served(stale, representation, x_cache, status, age=stale.age(now))


def _holds_answer(entry: CacheEntry | None) -> bool:
    """Whether ``entry`` holds an answer (not a cached 404) whose replacement says
    whether the route's answers changed."""
    return entry is not None and entry.status == 200


def hit_reply(entry: CacheEntry, now: float, representation: Representation) -> Reply:
    """The reply of a fresh hit on ``entry`` at ``now`` in ``representation``
    (:meth:`RecordPipeline.represent`): the one way a cache entry becomes a hit's
    answer, whichever path (aiohttp's or the fast path) sends it. It depends on ``now``
    only through :func:`hit_seconds`."""
    age_s, left_s = hit_seconds(entry, now)
    return _served(entry, representation, HIT, hit_label(left_s), age=age_s, left=left_s)


def hit_seconds(entry: CacheEntry, now: float) -> tuple[int, int]:
    """The whole seconds of age and of freshness left of ``entry`` at ``now``."""
    age = entry.age(now)
    return int(age), int(entry.ttl_s - age)


def _served(
    entry: CacheEntry,
    representation: Representation,
    x_cache: str,
    cache_status: str,
    *,
    age: float = 0.0,
    left: int = 0,
) -> Reply:
    """The reply of an entry in ``representation``, ``age`` seconds old with ``left``
    seconds of freshness (a negative entry raises its 404 again)."""
    if entry.status == 404:
        raise UpstreamRejected(entry.body.decode(), upstream_status=404)
    body, etag, coding = representation
    return Reply(
        body=body,
        etag=etag,
        x_cache=x_cache,
        cache_status=cache_status,
        age_s=int(age),
        max_age_s=left,
        coding=coding,
    )
