"""The HTTP edge around every handler: request ids, errors as problems, the access log
and the request metrics.

It wraps each handler (``edge(handler)``) instead of being an aiohttp middleware:
aiohttp calls handlers directly when an application has no middleware, and on the
cache-hit path that saves about a third of the time a request costs (bench/README.md).
Unknown paths and other methods reach handlers of their own (``not_found``,
``method_not_allowed``), so they get the same problem responses.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from gateway.errors import GatewayError, UpstreamContractError
from gateway.problems import problem_for_error, problem_for_http, problem_response
from gateway.state import LIVE, METRICS, REQUEST_ID, REQUEST_IDS
from gateway.trace import CURRENT_TRACE, RequestIds, RequestTrace

log = logging.getLogger("gateway.http")
access_log = logging.getLogger("gateway.access")
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
_UNMATCHED = "other"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def choose_request_id(given: str | None, ids: RequestIds) -> str:
    """The caller's X-Request-ID when it is safe to echo, otherwise a new one."""
    if given is not None and REQUEST_ID_PATTERN.fullmatch(given):
        return given
    return ids.new()


def route_name(request: web.Request) -> str:
    """A bounded label for the request's route: its name, never the raw path."""
    name = request.match_info.route.name
    return name if name is not None else _UNMATCHED


def edge(handler: Handler) -> Handler:
    """``handler`` with a request id, problem responses for every error, the access
    log line and the request metrics."""

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        app = request.app
        request_id = choose_request_id(request.headers.get("X-Request-ID"), app[REQUEST_IDS])
        request[REQUEST_ID] = request_id
        trace = RequestTrace()
        token = CURRENT_TRACE.set(trace)
        metrics = app[METRICS]
        metrics.in_flight.inc()
        response: web.StreamResponse
        try:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                response = problem_for_http(request, exc, request_id)
            except GatewayError as exc:
                if isinstance(exc, UpstreamContractError):
                    log.warning(
                        "upstream contract violation",
                        extra={
                            "event": "upstream_contract",
                            "request_id": request_id,
                            "route": route_name(request),
                            "detail": exc.detail,
                        },
                    )
                response = problem_for_error(request, exc, request_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "unhandled error",
                    extra={"request_id": request_id, "route": route_name(request)},
                )
                response = problem_response(
                    request,
                    status=500,
                    slug="internal",
                    title="Internal error",
                    detail="the gateway failed to handle this request; the request id is in"
                    " its logs",
                    request_id=request_id,
                )
            response.headers["X-Request-ID"] = request_id
        finally:
            metrics.in_flight.dec()
            CURRENT_TRACE.reset(token)
        elapsed = time.perf_counter() - started
        route = route_name(request)
        cache = response.headers.get("X-Cache", "NONE").lower()
        metrics.answered(route, response.status, cache, elapsed)
        if app[LIVE].settings.log.access:
            access_log.info(
                "request",
                extra={
                    "request_id": request_id,
                    "method": request.method,
                    "route": route,
                    "status": response.status,
                    "duration_ms": round(elapsed * 1000, 2),
                    "cache": cache,
                    "upstream_status": trace.upstream_status,
                    "upstream_ms": trace.upstream_ms,
                    "token_fingerprint": trace.token_fingerprint,
                },
            )
        return response

    handle.__name__ = getattr(handler, "__name__", "handle")
    return handle


async def not_found(request: web.Request) -> web.StreamResponse:
    """Every path the gateway does not have."""
    raise web.HTTPNotFound()


def method_not_allowed(allowed: Iterable[str]) -> Handler:
    """The handler of the other methods of a path: 405 with ``Allow``."""
    methods = set(allowed)

    async def handle(request: web.Request) -> web.StreamResponse:
        raise web.HTTPMethodNotAllowed(request.method, methods)

    return handle
