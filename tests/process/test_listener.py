"""The listening socket of a gateway process (``gateway.process.listener``): requests
pipelined ahead of a malformed one are answered, in order, then the 400, then the
connection closes, with the fast path and without it (docs/errors.md, "`malformed-request`").

Served here as the worker serves: ``make_runner`` over the app, then ``listen``; one
test runs ``serve`` itself as a subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.demo import DemoServer
from gateway.fastpath.connection import FastPathServer
from gateway.fastpath.server import make_runner
from gateway.http.app import create_app
from gateway.http.rejections import Refusals
from gateway.process.listener import HELD_BLANK_MAX, PIECES_MAX, HeadCuts, listen
from gateway.process.worker import MAX_HEADER_BYTES

from ..conftest import base_url, make_settings
from ..http.test_wire import (
    LIST,
    Answer,
    filter_parser_log,
    read_all,
    read_answer,
    request_bytes,
    send_and_read_all,
)
from .test_supervisor import GatewayProcess, fast_upstream, serve, started

__all__ = ["fast_upstream", "started"]  # fixtures of test_supervisor used here

MALFORMED = b"GET /users HTTP/1.1\r\nBad Header\r\n\r\n"
Listening = Callable[[bool], Awaitable[int]]


@pytest.fixture
async def listening(upstream: TestServer) -> AsyncIterator[Listening]:
    """Start a gateway in front of the reference upstream, with the fast path or
    without, served as the worker serves it; its port."""
    stops: list[tuple[asyncio.Server, web.AppRunner]] = []

    async def start(fast_path: bool) -> int:
        settings = make_settings(base_url(upstream), server={"fast_path": fast_path})
        runner = make_runner(
            create_app(settings),
            access_log=None,
            max_field_size=MAX_HEADER_BYTES,
            max_line_size=MAX_HEADER_BYTES,
        )
        await runner.setup()
        assert isinstance(runner.server, FastPathServer) is fast_path
        server = await listen(runner, "127.0.0.1", 0)
        stops.append((server, runner))
        port: int = server.sockets[0].getsockname()[1]
        return port

    yield start
    for server, runner in stops:
        server.close()
        await runner.cleanup()


WAYS = pytest.mark.parametrize("fast_path", [False, True], ids=["plain", "fast"])


@WAYS
@pytest.mark.parametrize(
    "ahead", [2, 40, PIECES_MAX], ids=["a-few", "past-aiohttp-s-queue", "the-bound"]
)
async def test_requests_in_the_read_of_a_malformed_one_are_answered_before_its_400(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool, ahead: int
) -> None:
    """``ahead`` requests then a head aiohttp's parser refuses, all in one write: each
    request ahead of it is answered, in order, then the 400, then the connection
    closes."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    data = b"".join(request_bytes(LIST, X_Request_ID=f"r-{n}") for n in range(ahead))
    answers, rest = await send_and_read_all(port, data + MALFORMED, ahead + 1)
    *ahead_of_it, refused = answers
    assert [a.headers["x-request-id"] for a in ahead_of_it] == [f"r-{n}" for n in range(ahead)]
    assert {a.status_line for a in ahead_of_it} == {"HTTP/1.1 200 OK"}
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert rest == b"", "closed after the 400"


