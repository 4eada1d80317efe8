"""Running the reference upstream on a real socket.

``start_demo_server`` is for code that owns an event loop (tests, benchmarks, the
gateway's demo mode); ``run_demo_upstream`` blocks the process serving until SIGINT
or SIGTERM (the ``records-gateway demo-upstream`` command). Either serves HTTPS with a
context from :func:`tls_context` (a certificate and key, and optionally the CA whose
client certificates it requires: an upstream that asks for mutual TLS).
"""

from __future__ import annotations

import asyncio
import functools
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from aiohttp import web

from gateway.demo.app import CHANGE_RATES, DEFAULT_TOKENS, DRIFT, create_demo_app


class DemoServer:
    """A started reference upstream; ``url`` has the port actually bound."""

    __slots__ = ("_runner", "app", "url")

    def __init__(self, runner: web.AppRunner, url: str) -> None:
        self._runner = runner
        self.app: web.Application = runner.app
        self.url = url

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> DemoServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def tls_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server TLS context: ``cert`` and ``key``; with ``client_ca``, a client
    certificate that CA issued is required of every caller."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key), _no_pass_phrase)
    if client_ca is not None:
        context.load_verify_locations(cafile=str(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def start_demo_server(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tokens: frozenset[str] = DEFAULT_TOKENS,
    latency_ms: float = 0.0,
    seed: int = 42,
    tls: ssl.SSLContext | None = None,
    drift: Iterable[str] = (),
    change_rates: Mapping[str, float] | None = None,
    clock: Callable[[], float] = time.time,
) -> DemoServer:
    """Serve ``create_demo_app(...)`` on ``host:port`` (0: a free port) until closed;
    over HTTPS with ``tls``."""
    app = create_demo_app(
        tokens=tokens,
        latency_ms=latency_ms,
        seed=seed,
        drift=drift,
        change_rates=change_rates,
        clock=clock,
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
    except BaseException:
        await runner.cleanup()
        raise
    scheme = "http" if tls is None else "https"
    return DemoServer(runner, f"{scheme}://{_url_host(bound_host)}:{bound_port}")


class CannotListen(Exception):
    """``run_demo_upstream`` cannot listen where it is told; ``error`` is why (the
    address in use, not on this machine, a port it may not bind)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def run_demo_upstream(
    *,
    host: str = "127.0.0.1",
    port: int = 9090,
    latency_ms: float = 0.0,
    seed: int = 42,
    tokens: frozenset[str] = DEFAULT_TOKENS,
    tls: ssl.SSLContext | None = None,
    drift: Iterable[str] = (),
    change_rates: Mapping[str, float] | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Serve the reference upstream in the foreground until SIGINT or SIGTERM; raises
    CannotListen, having printed nothing, when it cannot listen on ``host:port``."""
    start = functools.partial(
        start_demo_server,
        host=host,
        port=port,
        tokens=tokens,
        latency_ms=latency_ms,
        seed=seed,
        tls=tls,
        drift=drift,
        change_rates=change_rates,
        clock=clock,
    )
    asyncio.run(_serve_until_signalled(start))


async def _serve_until_signalled(start: Callable[[], Awaitable[DemoServer]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        try:
            server = await start()
        except OSError as exc:
            raise CannotListen(exc) from exc
        try:
            drift_on = server.app[DRIFT]
            drifting = f", drifting: {drift_on}" if drift_on else ""
            rates = server.app[CHANGE_RATES]
            changing = f", changing: {rates}" if rates else ""
            print(f"reference upstream listening on {server.url}{drifting}{changing}", flush=True)
            await stop.wait()
        finally:
            await server.close()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    print("reference upstream stopped", file=sys.stderr, flush=True)


def _no_pass_phrase() -> str:
    # an encrypted key fails to load instead of OpenSSL prompting on the terminal
    raise ssl.SSLError("the private key is encrypted; give it unencrypted")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
