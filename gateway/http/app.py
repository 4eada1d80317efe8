"""The app factory: routes, the edge around them, and the lifetimes of shared resources.

The typed app state is declared beside the types it holds (``LIVE`` in ``admin``,
``RECORDS`` in ``records``, ``UPSTREAMS`` in ``binding``, ``METRICS`` and ``OPENAPI``
in ``service``); ``COERCIONS`` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.cache.backend import CacheBackend
from gateway.cache.breaker import GuardedCache
from gateway.cache.clock import Clock, system_clock
from gateway.cache.coding import IdentityBodies
from gateway.cache.fleet import Fleet
from gateway.cache.memory import MemoryBackend
from gateway.cache.registry import BackendRegistry, default_registry
from gateway.comparison.shadow import Shadow
from gateway.config.live import ConfigSource, LiveConfig, cache_fingerprint, live_fingerprint
from gateway.config.settings import CacheSettings, Settings, UpstreamSettings
from gateway.errors import ConfigError
from gateway.http.admin import (
    ADMIN_PATHS,
    ADMIN_ROUTES,
    LIVE,
    SHADOW,
    SIBLINGS,
    apply_from_sibling,
    check_admin,
    unknown_admin_path,
)
from gateway.http.binding import UPSTREAMS, UpstreamBinding, Upstreams
from gateway.http.edge import Edge, Handler, method_not_allowed
from gateway.http.openapi import openapi_bytes
from gateway.http.records import RECORDS, RecordHandlers
from gateway.http.service import (
    METRICS,
    OPENAPI,
    ServedDocument,
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
from gateway.ops.siblings import Siblings
from gateway.ops.tracers import tracer_for
from gateway.ops.tracing import Tracer
from gateway.ops.ttl_advice import Policy
from gateway.records.keys import Keyer
from gateway.records.pipeline import RecordPipeline
from gateway.records.policy import CachePolicy
from gateway.records.routes import ROUTES
from gateway.upstream.client import UpstreamClient
from gateway.upstream.link import UpstreamLink

log = logging.getLogger("gateway.app")
COERCIONS = web.AppKey("coercions", CoercionCounts)


def create_app(
    settings: Settings,
    *,
    clock: Clock = system_clock,
    source: ConfigSource | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    tracer: Tracer | None = None,
    siblings: Siblings | None = None,
) -> web.Application:
    """Build the gateway application for ``settings``.

    ``source`` is where a reload reads the settings again (the file and the flags);
    without it a reload re-reads the environment only. ``clock`` is the wall time of
    cache entries; ``monotonic`` the time of the upstream's circuit breaker.
    ``tracer`` makes the requests' spans (None: the one ``settings.tracing`` asks for,
    made at the application's start); the application shuts it down at its cleanup,
    once everything else has stopped. ``siblings``: the other workers of this
    instance, which every admin action reaches (None: this process is the only one).
    """
    app = web.Application()
    coercions = CoercionCounts()
    live = LiveConfig(settings, source or ConfigSource())
    metrics_ = Metrics(coercions=coercions.take, ttl_policy=lambda: ttl_policy(live.settings))
    metrics_.ttls_configured(settings.cache.ttl_s.model_dump())
    app[LIVE] = live
    app[METRICS] = metrics_
    app[COERCIONS] = coercions
    document = ServedDocument(openapi_bytes, settings)
    live.on_change(document.apply)
    app[OPENAPI] = document
    edge = Edge(metrics=metrics_, live=live)
    # first: cleanup contexts end in reverse order, and the last spans (of requests and
    # refreshes the other contexts end) are exported at its end
    app.cleanup_ctx.append(functools.partial(_tracer_ctx, edge=edge, tracer=tracer))
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
            add_routes(app, edge, path, wrapped, name, guard=check_admin)
        # after the admin routes, before the unrouted: the rest of /admin is theirs
        app.router.add_resource(ADMIN_PATHS).add_route(
            "*", edge.wrap(unknown_admin_path), expect_handler=edge.expectation()
        )
    unrouted = Unrouted(edge)
    app.router.register_resource(unrouted)
    app[UNROUTED] = unrouted
    if not settings.server.fast_path:
        # the fast path answers targets without a path itself; plain aiohttp needs this
        # middleware for them (and every request then passes through it)
        app.middlewares.append(pathless_middleware(unrouted))
    app.cleanup_ctx.append(functools.partial(_pipeline_ctx, clock=clock, monotonic=monotonic))
    app.cleanup_ctx.append(_metrics_flush_ctx)
    if siblings is not None:
        app[SIBLINGS] = siblings
        app.cleanup_ctx.append(_siblings_ctx)
    return app


async def _siblings_ctx(app: web.Application) -> AsyncIterator[None]:
    """Take the other workers' admin actions for the life of the app, and say which
    configuration this worker runs (at start and after every applied reload)."""
    siblings = app[SIBLINGS]
    live = app[LIVE]
    siblings.publish_fingerprint(live_fingerprint(live.settings))
    live.on_change(lambda new: siblings.publish_fingerprint(live_fingerprint(new)))
    await siblings.listen(functools.partial(apply_from_sibling, app))
    try:
        yield
    finally:
        await siblings.close()


def ttl_policy(settings: Settings) -> tuple[Policy, dict[str, int]]:
    """What the TTL advice aims at (``cache.max_stale_share`` and its bounds), and each
    route's TTL now."""
    cache = settings.cache
    policy = Policy(
        max_stale_share=cache.max_stale_share,
        min_ttl_s=cache.ttl_advice_min_s,
        max_ttl_s=cache.ttl_advice_max_s,
    )
    return policy, cache.ttl_s.model_dump()


