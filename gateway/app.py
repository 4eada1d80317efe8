"""The app factory: routes, middleware and the lifetimes of shared resources."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.handlers import healthz, openapi_json, record_handler
from gateway.middleware import edge_middleware
from gateway.normalise import CoercionCounts, Normaliser
from gateway.openapi import openapi_bytes
from gateway.params import ROUTES
from gateway.pipeline import RecordPipeline
from gateway.settings import Settings
from gateway.state import COERCIONS, OPENAPI, PIPELINE, SETTINGS
from gateway.upstream import UpstreamClient, create_session


def create_app(settings: Settings) -> web.Application:
    """Build the gateway application for ``settings``."""
    app = web.Application(middlewares=[edge_middleware])
    app[SETTINGS] = settings
    app[COERCIONS] = CoercionCounts()
    for route in ROUTES:
        app.router.add_get(route.template, record_handler(route), name=route.name)
    app.router.add_get("/healthz", healthz, name="healthz")
    app[OPENAPI] = openapi_bytes(settings)
    app.router.add_get("/openapi.json", openapi_json, name="openapi")
    app.cleanup_ctx.append(_pipeline_ctx)
    return app


async def _pipeline_ctx(app: web.Application) -> AsyncIterator[None]:
    """One upstream session for the life of the app, closed on shutdown."""
    settings = app[SETTINGS]
    session = create_session(settings.upstream)
    upstream = UpstreamClient(session, settings.upstream)
    app[PIPELINE] = RecordPipeline(upstream, Normaliser(app[COERCIONS]))
    try:
        yield
    finally:
        await session.close()
