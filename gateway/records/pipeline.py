"""The request line of one record read, after validation:

    cache key -> cache (hit: bytes out) -> upstream -> normalise -> cache store -> reply

:class:`RecordPipeline` knows nothing of aiohttp's web layer; the HTTP edge hands it
a validated :class:`RecordQuery`, the caller's credentials and cache directives, and
turns the :class:`Reply`, or the GatewayError it raises, into a response.

Freshness: an entry is fresh for its route's TTL. Within ``stale_while_revalidate_s``
after that it is served at once while one background refresh runs; within
``stale_if_error_s`` it is served instead of an upstream failure (5xx, timeout,
unreachable). Misses for one key in one process make one upstream call.

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
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.cache.backend import OWN_LEASE
from gateway.cache.breaker import GuardedCache
from gateway.cache.clock import Clock
from gateway.cache.coding import IdentityBodies, Representation, stored_body
from gateway.cache.entry import (
    IDENTITY,
    CacheCorrupt,
    CacheEntry,
    CacheKey,
    Generations,
    Lookup,
    etag_of,
)
from gateway.comparison.shadow import Shadow
from gateway.config.settings import CacheSettings
from gateway.errors import (
    UpstreamCircuitOpen,
    UpstreamError,
    UpstreamRejected,
)
from gateway.normalise.normaliser import Normaliser
from gateway.ops.circuit import CircuitState
from gateway.ops.metrics import Metrics
from gateway.ops.trace import CACHE_LOOKUP, cache_read
from gateway.records.coalesce import Coalescer
from gateway.records.credentials import Credentials
from gateway.records.keys import Keyer
from gateway.records.routes import RecordQuery
from gateway.routing.routes import RouteTable
from gateway.routing.standard import ROUTES
from gateway.upstream.client import UpstreamClient, UpstreamReply, is_outage

log = logging.getLogger("gateway.pipeline")
_CLOSED = CircuitState.CLOSED
CACHE_NAME = "records-gateway"

# the Cache-Status detail of an answer given without calling the upstream because
# its circuit is open
CIRCUIT_OPEN = "upstream-circuit-open"

# the upstream's refusals after which a key's entry is not served again: the token is
# refused (401, 403) or the record is gone (404)
_DROPPED_ON = frozenset({401, 403, 404})

HIT = "HIT"
MISS = "MISS"
STALE = "STALE"
BYPASS = "BYPASS"


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """The tunable part of caching (reloadable without a restart)."""

    ttl_s: dict[str, int]
    stale_while_revalidate_s: int
    stale_if_error_s: int
    negative_ttl_s: int
    honor_client_no_cache: bool

    @classmethod
    def from_settings(cls, settings: CacheSettings, routes: RouteTable = ROUTES) -> CachePolicy:
        """The policy of ``settings``; a route of ``routes`` that the settings hold no
        TTL for has the TTL it declares."""
        return cls(
            ttl_s=routes.ttls(settings.ttl_s.model_dump()),
            stale_while_revalidate_s=settings.stale_while_revalidate_s,
            stale_if_error_s=settings.stale_if_error_s,
            negative_ttl_s=settings.negative_ttl_s,
            honor_client_no_cache=settings.honor_client_no_cache,
        )

    def lifetime_s(self, ttl_s: int) -> int:
        """How long an entry lives in the backend: its TTL plus the larger window."""
        return ttl_s + max(self.stale_while_revalidate_s, self.stale_if_error_s)


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
    """One read of the cache for one request (``RecordPipeline.stored_fresh``): the
    entry when it is a plain fresh hit, the key's text, and the lookup as read (None:
    the cache could not be used)."""

    fresh: CacheEntry | None
    key_text: str
    lookup: Lookup | None


class _Read(NamedTuple):
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
class _Fetched:
    """The outcome of one fill, shared by every request of the process that waited
    for it: this process's upstream call (stored or not), or the entry another
    instance filled (``collapsed``), or a stale entry while another instance fills
    (``stale``). ``plain`` is the identity body when this process made the entry."""

    entry: CacheEntry
    stored: bool
    collapsed: bool = False
    stale: bool = False
    plain: bytes | None = None


class _Flight(NamedTuple):
    """What a fill in this process is for: a key, under the purge generations its
    read saw (None: the cache could not say)."""

    key: str
    generations: Generations | None

    def joins(self, other: object) -> bool:
        """Whether a request of this flight may take ``other``'s result: the same
        key, and no purge between them that both could see (a request whose cache
        read failed, or a fill begun without the cache, knows of none)."""
        if not isinstance(other, _Flight) or other.key != self.key:
            return False
        mine, theirs = self.generations, other.generations
        return mine is None or theirs is None or mine == theirs


# How often a process waiting for another instance's fill looks for its entry: soon
# at first (a fast upstream answers within milliseconds), then at most every 50 ms.
_FIRST_POLL_S = 0.005
_POLL_LIMIT_S = 0.05


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
        self._shadow = shadow
        self._bodies = bodies
        self._upstream = upstream
        self._normaliser = normaliser
        self._cache = cache
        self._keyer = keyer
        self.policy = policy
        self._clock = clock
        self._inflight: Coalescer[_Fetched] = Coalescer()
        # reads in progress (read, stored_fresh), and the future of quiet() while
        # someone waits for them to end
        self._reads = 0
        self._quiet: asyncio.Future[None] | None = None

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
        return len(self._inflight)

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
        await self._inflight.close()

    @property
    def caches(self) -> bool:
        """Whether answers are cached at all (not with ``cache.backend = "none"``)."""
        return self._cache is not None

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        """The entry ``read`` would serve as a plain HIT for a request without cache
        directives, when this process holds it (no I/O, no waiting); None when ``read``
        must decide. Its reply at a moment is :func:`hit_reply` of its
        :meth:`represent`."""
        cache = self._cache
        if cache is None or not self.policy.ttl_s.get(key.route):
            return None
        entry = cache.fresh(key)
        if entry is None or entry.status != 200:
            return None
        return entry

    @property
    def shares_entries(self) -> bool:
        """Whether entries this process does not hold may be in a cache it shares
        (Redis): then :meth:`stored_fresh` is worth asking when :meth:`fresh` has
        nothing. With the memory backend, what this process holds is all there is."""
        cache = self._cache
        return cache is not None and cache.backend.capabilities.shared

    async def stored_fresh(self, key: CacheKey) -> StoredRead:
        """What ``read`` would find for a request without cache directives, read from
        the cache when this process does not hold it, as ``read`` reads it (the
        breaker, the near cache): its entry when it is a plain HIT; otherwise the
        lookup, for ``read`` of the same request to take as its own (``prior``), so
        that a request reads the cache once whichever way it is answered (twice would
        double Redis's load for misses and skew the breaker's share of failures)."""
        cache = self._cache
        if cache is None or not self.policy.ttl_s.get(key.route):
            return StoredRead(None, key.text, None)
        self._reads += 1
        try:
            lookup = await cache.get(key)
        finally:
            self._read_ended()
        entry = None if lookup is None else lookup.entry
        if entry is not None and entry.status == 200 and entry.left(self._clock()) > 0:
            return StoredRead(entry, key.text, lookup)
        return StoredRead(None, key.text, lookup)

    def represent(self, entry: CacheEntry, gzip: bool) -> Representation:
        """What a caller that accepts gzip (``gzip``), or not, is sent of ``entry``: the
        stored bytes, or the identity body (decompressed through the process's memo).
        Raises CacheCorrupt when a stored gzip body does not decompress."""
        return self._bodies.represent(entry, gzip)

    def _represent_fill(self, fetched: _Fetched, gzip: bool) -> Representation:
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
        ttl = self.policy.ttl_s.get(query.route.name, 0)
        if key is None:
            key = self._keyer.key(query, credentials)
        job = _Read(key, query, credentials, request_id, ttl)
        self._reads += 1
        try:
            return await self._read(job, directives, gzip, prior)
        except CacheCorrupt as exc:
            log.warning(
                "a cached entry does not decompress; answered from the upstream",
                extra={"route": query.route.template, "error": str(exc)},
            )
            fetched = await self._fetch(job, await self._current_generations(key))
            detail = "fwd=miss; stored" if fetched.stored else "fwd=miss"
            return _served(
                fetched.entry, self._represent_fill(fetched, gzip), MISS, detail, left=ttl
            )
        finally:
            self._read_ended()

    async def _read(
        self, job: _Read, directives: Directives, gzip: bool, prior: StoredRead | None = None
    ) -> Reply:
        key, query, credentials, request_id, ttl, _ = job
        policy = self.policy
        if self._cache is None or ttl == 0 or directives.no_store:
            detail = "fwd=request" if directives.no_store and self._cache and ttl else "fwd=bypass"
            fetched = await self._fetch(job, None, compress=gzip)
            return _served(fetched.entry, self._represent_fill(fetched, gzip), BYPASS, detail)
        if directives.no_cache and policy.honor_client_no_cache:
            current = await self._cache.get(key)
            if current is not None and _holds_answer(current.entry):
                job = _Read(key, query, credentials, request_id, ttl, current.entry)
            generations = None if current is None else current.generations
            fetched = await self._fetch(job, generations)
            stored = "; stored" if fetched.stored else ""
            representation = self._represent_fill(fetched, gzip)
            return _served(fetched.entry, representation, BYPASS, f"fwd=request{stored}", left=ttl)

        inflight = self._inflight
        ticket = inflight.reading(key.text)
        try:
            if prior is not None and prior.key_text == key.text:
                lookup = prior.lookup
            else:
                with cache_read() as span:
                    lookup = await self._cache.get(key)
                    span.set(
                        CACHE_LOOKUP,
                        "unavailable"
                        if lookup is None
                        else ("absent" if lookup.entry is None else "found"),
                    )
        finally:
            ended = inflight.done_reading(key.text, ticket)
        stale: CacheEntry | None = None
        if lookup is not None and lookup.entry is not None:
            entry = lookup.entry
            now = self._clock()
            age, left = entry.age(now), entry.left(now)
            if left > 0:
                return hit_reply(entry, now, self._bodies.represent(entry, gzip))
            if _holds_answer(entry):
                job = _Read(key, query, credentials, request_id, ttl, entry)
            overdue = -left
            if overdue < policy.stale_while_revalidate_s:
                self._refresh(job, lookup.generations)
                status = hit_status(-int(overdue) or -1)
                breaker = self._upstream.breaker
                if breaker is not None and breaker.state is not _CLOSED:
                    status = f"{status}; detail={CIRCUIT_OPEN}"
                return _served(entry, self._bodies.represent(entry, gzip), STALE, status, age=age)
            if overdue < policy.stale_if_error_s:
                stale = entry

        generations = lookup.generations if lookup is not None else None
        upstream = self._upstream
        if upstream.breaker is not None and upstream.breaker.state is not _CLOSED:
            # the upstream is down: answer now with what is held, or fail now
            if stale is not None:
                if upstream.available and generations is not None:
                    self._refresh(job, generations)  # the circuit's trial, in the background
                return self._circuit_stale(stale, gzip)
            if not upstream.available:
                raise upstream.circuit_open(f"GET {query.route.template}")
        flight = _Flight(key.text, generations)
        if flight not in inflight:
            for other in inflight.flights():
                if isinstance(other, _Flight) and flight.joins(other):
                    flight = other
                    break
        try:
            if ended is not None and flight.joins(ended[0]):
                fetched, joined = ended[1], True  # a fill that ended while this read ran
            elif stale is not None and upstream.breaker is not None:
                fetched, joined = await self._unless_circuit_opens(
                    inflight.run(flight, key.text, lambda: self._fill(job, generations, stale)),
                    f"GET {query.route.template}",
                )
            else:
                fetched, joined = await inflight.run(
                    flight, key.text, lambda: self._fill(job, generations, stale)
                )
        except UpstreamError as exc:
            if stale is not None and isinstance(exc, UpstreamCircuitOpen):
                return self._circuit_stale(stale, gzip)
            if stale is not None and is_outage(exc):
                log.info(
                    "serving stale entry instead of an upstream failure",
                    extra={"route": query.route.template, "error": exc.detail},
                )
                status = f"; fwd-status={exc.upstream_status}" if exc.upstream_status else ""
                return _served(
                    stale,
                    self._bodies.represent(stale, gzip),
                    STALE,
                    f"fwd=stale{status}",
                    age=stale.age(self._clock()),
                )
            raise
        if self._metrics is not None and (joined or fetched.collapsed or fetched.stale):
            kind = "process" if joined else "fleet"
            self._metrics.coalesced.labels(query.route.name, kind).inc()
        representation = self._represent_fill(fetched, gzip)
        if fetched.stale:
            entry = fetched.entry
            age = entry.age(self._clock())
            return _served(entry, representation, STALE, "fwd=stale; collapsed", age=age)
        if generations is None:
            detail = "fwd=miss; detail=cache-unavailable"
        elif fetched.collapsed:
            detail = "fwd=miss; collapsed"
        else:
            detail = "fwd=miss; stored" if fetched.stored else "fwd=miss"
        if fetched.collapsed:
            left = max(0, int(fetched.entry.left(self._clock())))
            age = fetched.entry.age(self._clock())
            return _served(fetched.entry, representation, MISS, detail, age=age, left=left)
        return _served(fetched.entry, representation, MISS, detail, left=ttl)

    async def _unless_circuit_opens(
        self, fill: Coroutine[Any, Any, tuple[_Fetched, bool]], what: str
    ) -> tuple[_Fetched, bool]:
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

    def _circuit_stale(self, stale: CacheEntry, gzip: bool) -> Reply:
        """``stale`` served in place of an upstream whose circuit is open."""
        now = self._clock()
        status = f"{hit_status(int(stale.left(now)) or -1)}; detail={CIRCUIT_OPEN}"
        return _served(
            stale, self._bodies.represent(stale, gzip), STALE, status, age=stale.age(now)
        )

    async def _current_generations(self, key: CacheKey) -> Generations | None:
        assert self._cache is not None
        lookup = await self._cache.get(key)
        return None if lookup is None else lookup.generations

    def _refresh(self, job: _Read, generations: Generations) -> None:
        """One background refresh of ``job``'s entry (none while the upstream's circuit
        is open with no trial due: it could only fail)."""
        if not self._upstream.available:
            return

        async def refresh() -> _Fetched:
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

        self._inflight.start(_Flight(job.key.text, generations), job.key.text, refresh)

    async def _fill(
        self, job: _Read, generations: Generations | None, stale: CacheEntry | None
    ) -> _Fetched:
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
            return await self._fetch(job, generations)
        key = job.key
        timeout_s = self._upstream.timeout_s
        token = await cache.take_lease(key, int(timeout_s * 1000))
        if token is not None:
            try:
                if token != OWN_LEASE:
                    # another instance may have filled it and given the lease back since
                    # this one read the cache
                    lookup = await cache.get(key)
                    filled = self._filled(lookup)
                    if filled is not None:
                        return filled
                    if lookup is not None:
                        generations = lookup.generations  # a purge in between
                return await self._fetch(job, generations)
            finally:
                await cache.drop_lease(key, token)
        if stale is not None:
            return _Fetched(stale, stored=False, stale=True)
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_POLL_S
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_LIMIT_S)
            # the lease first: a holder stores its entry before it gives the lease back
            held = await cache.leased(key)
            lookup = await cache.get(key)
            if lookup is None:
                return await self._fetch(job, None)
            filled = self._filled(lookup)
            if filled is not None:
                return filled
            generations = lookup.generations
            if not held:
                break
        return await self._fetch(job, generations)

    def _filled(self, lookup: Lookup | None) -> _Fetched | None:
        """The entry another instance filled, if ``lookup`` found one still fresh."""
        if lookup is None or lookup.entry is None or lookup.entry.left(self._clock()) <= 0:
            return None
        return _Fetched(lookup.entry, stored=False, collapsed=True)

    async def _fetch(
        self, job: _Read, generations: Generations | None, *, compress: bool = True
    ) -> _Fetched:
        """Upstream, normalise, and store when ``generations`` says the cache is usable.
        The body is compressed for the store, or else only when ``compress`` (a bypass
        whose one caller accepts gzip): a bypass for an identity caller, such as every
        request with ``cache.backend = "none"``, does not pay for a compression."""
        key, query, credentials, request_id, ttl, replaced = job
        upstream = self._upstream

        def ask() -> Awaitable[UpstreamReply]:
            return upstream.fetch(
                query, authorization=credentials.authorization, request_id=request_id
            )

        try:
            fetched = await ask()
        except UpstreamRejected as exc:
            await self._refused(job, exc, generations)
            self._offer(job, exc.upstream_status or 0, None, ask)
            raise
        started = time.perf_counter()
        body = self._normaliser.normalise(query, fetched.body)
        etag = etag_of(body)
        metrics = self._metrics
        if metrics is not None:
            metrics.normalised(query.route.name, time.perf_counter() - started)
            if replaced is not None:
                age = replaced.age(self._clock())
                metrics.refreshed(query.route.name, replaced.etag != etag, age)
        stores = generations is not None and self._cache is not None and ttl > 0
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
        if stores and self._cache is not None:
            stored = await self._cache.set(key, entry, self.policy.lifetime_s(ttl))
        # once stored: a comparison is not begun before what its caller waits for is done
        self._offer(job, fetched.status, fetched.body, ask, published=body)
        return _Fetched(entry, stored, plain=body)

    async def _refused(
        self, job: _Read, exc: UpstreamRejected, generations: Generations | None
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
        job: _Read,
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
    return _served(entry, representation, HIT, hit_status(left_s), age=age_s, left=left_s)


def hit_seconds(entry: CacheEntry, now: float) -> tuple[int, int]:
    """The whole seconds of age and of freshness left of ``entry`` at ``now``."""
    age = entry.age(now)
    return int(age), int(entry.ttl_s - age)


def hit_status(left_s: int) -> str:
    """The Cache-Status detail of a hit with ``left_s`` seconds of freshness left
    (negative once stale)."""
    return f"hit; ttl={left_s}"


def _outcome_taken(task: asyncio.Future[Any]) -> None:
    """Take the outcome of a fill nobody waits for any more (its failure was logged
    where it happened; asyncio would report it again as never retrieved)."""
    if not task.cancelled():
        task.exception()


def _served(
    entry: CacheEntry,
    representation: Representation,
    x_cache: str,
    status: str,
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
        cache_status=f"{CACHE_NAME}; {status}",
        age_s=int(age),
        max_age_s=left,
        coding=coding,
    )
