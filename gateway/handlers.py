"""The route handlers: HTTP in, validated query to the pipeline, bytes and headers out."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import orjson
from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.auth import is_bearer, parse_authorization
from gateway.cache import CacheEntry, CacheKey
from gateway.connections import ConnectionFingerprints
from gateway.edge import X_REQUEST_ID, Edge
from gateway.metrics import CONTENT_TYPE
from gateway.params import ROUTES, QueryMemo, RouteSpec
from gateway.pipeline import (
    NO_DIRECTIVES,
    Directives,
    RecordPipeline,
)
from gateway.replies import (
    JSON,
    DateField,
    HitHeads,
    ReadyReply,
    WireResponse,
    cache_headers,
    ready_head,
    sendable,
)
from gateway.request_head import RequestHead
from gateway.state import METRICS, OPENAPI, PIPELINE, READINESS, REQUEST_ID, SHORTCUT_DECLINED
from gateway.trace import current_trace

_HEALTHY = b'{"status":"ok"}'

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def client_directives(cache_control: str | None, pragma: str | None) -> Directives:
    """The ``no-cache`` / ``no-store`` request directives (``Pragma: no-cache`` too)."""
    if cache_control is None:
        if pragma is not None and "no-cache" in pragma.lower():
            return Directives(no_cache=True)
        return NO_DIRECTIVES
    names = {part.split("=", 1)[0].strip().lower() for part in cache_control.split(",")}
    if "no-cache" not in names and "no-store" not in names:
        return NO_DIRECTIVES
    return Directives(no_cache="no-cache" in names, no_store="no-store" in names)


def etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison of ``If-None-Match`` against our strong ETag."""
    if not etag:
        return False
    if if_none_match.strip() == "*":
        return True
    opaque = etag.removeprefix("W/")
    return any(
        candidate.strip().removeprefix("W/") == opaque for candidate in if_none_match.split(",")
    )


def _conditional(
    request: web.Request, etag: str, headers: CIMultiDict[str] | CIMultiDictProxy[str]
) -> web.Response | None:
    """304 Not Modified when the request's If-None-Match names ``etag`` (``headers``,
    those of the 200, are left as they are)."""
    if_none_match = request.headers.get(hdrs.IF_NONE_MATCH)
    if if_none_match is None or not etag_matches(if_none_match, etag):
        return None
    response = web.Response(status=304, headers=headers)
    del response.headers["Content-Type"]
    return response


# a route's fresh hit for a request and the path's id (None on a list route), or None
Shortcut = Callable[[web.Request, str | None], web.StreamResponse | None]


class HitTarget(NamedTuple):
    """A plain GET's head resolved to what its hit looks up (RecordRoutes.resolve_head):
    valid while the pipeline and ``limits.max_limit`` are the ones it was resolved
    under. A connection keeps the last one with the head it came from."""

    route: str
    key: CacheKey
    fingerprint: str
    request_id: str | None  # the caller's X-Request-ID
    pipeline: RecordPipeline
    max_limit: int


