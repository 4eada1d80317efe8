"""The fast path itself: it steps aside for plain aiohttp when an internal it relies on
is missing, and it holds an unfinished request head at a cost linear in its size,
under the limits aiohttp applies to the connection."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.test_utils import TestServer
from aiohttp.web_protocol import RequestHandler
from held_head import HEAD
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fastpath import internals, server
from gateway.fastpath.connection import FastPathServer, GatewayConnection
from gateway.fastpath.request_head import PendingHead
from gateway.http.app import create_app
from gateway.http.runner import GatewayRunner

from ..conftest import TOKEN, base_url, make_settings
from ..profiles import examples

ROOT = Path(__file__).resolve().parent.parent.parent
# about 60 KB in 100 header lines: the head bench/held_head.py sends a byte at a time
HEAD_60K = HEAD


def test_every_internal_the_fast_path_relies_on_is_there() -> None:
    assert internals.missing() == []


def test_a_missing_internal_is_named() -> None:
    class Older(RequestHandler):
        __slots__ = ()

    class Stripped:  # a connection class without any of it
        pass

    assert internals.missing(Older) == []
    absent = internals.missing(Stripped)
    assert "Stripped._waiter" in absent
    assert "Stripped._buffer_paused" in absent
    assert any(name.startswith("Stripped.handle_error") for name in absent)
    assert internals.missing(protocol=ModuleType("stripped")) == ["stripped._ErrInfo"]


@pytest.fixture
def hidden_internal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """aiohttp as a release without the connection's ``_buffer_paused`` (aiohttp's own
    3.14 branch has dropped it) looks to the check: its slots no longer name it. The
    attribute itself stays, so aiohttp's own code still runs."""
    slots = BaseProtocol.__slots__
    monkeypatch.setattr(
        BaseProtocol, "__slots__", tuple(name for name in slots if name != "_buffer_paused")
    )
    server._missing.cache_clear()
    yield
    server._missing.cache_clear()


