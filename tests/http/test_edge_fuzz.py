"""The gateway's edge under request heads built to break it: what any client sees.

Hypothesis writes whole request heads (methods usual, unusual and invalid; versions;
targets with percent-escapes and control characters, ``*``, authority and absolute
forms; header names and values of any bytes but line ends) and sends each on a
connection of its own, over real loopback, to two gateways served as in production
(the fast path, the server's header limits) in front of the reference upstream: one
caching (memory backend), one not (``cache.backend = "none"``). Whatever the head:

- an answer comes (a complete head is never met with a closed connection or silence);
- it is never a 500 (nor any 5xx but the 505 of a version the gateway does not speak);
- it carries ``X-Request-ID``;
- a 4xx or 5xx is an RFC 9457 problem (``application/problem+json``) whose ``status``
  is the answer's;
- both gateways give the same status.

The examples are derandomized (the same heads every run, in CI and locally; the
profile in tests/profiles.py sets how many).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpClient

from gateway.http.app import create_app
from gateway.process.worker import MAX_HEADER_BYTES

from ..conftest import TOKEN, GatewayTestServer, base_url, make_settings
from ..profiles import examples
from .test_wire import filter_parser_log

# bytes of a request line or header: anything but the line ends (each example is one
# request, whose end the client knows)
_LINE_BYTES = st.binary(max_size=24).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))

# Each part of a head comes in two kinds: usual (aiohttp's parser takes it, so the head
# reaches the gateway's own code: methods it knows, versions it reads, escaped paths,
# header values of any bytes but controls) and odd (what it may refuse). A head has at
# most one odd part, so that most heads get past the parser and some do not.
_METHODS = [b"GET"] * 4 + [b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"CONNECT"]
_METHODS += [b"TRACE", b"PATCH", b"PURGE"]
_ODD_METHODS = [b"PRI", b"QUERY", b"FOO", b"get", b"G\x01T", b"GET\xff", b""]
_VERSIONS = [b"HTTP/1.1"] * 4 + [b"HTTP/1.0", b"HTTP/0.9", b"HTTP/2.0", b"HTTP/1.2"]
_VERSIONS += [b"HTTP/3.0", b"HTTP/9.9"]
_ODD_VERSIONS = [b"HTTP/2", b"HTTP/1.10", b"http/1.1", b"HTTP/1.1 ", b"", b"HTTP/1", b"HTTP/\xff"]
_SEGMENTS = [
    b"users",
    b"clients",
    b"expenses",
    b"accounts",
    b"b1a6b1f1-620e-49d3-bb33-f3d8269cd696",
    b"ACC-002",
    b"Caja%20chica%20Bogot%C3%A1",
    b"healthz",
    b"readyz",
    b"openapi.json",
    b"admin",
    b"cache",
    b"",
    b".",
    b"..",
    b"x",
]
# percent-escapes: of control characters, of bytes that are not UTF-8, broken ones
_ESCAPES = [b"%0d%0a", b"%0a", b"%0d", b"%00", b"%09", b"%7f", b"%ff", b"%fe%ff", b"%zz"]
_ESCAPES += [b"%2F", b"%2f", b"%25", b"%20", b"%C3%A9", b"%e2%82%ac"]
_ESCAPES += [b"%ef%bf%bd", b"%ed%a0%80"]
_ODD_PATH_BYTES = [
    b"%",
    b"%2",
    b"\x00",
    b"\x01",
    b"\t",
    b"\x7f",
    b"\xff",
    b"\xc3\xa9",
    b" ",
    b"#",
    b"{",
]
_TARGETS = [
    b"/users?limit=3",
    b"/accounts/ACC-002",
    b"/use%0d%0ars",
    b"*",
    b"example.com:443",
    b"127.0.0.1:80",
    b"http://g/users",
    b"http://g",
    b"http://g/accounts%2FACC-002",
    b"//users",
    b"users",
    b"x:",
]
_QUERY_NAMES = [b"page", b"limit", b"type", b"concept", b"amount", b"dateFrom", b"x", b""]
_QUERY_VALUES = [b"1", b"0", b"999999999", b"1000000000", b"100", b"101", b"cash", b"1e3"]
_FIELD_NAMES = [
    b"Host",
    b"Authorization",
    b"Cache-Control",
    b"X-Request-ID",
    b"If-None-Match",
    b"Accept",
    b"Expect",
    b"Expect",
    b"Pragma",
    b"Connection",
    b"Proxy-Connection",
    b"Accept-Encoding",
    b"Cookie",
    b"Range",
    b"Upgrade",
    b"Origin",
]
_FIELD_VALUES = [
    b"Bearer " + TOKEN.encode(),
    b"Bearer " + TOKEN.encode() + b"\xff",
    b"bearer  " + TOKEN.encode(),
    b"Basic dXNlcjpwYXNz",
    b"100-continue",
    b"100-Continue, 100-continue",
    b"100-continue, foo",
    b"no-cache",
    b"no-store",
    b"close",
    b"keep-alive",
    b"upgrade",
    b"websocket",
    b"*",
    b'"0123"',
    b"text/html",
    b"caller-id-1",
    b"\xc3\xa9",
    b"\xff",
    b"",
]
# a field value of any bytes but controls (obs-text included)
_VALUE_BYTES = st.binary(max_size=24).map(
    lambda b: bytes(c for c in b if (c >= 0x20 and c != 0x7F) or c == 0x09)
)
_PART = st.one_of(st.sampled_from(_SEGMENTS), st.sampled_from(_ESCAPES))
_ODD_PART = st.one_of(st.sampled_from(_ODD_PATH_BYTES), _LINE_BYTES)


def path(part: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """An origin-form target of ``part``s, maybe with a query."""
    segment = st.lists(part, max_size=3).map(b"".join)
    pair = st.tuples(
        st.one_of(st.sampled_from(_QUERY_NAMES), part),
        st.one_of(st.sampled_from(_QUERY_VALUES), part),
    )
    query = st.lists(pair, max_size=4).map(lambda pairs: b"&".join(n + b"=" + v for n, v in pairs))
    return st.tuples(
        st.lists(segment, min_size=1, max_size=4).map(b"/".join),
        st.one_of(st.none(), query),
    ).map(lambda p: b"/" + p[0] + (b"" if p[1] is None else b"?" + p[1]))


PARTS: dict[str, tuple[st.SearchStrategy[bytes], st.SearchStrategy[bytes]]] = {
    "method": (
        st.sampled_from(_METHODS),
        st.one_of(st.sampled_from(_ODD_METHODS), _LINE_BYTES),
    ),
    "target": (
        st.one_of(path(_PART), st.sampled_from(_TARGETS)),
        st.one_of(path(st.one_of(_PART, _ODD_PART)), _LINE_BYTES),
    ),
    "version": (
        st.sampled_from(_VERSIONS),
        st.one_of(st.sampled_from(_ODD_VERSIONS), _LINE_BYTES),
    ),
    "name": (st.sampled_from(_FIELD_NAMES), _LINE_BYTES),
    "value": (st.one_of(st.sampled_from(_FIELD_VALUES), _VALUE_BYTES), _LINE_BYTES),
}


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """A whole request head, with at most one odd part; most carry a Host and the
    token, as a real caller's would."""
    odd = draw(st.sampled_from([None, None, None, "method", "target", "version", "name", "value"]))

    def part(kind: str) -> bytes:
        usual, unusual = PARTS[kind]
        return draw(unusual if kind == odd else usual)

    method, target, version = part("method"), part("target"), part("version")
    fields = []
    if draw(st.sampled_from([True] * 9 + [False])):
        fields.append((b"Host", b"g"))
    if draw(st.sampled_from([True] * 3 + [False])):
        fields.append((b"Authorization", b"Bearer " + TOKEN.encode()))
    fields += [(part("name"), part("value")) for _ in range(draw(st.integers(0, 4)))]
    # a body's framing is left out: a head announcing one is rightly waited after
    fields = [
        (name, value)
        for name, value in fields
        if name.strip().lower() not in (b"content-length", b"transfer-encoding")
    ]
    # a PRI line and an empty line are how HTTP/2's connection preface begins: aiohttp's
    # parser rightly waits for the rest of it
    assume(not (method == b"PRI" and not fields))
    lines = [method + b" " + target + b" " + version] + [name + b": " + v for name, v in fields]
    return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class Answer:
    status: int
    fields: dict[bytes, bytes]  # names lower-cased, the last of each
    body: bytes


