"""The app factory: routes, the edge around them, and the lifetimes of shared resources.

The typed app state is declared beside the handlers that read it (``LIVE`` and
``CACHE`` in ``admin``, ``PIPELINE`` and ``RECORDS`` in ``records``, ``READINESS``,
``METRICS`` and ``OPENAPI`` in ``service``); ``COERCIONS`` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.cache.backend import CacheBackend
from gateway.cache.breaker import GuardedCache
from gateway.cache.clock import Clock, system_clock
from gateway.cache.coding import IdentityBodies
from gateway.cache.fleet import Fleet
from gateway.cache.memory import MemoryBackend, NullBackend
from gateway.comparison.shadow import Shadow
from gateway.config.live import ConfigSource, LiveConfig, cache_fingerprint
from gateway.config.settings import CacheSettings, Settings, UpstreamSettings
from gateway.http.admin import ADMIN_ROUTES, CACHE, LIVE, SHADOW
from gateway.http.edge import Edge, Handler, method_not_allowed
from gateway.http.openapi import openapi_bytes
from gateway.http.records import PIPELINE, RECORDS, RecordHandlers
from gateway.http.service import (
    METRICS,
    OPENAPI,
    READINESS,
    healthz,
    metrics,
    openapi_json,
    readyz,
)
from gateway.http.unrouted import UNROUTED, Unrouted, pathless_middleware
from gateway.normalise.normaliser import CoercionCounts, Normaliser
from gateway.ops.circuit import CircuitBreaker, CircuitState
from gateway.ops.health import Readiness
from gateway.ops.logs import set_level
from gateway.ops.metrics import METRICS_FLUSH_S, Metrics, multiprocess_dir
from gateway.records.keys import Keyer
from gateway.records.pipeline import CachePolicy, RecordPipeline
from gateway.records.routes import ROUTES
from gateway.upstream.client import UpstreamClient
from gateway.upstream.link import UpstreamLink

log = logging.getLogger("gateway.app")
COERCIONS = web.AppKey("coercions", CoercionCounts)
# the fleet's announcements, set only when the cache is Redis
FLEET = web.AppKey("fleet", Fleet)


def create_app(
    settings: Settings,
    *,
    clock: Clock = system_clock,
    source: ConfigSource | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> web.Application:
    """Build the gateway application for ``settings``.

    ``source`` is where a reload reads the settings again (the file and the flags);
    without it a reload re-reads the environment only. ``clock`` is the wall time of
    cache entries; ``monotonic`` the time of the upstream's circuit breaker.
    """
    app = web.Application()
    coercions = CoercionCounts()
    metrics_ = Metrics(coercions=coercions.take)
    live = LiveConfig(settings, source or ConfigSource())
    app[LIVE] = live
    app[METRICS] = metrics_
    app[COERCIONS] = coercions
    app[OPENAPI] = openapi_bytes(settings)
    edge = Edge(metrics=metrics_, live=live)
    records = RecordHandlers(edge, live)
    app[RECORDS] = records
    for route in ROUTES:
        add_routes(app, edge, route.template, {"GET": records.handler(route)}, route.name)
    add_routes(app, edge, "/healthz", {"GET": edge.wrap(healthz, "healthz")}, "healthz")
    add_routes(app, edge, "/readyz", {"GET": edge.wrap(readyz, "readyz")}, "readyz")
    add_routes(app, edge, "/metrics", {"GET": edge.wrap(metrics, "metrics")}, "metrics")
    add_routes(app, edge, "/openapi.json", {"GET": edge.wrap(openapi_json, "openapi")}, "openapi")
    if settings.admin.token is not None:
        for path, name, handlers in ADMIN_ROUTES:
            wrapped = {method: edge.wrap(handler, name) for method, handler in handlers.items()}
            add_routes(app, edge, path, wrapped, name)
    unrouted = Unrouted(edge)
    app.router.register_resource(unrouted)
    app[UNROUTED] = unrouted
    if not settings.server.fast_path:
        # the fast path answers targets without a path itself; plain aiohttp needs this
        # middleware for them (and every request then passes through it)
        app.middlewares.append(pathless_middleware(unrouted))
    app.cleanup_ctx.append(functools.partial(_pipeline_ctx, clock=clock, monotonic=monotonic))
    app.cleanup_ctx.append(_metrics_flush_ctx)
    return app


def add_routes(
    app: web.Application, edge: Edge, path: str, handlers: dict[str, Handler], name: str
) -> None:
    """``path`` with its handlers, already inside the edge (GET also answers HEAD),
    and a 405 with ``Allow`` for every other method; the edge's expect handler on all."""
    # a path parameter is one segment of any characters but "/" (aiohttp's default
    # also refuses braces, which an account name may hold)
    resource = app.router.add_resource(re.sub(r"\{(\w+)\}", r"{\1:[^/]+}", path), name=name)
    expect = edge.expectation(name)
    allowed = set(handlers)
    for method, handler in handlers.items():
        resource.add_route(method, handler, expect_handler=expect)
        if method == "GET":
            resource.add_route("HEAD", handler, expect_handler=expect)
            allowed.add("HEAD")
    resource.add_route("*", edge.wrap(method_not_allowed(allowed), name), expect_handler=expect)


