"""The six record routes over HTTP: the caller's token and query validated, the
pipeline asked for the representation the caller accepts (``negotiation``), its
reply sent with its headers.

Each handler serves through the records' lookup port (``gateway.records.lookup``),
which the fast path (``gateway.fastpath``) uses too: when the fast path has looked a
request up and found no fresh entry, the handler takes that miss (its validated
query, key and cache read) instead of doing the same work again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.config.live import LiveConfig
from gateway.http.edge import REQUEST_ID, Edge
from gateway.http.negotiation import accept_encoding, gzip_preferred
from gateway.http.replies import reply_headers, reply_response
from gateway.ops.trace import current_trace
from gateway.records.credentials import parse_authorization
from gateway.records.lookup import Miss, RecordLookup, Target
from gateway.records.pipeline import NO_DIRECTIVES, Directives, RecordPipeline
from gateway.records.routes import check_segment
from gateway.routing.routes import Route, RouteTable
from gateway.routing.standard import ROUTES

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


class RecordHandlers:
    """The handlers of the record routes of one application (``routes``)."""

    def __init__(self, edge: Edge, live: LiveConfig, routes: RouteTable = ROUTES) -> None:
        self.edge = edge
        self.live = live
        self.lookup = RecordLookup(live, reply_headers, gzip_preferred, routes)
        self.routes = routes

    @property
    def pipeline(self) -> RecordPipeline | None:
        """The current upstream binding's (``gateway.http.binding``), once the app has
        started."""
        return self.lookup.pipeline

    @pipeline.setter
    def pipeline(self, pipeline: RecordPipeline | None) -> None:
        self.lookup.pipeline = pipeline

    def caching_pipeline(self) -> RecordPipeline | None:
        """The application's pipeline when it caches answers at all (see
        :meth:`RecordLookup.caching_pipeline`)."""
        return self.lookup.caching_pipeline()

    def handler(self, route: Route) -> RouteHandler:
        """The router's handler of ``route``, inside the edge."""

        async def read(request: web.Request) -> web.StreamResponse:
            headers = request.headers
            credentials = parse_authorization(headers.get("Authorization"))
            miss = self.lookup.handed(route)
            if miss is None:
                miss = self._miss(route, request, credentials.authorization)
            else:
                _trace_fingerprint(miss.target.fingerprint)
            target = miss.target
            # the representation is read from this request's own Accept-Encoding
            directives = client_directives(headers.get("Cache-Control"), headers.get("Pragma"))
            # served by the pipeline the lookup was made under, to its end, whatever
            # upstream a reload switches to meanwhile
            reply = await target.pipeline.read(
                target.query,
                credentials,
                request[REQUEST_ID],
                directives,
                key=target.key,
                gzip=gzip_preferred(accept_encoding(headers)),
                prior=miss.stored,
            )
            return reply_response(request, reply)

        read.__name__ = f"get_{route.name}"
        return self.edge.wrap(read, route.name, route.template)

    def _miss(self, route: Route, request: web.Request, authorization: str) -> Miss:
        """The request's lookup target, validated as the route requires (raising its
        problem), with no cache read made yet."""
        pipeline = self.pipeline
        assert pipeline is not None, "the record handlers run once the app has started"
        fingerprint = pipeline.keyer.fingerprint(authorization)
        _trace_fingerprint(fingerprint)
        path_value = None
        if route.path_param:
            # the id as sent: aiohttp's router keeps an escape it cannot decode
            check_segment(route.path_param, request.rel_url.raw_path.rpartition("/")[2])
            path_value = request.match_info[route.path_param]
        max_limit = self.live.settings.limits.max_limit
        query = self.lookup.memo(route).parse(
            route,
            path_value,
            request.rel_url.raw_query_string,
            lambda: request.query.items(),
            max_limit=max_limit,
        )
        key = pipeline.keyer.key_for(query, fingerprint)
        return Miss(Target(query, key, fingerprint, pipeline, max_limit, gzip=False), None)


def _trace_fingerprint(fingerprint: str) -> None:
    """The request's trace (if traced) carries its token's fingerprint."""
    trace = current_trace()
    if trace is not None:
        trace.token_fingerprint = fingerprint


RECORDS = web.AppKey("records", RecordHandlers)