async def answer_to(port: int, head: bytes) -> Answer:
    """The final answer to ``head`` sent alone on a new connection (a 100 Continue
    before it is passed over); fails when none comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    try:
        async with asyncio.timeout(5):
            while True:
                block = await reader.readuntil(b"\r\n\r\n")
                status_line, *lines = block[:-4].split(b"\r\n")
                version, status, *_ = status_line.split(b" ", 2)
                assert version.startswith(b"HTTP/"), status_line
                if not 100 <= int(status) < 200:
                    break
            fields = {}
            for line in lines:
                name, _, value = line.partition(b":")
                fields[name.strip().lower()] = value.strip()
            body = b""
            if b"content-length" in fields and not head.startswith(b"HEAD "):
                body = await reader.readexactly(int(fields[b"content-length"]))
    except (asyncio.IncompleteReadError, TimeoutError) as exc:
        raise AssertionError(f"no answer to {head!r}") from exc
    finally:
        writer.close()
    return Answer(int(status), fields, body)


async def served(aiohttp_client: AiohttpClient, upstream: TestServer, backend: str) -> int:
    """A gateway served as in production (the fast path, the server's header limits)
    with ``backend`` as its cache; its port."""
    app = create_app(
        make_settings(
            base_url(upstream),
            server={"fast_path": True},
            cache={"backend": backend},
            log={"access": False},
        )
    )
    server = GatewayTestServer(app)
    await server.start_server(max_line_size=MAX_HEADER_BYTES, max_field_size=MAX_HEADER_BYTES)
    client = cast(TestClient[web.Request, web.Application], await aiohttp_client(server))
    assert client.port is not None
    return client.port


@pytest.fixture
async def gateways(
    aiohttp_client: AiohttpClient, upstream: TestServer, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, int]:
    """The ports of a caching gateway and of one that does not cache, shared by every
    example (the caching one's entries fill as they run)."""
    filter_parser_log(monkeypatch)  # a rejected head may quote the token
    return (
        await served(aiohttp_client, upstream, "memory"),
        await served(aiohttp_client, upstream, "none"),
    )


@settings(
    max_examples=examples(300),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(head=heads())
async def test_every_head_gets_an_answer_with_a_request_id_and_never_a_500(
    gateways: tuple[int, int], head: bytes
) -> None:
    caching, uncached = gateways
    answers = [await answer_to(port, head) for port in (caching, uncached)]
    for answer in answers:
        assert answer.status < 500 or answer.status == 505, (head, answer)
        assert answer.fields.get(b"x-request-id"), (head, answer)
        if answer.status >= 400:
            assert answer.fields.get(b"content-type") == b"application/problem+json", head
            if answer.body:  # (none after a HEAD)
                assert orjson.loads(answer.body)["status"] == answer.status, head
    assert answers[0].status == answers[1].status, (head, answers)
