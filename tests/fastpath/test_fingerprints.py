"""Each open connection's token fingerprint, remembered for the life of the connection."""

from __future__ import annotations

import asyncio
import gc

import aiohttp
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.fastpath.connection import FastPathServer, GatewayConnection
from gateway.fastpath.fingerprints import (
    ENTRY_COST_BYTES,
    REMEMBERED_HEADER_MAX,
    ConnectionFingerprints,
)
from gateway.http.app import create_app
from gateway.records.keys import Keyer

from ..conftest import base_url, gateway_client, make_settings, token_upstream


class CountingKeyer(Keyer):
    def __init__(self, secret: bytes = b"s" * 32) -> None:
        super().__init__(namespace="rg", base_url="http://upstream", secret=secret)
        self.computed: list[str] = []

    def fingerprint(self, authorization: str) -> str:
        self.computed.append(authorization)
        return super().fingerprint(authorization)


def test_a_connection_computes_each_token_s_fingerprint_once_in_a_row() -> None:
    keyer = CountingKeyer()
    fingerprints = ConnectionFingerprints()
    one, two = object(), object()
    a = fingerprints.of(one, keyer, "Bearer aaa")
    assert a == Keyer(namespace="x", base_url="http://y", secret=b"s" * 32).fingerprint(
        "Bearer aaa"
    )
    assert fingerprints.of(one, keyer, "Bearer aaa") == a
    assert fingerprints.known(one, keyer, "Bearer aaa") == a
    assert keyer.computed == ["Bearer aaa"]
    # another token on the same connection, the same token on another connection
    b = fingerprints.of(one, keyer, "Bearer bbb")
    assert b != a
    assert fingerprints.known(one, keyer, "Bearer aaa") is None
    assert fingerprints.of(two, keyer, "Bearer aaa") == a
    assert keyer.computed == ["Bearer aaa", "Bearer bbb", "Bearer aaa"]
    # a new keyer (a reload with another secret) is never answered with the old one's
    other = CountingKeyer(secret=b"t" * 32)
    assert fingerprints.known(one, other, "Bearer bbb") is None
    assert fingerprints.of(one, other, "Bearer bbb") not in (a, b)
    assert len(fingerprints) == 2
    fingerprints.forget(one)
    fingerprints.forget(one)  # twice is harmless
    assert fingerprints.known(one, other, "Bearer bbb") is None
    assert len(fingerprints) == 1


def test_what_is_remembered_stays_within_its_bytes() -> None:
    """Anyone can send tokens (they are remembered before the upstream sees them), and
    a server may never report a closed connection: the table is bounded in bytes."""
    keyer = CountingKeyer()
    per_entry = len("Bearer " + "a" * 93) + ENTRY_COST_BYTES
    fingerprints = ConnectionFingerprints(max_bytes=3 * per_entry)
    for _ in range(10):
        fingerprints.of(object(), keyer, "Bearer " + "a" * 93)
        assert fingerprints.size_bytes <= 3 * per_entry
        assert 1 <= len(fingerprints) <= 3
    # a header longer than REMEMBERED_HEADER_MAX is fingerprinted, never kept
    long = "Bearer " + "x" * REMEMBERED_HEADER_MAX
    connection = object()
    before = len(keyer.computed)
    assert fingerprints.of(connection, keyer, long) == fingerprints.of(connection, keyer, long)
    assert len(keyer.computed) == before + 2
    assert fingerprints.known(connection, keyer, long) is None
    # a connection that switches tokens leaves no bytes behind for the old one
    fingerprints = ConnectionFingerprints()
    fingerprints.of(connection, keyer, "Bearer one")
    fingerprints.of(connection, keyer, "Bearer two-longer")
    assert fingerprints.size_bytes == len("Bearer two-longer") + ENTRY_COST_BYTES
    fingerprints.forget(connection)
    assert fingerprints.size_bytes == 0


def test_the_remembered_header_is_never_in_a_repr() -> None:
    fingerprints = ConnectionFingerprints()
    fingerprints.of(object(), CountingKeyer(), "Bearer wrong-secret-token")
    assert "wrong-secret-token" not in repr(fingerprints._last)


async def test_tokens_switching_on_one_connection_each_get_their_own_data(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, fast_path: bool
) -> None:
    tokens = ["token-0-secret", "token-1-secret"]
    upstream = await aiohttp_server(token_upstream(tokens))
    app = create_app(make_settings(base_url(upstream), cache={"backend": "memory"}))
    client = await gateway_client(aiohttp_client, app)  # closed by the fixture
    server = client.server.runner.server if client.server.runner else None
    # the fast path remembers the token's fingerprint per connection; plain aiohttp
    # remembers nothing of a connection
    fingerprints = server.hits.fingerprints if isinstance(server, FastPathServer) else None
    assert (fingerprints is not None) == fast_path
    url = str(client.make_url("/users"))
    order = [0, 0, 1, 1, 0, 1, 0, 0, 1]
    # one connection for every request: the caller's keep-alive pool of size 1; no
    # Accept-Encoding (a head that has one is aiohttp's to answer)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), skip_auto_headers=("Accept-Encoding",)
    ) as session:
        seen = []
        for n in order:
            headers = {"Authorization": f"Bearer {tokens[n]}"}
            async with session.get(url, headers=headers) as response:
                body = await response.json()
                seen.append((response.headers["X-Cache"], body["data"][0]["username"]))
        assert [user for _, user in seen] == [f"user-{n}" for n in order]
        assert [cache for cache, _ in seen] == ["MISS", "HIT", "MISS"] + ["HIT"] * 6
        assert fingerprints is None or len(fingerprints) == 1
    if fingerprints is None:
        return
    # the connection has closed: what it sent is forgotten
    for _ in range(200):
        if len(fingerprints) == 0:
            break
        await asyncio.sleep(0.01)
    assert len(fingerprints) == 0


async def test_a_closed_connection_is_freed_without_the_garbage_collector(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    """What a connection remembers holds nothing of it: once closed, it is freed by its
    last reference going, not left in a cycle for a collection to find (a caller
    opening a connection per request would otherwise make garbage of each)."""
    tokens = ["token-0-secret"]
    upstream = await aiohttp_server(token_upstream(tokens))
    app = create_app(
        make_settings(base_url(upstream), server={"fast_path": True}, cache={"backend": "memory"})
    )
    client = await gateway_client(aiohttp_client, app)
    server = client.server.runner.server if client.server.runner else None
    assert isinstance(server, FastPathServer)
    head = b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer token-0-secret\r\n\r\n"
    gc.collect()
    gc.disable()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        for _ in range(2):  # a miss, then a hit from the bytes: its token remembered
            writer.write(head)
            await reader.readuntil(b"\r\n\r\n")
        assert len(server.hits.fingerprints) == 1
        assert len(live_connections()) == 1
        writer.close()
        await writer.wait_closed()
        for _ in range(200):
            if not live_connections():
                break
            await asyncio.sleep(0.01)
        assert live_connections() == [], "freed with no collection"
        assert len(server.hits.fingerprints) == 0
    finally:
        gc.enable()


def live_connections() -> list[object]:
    """The fast path's connections the interpreter holds, reachable or not."""
    return [o for o in gc.get_objects() if isinstance(o, GatewayConnection)]
