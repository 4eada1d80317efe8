"""The route handlers: HTTP in, validated query to the pipeline, bytes and headers out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from gateway.auth import parse_authorization
from gateway.metrics import CONTENT_TYPE
from gateway.params import QueryMemo, RouteSpec
from gateway.pipeline import NO_DIRECTIVES, Directives, Reply
from gateway.state import LIVE, METRICS, OPENAPI, PIPELINE, READINESS, REQUEST_ID
from gateway.trace import current_trace

JSON = "application/json"
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


def reply_headers(reply: Reply) -> dict[str, str]:
    """The headers of a reply: its type and the cache headers (README's header table)."""
    headers = {
        "Content-Type": JSON,
        "X-Cache": reply.x_cache,
        "Cache-Status": reply.cache_status,
        "Age": str(reply.age_s),
        "Cache-Control": f"private, max-age={reply.max_age_s}",
    }
    if reply.etag:
        headers["ETag"] = reply.etag
    return headers


def record_handler(route: RouteSpec) -> RouteHandler:
    """The handler of one record route."""

    memo = QueryMemo()

    async def handle(request: web.Request) -> web.StreamResponse:
        headers = request.headers
        credentials = parse_authorization(headers.get("Authorization"))
        pipeline = request.app[PIPELINE]
        fingerprint = pipeline.keyer.fingerprint(credentials)
        trace = current_trace()
        if trace is not None:
            trace.token_fingerprint = fingerprint
        path_value = request.match_info[route.path_param] if route.path_param else None
        query = memo.parse(
            route,
            path_value,
            request.rel_url.raw_query_string,
            lambda: request.query.items(),
            max_limit=request.app[LIVE].settings.limits.max_limit,
        )
        directives = client_directives(headers.get("Cache-Control"), headers.get("Pragma"))
        reply = await pipeline.read(
            query,
            credentials,
            request[REQUEST_ID],
            directives,
            key=pipeline.keyer.key_for(query, fingerprint),
        )
        out = reply_headers(reply)
        if_none_match = headers.get("If-None-Match")
        if if_none_match is not None and etag_matches(if_none_match, reply.etag):
            del out["Content-Type"]
            return web.Response(status=304, headers=out)
        return web.Response(body=reply.body, headers=out)

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
