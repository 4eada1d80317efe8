"""Hits answered by the gateway's server ahead of the application, with aiohttp's
public API only.

Without the fast path (``server.fast_path = false``, or aiohttp lacking what it needs),
the gateway is served by aiohttp's public low-level server (``gateway.http.runner``),
whose handler is :meth:`PlainHits.handler`. It does what the fast path does from the
bytes, through the same port (``gateway.records.lookup``): a plain GET (HTTP/1.1, a
bearer token, no cache directive and nothing that frames a body or switches
protocols) is resolved to its target (remembered by path, query, token and
``Accept-Encoding``: validated, fingerprinted and keyed once), what this process holds
for it is read with no I/O, and the shared cache once when that says nothing. A fresh
entry is answered at once: its 200, or its 304 when ``If-None-Match`` names its
representation's ETag, with the headers the route's own reply has, counted and logged
as every answer (``Edge.record_hit``). Anything else is the application's (its router,
the edge, the pipeline's one decision), a miss handed the read made for it
(``handing``), so that nothing is validated, keyed or read twice.

The header fields of a hit are made once and kept in three parts, as the fast path
keeps its bytes: those that depend on the representation's coding only, those that
depend on the whole seconds of the entry's age and freshness left, and those that
depend on the representation's ETag; each part at most ``size`` of its kind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from aiohttp import HttpVersion11, hdrs, web
from multidict import CIMultiDict

from gateway.cache.coding import etag_matches
from gateway.http.edge import X_REQUEST_ID, Edge
from gateway.http.negotiation import accept_encoding
from gateway.ops.tracecontext import TRACEPARENT
from gateway.records.lookup import (
    CacheEntry,
    Hit,
    Keyer,
    Miss,
    RecordLookup,
    Representation,
    Target,
    handing,
    hit_seconds,
)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Fields = tuple[tuple[str, str], ...]
P = TypeVar("P")  # the form a part of the fields is kept in

log = logging.getLogger("gateway.http")
FAULT = "a hit failed before the application; the application answers the request"

# request fields after which a hit is not simply the entry's answer, or the message not
# simply a bodiless head: the full way decides (as the fast path declines them)
# (istr: compared without case)
DECLINED = frozenset(
    (
        hdrs.CACHE_CONTROL,
        hdrs.PRAGMA,
        hdrs.EXPECT,
        hdrs.CONTENT_LENGTH,
        hdrs.TRANSFER_ENCODING,
        hdrs.UPGRADE,
        hdrs.TE,
    )
)
# the fields of a hit's reply that change with the entry's age, next to each other
TIMED = ("Cache-Status", "Age", "Cache-Control")
# what a 304 leaves out of its 200's fields: metadata of a body it does not have
ENTITY_FIELDS = frozenset(("content-type", "content-encoding"))


class Fingerprints:
    """The fingerprint of a token for :meth:`RecordLookup.resolve`, computed when a
    target is first resolved (the lookup remembers targets, so once per target)."""

    def known(self, keyer: Keyer, authorization: str) -> str | None:
        return None

    def remember(self, keyer: Keyer, authorization: str) -> str:
        return keyer.fingerprint(authorization)


class FieldParts(Generic[P]):
    """The header fields of hit replies (``fields_of(entry, now, representation)``:
    ``RecordLookup.hit_fields``) kept in three parts (see the module's docstring), each
    made once by :meth:`made` in the form its user writes (``P``) and kept by what it
    depends on; ``variant`` is a form of the whole a caller may ask for besides (the
    304's fields), which changes the first part only. At most ``size`` of each of the
    last two parts are kept, the oldest forgotten first (no entry is held here)."""

    def __init__(
        self,
        fields_of: Callable[[CacheEntry, float, Representation], list[tuple[str, str]]],
        size: int = 8192,
    ) -> None:
        self._fields_of = fields_of
        self._size = size
        self._before: dict[tuple[str, Hashable], P] = {}
        self._timed: dict[tuple[int, int], P] = {}
        self._after: dict[tuple[str, int], P] = {}

    def __len__(self) -> int:
        """The parts kept of the two kinds bounded by ``size``."""
        return len(self._timed) + len(self._after)

    def parts(
        self, entry: CacheEntry, now: float, representation: Representation, variant: Hashable
    ) -> tuple[P, P, P]:
        """The three parts of the fields of a hit on ``entry`` at ``now``."""
        seconds = hit_seconds(entry, now)
        before = self._before.get((representation.coding, variant))
        timed = self._timed.get(seconds)
        after = self._after.get((representation.etag, len(representation.body)))
        if before is None or timed is None or after is None:
            fields = self._fields_of(entry, now, representation)
            names = tuple(name for name, _ in fields)
            first = names.index(TIMED[0])
            last = first + len(TIMED)
            if names[first:last] != TIMED:
                raise RuntimeError(f"the timed fields of a hit are not together: {names}")
            before, timed, after = self.made(
                (tuple(fields[:first]), tuple(fields[first:last]), tuple(fields[last:])),
                representation,
                variant,
            )
            self._before[(representation.coding, variant)] = before
            keep(self._timed, seconds, timed, self._size)
            keep(self._after, (representation.etag, len(representation.body)), after, self._size)
        return before, timed, after

    def made(
        self, parts: tuple[Fields, Fields, Fields], representation: Representation, variant: Any
    ) -> tuple[P, P, P]:
        """The three ``parts`` of the fields of a reply in ``representation``, in the
        form kept."""
        raise NotImplementedError


class HitFields(FieldParts[Fields]):
    """The fields of a hit's 200 (variant ``True``: modified) or of its 304, as pairs."""

    def __call__(
        self, entry: CacheEntry, now: float, representation: Representation, modified: bool
    ) -> CIMultiDict[str]:
        before, timed, after = self.parts(entry, now, representation, modified)
        return CIMultiDict(before + timed + after)

    def made(
        self, parts: tuple[Fields, Fields, Fields], representation: Representation, variant: Any
    ) -> tuple[Fields, Fields, Fields]:
        before, timed, after = parts
        if not variant:
            before = not_modified_fields(parts)
        return before, timed, after


def not_modified_fields(parts: tuple[Fields, Fields, Fields]) -> Fields:
    """The first of a 200's three parts of fields as a 304 has it: no metadata of a
    body it does not have. Those fields must all be in the first part (the other two
    are kept for either status)."""
    before, timed, after = parts
    if any(name.lower() in ENTITY_FIELDS for name, _ in timed + after):
        raise RuntimeError(f"a field of the body follows the first part: {parts}")
    return tuple(field for field in before if field[0].lower() not in ENTITY_FIELDS)


def keep(made: dict[Any, P], key: Any, value: P, size: int) -> None:
    """``made[key] = value``, the oldest forgotten first past ``size``."""
    if key not in made and len(made) >= size:
        del made[next(iter(made))]
    made[key] = value


class PlainHits:
    """The record routes' hits as aiohttp's public API answers them (see the module's
    docstring), with ``edge``'s accounting and ``lookup``'s port."""

    def __init__(self, edge: Edge, lookup: RecordLookup) -> None:
        self._edge = edge
        self._lookup = lookup
        self._fingerprints = Fingerprints()
        self.fields = HitFields(lookup.hit_fields)

    def handler(self, full: Handler) -> Handler:
        """The server's handler: hits answered here, every other request by ``full``
        (the application's), a miss handed the read made for it."""
        lookup = self._lookup
        fingerprints = self._fingerprints

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            started = time.perf_counter()
            headers = request.headers
            authorization = headers.get(hdrs.AUTHORIZATION)
            if (
                authorization is None
                or request.method != hdrs.METH_GET
                or request.version != HttpVersion11
            ):
                return await full(request)
            if not headers.keys().isdisjoint(DECLINED):
                return await full(request)
            target: Target | None = None
            found: Hit | Miss | None = None
            try:
                url = request.rel_url
                target = lookup.resolve(
                    url.raw_path,
                    url.raw_query_string,
                    authorization,
                    accept_encoding(headers),
                    fingerprints,
                )
                if target is not None:
                    found = lookup.held(target)
                    if found is None and lookup.shares(target):
                        found = await lookup.look_up(target)
                    if isinstance(found, Hit):
                        return self._answer(request, found, started)
            except Exception:
                # a fault here must not cost the caller its answer: the application
                # answers the request (with its own problem if the fault is there too)
                log.exception(FAULT)
                return await full(request)
            if target is None:
                return await full(request)
            with handing(found if isinstance(found, Miss) else Miss(target, None)):
                return await full(request)

        return handle

    def _answer(self, request: web.BaseRequest, hit: Hit, started: float) -> web.Response:
        """The response of ``hit`` to ``request``, counted and logged."""
        headers = request.headers
        representation = hit.representation
        if_none_match = headers.get(hdrs.IF_NONE_MATCH)
        modified = if_none_match is None or not etag_matches(if_none_match, representation.etag)
        target = hit.target
        fields = self.fields(hit.entry, target.pipeline.clock(), representation, modified)
        edge = self._edge
        request_id = edge.request_id(headers.get(X_REQUEST_ID))
        fields[X_REQUEST_ID] = request_id
        if modified:
            response = web.Response(body=representation.body, headers=fields)
        else:
            response = web.Response(status=304, headers=fields)
        route = target.query.route
        edge.record_hit(
            route.name,
            route.template,
            started,
            request_id,
            target.fingerprint,
            headers.get(TRACEPARENT),
            200 if modified else 304,
        )
        return response
