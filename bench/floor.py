"""The bench's floor: the most one Python process can serve here.

A bare aiohttp application on uvloop with one route answering every GET with the same
``--size`` bytes (``Content-Type: application/json``): no validation, no cache lookup,
no headers of its own, no access log. The gateway's hit path can approach it, never
pass it. ``bench/run.py`` starts it with the size of the gateway's hit body.

    python bench/floor.py --size 10236 [--host 127.0.0.1] [--port 0]

It prints ``floor listening on http://HOST:PORT`` once bound and serves until SIGINT
or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import uvloop
from aiohttp import web

from gateway.process.worker import settle_collector


def fixed_body(size: int) -> bytes:
    """A JSON document of exactly ``size`` bytes."""
    frame = b'{"pad":""}'
    if size < len(frame):
        raise ValueError(f"size must be at least {len(frame)}")
    return b'{"pad":"' + b"x" * (size - len(frame)) + b'"}'


def create_app(body: bytes) -> web.Application:
    async def answer(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", answer)
    return app


async def serve_app(app: web.Application, host: str, port: int, announce: str) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT or SIGTERM; once bound, print
    ``announce`` with ``{url}`` filled in (the bench waits for that line). Like the
    gateway, it settles the garbage collector once started (gateway.process.worker)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        # the gateway's own collector settings once started, so that a floor is not
        # beaten by tuning that it could have too
        settle_collector()
        bound = runner.addresses[0][1]
        print(announce.format(url=f"http://{host}:{bound}"), flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


async def serve(host: str, port: int, size: int) -> None:
    app = create_app(fixed_body(size))
    await serve_app(app, host, port, f"floor listening on {{url}} ({size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, required=True, help="body size in bytes")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.size))


if __name__ == "__main__":
    main()
