"""Running the gateway: processes, event loops, the listening socket and signals.

With ``server.workers = 1`` the gateway runs in this process. With N > 1 this process
becomes a small supervisor: it forks N workers that each listen on the same port
(SO_REUSEPORT) with their own event loop (uvloop on Linux), forwards SIGHUP, SIGTERM
and SIGINT to them, and exits 0 once they all have. The workers write their metrics
to a shared folder so that /metrics of any of them reports the whole gateway.

Signals, in a worker or a single process: SIGHUP re-reads the configuration and
applies what can change live; SIGTERM or SIGINT stop accepting, let requests in flight
finish for up to ``server.shutdown_timeout_s``, close the upstream session and the
Redis pool, and exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Coroutine
from typing import Any

from gateway.logs import configure_logging
from gateway.runtime import ConfigSource
from gateway.settings import Settings

log = logging.getLogger("gateway.server")

DEMO_TOKEN = "demo-token"
MAX_HEADER_BYTES = 32 * 1024
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_FORWARDED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop where it exists (Linux), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is installed on Linux
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def main_serve(settings: Settings, source: ConfigSource, *, demo: bool) -> int:
    """Serve until told to stop; returns the exit status."""
    configure_logging(settings.log.level, settings.log.format)
    # until the event loop handles SIGHUP (a reload), one must not end the process
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if settings.server.workers == 1:
        run(serve(settings, source, demo=demo))
        return 0
    return _supervise(settings, source, demo=demo)


async def serve(
    settings: Settings,
    source: ConfigSource,
    *,
    demo: bool = False,
    reuse_port: bool = False,
    worker: int | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, reloading on SIGHUP, then close everything in order."""
    from aiohttp import web

    from gateway.app import create_app
    from gateway.front import GatewayRunner
    from gateway.state import LIVE

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

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

    app = create_app(settings, source=source)
    runner = GatewayRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=settings.server.shutdown_timeout_s,
        keepalive_timeout=settings.server.keepalive_timeout_s,
        # room for large bearer tokens (JWTs with many claims) in one header line
        max_field_size=MAX_HEADER_BYTES,
        max_line_size=MAX_HEADER_BYTES,
    )
    await runner.setup()
    loop.add_signal_handler(signal.SIGHUP, app[LIVE].reload)
    try:
        site = web.TCPSite(
            runner, settings.server.host, settings.server.port, reuse_port=reuse_port or None
        )
        await site.start()
        release_free_memory()
        settle_collector()
        port = runner.addresses[0][1] if runner.addresses else settings.server.port
        log.info(
            "started",
            extra={
                "event": "start",
                "host": settings.server.host,
                "port": port,
                "pid": os.getpid(),
                "worker": worker,
                "upstream": settings.upstream.base_url,
                "cache_backend": settings.cache.backend,
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
        await runner.cleanup()
        if demo_server is not None:
            await demo_server.close()
        log.info("stopped", extra={"event": "stopped", "pid": os.getpid()})


_PR_SET_PDEATHSIG = 1  # prctl(2)


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
# requests in flight hold between them (a parsed page is a few hundred), so it ran
# several times a second over live requests and kept promoting them, at about a
# twentieth of a miss's CPU (bench/README.md, "Garbage collection").
GC_YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Once started: move every object alive now (modules, models, the app) out of the
    collector's sight for good (gc.freeze), so that full collections stop walking them,
    and let the young generation grow to GC_YOUNG_THRESHOLD. Reference cycles made
    while serving are still collected; the memory soak (make bench) bounds the cost."""
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _supervise(settings: Settings, source: ConfigSource, *, demo: bool) -> int:
    """Fork the workers, forward signals to them, reap them."""
    metrics_dir = tempfile.mkdtemp(prefix="records-gateway-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir
    children: dict[int, int] = {}
    supervisor = os.getpid()
    for index in range(settings.server.workers):
        pid = os.fork()
        if pid == 0:  # the worker
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            _stop_with(supervisor)
            # a reload before the worker's loop listens for it must not end the worker
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            code = 0
            try:
                run(serve(settings, source, demo=demo, reuse_port=True, worker=index))
            except BaseException:
                log.exception("worker failed", extra={"worker": index})
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        children[pid] = index

    def forward(signum: int, _frame: object) -> None:
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    log.info(
        "supervising workers",
        extra={"event": "supervise", "workers": sorted(children), "pid": os.getpid()},
    )
    status = 0
    while children:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries os.wait
            continue
        index = children.pop(pid, -1)
        code = os.waitstatus_to_exitcode(wait_status)
        _mark_dead(pid)
        if code != 0:
            status = 1
            log.error("worker exited", extra={"worker": index, "pid": pid, "exit": code})
            forward(signal.SIGTERM, None)
    shutil.rmtree(metrics_dir, ignore_errors=True)
    return status


def _stop_with(supervisor: int) -> None:
    """Ask Linux for a SIGTERM when the supervisor dies (SIGKILL, a crash), so that a
    worker never outlives it holding the port; then stop now if it already has."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux with glibc
        return
    if os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)


def _mark_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def _print_banner(settings: Settings, port: int, *, demo_url: str | None) -> None:
    host = settings.server.host
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    lines = [f"records-gateway listening on {base} (upstream {settings.upstream.base_url})"]
    if demo_url is not None:
        lines += [
            f"demo mode: the reference upstream runs in this process at {demo_url}",
            "try:",
            f"  curl -s -H 'Authorization: Bearer {DEMO_TOKEN}' '{base}/expenses?limit=2'",
        ]
    print(
        "\n".join(lines),
        file=sys.stderr if settings.log.format == "json" else sys.stdout,
        flush=True,
    )
