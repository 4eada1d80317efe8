"""One safe retry: a GET whose pooled connection the upstream had closed is sent again
once on a new connection; nothing else is ever retried.

The upstream here is a raw asyncio server, so that each test decides exactly what
happens to each connection (aiohttp's own server would not drop a request unanswered).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from ..conftest import AUTH, FakeClock, GatewayFactory

Client = TestClient[web.Request, web.Application]
BODY = (Path(__file__).parent.parent / "fixtures" / "users.upstream.json").read_bytes()
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
    + BODY
)
FAILURE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"


class RawUpstream:
    """Answers /users on HTTP/1.1 keep-alive connections, and does to each connection
    what ``mode`` says:

    - "drop-reused": answers a connection's first request; closes the connection when
      a second request arrives on it, without answering (the keep-alive race, every
      time);
    - "close-after-answer": closes every connection right after its first answer,
      without ``Connection: close``: when the next request arrives on it (the gateway
      sent it before the close reached it), or after half a second idle;
    - "reset-reused": as "drop-reused", with a reset (RST) instead of a close;
    - "drop-all": closes every connection as its first request arrives;
    - "hang": reads requests and never answers;
    - "ok": answers every request, and keeps the connection;
    - "503": answers 503 on a kept-alive connection;
    - "cut-short": answers a connection's first request; to a second one, sends part
      of a head (a status line and a cookie) and closes the connection.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0  # requests that arrived
        self.dropped = 0  # of them, the ones whose connection was closed unanswered
        self.connections = 0
        self.url = ""
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        answered = 0
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests += 1
                mode = self.mode
                if mode == "drop-all" or (mode == "drop-reused" and answered):
                    self.dropped += 1
                    return
                if mode == "reset-reused" and answered:
                    self.dropped += 1
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if mode == "hang":
                    await asyncio.sleep(3600)
                if mode == "cut-short" and answered:
                    writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=upstream-secret\r\n")
                    await writer.drain()
                    return
                writer.write(FAILURE if mode == "503" else ANSWER)
                await writer.drain()
                answered += 1
                if mode == "close-after-answer":
                    with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError):
                        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5)
                        self.requests += 1
                        self.dropped += 1
                    return
        finally:
            writer.close()


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream("drop-reused")
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield upstream
        # from Python 3.12 the server's close waits for its connections: a hanging
        # one is cut here
        for writer in upstream.writers:
            writer.transport.abort()
        server.close()


async def retries(client: Client) -> float:
    text = await (await client.get("/metrics")).text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_upstream_retries_total":
                assert sample.labels == {"route": "users"}
                return sample.value
    return 0.0


async def test_a_request_on_a_pooled_connection_the_upstream_closed_is_retried_on_a_new_one(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": closes kept-alive connections (idle
    timeout, restart).
    """
    client = await gateway_factory(raw_upstream.url, cache={"backend": "none"})
    for _ in range(10):
        response = await client.get("/users", headers=AUTH)
        assert response.status == 200
        assert (await response.json())["data"][0]["username"] == "admin"
    # every request that went out on a pooled connection was dropped, and sent again
    assert raw_upstream.dropped >= 4
    assert raw_upstream.requests == 10 + raw_upstream.dropped
    assert await retries(client) == raw_upstream.dropped


async def test_an_upstream_that_closes_every_kept_alive_connection_costs_no_caller_a_502(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": closes kept-alive connections (idle
    timeout, restart).
    """
    raw_upstream.mode = "close-after-answer"
    client = await gateway_factory(raw_upstream.url, cache={"backend": "none"})
    for _ in range(10):
        responses = await asyncio.gather(*(client.get("/users", headers=AUTH) for _ in range(20)))
        assert [response.status for response in responses] == [200] * 20
    # requests went out on connections the upstream was closing, and were sent again
    assert raw_upstream.dropped > 0
    assert raw_upstream.requests == 200 + raw_upstream.dropped
    assert await retries(client) == raw_upstream.dropped


async def test_a_pooled_connection_reset_before_the_answer_is_retried_on_a_new_one(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    raw_upstream.mode = "reset-reused"
    client = await gateway_factory(raw_upstream.url, cache={"backend": "none"})
    for _ in range(6):
        assert (await client.get("/users", headers=AUTH)).status == 200
    assert raw_upstream.dropped >= 2
    assert await retries(client) == raw_upstream.dropped


async def test_a_new_connection_closed_before_the_answer_is_not_retried(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    """Held for docs/deployment.md, "When the upstream fails": drops new connections before
    answering.
    """
    raw_upstream.mode = "drop-all"
    client = await gateway_factory(raw_upstream.url, cache={"backend": "none"})
    for sent in range(1, 4):
        response = await client.get("/users", headers=AUTH)
        assert response.status == 502
        body = await response.json(content_type=None)
        assert "closed the connection before answering" in body["detail"]
        assert raw_upstream.requests == sent, "one attempt: a failing upstream is not asked twice"
    assert await retries(client) == 0


async def test_a_timeout_is_not_retried(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    raw_upstream.mode = "hang"
    client = await gateway_factory(
        raw_upstream.url, cache={"backend": "none"}, upstream={"timeout_s": 0.3}
    )
    response = await client.get("/users", headers=AUTH)
    assert response.status == 504
    assert raw_upstream.requests == 1
    assert await retries(client) == 0


async def test_an_answer_is_not_retried(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    raw_upstream.mode = "503"
    client = await gateway_factory(raw_upstream.url, cache={"backend": "none"})
    for sent in range(1, 4):
        assert (await client.get("/users", headers=AUTH)).status == 502
        assert raw_upstream.requests == sent
    assert raw_upstream.connections == 1, "the answered connection stays in the pool"
    assert await retries(client) == 0


async def test_an_answer_cut_short_is_not_retried(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    raw_upstream.mode = "cut-short"
    client = await gateway_factory(raw_upstream.url, cache={"backend": "none"})
    assert (await client.get("/users", headers=AUTH)).status == 200
    response = await client.get("/users", headers=AUTH)  # the pooled connection
    assert response.status == 502
    assert raw_upstream.requests == 2, "the upstream began to answer: not sent again"
    detail = (await response.json(content_type=None))["detail"]
    assert "after part of its answer's head" in detail
    assert "upstream-secret" not in detail, "what the upstream sent is not quoted"
    readiness = await (await client.get("/readyz")).text()
    assert "upstream-secret" not in readiness
    assert await retries(client) == 0


async def test_an_upstream_that_drops_every_request_is_never_asked_twice_once_it_fails(
    raw_upstream: RawUpstream, gateway_factory: GatewayFactory
) -> None:
    raw_upstream.mode = "ok"
    ticks = FakeClock()
    client = await gateway_factory(raw_upstream.url, None, ticks, cache={"backend": "none"})
    responses = await asyncio.gather(*(client.get("/users", headers=AUTH) for _ in range(8)))
    assert {response.status for response in responses} == {200}
    assert raw_upstream.connections >= 5  # pooled now

    raw_upstream.mode = "drop-all"
    before = raw_upstream.requests
    statuses = [(await client.get("/users", headers=AUTH)).status for _ in range(6)]
    assert statuses == [502] * 5 + [503]
    # the first failure was the keep-alive race as far as the gateway could tell, and
    # was sent again once; the next ones came in a row, and were not
    assert raw_upstream.requests - before == 6
    assert await retries(client) == 1

    # after the reset time the trial goes out once, and is not sent again
    ticks.advance(5)
    before = raw_upstream.requests
    assert (await client.get("/users", headers=AUTH)).status == 502
    assert raw_upstream.requests - before == 1
    assert await retries(client) == 1
