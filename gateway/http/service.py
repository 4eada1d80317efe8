"""The gateway's own endpoints beside the records: liveness, readiness, metrics and
the OpenAPI document. None of them needs a token."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from aiohttp import web

from gateway.config.settings import Settings
from gateway.http.binding import UPSTREAMS
from gateway.http.replies import JSON
from gateway.ops.metrics import CONTENT_TYPE, Metrics

_HEALTHY = b'{"status":"ok"}'


class ServedDocument:
    """The bytes of the OpenAPI document for the settings in use: written at start and
    again by every applied reload (``LiveConfig.on_change``), since the document states
    keys a reload applies (``limits.max_limit``, ``cache.honor_client_no_cache``)."""

    __slots__ = ("_build", "body")

    def __init__(self, build: Callable[[Settings], bytes], settings: Settings) -> None:
        self._build = build
        self.body = build(settings)

    def apply(self, settings: Settings) -> None:
        self.body = self._build(settings)


METRICS = web.AppKey("metrics", Metrics)
OPENAPI = web.AppKey("openapi", ServedDocument)


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
    return web.Response(body=request.app[OPENAPI].body, content_type=JSON)
