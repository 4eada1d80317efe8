"""One gateway process: its event loop, its server on the listening socket, and signals.

SIGHUP re-reads the configuration (parsed off the event loop, which keeps serving) and
applies what can change live; SIGTERM or SIGINT stop accepting, let requests in flight
finish for up to ``server.shutdown_timeout_s``, close the upstream session and the Redis
pool, and return.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gateway.config.live import ConfigSource
from gateway.config.settings import Settings
from gateway.errors import StartError

log = logging.getLogger("gateway.server")

DEMO_TOKEN = "demo-token"
# room for large bearer tokens (JWTs with many claims) in one header line
MAX_HEADER_BYTES = 32 * 1024


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop where it exists (Linux), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is installed on Linux
        asyncio.run(coro)
    else:
        uvloop.run(coro)


async def serve(
    settings: Settings,
    source: ConfigSource,
    *,
    demo: bool = False,
    reuse_port: bool = False,
    worker: int | None = None,
    control: Path | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, reloading on SIGHUP, then close everything in order.
    ``control``: the folder where the workers of ``settings.server.workers`` reach each
    other (``gateway.ops.siblings``), when this is worker ``worker`` of several."""
    from gateway.fastpath.connection import FastPathServer
    from gateway.fastpath.server import make_runner
    from gateway.http.admin import LIVE
    from gateway.http.app import create_app
    from gateway.normalise.rules import engine_name
    from gateway.ops.metrics import check_multiprocess_dir
    from gateway.ops.siblings import Siblings
    from gateway.process.listener import listen

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    check_multiprocess_dir()
    demo_server = None
    if demo:
        from gateway.demo import start_demo_server

        demo_server = await start_demo_server(host="127.0.0.1", port=0)
        overrides = {
            **source.overrides,
            "upstream": {**source.overrides.get("upstream", {}), "base_url": demo_server.url},
            "cache": {**source.overrides.get("cache", {}), "backend": "memory"},
        }
        source = ConfigSource(source.path, overrides)
        settings = source.load()

    siblings = None
    if control is not None and worker is not None:
        siblings = Siblings(control, index=worker, count=settings.server.workers)
    app = create_app(settings, source=source, siblings=siblings)
    runner = make_runner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=settings.server.shutdown_timeout_s,
        keepalive_timeout=settings.server.keepalive_timeout_s,
        max_field_size=MAX_HEADER_BYTES,
        max_line_size=MAX_HEADER_BYTES,
    )
    await runner.setup()
    # a reload parses the file off the loop: each SIGHUP starts one, run in order
    reloads: set[asyncio.Task[object]] = set()

    def reload_on_signal() -> None:
        task: asyncio.Task[object] = loop.create_task(app[LIVE].reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload_on_signal)
    started = False
    listening: asyncio.Server | None = None
    try:
        host, port = settings.server.host, settings.server.port
        try:
            listening = await listen(runner, host, port, reuse_port=reuse_port)
        except OSError as exc:
            raise cannot_listen(host, port, exc, SERVE_ADDRESS_KEYS) from None
        started = True
        release_free_memory()
        settle_collector()
        if listening.sockets:
            port = listening.sockets[0].getsockname()[1]
        log.info(
            "started",
            extra={
                "event": "start",
                "host": host,
                "port": port,
                "pid": os.getpid(),
                "worker": worker,
                "upstream": settings.upstream.base_url,
                "cache_backend": settings.cache.backend,
                # which normalisation rules run (the compiled twin or pure Python), and
                # whether hits are answered from the bytes (gateway.fastpath)
                "normalise": engine_name(),
                "fast_path": isinstance(runner.server, FastPathServer),
            },
        )
        if worker is None or worker == 0:
            _print_banner(settings, port, demo_url=demo_server.url if demo_server else None)
        await stop.wait()
        log.info(
            "stopping: no new connections; waiting for requests in flight",
            extra={"event": "stop", "grace_s": settings.server.shutdown_timeout_s},
        )
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        for task in reloads:
            task.cancel()
        # a reload cut short kills its parser; the running configuration stays
        await asyncio.gather(*reloads, return_exceptions=True)
        if listening is not None:
            listening.close()  # no new connections; cleanup ends those open
        await runner.cleanup()
        if demo_server is not None:
            await demo_server.close()
        # a process that never listened says why (its StartError), not that it stopped
        if started:
            log.info("stopped", extra={"event": "stopped", "pid": os.getpid()})


# what sets the address serve listens on, named when it cannot listen there
SERVE_ADDRESS_KEYS = "server.host, server.port, --host, --port"


def cannot_listen(host: str, port: int, exc: OSError, keys: str) -> StartError:
    """The StartError of an address a server cannot listen on: the address, why in
    the system's words (in use, cannot assign requested address, permission denied, a
    name that does not resolve), and ``keys``, what sets the address."""
    if isinstance(exc, socket.gaierror):
        reason = exc.strerror or str(exc)
    elif not exc.errno:
        # Python 3.13's asyncio drops the errno of EADDRNOTAVAIL ("could not bind on any
        # address out of [...]"): one bind of a plain socket says it in the system's words
        reason = _bind_error(host, port) or str(exc) or type(exc).__name__
    else:
        # asyncio's own text repeats the address: "error while attempting to bind ..."
        reason = os.strerror(exc.errno)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return StartError(f"cannot listen on {address}: {reason} ({keys})", address=address)


def _bind_error(host: str, port: int) -> str | None:
    """Why a socket cannot bind to ``host:port``, in the system's words (None: it can
    now). The socket is closed at once; it never listens."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return exc.strerror or str(exc)
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as exc:
                return os.strerror(exc.errno) if exc.errno else str(exc)
    return None


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim): start-up
    builds and drops a lot (settings, models, the OpenAPI document) that would
    otherwise stay in the resident set for the life of the process."""
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover - not glibc
        return
    libc.malloc_trim(0)


# How many container objects (dicts, lists, ...) may be made, net of those freed, before
# the collector looks at the young ones. Python's default, 700, is less than what 64
# requests in flight hold between them (a parsed page is a few hundred), so it would
# run several times a second over live requests and keep promoting them
# (bench/README.md, "Garbage collection").
GC_YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Once started: move every object alive now (modules, models, the app) out of the
    collector's sight for good (gc.freeze), so that full collections stop walking them,
    and let the young generation grow to GC_YOUNG_THRESHOLD. Reference cycles made
    while serving are still collected; the memory soak (make bench) bounds the cost."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _print_banner(settings: Settings, port: int, *, demo_url: str | None) -> None:
    host = settings.server.host
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    listening = f"records-gateway listening on {base} (upstream {settings.upstream.base_url})"
    curl = f"curl -s -H 'Authorization: Bearer {DEMO_TOKEN}' '{base}/expenses?limit=2'"
    if settings.log.format == "json":
        # one JSON object like every other line, for log shippers that parse each line
        fields: dict[str, object] = {"event": "listening", "url": base}
        if demo_url is not None:
            fields.update(demo_upstream=demo_url, demo_try=curl)
        log.info(listening, extra=fields)
        return
    lines = [listening]
    if demo_url is not None:
        lines += [
            f"demo mode: the reference upstream runs in this process at {demo_url}",
            "try:",
            f"  {curl}",
        ]
    print("\n".join(lines), flush=True)