class RecordRoutes:
    """The six record routes of one application.

    A fresh hit held in this process (the memory backend, or the near cache in front
    of Redis) for a query already validated once is answered by :meth:`hit` straight
    away: no awaiting, no pipeline, the token's fingerprint remembered per connection
    (gateway.connections), the reply sent as ready-made bytes (gateway.replies).
    :attr:`shortcuts` (list routes, by path) and :attr:`id_shortcuts` (id routes, by
    the path above the id) let the server's front door (gateway.front) try that before
    aiohttp's router; a HEAD or a request with ``Expect`` tries it in the route's
    handler. Everything else, and any
    request a hit could not answer exactly as the full path would (no token, a new
    query string, cache directives), takes the full path, which validates and raises
    every problem.
    """

    def __init__(self, edge: Edge, fingerprints: ConnectionFingerprints) -> None:
        self.edge = edge
        self.fingerprints = fingerprints
        self.pipeline: RecordPipeline | None = None  # the app's, once it has started
        self._memos = {route.name: QueryMemo() for route in ROUTES}
        self._hit_heads = HitHeads()
        self._date = DateField()
        # the record routes by path (list routes) and by the path above the id (id
        # routes), and their hit shortcuts by the same, for the front door
        self.list_routes = {route.template: route for route in ROUTES if not route.path_param}
        self.id_routes = {
            route.template.rpartition("/")[0]: route for route in ROUTES if route.path_param
        }
        self.shortcuts: dict[str, Shortcut] = {
            path: self._shortcut(route) for path, route in self.list_routes.items()
        }
        self.id_shortcuts: dict[str, Shortcut] = {
            path: self._shortcut(route) for path, route in self.id_routes.items()
        }

    def hit(
        self, route: RouteSpec, path_value: str | None, request: web.Request
    ) -> web.StreamResponse | None:
        """The answer to ``request`` when it is a fresh hit held here; None otherwise."""
        pipeline = self.caching_pipeline()
        if pipeline is None:  # no request is a hit
            return None
        started = time.perf_counter()
        headers = request.headers
        authorization = headers.get(hdrs.AUTHORIZATION)
        if authorization is None or hdrs.CACHE_CONTROL in headers or hdrs.PRAGMA in headers:
            return None
        found = self._fresh(
            pipeline,
            route,
            path_value,
            request.rel_url.raw_query_string,
            authorization,
            request.protocol,
        )
        if found is None:
            return None
        entry, fingerprint, now = found
        request_id = self.edge.request_id(headers.get(X_REQUEST_ID))
        head = self._hit_heads(entry, now)
        response: web.StreamResponse | None = _conditional(request, entry.etag, head.headers)
        if response is None and sendable(request):
            response = WireResponse(head, self._date(), request_id, entry.body)
        else:
            response = response or web.Response(body=entry.body, headers=head.headers)
            response.headers[X_REQUEST_ID] = request_id
        self.edge.answered(
            request.method,
            route.name,
            response.status,
            "hit",
            started,
            request_id,
            token_fingerprint=fingerprint,
        )
        return response

    def caching_pipeline(self) -> RecordPipeline | None:
        """The application's pipeline when it caches answers at all; None before the
        application starts and with ``cache.backend = "none"`` (no request is a hit)."""
        pipeline = self.pipeline
        return pipeline if pipeline is not None and pipeline.caches else None

    def resolve_head(self, head: RequestHead, connection: object) -> HitTarget | None:
        """What a hit on ``head`` (a plain kept-alive GET read by
        ``gateway.request_head``, sent on ``connection``) looks up, when its route is a
        record route and its query was validated before; None otherwise (the request
        then takes aiohttp's way, unchanged)."""
        authorization = head.authorization
        pipeline = self.caching_pipeline()
        if authorization is None or pipeline is None:
            return None
        path = head.path
        route = self.list_routes.get(path)
        path_value: str | None = None
        if route is None:
            parent, _, path_value = path.rpartition("/")
            route = self.id_routes.get(parent) if path_value else None
            if route is None:
                return None
        max_limit = self.edge.live.settings.limits.max_limit
        found = self._key(pipeline, route, path_value, head.query, authorization, connection)
        if found is None:
            return None
        key, fingerprint = found
        return HitTarget(route.name, key, fingerprint, head.request_id, pipeline, max_limit)

    def answer_target(self, target: HitTarget) -> tuple[bytes, bytes] | None:
        """The whole answer (its head and body, as bytes) to the request ``target`` was
        resolved from, when it is a fresh hit held here and ``target`` still holds (the
        same pipeline, the same ``limits.max_limit``); None otherwise."""
        started = time.perf_counter()
        pipeline = self.pipeline
        if (
            pipeline is not target.pipeline
            or target.max_limit != self.edge.live.settings.limits.max_limit
        ):
            return None
        entry = pipeline.fresh(target.key)
        if entry is None:
            return None
        request_id = self.edge.request_id(target.request_id)
        head = self._hit_heads(entry, pipeline.clock())
        wire = ready_head(head, self._date(), request_id), entry.body
        self.edge.answered(
            "GET",
            target.route,
            200,
            "hit",
            started,
            request_id,
            token_fingerprint=target.fingerprint,
        )
        return wire

    def _fresh(
        self,
        pipeline: RecordPipeline,
        route: RouteSpec,
        path_value: str | None,
        query_string: str,
        authorization: str,
        connection: object,
    ) -> tuple[CacheEntry, str, float] | None:
        """The fresh entry ``pipeline`` (the caching one) holds here for the query
        (validated once already) and token, with the token's fingerprint and the time
        read; None otherwise."""
        found = self._key(pipeline, route, path_value, query_string, authorization, connection)
        if found is None:
            return None
        key, fingerprint = found
        entry = pipeline.fresh(key)
        if entry is None:
            return None
        return entry, fingerprint, pipeline.clock()

    def _key(
        self,
        pipeline: RecordPipeline,
        route: RouteSpec,
        path_value: str | None,
        query_string: str,
        authorization: str,
        connection: object,
    ) -> tuple[CacheKey, str] | None:
        """The cache key of a query validated once already, for a bearer token sent on
        ``connection`` (its fingerprint computed once per connection and token), with
        that fingerprint; None for a query not seen yet or a header that is not a
        bearer token (the full path answers those)."""
        max_limit = self.edge.live.settings.limits.max_limit
        query = self._memos[route.name].known(route, path_value, query_string, max_limit)
        if query is None:
            return None
        keyer = pipeline.keyer
        fingerprint = self.fingerprints.known(connection, keyer, authorization)
        if fingerprint is None:
            if not is_bearer(authorization):
                return None
            fingerprint = self.fingerprints.remember(connection, keyer, authorization)
        return keyer.key_for(query, fingerprint), fingerprint

    def _shortcut(self, route: RouteSpec) -> Shortcut:
        def shortcut(request: web.Request, path_value: str | None) -> web.StreamResponse | None:
            return self.hit(route, path_value, request)

        return shortcut

    def handler(self, route: RouteSpec) -> RouteHandler:
        """The router's handler of ``route``, inside the edge."""
        memo = self._memos[route.name]
        live = self.edge.live
        fingerprints = self.fingerprints

        async def read(request: web.Request) -> web.StreamResponse:
            headers = request.headers
            credentials = parse_authorization(headers.get("Authorization"))
            pipeline = request.app[PIPELINE]
            fingerprint = fingerprints.of(
                request.protocol, pipeline.keyer, credentials.authorization
            )
            trace = current_trace()
            if trace is not None:
                trace.token_fingerprint = fingerprint
            path_value = request.match_info[route.path_param] if route.path_param else None
            query = memo.parse(
                route,
                path_value,
                request.rel_url.raw_query_string,
                lambda: request.query.items(),
                max_limit=live.settings.limits.max_limit,
            )
            directives = client_directives(headers.get("Cache-Control"), headers.get("Pragma"))
            reply = await pipeline.read(
                query,
                credentials,
                request[REQUEST_ID],
                directives,
                key=pipeline.keyer.key_for(query, fingerprint),
            )
            out = cache_headers(
                reply.x_cache, reply.cache_status, reply.age_s, reply.max_age_s, reply.etag
            )
            conditional = _conditional(request, reply.etag, out)
            if conditional is not None:
                return conditional
            if sendable(request):
                return ReadyReply(reply.body, out)  # its X-Request-ID set by the edge
            return web.Response(body=reply.body, headers=out)

        read.__name__ = f"get_{route.name}"
        full = self.edge.wrap(read, route.name)

        async def handle(request: web.Request) -> web.StreamResponse:
            if request.get(SHORTCUT_DECLINED):
                return await full(request)
            path_value = request.match_info[route.path_param] if route.path_param else None
            return self.hit(route, path_value, request) or await full(request)

        handle.__name__ = f"get_{route.name}"
        return handle


async def healthz(request: web.Request) -> web.StreamResponse:
    """Liveness: the process answers. Needs no token and touches nothing."""
    return web.Response(body=_HEALTHY, content_type=JSON, headers={"Cache-Control": "no-store"})


async def readyz(request: web.Request) -> web.StreamResponse:
    """Readiness: each component ok, degraded or down; 503 when nothing can be served."""
    status, report = await request.app[READINESS].report()
    return web.Response(
        status=status,
        body=orjson.dumps(report),
        content_type=JSON,
        headers={"Cache-Control": "no-store"},
    )


async def metrics(request: web.Request) -> web.StreamResponse:
    """Prometheus text exposition; for the whole gateway when it runs several workers."""
    body = request.app[METRICS].exposition()
    response = web.Response(body=body, headers={"Cache-Control": "no-store"})
    response.headers["Content-Type"] = CONTENT_TYPE
    return response


async def openapi_json(request: web.Request) -> web.StreamResponse:
    """The OpenAPI document of this gateway. Needs no token."""
    return web.Response(body=request.app[OPENAPI], content_type=JSON)
