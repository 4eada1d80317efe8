"""Every way the upstream can fail, as the caller sees it through the gateway."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict
from pytest_aiohttp import AiohttpServer

from gateway.demo import RequestLog, RequestRecord

from ..conftest import AUTH, FakeClock, GatewayFactory, base_url, until

Client = TestClient[web.Request, web.Application]
Behaviour = Callable[[web.Request], Any]


async def fake_upstream(
    aiohttp_server: AiohttpServer, behaviour: Behaviour
) -> tuple[str, list[str]]:
    """A stand-in upstream whose every route runs ``behaviour``; returns its URL and hits."""
    hits: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        hits.append(request.raw_path)
        result = behaviour(request)
        if asyncio.iscoroutine(result):
            result = await result
        assert isinstance(result, web.StreamResponse)
        return result

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    server = await aiohttp_server(app)
    return base_url(server), hits


async def problem(client: Client, path: str = "/users") -> tuple[int, dict[str, Any], Any]:
    response = await client.get(path, headers=AUTH)
    assert response.headers["Content-Type"] == "application/problem+json"
    return response.status, await response.json(content_type=None), response.headers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_stopped_upstream_is_502(gateway_factory: GatewayFactory) -> None:
    client = await gateway_factory(f"http://127.0.0.1:{free_port()}")
    status, body, _ = await problem(client)
    assert status == 502
    assert body["title"] == "The upstream cannot be reached"
    assert body["detail"].startswith("GET /users: cannot connect to the upstream")
    assert "demo-token" not in str(body)


async def test_unresolvable_upstream_is_502(gateway_factory: GatewayFactory) -> None:
    client = await gateway_factory("http://upstream.invalid")
    status, body, _ = await problem(client)
    assert status == 502
    assert body["type"] == "urn:records-gateway:problem:upstream-unavailable"


async def test_slow_upstream_past_the_timeout_is_504(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    url, hits = await fake_upstream(aiohttp_server, slow)
    client = await gateway_factory(url, upstream={"timeout_s": 0.2})
    status, body, _ = await problem(client)
    assert status == 504
    assert body["title"] == "The upstream did not answer in time"
    assert "within 0.2 s" in body["detail"]
    assert hits == ["/users?page=1&limit=10"]


@pytest.mark.parametrize("upstream_status", [500, 502, 503])
async def test_upstream_server_errors_are_502(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, upstream_status: int
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server, lambda r: web.json_response({"error": "boom"}, status=upstream_status)
    )
    status, body, _ = await problem(await gateway_factory(url))
    assert status == 502
    assert body["upstreamStatus"] == upstream_status
    assert body["detail"] == f"GET /users: the upstream failed with status {upstream_status}"


@pytest.mark.parametrize("upstream_status", [400, 405, 409, 418, 422, 301])
async def test_unexpected_upstream_statuses_are_502(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, upstream_status: int
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server,
        lambda r: web.Response(status=upstream_status, headers={"Location": "/elsewhere"}),
    )
    status, body, _ = await problem(await gateway_factory(url))
    assert status == 502
    assert body["upstreamStatus"] == upstream_status
    assert "the gateway and the upstream disagree on the API" in body["detail"]


@pytest.mark.parametrize(
    ("upstream_status", "title"),
    [
        (401, "The upstream did not accept the token"),
        (403, "The upstream refused access"),
        (404, "Record not found"),
    ],
)
async def test_auth_and_not_found_keep_their_status(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, upstream_status: int, title: str
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server, lambda r: web.json_response({"secret": "x"}, status=upstream_status)
    )
    status, body, _ = await problem(await gateway_factory(url))
    assert status == upstream_status
    assert body["title"] == title
    assert "secret" not in body["detail"]


async def test_rate_limit_keeps_retry_after(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server, lambda r: web.Response(status=429, headers={"Retry-After": "17"})
    )
    status, body, headers = await problem(await gateway_factory(url))
    assert status == 429
    assert headers["Retry-After"] == "17"
    assert body["title"] == "Too many requests"


@pytest.mark.parametrize(
    ("sent", "passed_on"),
    [
        ("0", "0"),
        ("017", "17"),
        ("86400", "86400"),
        ("86401", "86400"),
        ("9" * 4000, "86400"),  # more digits than int() reads by default
        ("5, <script>", None),
        ("-5", None),
        ("1.5", None),
        ("\u0661\u0662", None),  # digits, but not ASCII ones
        ("Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ("Wednesday, 21-Oct-15 07:28:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ("Wed Oct 21 07:28:00 2015", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ("Wed Oct  1 07:28:00 2015", "Thu, 01 Oct 2015 07:28:00 GMT"),
        ("Fri, 31 Dec 9999 23:59:59 GMT", "86400"),  # more than the most, in a date
        ("Wed, 21 Oct 2015 07:28:00 GMT <script>", None),
        ("Wed, 31 Feb 2015 07:28:00 GMT", None),
        ("Wed, 21 Oct 2015 07:28:00 +0000", None),
        ("tomorrow", None),
        ("", None),
    ],
)
async def test_a_rate_limit_passes_on_only_a_valid_bounded_retry_after(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, sent: str, passed_on: str | None
) -> None:
    """docs/errors.md, "`rate-limited`": the upstream's Retry-After on a 429 is passed on
    as delay-seconds of at most a day or as an HTTP-date written by the gateway; anything
    else is dropped."""
    raw = sent.encode("utf-8")

    async def rate_limited(request: web.Request) -> web.StreamResponse:
        # written raw: aiohttp's server would refuse some of these values
        assert request.transport is not None
        request.transport.write(
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: "
            + raw
            + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        await asyncio.sleep(0.05)
        request.transport.close()
        return web.Response()

    url, hits = await fake_upstream(aiohttp_server, rate_limited)
    status, body, headers = await problem(await gateway_factory(url))
    assert (status, body["type"]) == (429, "urn:records-gateway:problem:rate-limited")
    assert headers.get("Retry-After") == passed_on
    assert len(hits) == 1


async def test_a_rate_limit_with_two_retry_after_fields_passes_on_neither(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server,
        lambda r: web.Response(
            status=429, headers=CIMultiDict([("Retry-After", "5"), ("Retry-After", "7")])
        ),
    )
    status, _, headers = await problem(await gateway_factory(url))
    assert status == 429
    assert "Retry-After" not in headers


@pytest.mark.parametrize("upstream_status", [500, 503])
async def test_a_server_error_passes_on_no_retry_after_of_the_upstream(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, upstream_status: int
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server,
        lambda r: web.Response(status=upstream_status, headers={"Retry-After": "5, <script>"}),
    )
    status, body, headers = await problem(await gateway_factory(url))
    assert (status, body["upstreamStatus"]) == (502, upstream_status)
    assert "Retry-After" not in headers
    assert "script" not in str(body)


async def test_non_json_body_is_502(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    url, _ = await fake_upstream(
        aiohttp_server, lambda r: web.Response(text="<html>maintenance</html>")
    )
    status, body, _ = await problem(await gateway_factory(url))
    assert status == 502
    assert body["title"] == "The upstream broke the API contract"
    assert body["detail"].startswith(
        "GET /users: the upstream answered with a body that is not JSON"
    )


@pytest.mark.parametrize("chunked", [False, True])
async def test_oversized_body_is_502(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, chunked: bool
) -> None:
    big = b'{"data": "' + b"x" * 5000 + b'"}'

    async def oversized(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(body=big, content_type="application/json")
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(big), 1000):
            await response.write(big[start : start + 1000])
        await response.write_eof()
        return response

    url, _ = await fake_upstream(aiohttp_server, oversized)
    client = await gateway_factory(url, upstream={"max_body_bytes": 4096})
    status, body, _ = await problem(client)
    assert status == 502
    assert "larger than upstream.max_body_bytes (4096)" in body["detail"]


async def test_base_url_path_prefix_is_kept(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    url, hits = await fake_upstream(
        aiohttp_server, lambda r: web.json_response({"id": "x", "name": "Caja chica"})
    )
    client = await gateway_factory(url + "/api/v2/")
    response = await client.get("/accounts/Caja%20chica", headers=AUTH)
    assert response.status == 200
    assert hits == ["/api/v2/accounts/Caja%20chica"]


async def test_one_session_serves_every_request(gateway: Client) -> None:
    from gateway.http.binding import UPSTREAMS

    pipeline = gateway.app[UPSTREAMS].current.pipeline
    link = pipeline.upstream._link
    first = link._session
    for _ in range(3):
        assert (await gateway.get("/users", headers=AUTH)).status == 200
    assert link._session is first
    assert first.connector is link.pool
    # upstream.max_connections (100): ninety pooled, ten for retries on new connections
    assert link.pool.limit == 90
    assert link._fresh.connector is not None
    assert link._fresh.connector.limit == 10


async def test_a_compressed_body_is_limited_by_its_decoded_size(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    import gzip

    bomb = gzip.compress(b'{"data": "' + b"0" * 200_000 + b'"}')

    async def compressed(request: web.Request) -> web.Response:
        return web.Response(
            body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )

    url, _ = await fake_upstream(aiohttp_server, compressed)
    client = await gateway_factory(url, upstream={"max_body_bytes": 65536})
    status, body, _ = await problem(client)
    assert len(bomb) < 65536
    assert status == 502
    assert "larger than upstream.max_body_bytes (65536)" in body["detail"]


async def test_a_cookie_the_upstream_sets_never_travels_with_another_caller(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """The session is shared by every caller: a cookie jar in it would hand one
    caller's upstream session to the next caller's requests."""
    cookies_seen: list[str | None] = []

    def behaviour(request: web.Request) -> web.Response:
        cookies_seen.append(request.headers.get("Cookie"))
        caller = request.headers["Authorization"].removeprefix("Bearer ")
        user = {"id": "00000000-0000-4000-8000-000000000001", "username": caller, "role": "ADMIN"}
        response = web.json_response({"data": [user], "total": 1, "page": 1, "limit": 10})
        response.set_cookie("session", f"{caller}-upstream-session", path="/")
        return response

    url, _ = await fake_upstream(aiohttp_server, behaviour)
    # by name: aiohttp's cookie jar ignores cookies from an IP address
    url = url.replace("127.0.0.1", "localhost")
    client = await gateway_factory(url, cache={"backend": "none"})
    for caller in ("caller-a-token", "caller-b-token", "caller-a-token"):
        response = await client.get("/users", headers={"Authorization": f"Bearer {caller}"})
        assert response.status == 200
        assert "Set-Cookie" not in response.headers
        assert (await response.json())["data"][0]["username"] == caller
    assert cookies_seen == [None, None, None]


# The trace context the upstream gets

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
FORWARDED = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])")


def forwarded(record: RequestRecord) -> tuple[str, str, str]:
    """The trace id, parent id and flags of the traceparent an upstream call carried."""
    assert record.traceparent is not None
    match = FORWARDED.fullmatch(record.traceparent)
    assert match is not None, record.traceparent
    trace_id, parent_id, flags = match.groups()
    assert parent_id != "0" * 16
    return trace_id, parent_id, flags


async def test_the_upstream_gets_the_caller_s_trace_with_a_parent_id_of_the_gateway_s(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    client = await gateway_factory(base_url(upstream))
    parents = set()
    for page, flags in enumerate(("01", "00", "01"), start=1):
        upstream_log.clear()
        headers = {
            **AUTH,
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-{flags}",
            "tracestate": TRACESTATE,
        }
        response = await client.get(f"/expenses?page={page}", headers=headers)
        assert response.status == 200
        (record,) = upstream_log.entries
        trace_id, parent_id, sent_flags = forwarded(record)
        assert (trace_id, sent_flags) == (CALLER_TRACE, flags)
        assert parent_id != CALLER_SPAN
        parents.add(parent_id)
        assert record.tracestate == TRACESTATE
    assert len(parents) == 3  # a span of its own for each upstream call


@pytest.mark.parametrize(
    "traceparents",
    [
        [],
        [f"00-{CALLER_TRACE.upper()}-{CALLER_SPAN}-01"],
        [f"00-{'0' * 32}-{CALLER_SPAN}-01"],
        [f"00-{CALLER_TRACE}-{'0' * 16}-01"],
        [f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01"],
        [f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-more"],
        ["a traceparent? no"],
        [f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"],
    ],
)
async def test_a_request_without_one_valid_traceparent_starts_a_trace_of_its_own(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    traceparents: list[str],
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    client = await gateway_factory(base_url(upstream))
    traces = set()
    for page in (1, 2):
        upstream_log.clear()
        headers = [(name, value) for name, value in AUTH.items()]
        headers += [("traceparent", value) for value in traceparents]
        headers += [("tracestate", TRACESTATE)]
        response = await client.get(f"/expenses?page={page}", headers=headers)
        assert response.status == 200  # never an error of the caller's
        (record,) = upstream_log.entries
        trace_id, _, flags = forwarded(record)
        assert trace_id != CALLER_TRACE
        assert flags == "01"  # sampled: an upstream that follows its caller records it
        assert record.tracestate is None  # only with a valid traceparent
        traces.add(trace_id)
    assert len(traces) == 2


async def test_a_higher_version_s_traceparent_is_continued_as_version_00(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway_factory(base_url(upstream))
    headers = {**AUTH, "traceparent": f"01-{CALLER_TRACE}-{CALLER_SPAN}-01-later-fields"}
    assert (await client.get("/users", headers=headers)).status == 200
    (record,) = upstream_log.entries
    assert forwarded(record)[0] == CALLER_TRACE
    assert forwarded(record)[2] == "01"


async def test_a_malformed_tracestate_is_dropped_and_the_trace_goes_on(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway_factory(base_url(upstream))
    too_many = ",".join(f"k{n}=v" for n in range(33))
    for page, tracestate in enumerate(("Rojo=1", "rojo=1,rojo=2", too_many), start=1):
        upstream_log.clear()
        headers = {
            **AUTH,
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            "tracestate": tracestate,
        }
        assert (await client.get(f"/expenses?page={page}", headers=headers)).status == 200
        (record,) = upstream_log.entries
        assert forwarded(record)[0] == CALLER_TRACE
        assert record.tracestate is None


async def test_the_trace_goes_upstream_with_the_access_log_off(
    gateway_factory: GatewayFactory, upstream: TestServer, upstream_log: RequestLog
) -> None:
    client = await gateway_factory(base_url(upstream), log={"access": False})
    headers = {**AUTH, "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    assert (await client.get("/users", headers=headers)).status == 200
    assert (await client.get("/clients", headers=AUTH)).status == 200
    caller, own = upstream_log.entries
    assert forwarded(caller)[0] == CALLER_TRACE
    assert forwarded(own)[0] != CALLER_TRACE


async def test_a_background_refresh_is_part_of_the_trace_of_the_request_that_started_it(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    upstream_log: RequestLog,
    clock: FakeClock,
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    client = await gateway_factory(base_url(upstream), clock=clock)
    assert (await client.get("/users", headers=AUTH)).status == 200
    clock.advance(301)  # past the TTL, within stale_while_revalidate_s
    headers = {**AUTH, "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    response = await client.get("/users", headers=headers)
    assert response.headers["X-Cache"] == "STALE"
    await until(lambda: len(upstream_log) == 2)
    first, refresh = upstream_log.entries
    assert forwarded(first)[0] != CALLER_TRACE
    assert forwarded(refresh)[0] == CALLER_TRACE
    assert forwarded(refresh)[1] != CALLER_SPAN


ECHOED = "tok-secret-echoed-7f3a"


def echoing_heads(token: bytes) -> dict[str, bytes]:
    """Answers that quote the caller's Authorization back, by where they put it."""
    bearer = b"Bearer " + token
    page = b'{"data":[{"id":"%s","username":"u","role":"ADMIN"}],"total":1,"page":1,"limit":10}'
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    return {
        "long-header": ok + b"X-Echo: " + bearer + b"a" * 9000 + b"\r\nContent-Length: 2\r\n\r\n{}",
        "set-cookie": ok
        + b"Set-Cookie: s="
        + bearer
        + b"b" * 9000
        + b"\r\nContent-Length: 2\r\n\r\n{}",
        "status-code": b"HTTP/1.1 2x0 " + bearer + b"\r\nContent-Length: 2\r\n\r\n{}",
        "reason": b"HTTP/1.1 503 " + bearer + b"\r\nContent-Length: 2\r\n\r\n{}",
        "long-status": b"HTTP/1.1 200 " + bearer + b"c" * 9000 + b"\r\nContent-Length: 2\r\n\r\n{}",
        "header-token": ok + b"X\x01Echo: " + bearer + b"\r\nContent-Length: 2\r\n\r\n{}",
        "content-length": ok + b"Content-Length: " + bearer + b"\r\n\r\n{}",
        "chunk-size": ok + b"Transfer-Encoding: chunked\r\n\r\n" + bearer + b"\r\n",
        "not-json": ok + b"Content-Length: %d\r\n\r\n%s" % (len(bearer), bearer),
        "invalid-json": ok + b'Content-Length: %d\r\n\r\n{"data": [%s' % (len(bearer) + 11, bearer),
        "wrong-type": ok + b"Content-Length: %d\r\n\r\n%s" % (len(page % bearer), page % bearer),
    }


async def test_no_answer_readiness_log_or_metric_quotes_what_an_upstream_echoes(
    gateway_factory: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    answers = echoing_heads(ECHOED.encode())
    order = list(answers)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        page = re.search(rb"page=([0-9]+)", head)
        assert page is not None
        writer.write(answers[order[int(page[1]) - 1]])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # every answer fails; the circuit stays closed so that each reaches the upstream
        client = await gateway_factory(
            f"http://127.0.0.1:{port}",
            cache={"backend": "none"},
            upstream={"breaker_failures": 100},
        )
        seen: list[str] = []
        for number, case in enumerate(order, start=1):
            response = await client.get(
                f"/users?page={number}", headers={"Authorization": f"Bearer {ECHOED}"}
            )
            body = await response.text()
            assert response.status in (502, 504), (case, body)
            seen.append(body + repr(dict(response.headers)))
            readiness = await client.get("/readyz")
            seen.append(await readiness.text())
        seen.append(await (await client.get("/metrics")).text())
    finally:
        server.close()
        await server.wait_closed()
    quoted = [text for text in seen if ECHOED in text]
    assert quoted == []
    logged = [record for record in caplog.records if ECHOED in repr(record.__dict__)]
    assert logged == []