def add_routes(
    app: web.Application,
    edge: Edge,
    path: str,
    handlers: dict[str, Handler],
    name: str,
    guard: Callable[[web.Request], None] | None = None,
) -> None:
    """``path`` with its handlers, already inside the edge (GET also answers HEAD),
    and a 405 with ``Allow`` for every other method once ``guard`` let the request
    through (the handlers run their own); the edge's expect handler on all."""
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
    not_allowed = method_not_allowed(allowed, guard)
    resource.add_route("*", edge.wrap(not_allowed, name), expect_handler=expect)


async def _tracer_ctx(
    app: web.Application, *, edge: Edge, tracer: Tracer | None
) -> AsyncIterator[None]:
    """The edge's tracer for the life of the app (``tracer``, or the one of the
    settings: raises ConfigError when that needs OpenTelemetry and it is not
    installed), shut down at its end: what is left of its spans is exported then."""
    if tracer is None:
        tracing = app[LIVE].settings.tracing
        tracer = tracer_for(
            tracing.otlp_traces_url,
            service_name=tracing.service_name,
            sample_ratio=tracing.sample_ratio,
        )
    edge.tracer = tracer
    try:
        yield
    finally:
        if tracer.recording:
            await asyncio.to_thread(tracer.shutdown)


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


def _fleet_of(
    backend: CacheBackend, prefix: str, live: LiveConfig, metrics_: Metrics
) -> Fleet | None:
    """The fleet announcements of a Redis-backed gateway (started); None otherwise."""
    if not backend.capabilities.shared:
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


def _workers_report(parts: ProcessParts) -> Callable[[], dict[str, Any]] | None:
    """The workers component of /readyz, with several workers."""
    siblings = parts.siblings
    if siblings is None:
        return None
    return lambda: siblings.report(live_fingerprint(parts.live.settings))


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


@dataclass(frozen=True, slots=True)
class ProcessParts:
    """What every upstream binding of the process shares, kept across switches: the
    running configuration, the metrics, the normaliser (and its coercion counts), the
    memo of identity bodies, the secret of the token fingerprints (random per process
    without ``cache.key_secret``), the clocks, the shadow traffic (whose report goes
    on across switches, starting again when the primary changes), and the memory or
    null backend (``local_backend``; None with Redis, whose backends are each
    binding's own) and the registry binding makes backends from (``backends``); the
    other workers of the instance, if any (``siblings``)."""

    live: LiveConfig
    metrics: Metrics
    normaliser: Normaliser
    bodies: IdentityBodies
    secret: bytes
    clock: Clock
    monotonic: Callable[[], float]
    shadow: Shadow
    local_backend: CacheBackend | None
    backends: BackendRegistry
    siblings: Siblings | None = None


