"""The gateway's own endpoints beside the records: liveness, readiness, metrics and
the OpenAPI document. None of them needs a token."""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.http.binding import UPSTREAMS
from gateway.http.replies import JSON
from gateway.ops.metrics import CONTENT_TYPE, Metrics

_HEALTHY = b'{"status":"ok"}'

METRICS = web.AppKey("metrics", Metrics)
OPENAPI = web.AppKey("openapi", bytes)  # the document, written once at start


async def healthz(request: web.Request) -> web.StreamResponse:
    """Liveness: the process answers. Touches nothing."""
    return web.Response(body=_HEALTHY, content_type=JSON, headers={"Cache-Control": "no-store"})


async def readyz(request: web.Request) -> web.StreamResponse:
    """Readiness of the upstream in use and its cache: each component ok, degraded or
    down; 503 when nothing can be served."""
    status, report = await request.app[UPSTREAMS].current.readiness.report()
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
    """The OpenAPI document of this gateway."""
    return web.Response(body=request.app[OPENAPI], content_type=JSON)
