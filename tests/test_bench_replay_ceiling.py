"""The matrix's ceiling (bench/replay_ceiling.py): a bare asyncio Protocol in front of
a small origin on loopback answers each key with the origin's own bytes, fetched once
per key, in order on a connection however the requests are pipelined, a 304 to a
matching If-None-Match, and closes after a ``Connection: close``. Nothing is timed."""

from __future__ import annotations

import asyncio
import gzip

from pytest_aiohttp import AiohttpServer
from replay_ceiling import Answers, Connection
from replay_floor import Replay

from .http.test_wire import read_answer
from .test_bench_replay_floor import BODY, Origin


async def ceiling_of(aiohttp_server: AiohttpServer) -> tuple[Origin, int, Replay, asyncio.Server]:
    origin = Origin()
    upstream = await aiohttp_server(origin.app())
    replay = Replay(str(upstream.make_url("")).rstrip("/"))
    answers = Answers(replay)
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(answers), "127.0.0.1", 0
    )
    return origin, server.sockets[0].getsockname()[1], replay, server


def head(target: str, token: str, *fields: str) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: c", f"Authorization: {token}", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_pipelined_keys_come_back_in_order_with_the_origins_bytes_fetched_once(
    aiohttp_server: AiohttpServer,
) -> None:
    origin, port, replay, server = await ceiling_of(aiohttp_server)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # a miss between hits, pipelined in one write: the rest waits for its fetch
        keys = [("/users", "Bearer a", ()), ("/users", "Bearer a", ("Accept-Encoding: gzip",)),
                ("/clients", "Bearer b", ()), ("/users", "Bearer a", ())]  # fmt: skip
        writer.write(b"".join(head(t, token, *fields) for t, token, fields in keys))
        async with asyncio.timeout(10):
            answers = [await read_answer(reader) for _ in keys]
        for (target, token, fields), answer in zip(keys, answers, strict=True):
            expected = BODY + token.encode() + target.encode()
            assert answer.status_line == "HTTP/1.1 200 OK"
            assert answer.headers["x-cache"] == "HIT"
            assert "age" not in answer.headers
            assert "date" in answer.headers
            if fields:
                assert answer.headers["content-encoding"] == "gzip"
                assert gzip.decompress(answer.body) == expected
            else:
                assert answer.body == expected
        assert sorted(origin.asked.values()) == [1, 1, 1]  # one fetch per key
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await replay.close()


async def test_a_matching_if_none_match_is_a_304_and_a_close_closes(
    aiohttp_server: AiohttpServer,
) -> None:
    _, port, replay, server = await ceiling_of(aiohttp_server)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head("/users", "Bearer a"))
        async with asyncio.timeout(10):
            etag = (await read_answer(reader)).headers["etag"]
            writer.write(head("/users", "Bearer a", f"If-None-Match: W/{etag}"))
            not_modified = await read_answer(reader)
            writer.write(head("/users", "Bearer a", 'If-None-Match: "x"', "Connection: close"))
            last = await read_answer(reader)
            assert await reader.read() == b"", "closed after the answer"
        assert not_modified.status_line == "HTTP/1.1 304 Not Modified"
        assert (not_modified.body, not_modified.headers["etag"]) == (b"", etag)
        assert "content-length" not in not_modified.headers
        assert last.status_line == "HTTP/1.1 200 OK"
        assert last.headers["connection"] == "close"
        assert last.body == BODY + b"Bearer a/users"
        writer.close()
    finally:
        server.close()
        await replay.close()