async def raw(port: int, data: bytes, *, piece: int = 0) -> bytes:
    """Send ``data`` (in pieces of ``piece`` bytes, or whole) on a new connection while
    reading, until the gateway closes it or a second passes after the last byte sent. A
    gateway that refuses the request may close before all of it is sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = bytearray()

    async def read() -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received.extend(chunk)

    reading = asyncio.ensure_future(read())
    try:
        for start in range(0, len(data), piece or len(data)):
            writer.write(data[start : start + (piece or len(data))])
            await writer.drain()
    except ConnectionError:
        pass  # it refused and closed: what it answered is being read
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(reading), 1)
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading
    writer.close()
    return bytes(received)


async def serve(upstream: TestServer, *, fast_path: bool = True) -> tuple[web.AppRunner, int]:
    app = create_app(make_settings(base_url(upstream), server={"fast_path": fast_path}))
    runner = server.make_runner(app, max_field_size=32 * 1024, max_line_size=32 * 1024)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_without_an_internal_the_gateway_serves_as_plain_aiohttp(
    hidden_internal: None, upstream: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.fastpath")
    runner, port = await serve(upstream)
    try:
        assert type(runner) is GatewayRunner
        assert type(runner.server) is web.Server  # aiohttp's public low-level server
        warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.fastpath"]
        assert len(warnings) == 1
        assert "RequestHandler._buffer_paused" in warnings[0]
        request = f"GET /users?limit=3 HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        first = await raw(port, request.encode())
        second = await raw(port, request.encode())
        assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"X-Cache: MISS" in first
        assert second.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"X-Cache: HIT" in second
        # what aiohttp's parser rejects gets aiohttp's own answer then (the gateway's
        # listener, gateway.process.listener, answers it with the edge's problem)
        rejected = await raw(port, b"GET /users HTTP/1.1\r\nHost: g\r\nBad Header: x\r\n\r\n")
        assert rejected.split(b" ")[1] == b"400"
        assert b"problem+json" not in rejected
    finally:
        await runner.cleanup()


async def test_with_every_internal_the_gateway_runs_the_fast_path(upstream: TestServer) -> None:
    runner, port = await serve(upstream)
    try:
        assert isinstance(runner.server, FastPathServer)
        assert isinstance(runner.server.connection(), GatewayConnection)
        rejected = await raw(port, b"GET /users HTTP/1.1\r\nHost: g\r\nBad Header: x\r\n\r\n")
        assert rejected.split(b" ")[1] == b"400"
        assert b"application/problem+json" in rejected
    finally:
        await runner.cleanup()


def test_a_server_without_its_options_is_named() -> None:
    class Bare:
        request_handler = None

    assert internals.server_missing(Bare()) == ["Server.request_factory"]  # type: ignore[arg-type]


def test_a_server_class_of_another_shape_is_named() -> None:
    class Elder:  # a server that takes no handler_cancellation and registers nothing
        def __init__(self, handler: object, *, request_factory: object = None) -> None:
            pass

    absent = internals.missing(server=Elder)
    assert "Elder(handler_cancellation=)" in absent
    assert any(name.startswith("Elder.connection_made") for name in absent)


def test_a_head_sent_a_byte_at_a_time_is_looked_at_a_bounded_number_of_times() -> None:
    pending = PendingHead(32 * 1024, 128)
    results = [pending.feed(HEAD_60K[i : i + 1]) for i in range(len(HEAD_60K))]
    assert results[-1] == len(HEAD_60K)
    assert set(results[:-1]) == {0}
    assert pending.examined <= 2 * len(HEAD_60K)


@settings(max_examples=examples(200), deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(HEAD_60K) - 1), max_size=40))
def test_a_head_cut_anywhere_is_held_alike_and_looked_at_a_bounded_number_of_times(
    cuts: list[int],
) -> None:
    points = [0, *sorted(set(cuts)), len(HEAD_60K)]
    pending = PendingHead(32 * 1024, 128)
    results = [pending.feed(HEAD_60K[a:b]) for a, b in itertools.pairwise(points)]
    assert results[-1] == len(HEAD_60K)
    assert set(results[:-1]) <= {0}
    assert pending.examined <= 2 * len(HEAD_60K)


@pytest.mark.parametrize(
    ("line_max", "fields_max", "head", "expected"),
    [
        (100, 4, b"GET /" + b"a" * 95, 0),  # 100 bytes on the request line: within
        (100, 4, b"GET /" + b"a" * 97, -1),  # over aiohttp's line limit: handed over
        (100, 2, b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n", -1),  # too many lines
        (100, 3, b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n", 0),
        (100, 4, b"POST / HTTP/1.1\r\n", -1),  # not a GET: aiohttp's
        (100, 4, b"GET / HTTP/1.1\r\nBad Header: x\r\n", -1),  # not a field line
        (100, 4, b"GET / HTTP/1.1\r\nA: \x01\r\n", -1),
    ],
)
def test_a_head_is_held_only_under_the_connection_s_limits(
    line_max: int, fields_max: int, head: bytes, expected: int
) -> None:
    assert PendingHead(line_max, fields_max).feed(head) == expected


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "plain"])
async def test_a_long_head_sent_a_byte_at_a_time_gets_the_answer_it_gets_whole(
    upstream: TestServer, fast_path: bool
) -> None:
    runner, port = await serve(upstream, fast_path=fast_path)
    try:
        whole = await raw(port, HEAD_60K)
        trickled = await raw(port, HEAD_60K, piece=1)
        assert whole.startswith(b"HTTP/1.1 200 OK\r\n")
        assert trickled.startswith(b"HTTP/1.1 200 OK\r\n")
        body = whole.partition(b"\r\n\r\n")[2]
        assert trickled.partition(b"\r\n\r\n")[2] == body
        # a line past the connection's limit, trickled, gets aiohttp's refusal
        too_long = b"GET /users HTTP/1.1\r\nHost: g\r\nX: " + b"x" * 40_000 + b"\r\n\r\n"
        refused = await raw(port, too_long, piece=997)
        assert refused.split(b" ")[1] == b"400"
        assert (b"problem+json" in refused) == fast_path
    finally:
        await runner.cleanup()


def test_the_locked_aiohttp_is_one_the_fast_path_was_verified_on() -> None:
    """Moving the lock to another aiohttp release means verifying the fast path on it
    (``make test`` passing) and naming it in ``internals.VERIFIED_ON``."""
    lock = (ROOT / "requirements" / "run.txt").read_text()
    (pinned,) = re.findall(r"^aiohttp==(\S+)", lock, re.MULTILINE)
    assert internals.verified(pinned), (pinned, internals.VERIFIED_ON)


@pytest.fixture
def unverified_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """aiohttp as a release the fast path was not verified on, with every internal the
    check looks for (the installed release's)."""
    monkeypatch.setattr(aiohttp, "__version__", "3.99.0")
    server._unverified.cache_clear()
    yield "3.99.0"
    server._unverified.cache_clear()


async def test_on_a_release_it_was_not_verified_on_the_fast_path_runs_and_says_so_once(
    unverified_release: str, upstream: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.fastpath")
    runners = [await serve(upstream) for _ in range(2)]
    try:
        assert all(isinstance(runner.server, FastPathServer) for runner, _ in runners)
        warnings = [r for r in caplog.records if r.name == "gateway.fastpath"]
        assert len(warnings) == 1, "once per process"
        assert warnings[0].levelname == "WARNING"
        message = warnings[0].getMessage()
        assert f"aiohttp {unverified_release} has every internal" in message
        assert "verified on 3.14.5" in message
        request = f"GET /users?limit=3 HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        _, port = runners[0]
        assert b"X-Cache: MISS" in await raw(port, request.encode())
        assert b"X-Cache: HIT" in await raw(port, request.encode())
    finally:
        for runner, _ in runners:
            await runner.cleanup()
