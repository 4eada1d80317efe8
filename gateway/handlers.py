"""The route handlers: HTTP in, validated query to the pipeline, bytes out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.auth import parse_authorization
from gateway.params import RouteSpec, parse_record_query
from gateway.state import OPENAPI, PIPELINE, REQUEST_ID, SETTINGS

JSON = "application/json"
_HEALTHY = b'{"status":"ok"}'

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def record_handler(route: RouteSpec) -> RouteHandler:
    """The handler of one record route."""

    async def handle(request: web.Request) -> web.StreamResponse:
        credentials = parse_authorization(request.headers.get("Authorization"))
        path_value = request.match_info[route.path_param] if route.path_param else None
        query = parse_record_query(
            route,
            path_value,
            request.query.items(),
            max_limit=request.app[SETTINGS].limits.max_limit,
        )
        reply = await request.app[PIPELINE].read(query, credentials, request[REQUEST_ID])
        return web.Response(body=reply.body, content_type=JSON)

    handle.__name__ = f"get_{route.name}"
    return handle


async def healthz(request: web.Request) -> web.StreamResponse:
    """Liveness: the process answers. Needs no token and touches nothing."""
    return web.Response(body=_HEALTHY, content_type=JSON, headers={"Cache-Control": "no-store"})


async def openapi_json(request: web.Request) -> web.StreamResponse:
    """The OpenAPI document of this gateway. Needs no token."""
    return web.Response(body=request.app[OPENAPI], content_type=JSON)
