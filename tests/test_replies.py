"""Fresh hits sent as ready-made bytes: the same fields aiohttp sends for the same
reply, framed right on a kept-alive connection, and aiohttp's own answer for every
request the bytes would not fit. A plain GET's hit is answered from the bytes the
connection receives (gateway.fastpath.connection.GatewayConnection): in order with every other
request on the connection, for its own token only, never after a purge."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from multidict import CIMultiDict

from gateway.http.app import create_app
from gateway.cache.entry import CacheEntry
from gateway.demo import REQUEST_LOG
from gateway.http.replies import HitHeads, ReadyReply, WireResponse
from gateway.http.records import PIPELINE, RECORDS

from .conftest import TOKEN, GatewayTestServer, base_url, make_settings

ADMIN = "admin-token-0123456789abcdef"

LIST = "/expenses?limit=5"
ACCOUNT = "/accounts/Caja%20chica%20Bogot%C3%A1"  # an id route (a HEAD: its handler)


@dataclass
class Answer:
    status_line: str
    fields: list[tuple[str, str]]  # as sent, in order, names lower-cased
    body: bytes

    @property
    def headers(self) -> CIMultiDict[str]:
        return CIMultiDict(self.fields)

    def comparable(self) -> list[tuple[str, str]]:
        """The fields, sorted, with the values that differ per request blanked."""
        return sorted((n, "*" if n in ("date", "x-request-id") else v) for n, v in self.fields)


async def read_answer(reader: asyncio.StreamReader, *, head: bool = False) -> Answer:
    """One HTTP/1.x answer, parsed strictly: CRLF lines, one ``name: value`` per
    field, the body exactly ``Content-Length`` bytes."""
    block = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = block[:-4].decode("latin-1").split("\r\n")
    fields = []
    for line in lines:
        name, sep, value = line.partition(": ")
        assert sep, line
        assert (name, value) == (name.strip(), value.strip()), line
        fields.append((name.lower(), value))
    answer = Answer(status_line, fields, b"")
    if not head:
        answer.body = await reader.readexactly(int(answer.headers["content-length"]))
    return answer


def request_bytes(path: str, *, method: str = "GET", version: str = "1.1", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: gateway", f"Authorization: Bearer {TOKEN}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@contextlib.asynccontextmanager
async def gateway_on(
    upstream: TestServer, backend: str
) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], int]]:
    """The gateway in front of ``upstream`` with ``cache.backend = backend``, on a
    loopback port: its test client and the port."""
    app = create_app(make_settings(base_url(upstream), cache={"backend": backend}))
    client: TestClient[web.Request, web.Application] = TestClient(GatewayTestServer(app))
    await client.start_server()
    port = client.port
    assert port is not None
    try:
        yield client, port
    finally:
        await client.close()


@pytest.fixture
async def served(upstream: TestServer) -> AsyncIterator[tuple[web.Application, int]]:
    async with gateway_on(upstream, "memory") as (client, port):
        for path in (LIST, ACCOUNT):  # a miss stores each; from then on they are hits
            response = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert response.headers["X-Cache"] == "MISS"
        yield client.app, port


def count_routed_hits(app: web.Application, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests reach the front door's or a route's hit (made into a
    web.Request by aiohttp); a hit answered from the connection's bytes does not."""
    records = app[RECORDS]
    hit = records.hit
    counted = [0]

    def counting(*args: Any) -> Any:
        counted[0] += 1
        return hit(*args)

    monkeypatch.setattr(records, "hit", counting)
    return counted


def count_full_reads(app: web.Application, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests take the pipeline's full way (a ready-made hit does not)."""
    pipeline = app[PIPELINE]
    read = pipeline.read
    counted = [0]

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return await read(*args, **kwargs)

    monkeypatch.setattr(pipeline, "read", counting)
    return counted


def count_ready_replies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many answers are sent as a ReadyReply."""
    prepare = ReadyReply.prepare
    counted = [0]

    async def counting(self: ReadyReply, request: web.BaseRequest) -> Any:
        counted[0] += 1
        return await prepare(self, request)

    monkeypatch.setattr(ReadyReply, "prepare", counting)
    return counted


async def exchange(port: int, *requests: bytes, head: bool = False) -> list[Answer]:
    """Send ``requests`` in one write on one connection; read an answer to each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(requests))
    async with asyncio.timeout(10):  # a wrong Content-Length would leave it waiting
        answers = [await read_answer(reader, head=head) for _ in requests]
    writer.close()
    await writer.wait_closed()
    return answers


