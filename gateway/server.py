"""Running the gateway: the event loop, the listening socket, signals and the banner."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.settings import Settings

log = logging.getLogger("gateway.server")

DEMO_TOKEN = "demo-token"


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop where it exists (Linux), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is installed on Linux
        asyncio.run(coro)
    else:
        uvloop.run(coro)


async def serve(settings: Settings, *, demo: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then close everything in order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    demo_server = None
    if demo:
        from gateway.demo import start_demo_server

        demo_server = await start_demo_server(host="127.0.0.1", port=0)
        settings = settings.model_copy(
            update={"upstream": settings.upstream.model_copy(update={"base_url": demo_server.url})}
        )

    runner = web.AppRunner(create_app(settings), handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.server.host, settings.server.port)
        await site.start()
        port = runner.addresses[0][1] if runner.addresses else settings.server.port
        _print_banner(settings, port, demo_url=demo_server.url if demo_server else None)
        await stop.wait()
        log.info("stopping")
    finally:
        await runner.cleanup()
        if demo_server is not None:
            await demo_server.close()


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
    print("\n".join(lines), file=sys.stdout, flush=True)
