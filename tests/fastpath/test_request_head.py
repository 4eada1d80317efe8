"""Reading a plain GET's head for the hit path: what it reads, what it leaves to
aiohttp, and that what it reads is what aiohttp's own parser reads."""

from __future__ import annotations

import asyncio
import functools
from typing import Any
from urllib.parse import unquote

import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from aiohttp.test_utils import make_mocked_request
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidParameters
from gateway.fastpath.request_head import (
    FIELDS_MAX,
    LINE_MAX,
    HeadReader,
    RequestHead,
    may_become_head,
    read_head,
)
from gateway.http.app import create_app
from gateway.http.records import RECORDS
from gateway.process.worker import MAX_HEADER_BYTES
from gateway.records.lookup import query_pairs
from gateway.records.routes import check_segment

from ..conftest import make_settings
from ..profiles import examples

PLAIN = b"GET /expenses?limit=10 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer t-1\r\n\r\n"


def head_of(*lines: str, request_line: str = "GET /expenses?limit=10 HTTP/1.1") -> bytes:
    return ("\r\n".join((request_line, *lines)) + "\r\n\r\n").encode("latin-1")


def test_a_plain_get_is_read() -> None:
    assert read_head(PLAIN) == RequestHead("/expenses", "limit=10", "Bearer t-1", None)
    assert read_head(
        head_of(
            "host: gw",
            "authorization:Bearer  t-2 \t",
            "X-Request-ID: caller-1",
            "Connection: Keep-Alive",
            "Accept: application/json",
            request_line="GET /accounts/ACC-002 HTTP/1.1",
        )
    ) == RequestHead("/accounts/ACC-002", "", "Bearer  t-2", "caller-1")
    assert read_head(head_of("Host: gw", request_line="GET /users? HTTP/1.1")) == RequestHead(
        "/users", "", None, None
    )
    # a caller that closes the connection after its answer
    assert read_head(head_of("Host: gw", "Connection: Close")) == RequestHead(
        "/expenses", "limit=10", None, None, close=True
    )
    # the ETags a conditional request names, as sent (a 304 is the hit's to decide)
    assert read_head(head_of("Host: gw", 'If-None-Match:  W/"a", "b" ')) == RequestHead(
        "/expenses", "limit=10", None, None, None, None, 'W/"a", "b"'
    )


@pytest.mark.parametrize(
    "head",
    [
        head_of("Host: gw", request_line="HEAD /expenses HTTP/1.1"),
        head_of("Host: gw", request_line="POST /expenses HTTP/1.1"),
        head_of("Host: gw", request_line="GET /expenses HTTP/1.0"),
        head_of("Host: gw", request_line="GET http://gw/expenses HTTP/1.1"),
        head_of("Host: gw", request_line="GET /accounts/a%2Eb HTTP/1.1"),  # an escaped dot
        head_of("Host: gw", request_line="GET /accounts/a%2 HTTP/1.1"),  # half an escape
        head_of("Host: gw", request_line="GET /accounts/%zz HTTP/1.1"),  # not an escape
        head_of("Host: gw", request_line="GET /expenses/../users HTTP/1.1"),
        head_of("Host: gw", request_line="GET /expenses/./e-1 HTTP/1.1"),
        head_of("Host: gw", request_line="GET //expenses HTTP/1.1"),
        head_of("Host: gw", request_line="GET /expenses?a=1#frag HTTP/1.1"),
        head_of("Host: gw", request_line="GET /expenses?a=<b> HTTP/1.1"),
        head_of("Host: gw", request_line="GET  /expenses HTTP/1.1"),
        head_of("Authorization: Bearer t"),  # no Host: aiohttp refuses HTTP/1.1 without
        head_of("Host: gw", "Host: other"),
        head_of("Host: gw", "Authorization: Bearer a", "Authorization: Bearer b"),
        head_of("Host: gw", "X-Request-ID: a", "x-request-id: b"),
        head_of("Host: gw", "Cache-Control: no-cache"),
        head_of("Host: gw", "Pragma: no-cache"),
        head_of("Host: gw", "Expect: 100-continue"),
        head_of("Host: gw", "Content-Length: 0"),
        head_of("Host: gw", "Transfer-Encoding: chunked"),
        head_of("Host: gw", "Upgrade: websocket", "Connection: upgrade"),
        head_of("Host: gw", "Connection: close, upgrade"),
        head_of("Host: gw", "TE: trailers"),
        head_of("Host: gw", "Proxy-Connection: close"),  # aiohttp reads it as Connection
        head_of("Host: gw", "Authorization : Bearer t"),  # space before the colon
        head_of("Host: gw", " folded: on"),  # obs-fold
        head_of("Host: gw", "Authorization: Bearer caf\xe9"),  # a byte above 0x7F
        head_of("Host: gw", "X-Ctl: a\x7fb"),
        b"GET /expenses HTTP/1.1\nHost: gw\n\n",  # bare LFs
        b"GET /expenses HTTP/1.1\r\nHost: gw\r\n\r\nGET /users HTTP/1.1\r\n",  # not one head
        head_of("Host: gw", "X-Long: " + "a" * LINE_MAX),
        head_of("Host: gw", *(f"X-{n}: v" for n in range(FIELDS_MAX))),
    ],
)
def test_anything_else_is_left_to_aiohttp(head: bytes) -> None:
    assert read_head(head) is None