async def _metrics_flush_ctx(app: web.Application) -> AsyncIterator[None]:
    """Hand the request tallies to prometheus-client once a second (a scrape flushes
    its own process; this is how the other workers' requests reach the sum)."""
    metrics_ = app[METRICS]
    shadow = app[SHADOW]

    def flush() -> None:
        # A failed write (a full disk under PROMETHEUS_MULTIPROC_DIR) loses that
        # second's tallies; it must not stop the next flushes or fail a shutdown.
        try:
            metrics_.flush()
        except Exception:
            log.exception("metrics: handing the request tallies over failed")
        shadow.publish()

    async def flush_every_second() -> None:
        while True:
            await asyncio.sleep(METRICS_FLUSH_S)
            flush()

    flushing = asyncio.ensure_future(flush_every_second())
    try:
        yield
    finally:
        flushing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flushing
        flush()


def create_backend(settings: CacheSettings, *, prefix: str, clock: Clock) -> CacheBackend:
    """The configured cache backend (not yet connected: Redis connects on first use)."""
    if settings.backend == "redis":
        # imported here: redis-py costs megabytes of memory the other backends do not need
        from gateway.cache.near import NearCache, TieredBackend
        from gateway.cache.redis import RedisBackend
        from gateway.cache.topology import connect

        topology = connect(settings)
        far = RedisBackend(
            topology.commands, prefix=prefix, timeout_s=settings.redis_timeout_ms / 1000
        )
        return TieredBackend(
            far,
            NearCache(max_bytes=settings.near_max_bytes, clock=clock, enabled=settings.near_cache),
            topology=topology,
            prefix=prefix,
        )
    if settings.backend == "memory":
        return MemoryBackend(max_bytes=settings.memory_max_bytes, clock=clock)
    return NullBackend()


def _fleet_of(
    backend: CacheBackend, prefix: str, live: LiveConfig, metrics_: Metrics
) -> Fleet | None:
    """The fleet announcements of a Redis-backed gateway (started); None otherwise."""
    if backend.name != "redis":
        return None  # (and redis-py, megabytes of memory, is not imported)
    from gateway.cache.near import TieredBackend

    if not isinstance(backend, TieredBackend):
        return None
    fleet = Fleet(
        backend.topology.commands,
        prefix=prefix,
        fingerprint=lambda: cache_fingerprint(live.settings),
        on_read=metrics_.fleet_configurations.set,
    )
    fleet.start()
    return fleet


