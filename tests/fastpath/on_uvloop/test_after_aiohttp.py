"""The fast path on the event loop the gateway serves on (uvloop), where the order of
I/O and of ready callbacks differs from asyncio's own: a caller that sends its next
request as soon as it has read an answer aiohttp gave finds aiohttp coming back from
that answer, not yet waiting for the next request."""

from __future__ import annotations

import asyncio
import sys

import pytest
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpClient

from ...conftest import base_url
from ...http.test_wire import LIST, count_full_reads, exchange, request_bytes
from ..test_connection import by_the_full_way, served_fast

# A caller in a process of its own: one request at a time on one connection, each
# sent as soon as the answer before it is read, as a service's client sends them.
_ONE_AT_A_TIME = """
import socket, sys
port, count = int(sys.argv[1]), int(sys.argv[2])
first, then = (bytes.fromhex(sys.argv[n]) for n in (3, 4))
sock = socket.create_connection(("127.0.0.1", port))
for n in range(count):
    sock.sendall(first if n == 0 else then)
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\\r\\n\\r\\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\\r\\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    assert b" 200 " in head.split(b"\\r\\n")[0], head
print("answered", count)
"""


async def test_hits_after_one_aiohttp_answered_are_answered_from_the_bytes_again(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller sends its requests one at a time on one connection, the first taken
    aiohttp's way (a cache directive), each next one as soon as it has read the
    answer before: the next often arrives while aiohttp is coming back from that
    answer, and is answered from the bytes all the same (taken for busy, aiohttp would
    have answered it, and so every request after it on the connection)."""
    client, port = await served_fast(aiohttp_client, base_url(upstream))
    await exchange(port, request_bytes(LIST))
    full_reads = count_full_reads(client.app, monkeypatch)
    caller = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _ONE_AT_A_TIME,
        str(port),
        "300",
        by_the_full_way(LIST).hex(),
        request_bytes(LIST).hex(),
        stdout=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, _ = await caller.communicate()
    assert (caller.returncode, out.strip()) == (0, b"answered 300")
    assert full_reads[0] <= 3, f"{full_reads[0]} of the 300 requests went aiohttp's way"