@pytest.mark.parametrize(
    ("start", "may"),
    [
        (b"G", True),
        (b"GET /exp", True),
        (b"GET /expenses?limit=10 HTTP/1.1\r", True),
        (b"GET /expenses HTTP/1.1\r\nHost: g", True),
        (b"GET /expenses HTTP/1.1\r\nHost: gw\r\n\r", True),
        (b"POST /", False),
        (b"G\x01T /", False),
        (b"\x16\x03\x01\x02\x00", False),  # TLS
        (b"GET /expenses HTTP/1.0\r\n", False),
        (b"GET /expenses HTTP/1.1\r\nBad Header\r\n", False),
        (b"GET /expenses HTTP/1.1\r\nHost: gw\r\nX: caf\xc3", False),
        (b"GET /" + b"a" * (LINE_MAX + 1), False),
    ],
)
def test_what_may_become_a_head_read_here(start: bytes, may: bool) -> None:
    assert may_become_head(start) is may


@settings(max_examples=examples(300), deadline=None)
@given(st.data())
def test_every_start_of_a_head_read_here_may_become_one(data: st.DataObject) -> None:
    """A head split anywhere is held until whole, never handed to aiohttp half-way."""
    head = data.draw(heads())
    if read_head(head) is None:
        return
    cut = data.draw(st.integers(1, len(head) - 1))  # its end not reached yet
    assert may_become_head(head[:cut]), head[:cut]


def test_the_limits_are_the_caller_s() -> None:
    padded = head_of("Host: gw", "X-Pad: " + "p" * 5000)
    assert read_head(padded) is not None
    assert read_head(padded, line_max=4095) is None
    many = head_of("Host: gw", *(f"X-{n}: v" for n in range(10)))
    assert read_head(many) is not None
    assert read_head(many, fields_max=10) is None  # eleven header lines


