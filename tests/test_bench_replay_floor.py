"""The public path's floor (bench/replay_floor.py): in front of a small origin on
loopback, it answers each key (token, target, gzip or not) with the origin's own
bytes, asks the origin once per key however many ask at once, and answers a matching
If-None-Match with a 304. Nothing is timed."""

from __future__ import annotations

import asyncio
import collections
import gzip

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from pytest_aiohttp import AiohttpServer
from replay_floor import Replay, replay_app

BODY = b'{"data": [1, 2, 3]}'


class Origin:
    """What the origin was asked, per (Authorization, target, Accept-Encoding)."""

    def __init__(self) -> None:
        self.asked: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.gate = asyncio.Event()
        self.gate.set()

    def app(self) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            encoding = request.headers.get("Accept-Encoding", "")
            token = request.headers.get("Authorization", "")
            self.asked[(token, request.raw_path, encoding)] += 1
            await self.gate.wait()
            body = BODY + token.encode() + request.raw_path.encode()
            headers = {"ETag": f'"{len(body)}-{token[-1:]}"', "X-Cache": "HIT",
                       "Cache-Control": "max-age=60", "Age": "3"}  # fmt: skip
            if "gzip" in encoding:
                body = gzip.compress(body)
                headers["Content-Encoding"] = "gzip"
            return web.Response(body=body, content_type="application/json", headers=headers)

        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        return app


async def floor_of(aiohttp_server: AiohttpServer) -> tuple[Origin, TestServer, Replay]:
    origin = Origin()
    upstream = await aiohttp_server(origin.app())
    replay = Replay(str(upstream.make_url("")).rstrip("/"))
    server = await aiohttp_server(replay_app(replay))
    return origin, server, replay


async def get(
    server: TestServer, target: str, **headers: str
) -> tuple[int, CIMultiDict[str], bytes]:
    """GET ``target`` with ``headers`` (``If_None_Match`` for ``If-None-Match``)."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        wanted = {"Accept-Encoding": "identity"}
        wanted.update({name.replace("_", "-"): value for name, value in headers.items()})
        async with session.get(server.make_url(target), headers=wanted) as answer:
            return answer.status, CIMultiDict(answer.headers), await answer.read()


async def test_the_origins_bytes_come_back_once_fetched_per_key(
    aiohttp_server: AiohttpServer,
) -> None:
    origin, floor, replay = await floor_of(aiohttp_server)
    try:
        for token in ("Bearer a", "Bearer b"):
            for target in ("/users?limit=3", "/clients"):
                for encoding in ("identity", "gzip"):
                    answers = [
                        await get(floor, target, Authorization=token, Accept_Encoding=encoding)
                        for _ in range(3)
                    ]
                    assert len({(status, body) for status, _, body in answers}) == 1
                    status, headers, body = answers[0]
                    expected = BODY + token.encode() + target.encode()
                    if encoding == "gzip":
                        assert headers["Content-Encoding"] == "gzip"
                        assert gzip.decompress(body) == expected
                    else:
                        assert "Content-Encoding" not in headers
                        assert body == expected
                    assert status == 200
                    assert headers["X-Cache"] == "HIT"
                    assert headers["Cache-Control"] == "max-age=60"
                    assert headers["Content-Type"] == "application/json"
                    assert "Age" not in headers
        # one fetch per (token, target, gzip or not), a different token another key
        assert len(origin.asked) == 8
        assert set(origin.asked.values()) == {1}
    finally:
        await replay.close()


async def test_concurrent_first_requests_share_one_fetch(aiohttp_server: AiohttpServer) -> None:
    origin, floor, replay = await floor_of(aiohttp_server)
    origin.gate.clear()
    try:
        waiting = [
            asyncio.ensure_future(get(floor, "/users", Authorization="Bearer a")) for _ in range(10)
        ]
        while not origin.asked:
            await asyncio.sleep(0.01)
        origin.gate.set()
        answers = await asyncio.gather(*waiting)
        assert {status for status, _, _ in answers} == {200}
        assert len({body for _, _, body in answers}) == 1
        assert list(origin.asked.values()) == [1]
    finally:
        await replay.close()


async def test_a_matching_if_none_match_is_a_304_without_a_body(
    aiohttp_server: AiohttpServer,
) -> None:
    _, floor, replay = await floor_of(aiohttp_server)
    try:
        _, headers, _ = await get(floor, "/users", Authorization="Bearer a")
        etag = headers["ETag"]
        status, headers, body = await get(
            floor, "/users", Authorization="Bearer a", If_None_Match=f"W/{etag}"
        )
        assert (status, body, headers["ETag"]) == (304, b"", etag)
        status, _, body = await get(floor, "/users", Authorization="Bearer a", If_None_Match='"x"')
        assert status == 200
        assert body
    finally:
        await replay.close()