def bind_upstream(settings: Settings, parts: ProcessParts) -> UpstreamBinding:
    """Everything bound to ``settings.upstream.base_url`` (``gateway.http.binding``),
    its background work started. Raises ValueError, naming the key, when the
    upstream's TLS files do not load, before anything is made."""
    metrics_ = parts.metrics
    link = UpstreamLink(settings.upstream)  # the one part that may fail: made first
    keyer = Keyer(
        namespace=settings.cache.namespace,
        base_url=settings.upstream.base_url,
        secret=parts.secret,
    )
    own_backend = None
    backend = parts.local_backend
    if backend is None:
        backend = own_backend = parts.backends.create(
            settings.cache, prefix=keyer.prefix, clock=parts.clock
        )
        backend.start()
    binding: UpstreamBinding

    def cache_changed(state: CircuitState) -> None:
        if binding.serving:
            metrics_.circuit_changed(backend.name, state.value)

    def upstream_changed(state: CircuitState) -> None:
        if binding.serving:
            metrics_.upstream_circuit_changed(state.value)

    metrics_.circuit_changed(backend.name, CircuitState.CLOSED.value)
    cache = GuardedCache(
        backend,
        _breaker(settings.cache, on_change=cache_changed),
        on_error=metrics_.cache_errors.labels(backend.name).inc,
    )
    upstream_breaker = _breaker(
        settings.upstream,
        streak_window_s=settings.upstream.breaker_window_s,
        name="upstream",
        skipping="answering from the cache only, without calling the upstream",
        monotonic=parts.monotonic,
        on_change=upstream_changed,
    )
    upstream = UpstreamClient(link, settings.upstream, breaker=upstream_breaker, metrics=metrics_)
    pipeline = RecordPipeline(
        upstream=upstream,
        normaliser=parts.normaliser,
        cache=cache if backend.capabilities.stores else None,
        keyer=keyer,
        policy=CachePolicy.from_settings(settings.cache),
        clock=parts.clock,
        bodies=parts.bodies,
        metrics=metrics_,
        shadow=parts.shadow,
    )
    fleet = _fleet_of(backend, keyer.prefix, parts.live, metrics_)
    readiness = Readiness(
        upstream=upstream.health,
        upstream_check=upstream.check,
        cache_state=cache.outcomes,
        cache_check=cache.check if backend.capabilities.stores else None,
        interval_s=settings.health.check_interval_s,
        fleet=None if fleet is None else fleet.report,
        upstream_circuit=lambda: upstream_breaker.state.value,
        workers=_workers_report(parts),
    )
    binding = UpstreamBinding(
        pipeline, cache, readiness, link, fleet=fleet, own_backend=own_backend
    )
    return binding


async def _pipeline_ctx(
    app: web.Application, *, clock: Clock, monotonic: Callable[[], float]
) -> AsyncIterator[None]:
    """The upstream binding (the upstream's session, the cache backend, the pipeline)
    for the life of the app; a reload that changes ``upstream.base_url`` switches to a
    new one (``gateway.http.binding``)."""
    live = app[LIVE]
    settings = live.settings
    metrics_ = app[METRICS]
    shared = multiprocess_dir()
    local_backend: CacheBackend | None = None
    backends = default_registry()
    if not backends.capabilities(settings.cache.backend).shared:
        local_backend = backends.create(settings.cache, prefix="", clock=clock)
        local_backend.start()
    parts = ProcessParts(
        live=live,
        metrics=metrics_,
        normaliser=Normaliser(app[COERCIONS]),
        bodies=IdentityBodies(settings.cache.identity_memo_max_bytes),
        secret=_key_secret(settings.cache),
        clock=clock,
        monotonic=monotonic,
        shadow=Shadow(
            settings.upstream, metrics=metrics_, shared=None if shared is None else Path(shared)
        ),
        local_backend=local_backend,
        backends=backends,
        siblings=app.get(SIBLINGS),
    )
    app[SHADOW] = parts.shadow
    upstreams = Upstreams(bind_upstream(settings, parts), records=app[RECORDS])
    app[UPSTREAMS] = upstreams
    background: set[asyncio.Future[None]] = set()

    def apply(new: Settings) -> None:
        current = upstreams.current
        old_ttls = current.pipeline.policy.ttl_s
        if new.upstream.base_url != current.base_url:
            try:
                binding = bind_upstream(new, parts)
            except ValueError as exc:
                raise ConfigError(f"upstream.{exc}") from exc
            upstreams.switch(binding)
            metrics_.upstream_switched()
            log.info(
                "upstream switched: new requests go to the new upstream, those in flight"
                " finish on the old one",
                extra={
                    "event": "upstream_switch",
                    "from_url": current.base_url,
                    "to_url": binding.base_url,
                    "in_flight": current.pipeline.reads_in_progress,
                },
            )
        else:
            current.pipeline.policy = CachePolicy.from_settings(new.cache)
            current.upstream.reconfigure(new.upstream)
            current.readiness.interval_s = new.health.check_interval_s
        now = upstreams.current
        for route, ttl in now.pipeline.policy.ttl_s.items():
            if old_ttls.get(route) != ttl:
                announcing = asyncio.ensure_future(now.cache.backend.announce(route))
                background.add(announcing)
                announcing.add_done_callback(background.discard)
        parts.shadow.reconfigure(new.upstream)
        metrics_.ttls_configured(new.cache.ttl_s.model_dump())
        set_level(new.log.level)

    live.on_change(apply)
    try:
        yield
    finally:
        app[RECORDS].pipeline = None
        await upstreams.close()
        await parts.shadow.close()
        if local_backend is not None:
            await local_backend.close()
