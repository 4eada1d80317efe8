"""The one port between the serving layers and the records: a GET of a record route
looked up in the cache, answered :class:`Hit` or :class:`Miss`.

Both ways in use it alike. The fast path (``gateway.fastpath``) resolves a head it
read to a :class:`Target` (:meth:`RecordLookup.resolve`: the route, the query
validated or remembered, the token's fingerprint, the cache key), asks what this
process holds for it (:meth:`RecordLookup.held`, no I/O: a hit, or with the memory
backend the miss carrying that one read) and, when that says nothing, reads the shared
cache once (:meth:`RecordLookup.look_up`). A hit is answered there. A miss is handed
to the route's handler (``gateway.http.records``), which serves it with what the miss
carries (the validated query, the key, the cache read made) instead of doing that work
again.

How a miss reaches the handler: not on the request object. The fast path hands the
request's head to aiohttp and keeps the miss on its own connection; when aiohttp
calls the server's handler for that request (in the request's own task), the fast
path runs it inside :func:`handing` of the miss, a context variable of this module
that lives as long as that call, in that task only. The handler takes it with
:meth:`RecordLookup.handed`, and only when it is a miss of the same route, pipeline
and limits. Any other request (another task, another route) sees none.

Rendering and content negotiation are the HTTP edge's: they are given to the port
(``headers_of``, ``gzip_preferred``) when the edge makes it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import NamedTuple, Protocol
from urllib.parse import unquote

from yarl import URL

from gateway.cache.coding import Representation, etag_matches
from gateway.cache.entry import CacheCorrupt, CacheEntry, CacheKey
from gateway.config.live import LiveConfig
from gateway.errors import RequestError
from gateway.records.credentials import is_bearer
from gateway.records.keys import Keyer
from gateway.records.pipeline import RecordPipeline, Reply, StoredRead, hit_reply, hit_seconds
from gateway.records.routes import QueryMemo, RecordQuery, check_segment
from gateway.routing.routes import Route, RouteTable

__all__ = [
    "FAST_PAIRS_MAX",
    "CacheEntry",
    "FingerprintMemo",
    "Hit",
    "Keyer",
    "Miss",
    "RecordLookup",
    "Representation",
    "Target",
    "etag_matches",
    "handing",
    "hit_seconds",
    "query_pairs",
]

# resolve validates a query of fewer pairs than this (a route takes 10 at most); a
# longer one, valid or not, is the handler's alone, so that it is read once
FAST_PAIRS_MAX = 32
# what resolve remembers of the targets it resolved, at most, in bytes: each charged
# its request's path, query, Authorization and Accept-Encoding plus TARGET_COST_BYTES
TARGETS_MAX_BYTES = 8 * 1024 * 1024
TARGET_COST_BYTES = 400
# a request whose four parts are longer than this together is resolved each time
TARGET_PARTS_MAX = 4096

# a path resolve takes: unreserved characters and escapes other than of a dot, with no
# dot segment and no empty one (the fast path reads no other; aiohttp's router may
# decode or join what this leaves out, which the route's handler checks itself)
_PLAIN_PATH = re.compile(
    r"(?:/(?:[A-Za-z0-9_~-]|%(?!2[Ee])[0-9A-Fa-f]{2})(?:[A-Za-z0-9_~.-]|%(?!2[Ee])[0-9A-Fa-f]{2})*)+"
)

# what a target is resolved from: path, query, Authorization, Accept-Encoding
RequestParts = tuple[str, str, str, str | None]


def query_pairs(query_string: str) -> list[tuple[str, str]]:
    """The decoded pairs of a raw query string, as aiohttp's ``request.query`` gives
    them for a request whose target carries it (both are yarl's reading of it)."""
    return list(URL.build(query_string=query_string, encoded=True).query.items())


class FingerprintMemo(Protocol):
    """Where a caller of :meth:`RecordLookup.resolve` keeps the fingerprints of the
    tokens it saw (the fast path: per connection)."""

    def known(self, keyer: Keyer, authorization: str) -> str | None: ...

    def remember(self, keyer: Keyer, authorization: str) -> str: ...


class Target(NamedTuple):
    """A GET of a record route resolved to what its lookup reads: valid while the
    pipeline and ``limits.max_limit`` are the ones it was resolved under."""

    query: RecordQuery
    key: CacheKey
    fingerprint: str
    pipeline: RecordPipeline
    max_limit: int
    gzip: bool  # the caller is served gzip (its Accept-Encoding)


class Hit(NamedTuple):
    """A fresh entry for ``target``, in the representation its caller gets."""

    target: Target
    entry: CacheEntry
    representation: Representation


class Miss(NamedTuple):
    """No fresh entry for ``target``: ``stored`` is the cache read made for it (None:
    none was made), which serving it takes as its own."""

    target: Target
    stored: StoredRead | None


_HANDED: ContextVar[Miss | None] = ContextVar("handed_miss", default=None)


@contextlib.contextmanager
def handing(miss: Miss | None) -> Iterator[None]:
    """Within this block (in this task only), :meth:`RecordLookup.handed` gives
    ``miss``."""
    token = _HANDED.set(miss)
    try:
        yield
    finally:
        _HANDED.reset(token)


class RecordLookup:
    """The lookup of the record routes of one application (see the module's
    docstring). ``pipeline`` is the current upstream binding's, set once the
    application starts; ``headers_of`` gives a reply's HTTP header fields and
    ``gzip_preferred`` reads an ``Accept-Encoding`` (both the edge's)."""

    def __init__(
        self,
        live: LiveConfig,
        headers_of: Callable[[Reply], Mapping[str, str]],
        gzip_preferred: Callable[[str | None], bool],
        routes: RouteTable,
    ) -> None:
        self.live = live
        self.routes = routes
        self.pipeline: RecordPipeline | None = None
        self._headers_of = headers_of
        self.gzip_preferred = gzip_preferred
        self._memos = {route.name: QueryMemo() for route in routes}
        self._targets: dict[RequestParts, Target] = {}
        self._targets_bytes = 0

    @property
    def targets_bytes(self) -> int:
        """The bytes charged for the targets :meth:`resolve` remembers."""
        return self._targets_bytes

    def memo(self, route: Route) -> QueryMemo:
        """The memo of ``route``'s validated queries (shared by both ways in)."""
        return self._memos[route.name]

    def caching_pipeline(self) -> RecordPipeline | None:
        """The application's pipeline when it caches answers at all; None before the
        application starts and with ``cache.backend = "none"`` (no request is a hit)."""
        pipeline = self.pipeline
        return pipeline if pipeline is not None and pipeline.caches else None

    def query(self, path: str, query_string: str, max_limit: int) -> RecordQuery | None:
        """The validated query of a GET of ``path`` and raw ``query_string``: remembered,
        or validated now as the route's handler would (the same memo, the same pairs as
        aiohttp's ``request.query``); None when ``path`` is no record route or the
        query is invalid (the handler then answers its problem).

        ``path`` is as sent, with no dot segment, no empty segment and no escaped dot: a
        record route's path exactly, or an id route's with the id as its last segment,
        whose escapes are decoded as aiohttp's router decodes them."""
        matched = self.routes.match(path)
        if matched is None:
            return None
        route, path_value = matched
        memo = self._memos[route.name]
        known = memo.known(route, path_value, query_string, max_limit)
        if known is not None:
            return known
        if query_string.count("&") >= FAST_PAIRS_MAX:
            return None  # far more pairs than any route takes: the handler reads it once
        try:
            if path_value is not None and "%" in path_value:
                check_segment(route.path_param or "", path_value)
                path_value = unquote(path_value, errors="strict")
            return memo.parse(
                route,
                path_value,
                query_string,
                lambda: query_pairs(query_string),
                max_limit=max_limit,
            )
        except RequestError:
            return None

    def resolve(
        self,
        path: str,
        query_string: str,
        authorization: str,
        accept_encoding: str | None,
        fingerprints: FingerprintMemo,
    ) -> Target | None:
        """What a GET of ``path`` and ``query_string`` with a bearer ``authorization``
        looks up, when caching is on and its query is valid; None otherwise.

        A target once resolved is remembered by those four parts (within
        ``TARGETS_MAX_BYTES``) while it :meth:`holds`: the same request from any
        connection is then resolved without validating, fingerprinting or keying
        again."""
        parts = (path, query_string, authorization, accept_encoding)
        known = self._targets.get(parts)
        if known is not None and self.holds(known):
            return known
        target = self._resolved(parts, fingerprints)
        if target is not None:
            self._remember(parts, target)
        return target

    def _resolved(self, parts: RequestParts, fingerprints: FingerprintMemo) -> Target | None:
        path, query_string, authorization, accept_encoding = parts
        pipeline = self.caching_pipeline()
        if pipeline is None or _PLAIN_PATH.fullmatch(path) is None:
            return None
        max_limit = self.live.settings.limits.max_limit
        query = self.query(path, query_string, max_limit)
        if query is None:
            return None
        keyer = pipeline.keyer
        fingerprint = fingerprints.known(keyer, authorization)
        if fingerprint is None:
            if not is_bearer(authorization):
                return None
            fingerprint = fingerprints.remember(keyer, authorization)
        key = keyer.key_for(query, fingerprint)
        gzip = self.gzip_preferred(accept_encoding)
        return Target(query, key, fingerprint, pipeline, max_limit, gzip)

    def _remember(self, parts: RequestParts, target: Target) -> None:
        size = sum(len(part) for part in parts if part is not None)
        if size > TARGET_PARTS_MAX:
            return
        cost = size + TARGET_COST_BYTES
        previous = self._targets.pop(parts, None)
        if previous is not None:
            self._targets_bytes -= cost
        if self._targets_bytes + cost > TARGETS_MAX_BYTES:
            # full: start again (what is asked again is resolved again, once)
            self._targets.clear()
            self._targets_bytes = 0
        self._targets[parts] = target
        self._targets_bytes += cost

    def holds(self, target: Target) -> bool:
        """Whether ``target`` was resolved under the pipeline and limits in force."""
        return (
            self.pipeline is target.pipeline
            and target.max_limit == self.live.settings.limits.max_limit
        )

    def held(self, target: Target) -> Hit | Miss | None:
        """What this process holds for ``target``, read with no I/O while ``target``
        still holds: its hit when the entry is fresh; the miss carrying that read when
        the backend holds every entry in this process (the memory backend: nothing
        else is worth reading); None otherwise (the shared cache may have it, or a
        stored body that does not decompress: serving the miss fetches it again)."""
        if not self.holds(target):
            return None
        found = target.pipeline.held(target.key)
        if found is None:
            return None
        if isinstance(found, StoredRead):
            return Miss(target, found)
        return self._hit(target, found)

    def shares(self, target: Target) -> bool:
        """Whether ``target``'s entry may be in a cache this process shares, so that
        :meth:`look_up` is worth its read when :meth:`held` has nothing."""
        return target.pipeline.shares_entries and self.holds(target)

    async def look_up(self, target: Target) -> Hit | Miss:
        """``target`` read from the shared cache (once): its hit, or the miss carrying
        the read."""
        stored = await target.pipeline.stored_fresh(target.key)
        hit = None
        if stored.fresh is not None and self.holds(target):
            hit = self._hit(target, stored.fresh)
        return Miss(target, stored) if hit is None else hit

    def _hit(self, target: Target, entry: CacheEntry) -> Hit | None:
        try:
            representation = target.pipeline.represent(entry, target.gzip)
        except CacheCorrupt:
            return None
        return Hit(target, entry, representation)

    def hit_fields(
        self, entry: CacheEntry, now: float, representation: Representation
    ) -> list[tuple[str, str]]:
        """The header fields of the reply of a hit on ``entry`` at ``now`` in
        ``representation``, in order: those the handler sends for it
        (``Content-Length`` aside)."""
        reply = hit_reply(entry, now, representation)
        return list(self._headers_of(reply).items())

    def handed(self, route: Route) -> Miss | None:
        """The miss the fast path made of the request being handled, when it is one of
        ``route`` under the pipeline and limits in force (see the module's docstring)."""
        miss = _HANDED.get()
        if miss is None or miss.target.query.route is not route or not self.holds(miss.target):
            return None
        return miss
