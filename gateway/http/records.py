"""The six record routes over HTTP: the caller's token and query validated, the
pipeline asked for the representation the caller accepts (``negotiation``), its
reply sent with its headers.

:meth:`RecordHandlers.hit_query` gives the fast path (``gateway.fastpath``) the
validated query of a head without a request object: remembered from before, or
validated then as the handler would; an invalid one takes the handler, which raises
every problem.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import hdrs, web
from multidict import CIMultiDictProxy
from yarl import URL

from gateway.config.live import LiveConfig
from gateway.errors import RequestError
from gateway.http.edge import REQUEST_ID, Edge
from gateway.http.negotiation import MOST_MEMBERS, gzip_preferred
from gateway.http.replies import reply_response
from gateway.ops.trace import current_trace
from gateway.records.credentials import parse_authorization
from gateway.records.pipeline import NO_DIRECTIVES, Directives, RecordPipeline, StoredRead
from gateway.records.routes import QueryMemo, RecordQuery, check_segment
from gateway.routing.routes import Route, RouteTable
from gateway.routing.standard import ROUTES

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# hit_query validates a query of fewer pairs than this (a route takes 10 at most);
# a longer one, valid or not, is the handler's alone, so that it is read once
FAST_PAIRS_MAX = 32


def query_pairs(query_string: str) -> list[tuple[str, str]]:
    """The decoded pairs of a raw query string, as aiohttp's ``request.query`` gives
    them for a request whose target carries it (both are yarl's reading of it)."""
    return list(URL.build(query_string=query_string, encoded=True).query.items())


def accept_encoding(headers: CIMultiDictProxy[str]) -> str | None:
    """The request's ``Accept-Encoding``, its fields joined as one list (None: none; of
    more fields than a list's members are read, the first)."""
    values = headers.getall(hdrs.ACCEPT_ENCODING, None)
    if values is None:
        return None
    return values[0] if len(values) == 1 else ", ".join(values[:MOST_MEMBERS])


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
        self.routes = routes
        # the current upstream binding's (gateway.http.binding), once the app has started
        self.pipeline: RecordPipeline | None = None
        self._memos = {route.name: QueryMemo() for route in routes}

    def caching_pipeline(self) -> RecordPipeline | None:
        """The application's pipeline when it caches answers at all; None before the
        application starts and with ``cache.backend = "none"`` (no request is a hit)."""
        pipeline = self.pipeline
        return pipeline if pipeline is not None and pipeline.caches else None

    def hit_query(self, path: str, query_string: str, max_limit: int) -> RecordQuery | None:
        """The validated query of a GET of ``path`` and raw ``query_string``, for the
        fast path: remembered, or validated now as the route's handler would (the same
        memo, the same pairs as aiohttp's ``request.query``); None when ``path`` is no
        record route or the query is invalid (the handler then answers its problem).

        ``path`` is as sent, with no dot segment, no empty segment and no escaped dot
        (the fast path reads no other): a record route's path exactly, or an id route's
        with the id as its last segment, whose escapes are decoded as aiohttp's router
        decodes them (an escape anywhere else, which the router would decode too, is
        left to it)."""
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

    def handler(self, route: Route) -> RouteHandler:
        """The router's handler of ``route``, inside the edge."""
        memo = self._memos[route.name]
        live = self.live

        async def read(request: web.Request) -> web.StreamResponse:
            headers = request.headers
            credentials = parse_authorization(headers.get("Authorization"))
            # taken once: the request is served by this upstream binding's pipeline to
            # its end, whatever upstream a reload switches to meanwhile
            pipeline = self.pipeline
            assert pipeline is not None, "the record handlers run once the app has started"
            fingerprint = pipeline.keyer.fingerprint(credentials.authorization)
            trace = current_trace()
            if trace is not None:
                trace.token_fingerprint = fingerprint
            path_value = None
            if route.path_param:
                # the id as sent: aiohttp's router keeps an escape it cannot decode
                check_segment(route.path_param, request.rel_url.raw_path.rpartition("/")[2])
                path_value = request.match_info[route.path_param]
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
                gzip=gzip_preferred(accept_encoding(headers)),
                prior=request.get(PRIOR_READ),
            )
            return reply_response(request, reply)

        read.__name__ = f"get_{route.name}"
        return self.edge.wrap(read, route.name, route.template)


RECORDS = web.AppKey("records", RecordHandlers)
# The cache read already made for this request (by the fast path, which then handed
# the request on): its handler's read takes it instead of reading the cache again.
PRIOR_READ = web.RequestKey("prior_read", StoredRead)