# Heads from pieces that are each mostly right and sometimes not, so that both what
# is read and what is refused come up often.
_METHODS = st.sampled_from(["GET"] * 30 + ["HEAD", "get", "POST"])
_VERSIONS = st.sampled_from(["HTTP/1.1"] * 30 + ["HTTP/1.0", "HTTP/2.0", "http/1.1"])
_GOOD_PATH = "abcAZ09-_~/."
_ESCAPES = ["%20", "%2F", "%2f", "%C3%A1", "%6F", "%7e", "%2E", "%25", "%zz", "%"]
_ODD_PATH = _GOOD_PATH + "%2F:@!$&'()*+,;=#?\"<> "
_GOOD_QUERY = "abz09=&-_.~%20+,;:@/?!$'()*"
_ODD_QUERY = _GOOD_QUERY + '#<>"{}|\\^` \x7f'
_NAMES = st.sampled_from(
    ["Authorization", "X-Request-ID", "Accept", "User-Agent", "X-Other", "x-other"] * 6
    + ["Accept-Encoding", "accept-encoding", "traceparent", "Traceparent"] * 3
    + ["If-None-Match", "if-none-match"] * 3
    + ["Connection", "Proxy-Connection", "Content-Length", "Transfer-Encoding", "Cache-Control"]
    + ["Bad Name", ""]
)
_VALUES = st.sampled_from(
    ["keep-alive", "Keep-Alive", "gw", "Bearer demo-token", " Bearer  x \t", "v=1, w"] * 6
    + ["gzip", " gzip, deflate ", "identity;q=0", "br;q=1.0, gzip;q=0.8, *;q=0.1"] * 2
    + [" 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01 ", "00-x-y-01"] * 2
    + ["close", "0", "chunked", "a\x7fb", "a\x00b", "caf\xe9", "x\ry"]
)


def _either(good: str, odd: str, max_size: int) -> st.SearchStrategy[str]:
    # three times in four from the good alphabet
    chosen = st.sampled_from([good, good, good, odd])
    return chosen.flatmap(lambda alphabet: st.text(alphabet=alphabet, max_size=max_size))


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    path = "/" + draw(_either(_GOOD_PATH, _ODD_PATH, 20))
    if draw(st.integers(0, 3)) == 0:  # an id with escapes
        path += "/" + "".join(draw(st.lists(st.sampled_from([*_ESCAPES, "a", "Z9"]), max_size=5)))
    if draw(st.booleans()):
        path += "?" + draw(_either(_GOOD_QUERY, _ODD_QUERY, 20))
    lines = [f"{draw(_METHODS)} {path} {draw(_VERSIONS)}"]
    fields = [f"{draw(_NAMES)}:{draw(_VALUES)}" for _ in range(draw(st.integers(0, 3)))]
    if draw(st.integers(0, 6)):
        fields.insert(draw(st.integers(0, len(fields))), "Host: gw")
    end = draw(st.sampled_from(["\r\n"] * 8 + ["\n"]))
    return (end.join(lines + fields) + end + end).encode("utf-8")


async def aiohttp_parses(head: bytes) -> tuple[list[Any], bool, bytes] | None:
    """What aiohttp's parser, with the server's limits, makes of ``head`` (its
    messages, whether it switches protocols, what it leaves); None when it refuses it."""
    loop = asyncio.get_running_loop()
    parser = HttpRequestParser(
        BaseProtocol(loop),
        loop,
        2**16,
        max_line_size=MAX_HEADER_BYTES,
        max_field_size=MAX_HEADER_BYTES,
    )
    try:
        messages, upgraded, tail = parser.feed_data(head)
    except HttpProcessingError:
        return None
    return list(messages), upgraded, tail


async def aiohttp_reads(head: bytes) -> RequestHead | None:
    """What aiohttp's parser, with the server's limits, reads of ``head``; None when it
    refuses it."""
    parsed = await aiohttp_parses(head)
    if parsed is None:
        return None
    messages, _, tail = parsed
    assert len(messages) == 1
    assert tail == b""
    message = messages[0][0]
    return RequestHead(
        message.url.raw_path,
        message.url.raw_query_string,
        message.headers.get("Authorization"),
        message.headers.get("X-Request-ID"),
        message.headers.get("Accept-Encoding"),
        message.headers.get("traceparent"),
        message.headers.get("If-None-Match"),
        message.should_close,
    )