@pytest.mark.parametrize("path", [LIST, ACCOUNT])
async def test_ready_made_answers_send_what_aiohttp_sends_for_the_same_reply(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    routed_hits = count_routed_hits(app, monkeypatch)
    # both pipelined on one connection: the ready-made bytes must frame exactly; the
    # second takes the full way (its Cache-Control): aiohttp's own web.Response
    ready, full = await exchange(
        port, request_bytes(path), request_bytes(path, Cache_Control="max-age=60")
    )
    # and over HTTP/1.0
    (own,) = await exchange(port, request_bytes(path, version="1.0", Cache_Control="max-age=60"))
    assert full_reads == [2], "only the first took no full way"
    # the list route's plain GET is answered from the connection's bytes; the id has
    # a percent escape, which gateway.fastpath.request_head leaves to aiohttp and the front
    # door; the other two are offered to the front door's hit too, which declines them
    assert routed_hits == ([3] if "%" in path else [2])
    assert ready.status_line == full.status_line == "HTTP/1.1 200 OK"
    assert own.status_line == "HTTP/1.0 200 OK"
    assert ready.body == full.body == own.body
    assert ready.comparable() == full.comparable() == own.comparable()
    assert ready.headers["x-cache"] == full.headers["x-cache"] == "HIT"
    assert ready.headers["content-length"] == str(len(ready.body))
    assert ready.headers["x-request-id"] != full.headers["x-request-id"]
    assert "connection" not in ready.headers
    # RFC 9110 IMF-fixdate, as aiohttp writes it
    imf_fixdate = r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT"
    for answer in (ready, full, own):
        assert re.fullmatch(imf_fixdate, answer.headers["date"])
    # which way wrote each: the ready-made bytes end with the request id, aiohttp's
    # own answer with the fields it adds (Content-Length, Date, Server)
    assert ready.fields[-1][0] == "x-request-id"
    assert full.fields[-1][0] != "x-request-id"
    assert own.fields[-1][0] != "x-request-id"


async def test_a_full_way_reply_sends_what_aiohttp_sends_for_the_same_reply(
    upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caching off: every answer is the pipeline's. A kept-alive HTTP/1.1 GET's is a
    ReadyReply, framed right when pipelined; HTTP/1.0's and Connection: close's are
    aiohttp's own web.Response, with the same fields."""
    prepared = count_ready_replies(monkeypatch)
    async with gateway_on(upstream, "none") as (_, port):
        first, second = await exchange(port, request_bytes(LIST), request_bytes(ACCOUNT))
        assert prepared == [2]
        (own,) = await exchange(port, request_bytes(LIST, version="1.0"))
        (closing,) = await exchange(port, request_bytes(LIST, Connection="close"))
        assert prepared == [2]
    assert first.status_line == second.status_line == closing.status_line == "HTTP/1.1 200 OK"
    assert first.body == own.body == closing.body
    assert orjson.loads(second.body)["id"] == "Caja chica Bogotá"
    assert first.comparable() == own.comparable()
    assert [name for name, _ in first.fields] == [name for name, _ in own.fields]  # in order
    assert [field for field in first.comparable() if field[0] != "connection"] == [
        field for field in closing.comparable() if field[0] != "connection"
    ]
    assert first.headers["x-cache"] == "BYPASS"
    assert first.headers["cache-status"] == "records-gateway; fwd=bypass"
    assert first.headers["content-length"] == str(len(first.body))
    assert first.headers["content-type"] == "application/json"
    assert re.fullmatch(r'"[0-9a-f]{32}"', first.headers["etag"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert "connection" not in first.headers
    assert closing.headers["connection"] == "close"


async def test_pipelined_hits_each_get_a_whole_answer_and_their_own_request_id(
    served: tuple[web.Application, int],
) -> None:
    _, port = served
    answers = await exchange(
        port,
        request_bytes(LIST),
        request_bytes(ACCOUNT, X_Request_ID="caller-id-1"),
        request_bytes(LIST),
    )
    assert [a.headers["x-cache"] for a in answers] == ["HIT"] * 3
    assert answers[0].body == answers[2].body != answers[1].body
    ids = [a.headers["x-request-id"] for a in answers]
    assert ids[1] == "caller-id-1"
    assert len(set(ids)) == 3


@pytest.mark.parametrize(
    ("request_", "status_line", "connection"),
    [
        (request_bytes(LIST, version="1.0"), "HTTP/1.0 200 OK", None),
        (request_bytes(LIST, Connection="close"), "HTTP/1.1 200 OK", "close"),
        (request_bytes(ACCOUNT, version="1.0"), "HTTP/1.0 200 OK", None),
    ],
)
async def test_a_hit_the_bytes_would_not_fit_is_aiohttp_s_own_answer(
    served: tuple[web.Application, int],
    monkeypatch: pytest.MonkeyPatch,
    request_: bytes,
    status_line: str,
    connection: str | None,
) -> None:
    """HTTP/1.0 or ``Connection: close``: still a hit without the pipeline, answered
    the way aiohttp answers such a request, and the connection closed after it."""
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_)
    async with asyncio.timeout(10):  # a hang would be a connection left open
        answer = await read_answer(reader)
        assert await reader.read() == b"", "the gateway closed the connection"
    writer.close()
    await writer.wait_closed()
    assert full_reads == [0]
    assert answer.status_line == status_line
    assert answer.headers["x-cache"] == "HIT"
    assert answer.headers.get("connection") == connection
    assert len(answer.body) == int(answer.headers["content-length"]) > 0


async def test_a_head_on_a_hit_has_the_fields_and_no_body(
    served: tuple[web.Application, int],
) -> None:
    _, port = served
    head, get = await exchange(port, request_bytes(ACCOUNT, method="HEAD"), head=True) + [
        (await exchange(port, request_bytes(ACCOUNT)))[0]
    ]
    assert head.status_line == "HTTP/1.1 200 OK"
    assert head.headers["x-cache"] == "HIT"
    assert head.comparable() == get.comparable()
    assert head.body == b""


def test_hit_heads_follow_each_entry_and_second_and_stay_bounded() -> None:
    made = HitHeads(size=2)
    one = CacheEntry(body=b"{}", etag='"one"', stored_at=1000.0, ttl_s=60)
    two = CacheEntry(body=b"[1,2]", etag='"two"', stored_at=1000.0, ttl_s=30)
    first = made(one, 1000.5)
    fields = {
        "Content-Type": "application/json",
        "X-Cache": "HIT",
        "Cache-Status": "records-gateway; hit; ttl=59",
        "Age": "0",
        "Cache-Control": "private, max-age=59",
        "ETag": '"one"',
    }
    assert dict(first.headers) == fields
    wire = first.wire.decode("latin-1")
    assert wire.startswith("HTTP/1.1 200 OK\r\n")
    assert wire.endswith("\r\n")
    assert not wire.endswith("\r\n\r\n")  # Date and the request id follow
    lines = wire.split("\r\n")[1:-1]
    assert lines[: len(fields)] == [f"{name}: {value}" for name, value in fields.items()]
    assert lines[len(fields)] == "Content-Length: 2"
    assert lines[len(fields) + 1].startswith("Server: ")
    with pytest.raises(TypeError):  # shared by every request: read-only
        first.headers["X-Request-ID"] = "mine"  # type: ignore[index]
    assert made(one, 1000.5) is first
    assert made(two, 1012.0).headers["Cache-Status"] == "records-gateway; hit; ttl=18"
    assert made(two, 1012.0).headers["Age"] == "12"
    assert b"Content-Length: 5\r\n" in made(two, 1012.0).wire
    later = made(one, 1030.2)  # a third: the kept ones are dropped, not mixed up
    assert (later.headers["Age"], later.headers["Cache-Control"], later.headers["ETag"]) == (
        "30",
        "private, max-age=29",
        '"one"',
    )
    assert made(two, 1012.0).headers["ETag"] == '"two"'


class RecordingWriter:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def write_eof(self, chunk: bytes = b"") -> None:
        self.sent.append(chunk)


async def test_a_ready_made_answer_once_sent_is_what_aiohttp_s_own_is() -> None:
    """The server and anything that inspects an answer read these after prepare()."""
    entry = CacheEntry(body=b'{"data":[]}', etag='"e"', stored_at=1000.0, ttl_s=60)
    response = WireResponse(HitHeads()(entry, 1001.0), b"Date: now\r\n", "id-1", entry.body)
    assert response.status == 200
    assert response.keep_alive
    assert not response.prepared
    writer = RecordingWriter()
    request = make_mocked_request("GET", "/users", writer=writer)
    assert await response.prepare(request) is cast(Any, writer)
    (wire,) = writer.sent
    assert wire.endswith(b"Date: now\r\nX-Request-ID: id-1\r\n\r\n" + entry.body)
    assert response.prepared
    assert response.body_length == len(wire)
    assert "eof" in repr(response)
    await response.write_eof()  # the end was sent with the rest: nothing more goes out
    assert await response.prepare(request) is None
    assert writer.sent == [wire]
    response.force_close()
    assert not response.keep_alive


class HeadWriter(RecordingWriter):
    output_size = 0

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        head = status_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sent.append((head + "\r\n").encode("latin-1"))

    async def write_eof(self, chunk: bytes = b"") -> None:
        await super().write_eof(chunk)
        self.output_size = sum(len(part) for part in self.sent)


async def test_a_miss_is_a_ready_reply_with_the_fields_of_aiohttp_s_own(
    upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caching on: a kept-alive HTTP/1.1 miss is a ReadyReply, an HTTP/1.0 miss is
    web.Response; both MISS, stored, with the same fields in the same order."""
    prepared = count_ready_replies(monkeypatch)
    async with gateway_on(upstream, "memory") as (_, port):
        (ready,) = await exchange(port, request_bytes("/expenses?limit=3"))
        (own,) = await exchange(port, request_bytes("/expenses?limit=4", version="1.0"))
        (hit,) = await exchange(port, request_bytes("/expenses?limit=3"))
    assert prepared == [1]
    assert ready.status_line == "HTTP/1.1 200 OK"
    assert [name for name, _ in ready.fields] == [name for name, _ in own.fields]
    for answer in (ready, own):
        assert answer.headers["x-cache"] == "MISS"
        assert answer.headers["cache-status"] == "records-gateway; fwd=miss; stored"
        assert answer.headers["content-length"] == str(len(answer.body))
    assert len(orjson.loads(ready.body)["data"]) == 3
    assert len(orjson.loads(own.body)["data"]) == 4
    assert (hit.headers["x-cache"], hit.body, hit.headers["etag"]) == (
        "HIT",
        ready.body,
        ready.headers["etag"],
    )


async def test_a_full_way_reply_once_sent_is_what_aiohttp_s_own_is() -> None:
    headers = CIMultiDict({"Content-Type": "application/json", "X-Cache": "MISS"})
    response = ReadyReply(b'{"data":[]}', headers)
    response.headers["X-Request-ID"] = "id-2"  # as the edge sets it
    assert (response.status, response.keep_alive, response.prepared) == (200, True, False)
    writer = HeadWriter()
    request = make_mocked_request("GET", "/users", writer=writer)
    assert await response.prepare(request) is cast(Any, writer)
    head, body = writer.sent
    assert body == b'{"data":[]}'
    fields = head.decode("latin-1").split("\r\n")
    assert fields[0] == "HTTP/1.1 200 OK"
    assert fields[1:4] == ["Content-Type: application/json", "X-Cache: MISS", "X-Request-ID: id-2"]
    assert "Content-Length: 11" in fields
    assert response.prepared
    assert response.body_length == len(head) + len(body)
    await response.write_eof()
    assert await response.prepare(request) is None
    assert writer.sent == [head, body]
    response.force_close()
    assert not response.keep_alive


def split_in_two(request: bytes) -> tuple[bytes, bytes]:
    middle = len(request) // 2
    return request[:middle], request[middle:]


async def test_a_head_that_arrives_in_pieces_is_answered_once_whole(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    app, port = served
    routed_hits = count_routed_hits(app, monkeypatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(10):
        for piece in (*split_in_two(request_bytes(LIST)), b"GET /expenses?limit=5 HTTP/1.1\r"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.05)  # separate segments, separate data_received calls
        writer.write(f"\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        answers = [await read_answer(reader), await read_answer(reader)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-cache"] for a in answers] == ["HIT", "HIT"]
    assert answers[0].body == answers[1].body
    assert routed_hits == [0]


async def test_answers_keep_the_order_of_requests_whichever_way_each_is_answered(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hit behind a miss waits for it; a request with a body hands the connection
    to aiohttp, and the hits behind it are still answered, in order."""
    app, port = served
    full_reads = count_full_reads(app, monkeypatch)
    post = b"POST /expenses HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello"
    answers = await exchange(
        port,
        request_bytes(LIST, X_Request_ID="r-1"),
        request_bytes("/expenses?limit=6", X_Request_ID="r-2"),  # not cached yet
        request_bytes(LIST, X_Request_ID="r-3"),
        post,
        request_bytes(LIST, X_Request_ID="r-5"),
        request_bytes("/expenses?limit=6", X_Request_ID="r-6"),
    )
    assert [a.status_line for a in answers] == ["HTTP/1.1 200 OK"] * 3 + [
        "HTTP/1.1 405 Method Not Allowed"
    ] + ["HTTP/1.1 200 OK"] * 2
    assert [a.headers.get("x-cache") for a in answers] == [
        "HIT",
        "MISS",
        "HIT",
        None,
        "HIT",
        "HIT",
    ]
    ids = [a.headers["x-request-id"] for a in answers]
    assert ids[:3] == ["r-1", "r-2", "r-3"]
    assert ids[4:] == ["r-5", "r-6"]
    assert answers[0].body == answers[2].body == answers[4].body != answers[1].body
    assert answers[1].body == answers[5].body
    assert full_reads == [1]


async def test_a_hit_is_only_ever_for_the_token_that_asked(
    served: tuple[web.Application, int], upstream: TestServer
) -> None:
    """One connection, two tokens: the second token's identical request is not
    answered from the first's entry, and the first's are hits again after it."""
    _, port = served
    calls = len(upstream.app[REQUEST_LOG].entries)
    other = request_bytes(LIST).replace(TOKEN.encode(), b"someone-else-token")
    answers = await exchange(port, request_bytes(LIST), other, request_bytes(LIST))
    assert [a.status_line for a in answers] == [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 401 Unauthorized",
        "HTTP/1.1 200 OK",
    ]
    assert answers[1].headers["content-type"] == "application/problem+json"
    assert [a.headers.get("x-cache") for a in (answers[0], answers[2])] == ["HIT", "HIT"]
    assert len(upstream.app[REQUEST_LOG].entries) == calls + 1, "the other token went upstream"
    assert b"someone-else-token" not in answers[1].body


async def test_a_purge_reaches_a_connection_that_repeats_the_same_request(
    upstream: TestServer,
) -> None:
    app = create_app(
        make_settings(base_url(upstream), cache={"backend": "memory"}, admin={"token": ADMIN})
    )
    client: TestClient[web.Request, web.Application] = TestClient(GatewayTestServer(app))
    await client.start_server()
    try:
        port = client.port
        assert port is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        seen = []
        async with asyncio.timeout(10):
            for step in range(4):
                if step == 2:
                    purged = await client.delete(
                        "/admin/cache", headers={"Authorization": f"Bearer {ADMIN}"}
                    )
                    assert purged.status == 200
                writer.write(request_bytes(LIST))
                seen.append((await read_answer(reader)).headers["x-cache"])
        writer.close()
        await writer.wait_closed()
    finally:
        await client.close()
    assert seen == ["MISS", "HIT", "MISS", "HIT"]


async def test_many_pipelined_hits_a_caller_does_not_read_yet_all_arrive_in_order(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers a caller does not read fill the socket; the rest wait for it to drain
    (aiohttp's way, which the front door's hit takes) instead of piling up in the
    process, and none is lost."""
    app, port = served
    page = "/expenses?limit=100"  # about 100 KB an answer
    assert (await exchange(port, request_bytes(page)))[0].headers["x-cache"] == "MISS"
    routed_hits = count_routed_hits(app, monkeypatch)
    count = 200  # about 20 MB of answers, far more than the socket buffers hold
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(request_bytes(page, X_Request_ID=f"r-{n}") for n in range(count)))
    await asyncio.sleep(0.5)  # the gateway writes until the socket is full
    async with asyncio.timeout(30):
        answers = [await read_answer(reader) for _ in range(count)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-request-id"] for a in answers] == [f"r-{n}" for n in range(count)]
    assert {a.headers["x-cache"] for a in answers} == {"HIT"}
    assert len({a.body for a in answers}) == 1
    assert 0 < routed_hits[0] < count, "some were written at once, the rest waited"


async def test_a_connection_answered_from_its_bytes_closes_when_idle_not_while_busy(
    upstream: TestServer,
) -> None:
    """The keep-alive timeout counts from the last answer, as for aiohttp's own."""
    app = create_app(make_settings(base_url(upstream), cache={"backend": "memory"}))
    server = GatewayTestServer(app)
    await server.start_server(keepalive_timeout=1.0)  # the runner's options
    client: TestClient[web.Request, web.Application] = TestClient(server)
    await client.start_server()
    try:
        port = client.port
        assert port is not None
        await client.get(LIST, headers={"Authorization": f"Bearer {TOKEN}"})
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        async with asyncio.timeout(20):
            for _ in range(12):  # 2.4 s of requests, past the timeout from the first
                writer.write(request_bytes(LIST))
                assert (await read_answer(reader)).headers["x-cache"] == "HIT"
                await asyncio.sleep(0.2)
            assert await reader.read() == b"", "closed once idle"
        writer.close()
        await writer.wait_closed()
    finally:
        await client.close()


async def read_all(reader: asyncio.StreamReader, count: int) -> tuple[list[Answer], bytes]:
    """``count`` answers, then whatever comes until the gateway closes (b"" if it
    does so at once)."""
    async with asyncio.timeout(10):  # guards against a hang only
        answers = [await read_answer(reader) for _ in range(count)]
        return answers, await reader.read()


async def test_a_stream_of_empty_lines_is_left_to_aiohttp(
    served: tuple[web.Application, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty lines are no request (aiohttp skips them): after the first, the connection
    is aiohttp's alone, not read here four bytes at a time."""
    app, port = served
    routed_hits = count_routed_hits(app, monkeypatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(LIST) + b"\r\n\r\n" * 20_000 + request_bytes(LIST))
    async with asyncio.timeout(10):
        answers = [await read_answer(reader) for _ in range(2)]
    writer.close()
    await writer.wait_closed()
    assert [a.headers["x-cache"] for a in answers] == ["HIT", "HIT"]
    assert routed_hits == [1], "the second went through aiohttp and the front door"


async def test_a_request_aiohttp_waits_to_see_the_rest_of_keeps_the_connection_aiohttp_s(
    served: tuple[web.Application, int],
) -> None:
    """An HTTP/2 preface's first line: aiohttp's parser waits for the rest, then refuses
    it, as it did before hits were answered from the bytes; what follows is not
    answered as requests of its own."""
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"PRI * HTTP/2.0\r\n\r\n" + request_bytes(LIST) + request_bytes(LIST))
    (answer,), rest = await read_all(reader, 1)
    writer.close()
    await writer.wait_closed()
    assert answer.status_line.endswith(" 400 Bad Request")  # aiohttp says HTTP/1.0 here
    assert answer.headers["content-type"] == "application/problem+json"
    assert rest == b"", "closed after the 400, nothing answered from the cache"


async def test_proxy_connection_close_is_honoured_as_aiohttp_reads_it(
    served: tuple[web.Application, int],
) -> None:
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(LIST, Proxy_Connection="close") + request_bytes(LIST))
    (answer,), rest = await read_all(reader, 1)
    writer.close()
    await writer.wait_closed()
    assert answer.headers["x-cache"] == "HIT"
    assert answer.headers["connection"] == "close"
    assert rest == b""


async def test_an_unfinished_head_over_the_limits_is_refused_at_once(
    served: tuple[web.Application, int],
) -> None:
    """A request line longer than the server allows gets its problem while the line is
    still unfinished, as from aiohttp alone (not only once the head ends)."""
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /expenses?limit=3&x=" + b"a" * 40_000)  # no line end, ever
    (answer,), rest = await read_all(reader, 1)
    writer.close()
    await writer.wait_closed()
    assert answer.status_line.endswith(" 400 Bad Request")  # aiohttp says HTTP/1.0 here
    assert orjson.loads(answer.body)["type"].endswith("malformed-request")
    assert rest == b""


async def test_a_field_over_the_connection_s_own_limit_is_refused_not_answered(
    served: tuple[web.Application, int],
) -> None:
    """The served gateway here has aiohttp's default limits (8190 bytes a field): a
    head that passes them is a hit, one that does not is refused, whichever way it
    would be answered."""
    _, port = served
    within, beyond = (request_bytes(LIST, X_Pad="p" * size) for size in (6_000, 10_000))
    answers = await exchange(port, within)
    assert answers[0].headers["x-cache"] == "HIT"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(beyond)
    (answer,), rest = await read_all(reader, 1)
    writer.close()
    await writer.wait_closed()
    assert answer.status_line.endswith(" 400 Bad Request")  # aiohttp says HTTP/1.0 here
    assert rest == b""


async def test_hits_pipelined_behind_a_miss_past_aiohttp_s_queue_are_all_answered(
    served: tuple[web.Application, int],
) -> None:
    """More requests behind a miss than aiohttp queues (32): aiohttp takes them all,
    its parser holding back what does not fit, and answers each in turn."""
    _, port = served
    count = 80
    requests = [request_bytes("/expenses?limit=9", X_Request_ID="r-miss")]
    requests += [request_bytes(LIST, X_Request_ID=f"r-{n}") for n in range(count)]
    answers = await exchange(port, *requests)
    assert [a.headers["x-request-id"] for a in answers] == ["r-miss"] + [
        f"r-{n}" for n in range(count)
    ]
    assert answers[0].headers["x-cache"] == "MISS"
    assert {a.headers["x-cache"] for a in answers[1:]} == {"HIT"}


@pytest.mark.parametrize(
    "start",
    [
        b"GET /expenses HTTP/1.1\r\nBad Header\r\n",  # a field line without a colon
        b"G\x01T /expenses HTTP/1.1\r\n",  # a control byte in the method
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # TLS on the HTTP port
    ],
)
async def test_an_unfinished_head_aiohttp_refuses_is_refused_at_once(
    served: tuple[web.Application, int], start: bytes
) -> None:
    """Not held until the head ends (or the idle timeout closes the connection without
    a word): aiohttp's parser sees it and answers at once, as before."""
    _, port = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(start)
    (answer,), rest = await read_all(reader, 1)
    writer.close()
    await writer.wait_closed()
    assert answer.status_line.endswith(" 400 Bad Request")
    assert rest == b""


async def test_requests_behind_a_busy_connection_stay_within_aiohttp_s_queue(
    upstream: TestServer,
) -> None:
    """Heads that arrive while aiohttp handles the connection's earlier request go to
    it in one piece, so its parser holds back what does not fit its queue (32) rather
    than each becoming a queued request; all are answered, in order."""
    app = create_app(make_settings(base_url(upstream), cache={"backend": "memory"}))
    client: TestClient[web.Request, web.Application] = TestClient(GatewayTestServer(app))
    await client.start_server()
    try:
        port = client.port
        runner = client.server.runner
        assert port is not None
        assert runner is not None
        assert runner.server is not None
        count = 400
        requests = [request_bytes("/expenses?limit=11", X_Request_ID="r-miss")]
        requests += [request_bytes("/healthz", X_Request_ID=f"r-{n}") for n in range(count)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(requests))
        await writer.drain()
        queued = [0]
        for _ in range(40):  # before anything is read
            queued += [len(cast(Any, c)._messages) for c in runner.server.connections]
            await asyncio.sleep(0.002)
        async with asyncio.timeout(30):
            answers = [await read_answer(reader) for _ in range(count + 1)]
        writer.close()
        await writer.wait_closed()
    finally:
        await client.close()
    assert [a.headers["x-request-id"] for a in answers] == ["r-miss"] + [
        f"r-{n}" for n in range(count)
    ]
    assert 0 < max(queued) <= 32
