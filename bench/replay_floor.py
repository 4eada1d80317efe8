"""The public path's floor: a bare aiohttp app on uvloop replaying an origin's answers.

The matrix (bench/matrix.py) measures the gateway with ``server.fast_path = false``
(public aiohttp only) against this: the least an aiohttp application (one route, no
middleware) needs to answer the same traffic with the same bytes. It fronts
``--origin`` (in the bench, a warm gateway, so the bytes are the gateway's own) and
keys each request on its Authorization, its target as sent and whether it accepts
gzip. The first request of a key fetches the
origin once (concurrent first requests share that fetch); every later one is a dict
lookup and one ``web.Response`` of the stored status, headers and body, or a 304 when
its ``If-None-Match`` names the stored ETag. No parsing, validation, logging or
metrics: what is left is aiohttp's own cost of a request and an answer.

    python bench/replay_floor.py --host 127.0.0.1 --port 8090 --origin http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import uvloop
from aiohttp import ClientSession, ClientTimeout, web
from multidict import CIMultiDict

from gateway.cache.coding import etag_matches

# the origin's answer headers a replay carries (Date, Server, Content-Length and the
# connection's own are aiohttp's to write; Age would be stale)
REPLAYED = ("Content-Type", "Content-Encoding", "ETag", "Cache-Control", "Vary", "X-Cache",
            "Cache-Status")  # fmt: skip
# a stored answer's key: the request's Authorization, its target as sent, and whether
# it accepts gzip
Key = tuple[str, str, bool]
# what a 304 carries of them (RFC 9110, 15.4.5)
NOT_MODIFIED = ("ETag", "Cache-Control", "Vary")


@dataclass(frozen=True, slots=True)
class Stored:
    """One key's answer, as the origin gave it."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    etag: str  # "" when the origin gave none
    not_modified: Mapping[str, str]  # the headers of its 304

    def response(self, if_none_match: str | None) -> web.Response:
        if if_none_match is not None and etag_matches(if_none_match, self.etag):
            return web.Response(status=304, headers=self.not_modified)
        return web.Response(status=self.status, headers=self.headers, body=self.body)


class Replay:
    """The stored answers by key, and the fetches under way."""

    def __init__(self, origin: str) -> None:
        self._origin = origin.rstrip("/")
        self._stored: dict[Key, Stored] = {}
        self._fetching: dict[Key, asyncio.Future[Stored]] = {}
        self._session: ClientSession | None = None

    async def handle(self, request: web.BaseRequest) -> web.Response:
        """The stored answer to ``request`` (fetched first when its key is new)."""
        headers = request.headers
        gzip = "gzip" in headers.get("Accept-Encoding", "")
        key = (headers.get("Authorization", ""), request.raw_path, gzip)
        stored = self._stored.get(key)
        if stored is None:
            stored = await self._first(key)
        return stored.response(headers.get("If-None-Match"))

    def held(self, key: Key) -> Stored | None:
        """The answer stored for ``key`` (Authorization, target as sent, gzip or not)."""
        return self._stored.get(key)

    async def stored(self, key: Key) -> Stored:
        """The answer for ``key``, fetched from the origin first when it is new."""
        stored = self._stored.get(key)
        return stored if stored is not None else await self._first(key)

    async def _first(self, key: Key) -> Stored:
        pending = self._fetching.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Stored] = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            stored = await self._fetch(*key)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a waiter may never come
            raise
        finally:
            del self._fetching[key]
        self._stored[key] = stored
        future.set_result(stored)
        return stored

    async def _fetch(self, authorization: str, target: str, gzip: bool) -> Stored:
        if self._session is None:
            self._session = ClientSession(
                auto_decompress=False,
                timeout=ClientTimeout(total=30),
                skip_auto_headers=("Accept-Encoding",),
            )
        asked = {"Authorization": authorization} if authorization else {}
        if gzip:
            asked["Accept-Encoding"] = "gzip"
        async with self._session.get(self._origin + target, headers=asked) as answer:
            body = await answer.read()
            kept = CIMultiDict(
                (name, answer.headers[name]) for name in REPLAYED if name in answer.headers
            )
            headers = dict(kept)
            not_modified = {name: kept[name] for name in NOT_MODIFIED if name in kept}
            return Stored(answer.status, headers, body, kept.get("ETag", ""), not_modified)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def replay_app(replay: Replay) -> web.Application:
    """The floor as an aiohttp application: one route, every GET, no middleware."""
    app = web.Application()
    app.router.add_get("/{target:.*}", replay.handle)
    return app


async def serve(host: str, port: int, origin: str) -> None:
    replay = Replay(origin)
    runner = web.AppRunner(replay_app(replay), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"replay floor: listening on http://{host}:{bound} (replaying {origin})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await replay.close()


def run_replay(doc: str, serving: Callable[[str, int, str], Coroutine[Any, Any, None]]) -> None:
    """The command line of a replaying server (``doc`` its module's docstring):
    ``serving(host, port, origin)`` on uvloop."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--origin", required=True)
    args = parser.parse_args()
    uvloop.run(serving(args.host, args.port, args.origin))


def main() -> None:
    run_replay(__doc__, serve)


if __name__ == "__main__":
    main()
