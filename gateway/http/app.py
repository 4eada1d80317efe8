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
from gateway.errors import CacheUnavailable, ConfigError
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
from gateway.http.api_docs import docs_files
from gateway.http.binding import UPSTREAMS, UpstreamBinding, Upstreams
from gateway.http.console import console_files
from gateway.http.edge import EDGE, Edge, Handler, method_not_allowed
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
from gateway.http.unrouted import UNROUTED, Unrouted
from gateway.normalise.normaliser import CoercionCounts, Normaliser
from gateway.ops.circuit import CircuitBreaker, CircuitState
from gateway.ops.health import Readiness
from gateway.ops.logs import set_level
from gateway.ops.metrics import INDEX_SIZE_S, METRICS_FLUSH_S, Metrics, multiprocess_dir
from gateway.ops.siblings import Siblings
from gateway.ops.tracers import tracer_for
from gateway.ops.tracing import Tracer
from gateway.ops.ttl_advice import Policy
from gateway.records.keys import Keyer
from gateway.records.pipeline import RecordPipeline
from gateway.records.policy import CachePolicy
from gateway.routing.routes import RouteTable
from gateway.routing.standard import ROUTES
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
    backends: BackendRegistry | None = None,
    routes: RouteTable = ROUTES,
) -> web.Application:
    """Build the gateway application for ``settings``, serving ``routes``.

    ``source`` is where a reload reads the settings again (the file and the flags);
    without it a reload re-reads the environment only. ``clock`` is the wall time of
    cache entries; ``monotonic`` the time of the upstream's circuit breaker.
    ``tracer`` makes the requests' spans (None: the one ``settings.tracing`` asks for,
    made at the application's start); the application shuts it down at its cleanup,
    once everything else has stopped. ``siblings``: the other workers of this
    instance, which every admin action reaches (None: this process is the only one).
    ``backends``: the cache backends ``cache.backend`` names (None: those the gateway
    ships, ``default_registry()``).
    """
    app = web.Application()
    live = LiveConfig(settings, source or ConfigSource())
    edge = _state_and_edge(app, live, routes)
    # first: cleanup contexts end in reverse order, and the last spans (of requests and
    # refreshes the other contexts end) are exported at its end
    app.cleanup_ctx.append(functools.partial(_tracer_ctx, edge=edge, tracer=tracer))
    _add_all_routes(app, edge, live, routes)
    registry = default_registry() if backends is None else backends
    pipeline_ctx = functools.partial(
        _pipeline_ctx, clock=clock, monotonic=monotonic, backends=registry
    )
    app.cleanup_ctx.append(pipeline_ctx)
    app.cleanup_ctx.append(_metrics_flush_ctx)
    app.cleanup_ctx.append(_index_size_ctx)
    if siblings is not None:
        app[SIBLINGS] = siblings
        app.cleanup_ctx.append(_siblings_ctx)
    return app


def _state_and_edge(app: web.Application, live: LiveConfig, routes: RouteTable) -> Edge:
    """Put in the app's state what the edge and the service handlers read (the running
    configuration, the metrics, the coercion counts, the document); the edge every
    handler runs inside."""
    settings = live.settings
    coercions = CoercionCounts()
    metrics_ = Metrics(
        coercions=coercions.take, ttl_policy=lambda: ttl_policy(live.settings, routes)
    )
    metrics_.ttls_configured(routes.ttls(settings.cache.ttl_s.model_dump()))
    app[LIVE] = live
    app[METRICS] = metrics_
    app[COERCIONS] = coercions
    document = ServedDocument(functools.partial(openapi_bytes, routes=routes), settings)
    live.on_change(document.apply)
    app[OPENAPI] = document
    return Edge(metrics=metrics_, live=live)


def _add_all_routes(app: web.Application, edge: Edge, live: LiveConfig, routes: RouteTable) -> None:
    """The record routes, the service routes, the admin routes (with an admin token)
    and, last, the resource that answers every path no route has."""
    settings = live.settings
    records = RecordHandlers(edge, live, routes)
    app[RECORDS] = records
    app[EDGE] = edge
    edge.lookup = records.lookup
    for route in routes:
        add_routes(app, edge, route.template, {"GET": records.handler(route)}, route.name)
    add_routes(app, edge, "/healthz", {"GET": edge.wrap(healthz, "healthz")}, "healthz")
    add_routes(app, edge, "/readyz", {"GET": edge.wrap(readyz, "readyz")}, "readyz")
    add_routes(app, edge, "/metrics", {"GET": edge.wrap(metrics, "metrics")}, "metrics")
    add_routes(app, edge, "/openapi.json", {"GET": edge.wrap(openapi_json, "openapi")}, "openapi")
    if settings.server.docs:
        for file in docs_files():
            add_routes(app, edge, file.path, {"GET": edge.wrap(file.handle, "docs")}, file.name)
    if settings.admin.routes_exist:
        for path, name, handlers in ADMIN_ROUTES:
            wrapped = {method: edge.wrap(handler, name) for method, handler in handlers.items()}
            add_routes(app, edge, path, wrapped, name, guard=check_admin)
        # the console's page asks for the token itself: served to anyone, read by nobody
        # without the token (absent with the change feed's key alone)
        for file in console_files() if settings.admin.token is not None else ():
            handle = {"GET": edge.wrap(file.handle, "console")}
            add_routes(app, edge, file.path, handle, file.name, guard=check_admin)
        # after the admin routes, before the unrouted: the rest of /admin is theirs
        app.router.add_resource(ADMIN_PATHS).add_route(
            "*", edge.wrap(unknown_admin_path), expect_handler=edge.expectation()
        )
    unrouted = Unrouted(edge)
    app.router.register_resource(unrouted)
    app[UNROUTED] = unrouted
    edge.pathless = unrouted.respond


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