def _breaker(settings: CacheSettings | UpstreamSettings, **options: Any) -> CircuitBreaker:
    """The circuit breaker of a section's ``breaker_*`` keys (the cache's and the
    upstream's are named alike)."""
    return CircuitBreaker(
        failures=settings.breaker_failures,
        reset_s=settings.breaker_reset_s,
        window_s=settings.breaker_window_s,
        failure_share=settings.breaker_failure_share,
        min_calls=settings.breaker_min_calls,
        **options,
    )


def _key_secret(settings: CacheSettings) -> bytes:
    if settings.key_secret is not None:
        return settings.key_secret.get_secret_value().encode()
    return MemoryBackend.new_secret()


async def _pipeline_ctx(
    app: web.Application, *, clock: Clock, monotonic: Callable[[], float]
) -> AsyncIterator[None]:
    """The upstream session and the cache backend for the life of the app."""
    live = app[LIVE]
    settings = live.settings
    metrics_ = app[METRICS]
    keyer = Keyer(
        namespace=settings.cache.namespace,
        base_url=settings.upstream.base_url,
        secret=_key_secret(settings.cache),
    )
    backend = create_backend(settings.cache, prefix=keyer.prefix, clock=clock)
    backend.start()
    metrics_.circuit_changed(backend.name, CircuitState.CLOSED.value)
    cache = GuardedCache(
        backend,
        _breaker(
            settings.cache,
            on_change=lambda state: metrics_.circuit_changed(backend.name, state.value),
        ),
        on_error=metrics_.cache_errors.labels(backend.name).inc,
    )
    link = UpstreamLink(settings.upstream)
    upstream_breaker = _breaker(
        settings.upstream,
        streak_window_s=settings.upstream.breaker_window_s,
        name="upstream",
        skipping="answering from the cache only, without calling the upstream",
        monotonic=monotonic,
        on_change=lambda state: metrics_.upstream_circuit_changed(state.value),
    )
    upstream = UpstreamClient(link, settings.upstream, breaker=upstream_breaker, metrics=metrics_)
    shared = multiprocess_dir()
    shadow = Shadow(
        settings.upstream, metrics=metrics_, shared=None if shared is None else Path(shared)
    )
    pipeline = RecordPipeline(
        upstream=upstream,
        normaliser=Normaliser(app[COERCIONS]),
        cache=None if settings.cache.backend == "none" else cache,
        keyer=keyer,
        policy=CachePolicy.from_settings(settings.cache),
        clock=clock,
        bodies=IdentityBodies(settings.cache.identity_memo_max_bytes),
        metrics=metrics_,
        shadow=shadow,
    )
    fleet = _fleet_of(backend, keyer.prefix, live, metrics_)
    readiness = Readiness(
        upstream=upstream.health,
        upstream_check=upstream.check,
        cache_state=cache.outcomes,
        cache_check=None if settings.cache.backend == "none" else cache.check,
        interval_s=settings.health.check_interval_s,
        fleet=None if fleet is None else fleet.report,
        upstream_circuit=lambda: upstream_breaker.state.value,
    )

    def apply(new: Settings) -> None:
        old_ttls = pipeline.policy.ttl_s
        pipeline.policy = CachePolicy.from_settings(new.cache)
        for route, ttl in pipeline.policy.ttl_s.items():
            if old_ttls.get(route) != ttl:
                announcing = asyncio.ensure_future(backend.announce(route))
                background.add(announcing)
                announcing.add_done_callback(background.discard)
        upstream.reconfigure(new.upstream)
        shadow.reconfigure(new.upstream)
        readiness.interval_s = new.health.check_interval_s
        set_level(new.log.level)

    background: set[asyncio.Future[None]] = set()
    live.on_change(apply)
    app[CACHE] = cache
    app[PIPELINE] = pipeline
    app[READINESS] = readiness
    app[SHADOW] = shadow
    app[RECORDS].pipeline = pipeline
    if fleet is not None:
        app[FLEET] = fleet
    try:
        yield
    finally:
        app[RECORDS].pipeline = None
        await pipeline.close()
        await shadow.close()
        if fleet is not None:
            await fleet.close()
        await backend.close()
        await link.close()
