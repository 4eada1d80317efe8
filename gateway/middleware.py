"""The middleware at the HTTP edge: request ids, errors as problems, the access log
and the request metrics."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.errors import GatewayError
from gateway.problems import problem_for_error, problem_for_http, problem_response
from gateway.state import LIVE, METRICS, REQUEST_ID
from gateway.trace import CURRENT_TRACE, RequestTrace

log = logging.getLogger("gateway.http")
access_log = logging.getLogger("gateway.access")
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
_UNMATCHED = "other"


def choose_request_id(given: str | None) -> str:
    """The caller's X-Request-ID when it is safe to echo, otherwise a new one."""
    if given is not None and REQUEST_ID_PATTERN.fullmatch(given):
        return given
    return uuid.uuid4().hex


def route_name(request: web.Request) -> str:
    """A bounded label for the request's route: its name, never the raw path."""
    name = request.match_info.route.name
    return name if name is not None else _UNMATCHED


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request an id, turn every error into a problem, log and count it."""
    started = time.perf_counter()
    request_id = choose_request_id(request.headers.get("X-Request-ID"))
    request[REQUEST_ID] = request_id
    trace = RequestTrace()
    token = CURRENT_TRACE.set(trace)
    metrics = request.app[METRICS]
    metrics.in_flight.inc()
    response: web.StreamResponse
    try:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            response = problem_for_http(request, exc, request_id)
        except GatewayError as exc:
            response = problem_for_error(request, exc, request_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "unhandled error", extra={"request_id": request_id, "route": route_name(request)}
            )
            response = problem_response(
                request,
                status=500,
                slug="internal",
                title="Internal error",
                detail="the gateway failed to handle this request; the request id is in its logs",
                request_id=request_id,
            )
        response.headers["X-Request-ID"] = request_id
    finally:
        metrics.in_flight.dec()
        CURRENT_TRACE.reset(token)
    elapsed = time.perf_counter() - started
    route = route_name(request)
    cache = response.headers.get("X-Cache", "NONE").lower()
    metrics.requests.labels(route, str(response.status), cache).inc()
    metrics.request_seconds.labels(route, cache).observe(elapsed)
    if cache != "none":
        metrics.cache_results.labels(route, cache).inc()
    if request.app[LIVE].settings.log.access:
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