@WAYS
async def test_requests_behind_one_with_a_body_are_answered_before_the_400(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """A request with a ``Content-Length`` body that holds an empty line, one behind
    it, then a malformed head, all in one write: both answered, in order, then the
    400, then the connection closes."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    data = request_bytes(LIST, X_Request_ID="r-body", Content_Length="8") + b"ab\r\n\r\ncd"
    data += request_bytes(LIST, X_Request_ID="r-after")
    answers, rest = await send_and_read_all(port, data + MALFORMED, 3)
    assert_answered_then_refused(answers, rest)


def assert_answered_then_refused(answers: list[Answer], rest: bytes) -> None:
    """``r-body`` and ``r-after`` answered, in order, then the edge's 400 problem,
    then the connection closed."""
    assert [a.headers.get("x-request-id") for a in answers[:2]] == ["r-body", "r-after"]
    assert [a.status_line for a in answers] == [
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.0 400 Bad Request",
    ]
    assert answers[2].headers["content-type"] == "application/problem+json"
    problem = orjson.loads(answers[2].body)
    assert problem["type"] == "urn:records-gateway:problem:malformed-request"
    assert rest == b""


@WAYS
async def test_empty_lines_behind_a_malformed_head_get_nothing_more(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """A request, a malformed head and 64 KiB of empty lines in one write: the
    answer, the 400, and the connection closed; nothing for the empty lines."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    data = request_bytes(LIST, X_Request_ID="r-0") + MALFORMED + b"\r\n\r\n" * 16384
    (answer, refused), rest = await send_and_read_all(port, data, 2)
    assert answer.headers["x-request-id"] == "r-0"
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert rest == b""


class Recorder(asyncio.Protocol):
    """What a connection's handler is fed, call by call."""

    def __init__(self) -> None:
        self.fed: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Nothing to do: it only records."""

    def data_received(self, data: bytes) -> None:
        self.fed.append(data)


def test_a_read_with_one_head_end_at_most_goes_whole() -> None:
    for data in (request_bytes(LIST), request_bytes(LIST)[:-2], request_bytes(LIST) + b"GE"):
        handler = Recorder()
        HeadCuts(handler).data_received(data)
        assert len(handler.fed) <= 2
        assert b"".join(handler.fed) == data
    handler = Recorder()
    whole = request_bytes(LIST)
    HeadCuts(handler).data_received(whole)
    assert handler.fed[0] is whole, "not copied"


def test_a_read_is_cut_after_each_empty_line_up_to_the_bound() -> None:
    handler = Recorder()
    HeadCuts(handler).data_received(request_bytes(LIST) * 3 + b"GET")
    assert handler.fed == [request_bytes(LIST)] * 3 + [b"GET"]
    flood = b"\r\n\r\n" * 16384
    handler = Recorder()
    HeadCuts(handler).data_received(flood)
    assert len(handler.fed) == PIECES_MAX + 1
    assert b"".join(handler.fed) == flood


async def test_blank_lines_that_make_no_request_are_fed_on_not_held_without_bound() -> None:
    """A caller sending nothing but empty lines, read after read, with the head
    checker on: what the connection holds back from aiohttp stays within
    ``HELD_BLANK_MAX`` (the rest is fed on), so its memory and the copying of what it
    holds do not grow with what the caller sends."""
    handler = Recorder()
    cuts = HeadCuts(handler, Refusals())
    cuts.connection_made(DummyTransport())
    blank = b"\r\n\r\n" * 1024
    for _ in range(64):
        cuts.data_received(blank)
    fed = sum(map(len, handler.fed))
    assert len(blank) * 64 - fed <= HELD_BLANK_MAX
    assert fed > 0


class DummyTransport(asyncio.Transport):
    """A transport that goes nowhere (the handler here records what it is fed)."""


async def test_serve_without_the_fast_path_answers_a_pipeline_ahead_of_a_malformed_head(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    """``serve`` with ``server.fast_path = false``: three requests and a malformed head
    in one write, each answered in order, then the 400, then the connection closes."""
    extra = "[server]\nfast_path = false\n"
    gateway = await serve(started, tmp_path, fast_upstream.url, extra=extra)
    data = b"".join(request_bytes("/healthz", X_Request_ID=f"r-{n}") for n in range(3))
    answers, rest = await send_and_read_all(gateway.port, data + MALFORMED, 4)
    assert [a.headers.get("x-request-id") for a in answers[:3]] == ["r-0", "r-1", "r-2"]
    assert [a.status_line for a in answers] == ["HTTP/1.1 200 OK"] * 3 + [
        "HTTP/1.0 400 Bad Request"
    ]
    assert rest == b""


# heads aiohttp's parser refuses, each with the detail of its problem
REFUSED_HEADS = {
    "malformed-field": (
        MALFORMED,
        "the request is not valid HTTP/1.1: a malformed request line or header",
    ),
    "line-too-long": (
        b"GET /users HTTP/1.1\r\nX-Long: " + b"a" * (MAX_HEADER_BYTES + 16) + b"\r\n\r\n",
        "the request line or a header is longer than the gateway accepts",
    ),
    "unknown-method": (
        b"G@T /users HTTP/1.1\r\nHost: gateway\r\n\r\n",
        "not an HTTP/1.1 request (TLS to a plain-HTTP port, or an unknown method)",
    ),
}


@pytest.mark.parametrize("refused_head", list(REFUSED_HEADS))
async def test_a_refused_head_gets_the_same_problem_with_the_fast_path_or_without(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, refused_head: str
) -> None:
    """A request, then a head aiohttp's parser refuses, in one write: the answer, then
    the same 400 problem both ways (status line, fields, type, title, detail), then
    the connection closes (docs/errors.md, "`malformed-request`")."""
    filter_parser_log(monkeypatch)
    head, detail = REFUSED_HEADS[refused_head]
    seen = {}
    for fast_path in (False, True):
        port = await listening(fast_path)
        data = request_bytes(LIST, X_Request_ID="r-0") + head
        (answer, refused), rest = await send_and_read_all(port, data, 2)
        assert answer.status_line == "HTTP/1.1 200 OK"
        assert rest == b"", "closed after the 400"
        problem = orjson.loads(refused.body)
        assert problem.pop("requestId") == refused.headers["x-request-id"]
        names = sorted({name for name, _ in refused.fields} - {"date", "x-request-id"})
        seen[fast_path] = (refused.status_line, refused.headers["content-type"], names, problem)
    assert seen[False] == seen[True]
    assert seen[False][:2] == ("HTTP/1.0 400 Bad Request", "application/problem+json")
    assert seen[False][3] == {
        "type": "urn:records-gateway:problem:malformed-request",
        "title": "Malformed HTTP request",
        "status": 400,
        "detail": detail,
        "instance": "/",
    }


@WAYS
async def test_a_refused_head_after_a_read_with_a_body_is_the_edges_problem_both_ways(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """A request with a body, answered, then a malformed head in a later read: the
    edge's problem, with the fast path or without (docs/errors.md, "`malformed-request`")."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(LIST, X_Request_ID="r-body", Content_Length="2") + b"ab")
    first = await read_answer(reader)
    assert first.headers["x-request-id"] == "r-body"
    writer.write(MALFORMED)
    await the_malformed_request_problem(reader, writer)


@WAYS
async def test_a_body_in_many_reads_then_a_refused_head_is_the_edges_problem_both_ways(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """A request whose 256 KiB body (with empty lines in it) comes in pieces, answered;
    then a valid request and a malformed head in a later read: both answered in
    order, the second the edge's problem."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = (b"x" * 1000 + b"\r\n\r\n") * 260
    writer.write(request_bytes(LIST, X_Request_ID="r-big", Content_Length=str(len(body))))
    for start in range(0, len(body), 50_000):
        writer.write(body[start : start + 50_000])
        await writer.drain()
        await asyncio.sleep(0)
    first = await read_answer(reader)
    assert first.headers["x-request-id"] == "r-big"
    writer.write(request_bytes(LIST, X_Request_ID="r-next") + MALFORMED)
    (answered, refused), rest = await read_all(reader, 2)
    writer.close()
    assert answered.headers["x-request-id"] == "r-next"
    assert refused.headers["content-type"] == "application/problem+json"
    assert orjson.loads(refused.body)["type"] == "urn:records-gateway:problem:malformed-request"
    assert rest == b""


# heads at the edge of what aiohttp's parser takes
ODD_HEADS = {
    "http2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "connect": b"CONNECT gateway:443 HTTP/1.1\r\nHost: gateway:443\r\n\r\n",
    "upgrade": b"GET /users HTTP/1.1\r\nHost: g\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
    "bare-lf": b"GET /users HTTP/1.1\nHost: g\n\n",
    "folded-field": b"GET /users HTTP/1.1\r\nHost: g\r\nX-A: a\r\n b\r\n\r\n",
    "nul-in-target": b"GET /us\x00ers HTTP/1.1\r\nHost: g\r\n\r\n",
    "version-3": b"GET /users HTTP/3.0\r\nHost: g\r\n\r\n",
    "tls-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32 + b"\r\n\r\n",
}


@pytest.mark.parametrize("odd_head", list(ODD_HEADS))
async def test_an_odd_head_is_answered_alike_with_the_fast_path_or_without(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, odd_head: str
) -> None:
    """A request, then a head at the edge of what the parser takes, in one write: the
    same status lines and content types both ways, and the connection closed."""
    filter_parser_log(monkeypatch)
    seen = {}
    for fast_path in (False, True):
        port = await listening(fast_path)
        data = request_bytes(LIST, X_Request_ID="r-0") + ODD_HEADS[odd_head]
        answers, _ = await send_and_read_all(port, data, 2)
        seen[fast_path] = [(a.status_line, a.headers.get("content-type")) for a in answers]
    assert seen[False] == seen[True]


@WAYS
async def test_a_head_split_across_reads_is_answered_and_a_refused_one_is_a_problem(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """A valid head sent in two writes, a moment apart, is answered; then a malformed
    head sent in two writes gets the 400 problem, and the connection closes."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for head in (request_bytes(LIST, X_Request_ID="r-split"), MALFORMED):
        writer.write(head[:20])
        await writer.drain()
        await asyncio.sleep(0.05)  # a read of its own: not asserted on, only arranged
        writer.write(head[20:])
        if head is MALFORMED:
            break
        answer = await read_answer(reader)
        assert answer.status_line == "HTTP/1.1 200 OK"
        assert answer.headers["x-request-id"] == "r-split"
    (refused,), rest = await read_all(reader, 1)
    writer.close()
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert refused.headers["content-type"] == "application/problem+json"
    assert rest == b""


# request bodies ahead of a refused head: (the head and what its body starts with, the
# rest of the body); the body holds empty lines, and a chunked one ends at one
BODIES = {
    "length": (
        request_bytes(LIST, X_Request_ID="r-body", Content_Length="14") + b"ab\r\n\r\n",
        b"cd\r\n\r\nef",
    ),
    "chunked": (
        request_bytes(LIST, X_Request_ID="r-body", Transfer_Encoding="chunked") + b"4\r\nab\r\n",
        b"\r\n6\r\ncd\r\n\r\n\r\n0\r\n\r\n",
    ),
    "chunked-trailer": (
        request_bytes(LIST, X_Request_ID="r-body", Transfer_Encoding="chunked") + b"2\r\nab",
        b"\r\n0\r\nX-Trailer: t\r\n\r\n",
    ),
}


@WAYS
@pytest.mark.parametrize("split", [False, True], ids=["one-read", "body-across-reads"])
@pytest.mark.parametrize("body", list(BODIES))
async def test_a_refused_head_in_the_read_of_a_body_is_the_edges_problem_both_ways(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool, split: bool, body: str
) -> None:
    """A request with a body (of a length, or chunked), a request,
    then a malformed head, the last two in the read where the body ends: both requests
    answered in order, then the edge's 400 problem, and the connection closed
    (docs/errors.md, "`malformed-request`")."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    start, end = BODIES[body]
    after = request_bytes(LIST, X_Request_ID="r-after") + MALFORMED
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if split:
        writer.write(start)
        await writer.drain()
        await asyncio.sleep(0.05)  # a read of its own: not asserted on, only arranged
        writer.write(end + after)
    else:
        writer.write(start + end + after)
    answers, rest = await read_all(reader, 3)
    writer.close()
    assert_answered_then_refused(answers, rest)


@pytest.mark.parametrize(
    "framing",
    [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabXY0\r\n\r\n", b"0\r\nBad Trailer\r\n\r\n"],
    ids=["size", "chunk-end", "trailer"],
)
async def test_a_chunked_body_s_bad_framing_is_answered_alike_both_ways(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, framing: bytes
) -> None:
    """A request, then one whose chunked body the parser refuses, in one write: the
    same answers both ways (aiohttp's: both requests answered, as neither handler
    reads a body; the body's error is the body's reader's)."""
    filter_parser_log(monkeypatch)
    seen = {}
    for fast_path in (False, True):
        port = await listening(fast_path)
        data = request_bytes(LIST, X_Request_ID="r-0")
        data += request_bytes(LIST, X_Request_ID="r-1", Transfer_Encoding="chunked") + framing
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        async with asyncio.timeout(10):  # guards against a hang only
            answers = [await read_answer(reader) for _ in range(2)]
        writer.close()
        await writer.wait_closed()
        seen[fast_path] = [
            (a.status_line, a.headers["content-type"], a.headers["x-request-id"]) for a in answers
        ]
    assert seen[False] == seen[True]
    assert seen[False] == [
        ("HTTP/1.1 200 OK", "application/json", "r-0"),
        ("HTTP/1.1 200 OK", "application/json", "r-1"),
    ]


@WAYS
async def test_a_request_asking_to_close_is_the_last_answered_on_its_connection(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool
) -> None:
    """``Connection: close``, then another request in the same write: the first is
    answered (saying ``Connection: close``), then the connection closes; nothing is
    answered behind it, with the fast path or without."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    data = request_bytes(LIST, X_Request_ID="r-close", Connection="close")
    data += request_bytes(LIST, X_Request_ID="r-behind")
    (answer,), rest = await send_and_read_all(port, data, 1)
    assert answer.status_line == "HTTP/1.1 200 OK"
    assert (answer.headers["x-request-id"], answer.headers["connection"]) == ("r-close", "close")
    assert rest == b"", "nothing answered behind it"


# heads aiohttp's parser refuses that are one whole head of a read, each close to the
# plain form (docs: the errors page, "malformed-request")
REFUSED_ALONE = {
    "two-hosts": b"GET /users HTTP/1.1\r\nHost: gateway\r\nHost: gateway\r\n\r\n",
    "two-user-agents": b"GET /users HTTP/1.1\r\nHost: g\r\nUser-Agent: a\r\nuser-agent: b\r\n\r\n",
    "malformed-field": MALFORMED,
}


@WAYS
@pytest.mark.parametrize("refused", list(REFUSED_ALONE))
async def test_a_refused_head_read_alone_after_plain_gets_is_the_edges_problem(
    listening: Listening, monkeypatch: pytest.MonkeyPatch, fast_path: bool, refused: str
) -> None:
    """Plain GETs, each a read of its own and answered (without the fast path they go
    to aiohttp unread by the head checker), then a head aiohttp's parser refuses, a
    read of its own too: the 400 problem, and the connection closes."""
    filter_parser_log(monkeypatch)
    port = await listening(fast_path)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for n in range(3):
        writer.write(request_bytes(LIST, X_Request_ID=f"r-{n}"))
        answer = await read_answer(reader)
        assert answer.status_line == "HTTP/1.1 200 OK"
        assert answer.headers["x-request-id"] == f"r-{n}"
    writer.write(REFUSED_ALONE[refused])
    await the_malformed_request_problem(reader, writer)


async def the_malformed_request_problem(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """What the connection answers next is the 400 malformed-request problem, and it
    closes after it."""
    (refused,), rest = await read_all(reader, 1)
    writer.close()
    assert refused.status_line == "HTTP/1.0 400 Bad Request"
    assert refused.headers["content-type"] == "application/problem+json"
    assert orjson.loads(refused.body)["type"] == "urn:records-gateway:problem:malformed-request"
    assert rest == b""