def ttl_policy(settings: Settings, routes: RouteTable = ROUTES) -> tuple[Policy, dict[str, int]]:
    """What the TTL advice aims at (``cache.max_stale_share`` and its bounds), and each
    route's TTL now."""
    cache = settings.cache
    policy = Policy(
        max_stale_share=cache.max_stale_share,
        min_ttl_s=cache.ttl_advice_min_s,
        max_ttl_s=cache.ttl_advice_max_s,
    )
    return policy, routes.ttls(cache.ttl_s.model_dump())


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


async def _index_size_ctx(app: web.Application) -> AsyncIterator[None]:
    """Ask the cache backend the size of its records' index every INDEX_SIZE_S (cheap:
    with Redis one instance measures it at most every 5 minutes) for the gauges; until
    the first answer they show 0."""
    metrics_ = app[METRICS]

    async def every_minute() -> None:
        while True:
            # the first a minute after the start: a process that lives less asks nothing
            await asyncio.sleep(INDEX_SIZE_S)
            backend = app[UPSTREAMS].current.cache.backend
            with contextlib.suppress(CacheUnavailable):
                size = await backend.index_size()
                if size is not None:
                    metrics_.record_index(size.keys, size.bytes)

    asking = asyncio.ensure_future(every_minute())
    try:
        yield
    finally:
        asking.cancel()
        # a measurement under way may not end at once: it is not waited for
        await asyncio.wait([asking], timeout=1.0)


def _fleet_of(backend: CacheBackend, live: LiveConfig, metrics_: Metrics) -> Fleet | None:
    """The fleet announcements over a shared backend that can hold them (not started);
    None otherwise."""
    return backend.fleet(
        lambda: cache_fingerprint(live.settings), metrics_.fleet_configurations.set
    )


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
    routes: RouteTable = ROUTES


def bind_upstream(settings: Settings, parts: ProcessParts) -> UpstreamBinding:
    """Everything bound to ``settings.upstream.base_url`` (``gateway.http.binding``),
    its background work started. Raises ValueError, naming the key, when the
    upstream's TLS files do not load, before anything is made."""
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

    def serving() -> bool:
        # a binding switched away from (or not yet serving) reports no circuit changes
        return binding.serving

    cache = _guarded_cache(settings.cache, backend, parts.metrics, serving)
    upstream_breaker = _upstream_breaker(settings.upstream, parts, serving)
    upstream = UpstreamClient(
        link, settings.upstream, breaker=upstream_breaker, metrics=parts.metrics
    )
    pipeline = RecordPipeline(
        upstream=upstream,
        normaliser=parts.normaliser,
        cache=cache if backend.capabilities.stores else None,
        keyer=keyer,
        policy=CachePolicy.from_settings(settings.cache, parts.routes),
        clock=parts.clock,
        bodies=parts.bodies,
        metrics=parts.metrics,
        shadow=parts.shadow,
    )
    fleet = _fleet_of(backend, parts.live, parts.metrics)
    readiness = _readiness(settings, parts, cache, upstream, fleet, upstream_breaker)
    if fleet is not None:
        fleet.start(readiness.summary)
    binding = UpstreamBinding(
        pipeline, cache, readiness, link, fleet=fleet, own_backend=own_backend
    )
    return binding


def _guarded_cache(
    settings: CacheSettings,
    backend: CacheBackend,
    metrics_: Metrics,
    serving: Callable[[], bool],
) -> GuardedCache:
    """``backend`` behind the cache's circuit breaker, its state and errors counted."""

    def changed(state: CircuitState) -> None:
        if serving():
            metrics_.circuit_changed(backend.name, state.value)

    metrics_.circuit_changed(backend.name, CircuitState.CLOSED.value)
    return GuardedCache(
        backend,
        _breaker(settings, on_change=changed),
        on_error=metrics_.cache_errors.labels(backend.name).inc,
    )


