"""The bench's miss floor: what a bare aiohttp proxy that normalises in-process adds to a miss.

A bare aiohttp application on uvloop with one route, ``GET /expenses``: it validates the
query with the gateway's own ``parse_record_query``, forwards the request to the
upstream through one shared ``ClientSession`` (a pool of 100 connections, as the
gateway's ``upstream.max_connections``), forwarding ``Authorization``, and answers the
upstream's body normalised by the gateway's own ``Normaliser``. Nothing else: no cache
lookup, coalescing, circuit breaker, metrics, request ids, ETag, cache headers, problem
answers or access log. ``bench/run.py`` loads it like ``miss`` and ``direct``, so that a
run shows how much of what a miss adds is the stack's (two loopback hops through aiohttp's
server and client, and normalising) and how much is the gateway's own work.

    python bench/miss_floor.py --upstream http://127.0.0.1:8081 [--host 127.0.0.1] [--port 0]

It prints ``miss-floor listening on http://HOST:PORT`` once bound and serves until
SIGINT or SIGTERM. Any upstream status but 200 is answered as 502; bad input as 400.
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web
from floor import serve_app

from gateway.errors import GatewayError
from gateway.normalise.normaliser import CoercionCounts, Normaliser
from gateway.records.routes import parse_record_query
from gateway.routing.standard import EXPENSES

SESSION = web.AppKey("session", aiohttp.ClientSession)
MAX_LIMIT = 1000


def create_app(upstream: str) -> web.Application:
    normaliser = Normaliser(CoercionCounts())

    async def expenses(request: web.Request) -> web.Response:
        try:
            query = parse_record_query(EXPENSES, None, request.query.items(), max_limit=MAX_LIMIT)
        except GatewayError as exc:
            return web.Response(status=400, text=str(exc))
        headers = {"Authorization": request.headers.get("Authorization", "")}
        async with request.app[SESSION].get(upstream + request.path_qs, headers=headers) as got:
            if got.status != 200:
                return web.Response(status=502, text=f"upstream status {got.status}")
            body = await got.read()
        return web.Response(body=normaliser.normalise(query, body), content_type="application/json")

    async def session(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=100, limit_per_host=100)
        app[SESSION] = aiohttp.ClientSession(connector=connector)

    async def close(app: web.Application) -> None:
        await app[SESSION].close()

    app = web.Application()
    app.on_startup.append(session)
    app.on_cleanup.append(close)
    app.router.add_get("/expenses", expenses)
    return app


async def serve(host: str, port: int, upstream: str) -> None:
    announce = f"miss-floor listening on {{url}} (upstream {upstream})"
    await serve_app(create_app(upstream), host, port, announce)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.upstream.rstrip("/")))


if __name__ == "__main__":
    main()