@settings(max_examples=examples(600), deadline=None)
@given(heads())
@example(PLAIN)
@example(head_of("Host: gw", request_line="GET /expenses?a=%zz HTTP/1.1"))
@example(head_of("Host: gw", "Authorization:   Bearer x   "))
async def test_what_is_read_is_what_aiohttp_reads(head: bytes) -> None:
    read = read_head(head)
    if read is not None:
        # the path as sent; aiohttp's raw path has escapes of unreserved characters
        # decoded (yarl's), and the two are the same path once decoded
        theirs = await aiohttp_reads(head)
        assert theirs is not None
        assert unquote(theirs.path) == unquote(read.path)
        assert theirs._replace(path=read.path) == read
        # and the fast path validates the query aiohttp's request.query would give
        assert query_pairs(read.query) == await aiohttp_query(head)


async def aiohttp_query(head: bytes) -> list[tuple[str, str]]:
    """The query of ``head`` as aiohttp's request gives it (``request.query`` is the
    query of the URL its parser made, ``request.rel_url``)."""
    loop = asyncio.get_running_loop()
    parser = HttpRequestParser(BaseProtocol(loop), loop, 2**16)
    messages, _, _ = parser.feed_data(head)
    return list(messages[0][0].url.query.items())


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(heads(), min_size=1, max_size=8))
def test_a_connection_s_reader_reads_each_head_as_read_head_does(drawn: list[bytes]) -> None:
    """A connection's reader, which reads a head whose header block it read last by its
    request line alone, reads every head as ``read_head`` does: heads of their own, and
    the request line of one on the header block of the one before (as a service's
    connection sends them)."""
    reader = HeadReader()
    previous = drawn[0]
    for head in drawn:
        line, _, _ = head.partition(b"\r\n")
        _, _, fields = previous.partition(b"\r\n")
        for sent in (head, line + b"\r\n" + fields, head):
            assert reader.read(sent) == read_head(sent)
        previous = head


def test_a_connection_s_reader_checks_the_request_line_of_a_known_block() -> None:
    reader = HeadReader(line_max=40)
    assert reader.read(PLAIN) == read_head(PLAIN)
    fields = PLAIN.partition(b"\r\n")[2]
    for line in (b"GET /a/../b HTTP/1.1", b"GET //x HTTP/1.1", b"POST /x HTTP/1.1",
                 b"GET /" + b"x" * 40 + b" HTTP/1.1", b"GET /x?a=<b> HTTP/1.1"):  # fmt: skip
        assert reader.read(line + b"\r\n" + fields) is None
    read = reader.read(b"GET /expenses/7?page=2 HTTP/1.1\r\n" + fields)
    assert read == RequestHead("/expenses/7", "page=2", "Bearer t-1", None, None, None)


@functools.cache
def _gateway_app() -> web.Application:
    return create_app(make_settings("http://upstream.invalid"))


@settings(max_examples=examples(400), deadline=None)
@given(
    st.lists(st.sampled_from([*_ESCAPES, "%C3", "%A1", "a", "Z9", "-", "~", ".", "+"]), max_size=6)
)
async def test_an_id_with_escapes_is_decoded_as_aiohttp_s_router_decodes_it(
    parts: list[str],
) -> None:
    """The id of a head read here, as the fast path resolves it, is the one aiohttp's
    router hands the route's handler; an id the handler would refuse (an escape that is
    not UTF-8) is no hit."""
    head = f"GET /accounts/{''.join(parts)} HTTP/1.1\r\nHost: gw\r\n\r\n".encode()
    read = read_head(head)
    if read is None:
        return
    app = _gateway_app()
    query = app[RECORDS].lookup.query(read.path, read.query, 1000)
    match = await app.router.resolve(make_mocked_request("GET", read.path, app=app))
    routed = match.get("accountId")
    if query is None:
        valid = True
        try:
            check_segment("accountId", read.path.rpartition("/")[2])
        except InvalidParameters:
            valid = False
        assert routed is None or routed == "" or not valid
    else:
        assert query.path_value == routed