def _upstream_breaker(
    settings: UpstreamSettings, parts: ProcessParts, serving: Callable[[], bool]
) -> CircuitBreaker:
    """The upstream's circuit breaker, its changes counted while ``serving()``."""
    metrics_ = parts.metrics

    def changed(state: CircuitState) -> None:
        if serving():
            metrics_.upstream_circuit_changed(state.value)

    return _breaker(
        settings,
        streak_window_s=settings.breaker_window_s,
        name="upstream",
        skipping="answering from the cache only, without calling the upstream",
        monotonic=parts.monotonic,
        on_change=changed,
    )


def _readiness(
    settings: Settings,
    parts: ProcessParts,
    cache: GuardedCache,
    upstream: UpstreamClient,
    fleet: Fleet | None,
    upstream_breaker: CircuitBreaker,
) -> Readiness:
    """What /readyz reports of one binding."""
    return Readiness(
        upstream=upstream.health,
        upstream_check=upstream.check,
        cache_state=cache.outcomes,
        cache_check=cache.check if cache.backend.capabilities.stores else None,
        interval_s=settings.health.check_interval_s,
        fleet=None if fleet is None else fleet.report,
        upstream_circuit=lambda: upstream_breaker.state.value,
        workers=_workers_report(parts),
    )


def _process_parts(
    app: web.Application,
    *,
    clock: Clock,
    monotonic: Callable[[], float],
    backends: BackendRegistry,
) -> ProcessParts:
    """What the upstream bindings of this process share (``ProcessParts``); the memory
    or null backend made and started, when the configured backend is not shared."""
    live = app[LIVE]
    settings = live.settings
    metrics_ = app[METRICS]
    shared = multiprocess_dir()
    local_backend: CacheBackend | None = None
    if not backends.capabilities(settings.cache.backend).shared:
        local_backend = backends.create(settings.cache, prefix="", clock=clock)
        local_backend.start()
    return ProcessParts(
        live=live,
        metrics=metrics_,
        normaliser=Normaliser(app[COERCIONS]),
        bodies=IdentityBodies(
            settings.cache.identity_memo_max_bytes, metrics_.identity_decompressions.inc
        ),
        secret=_key_secret(settings.cache),
        clock=clock,
        monotonic=monotonic,
        shadow=Shadow(
            settings.upstream, metrics=metrics_, shared=None if shared is None else Path(shared)
        ),
        local_backend=local_backend,
        backends=backends,
        siblings=app.get(SIBLINGS),
        routes=app[RECORDS].routes,
    )


class _Reconfiguration:
    """What a reload applies to the bindings: a new binding when ``upstream.base_url``
    changes, the new policy and timeouts otherwise; then every instance told of the
    routes whose TTL changed (their near copies dropped)."""

    def __init__(self, parts: ProcessParts, upstreams: Upstreams) -> None:
        self._parts = parts
        self._upstreams = upstreams
        self._background: set[asyncio.Future[None]] = set()

    def __call__(self, new: Settings) -> None:
        current = self._upstreams.current
        old_ttls = current.pipeline.policy.ttl_s
        if new.upstream.base_url != current.base_url:
            self._switch(new, current)
        else:
            current.pipeline.policy = CachePolicy.from_settings(new.cache, self._parts.routes)
            current.upstream.reconfigure(new.upstream)
            current.readiness.interval_s = new.health.check_interval_s
        now = self._upstreams.current
        for route, ttl in now.pipeline.policy.ttl_s.items():
            if old_ttls.get(route) != ttl:
                announcing = asyncio.ensure_future(now.cache.backend.announce(route))
                self._background.add(announcing)
                announcing.add_done_callback(self._background.discard)
        self._parts.shadow.reconfigure(new.upstream)
        self._parts.metrics.ttls_configured(self._parts.routes.ttls(new.cache.ttl_s.model_dump()))
        set_level(new.log.level)

    def _switch(self, new: Settings, current: UpstreamBinding) -> None:
        try:
            binding = bind_upstream(new, self._parts)
        except ValueError as exc:
            raise ConfigError(f"upstream.{exc}") from exc
        self._upstreams.switch(binding)
        self._parts.metrics.upstream_switched()
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


async def _pipeline_ctx(
    app: web.Application,
    *,
    clock: Clock,
    monotonic: Callable[[], float],
    backends: BackendRegistry,
) -> AsyncIterator[None]:
    """The upstream binding (the upstream's session, the cache backend, the pipeline)
    for the life of the app; a reload that changes ``upstream.base_url`` switches to a
    new one (``gateway.http.binding``)."""
    parts = _process_parts(app, clock=clock, monotonic=monotonic, backends=backends)
    app[SHADOW] = parts.shadow
    upstreams = Upstreams(bind_upstream(parts.live.settings, parts), records=app[RECORDS])
    app[UPSTREAMS] = upstreams
    parts.live.on_change(_Reconfiguration(parts, upstreams))
    try:
        yield
    finally:
        app[RECORDS].pipeline = None
        await upstreams.close()
        await parts.shadow.close()
        if parts.local_backend is not None:
            await parts.local_backend.close()
