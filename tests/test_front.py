"""The front door: which requests a shortcut may answer before the router."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import quote

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpServer

from gateway.app import create_app
from gateway.demo import create_demo_app
from gateway.front import front_door
from gateway.handlers import Shortcut
from gateway.logs import MalformedRequestFilter
from gateway.state import METRICS, RECORDS, SHORTCUT_DECLINED

from .conftest import GatewayTestServer, base_url, make_settings

ANSWER = web.Response(text="from the shortcut")
ROUTED = web.Response(text="from the application")


@pytest.mark.parametrize(
    ("method", "path", "headers", "expected", "tried"),
    [
        ("GET", "/expenses?limit=10", {}, ANSWER, [("/expenses", None)]),
        ("GET", "/expenses/e-1?x=1", {}, ANSWER, [("/expenses/{id}", "e-1")]),
        (
            "GET",
            "/accounts/Caja%20chica%20Bogot%C3%A1",
            {},
            ANSWER,
            [("/accounts/{id}", "Caja chica Bogotá")],
        ),
        ("GET", "/expenses/", {}, ROUTED, []),  # no id: not the id route
        ("GET", "/accounts/a%2Fb", {}, ROUTED, []),  # an encoded "/": the router decides
        ("GET", "/expenses/e-1/x", {}, ROUTED, []),
        ("GET", "/expenses/e-1/", {}, ROUTED, []),
        ("GET", "/other/e-1", {}, ROUTED, []),
        ("HEAD", "/expenses", {}, ROUTED, []),
        ("HEAD", "/expenses/e-1", {}, ROUTED, []),
        ("POST", "/expenses", {}, ROUTED, []),
        ("GET", "/expenses", {"Expect": "100-continue"}, ROUTED, []),
        ("GET", "/expenses/e-1", {"Expect": "100-continue"}, ROUTED, []),
        ("GET", "/users", {}, ROUTED, [("/users", None)]),  # declined: the app answers
    ],
)
async def test_only_a_plain_get_on_a_shortcut_path_is_tried(
    method: str,
    path: str,
    headers: dict[str, str],
    expected: web.Response,
    tried: list[tuple[str, str | None]],
) -> None:
    calls: list[tuple[str, str | None]] = []

    def shortcut(name: str, answer: web.Response | None) -> Shortcut:
        def try_it(request: web.Request, value: str | None) -> web.StreamResponse | None:
            calls.append((name, value))
            return answer

        return try_it

    routed: list[str] = []

    async def application(request: web.BaseRequest) -> web.StreamResponse:
        routed.append(request.path)
        return ROUTED

    handle = front_door(
        application,
        {"/expenses": shortcut("/expenses", ANSWER), "/users": shortcut("/users", None)},
        {
            "/expenses": shortcut("/expenses/{id}", ANSWER),
            "/accounts": shortcut("/accounts/{id}", ANSWER),
        },
    )
    request = make_mocked_request(method, path, headers=headers)
    response = await handle(request)
    assert response is expected
    assert calls == tried
    assert routed == ([] if expected is ANSWER else [request.path])
    # a declined shortcut is not tried again by the route's handler
    assert request.get(SHORTCUT_DECLINED, False) == (tried == [("/users", None)])


def test_the_app_has_nothing_the_front_door_would_skip() -> None:
    """Front-door answers bypass aiohttp's middlewares and on_response_prepare; the
    gateway must not rely on either (add one, and hits on list routes would miss it)."""
    app = create_app(make_settings("http://127.0.0.1:9"))
    assert list(app.middlewares) == []
    assert list(app.on_response_prepare) == []


@pytest.fixture
def gateway_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's server log with the filter the gateway installs (gateway.logs)."""
    server_log = logging.getLogger("aiohttp.server")
    monkeypatch.setattr(server_log, "filters", [MalformedRequestFilter()])


async def exchange_raw(app: web.Application, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``raw`` to ``app`` served as the gateway serves it; read until it closes."""
    client: TestClient[web.Request, web.Application] = TestClient(GatewayTestServer(app))
    await client.start_server()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        writer.write(raw)
        async with asyncio.timeout(10):
            answer = await reader.read()  # the whole answer, then the gateway closes
        writer.close()
    finally:
        await client.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert len(body) == int(headers["Content-Length"])
    return status_line, headers, body


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (
            b"GET /users HTTP/1.1\r\nHost: g\r\n"
            b"Authorization: Bearer wrong-secret\x01-token\r\n\r\n",
            "the request is not valid HTTP/1.1: a malformed request line or header",
        ),
        (
            b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer wrong-secret-token"
            + b"x" * 40_000  # over the 32 KiB the server accepts (README)
            + b"\r\n\r\n",
            "the request line or a header is longer than the gateway accepts",
        ),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03wrong-secret-token\r\n\r\n",
            "not an HTTP/1.1 request (TLS to a plain-HTTP port, or an unknown method)",
        ),
    ],
)
async def test_a_request_the_http_parser_rejects_gets_a_problem_that_quotes_nothing(
    raw: bytes, detail: str, gateway_logging: None, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings("http://127.0.0.1:9"))
    status_line, headers, body = await exchange_raw(app, raw)
    assert status_line == "HTTP/1.0 400 Bad Request"  # as aiohttp answers it, then closes
    assert headers["Content-Type"] == "application/problem+json"
    assert orjson.loads(body) == {
        "type": "urn:records-gateway:problem:malformed-request",
        "title": "Malformed HTTP request",
        "status": 400,
        "detail": detail,
        "instance": "/",
        "requestId": headers["X-Request-ID"],
    }
    assert b"secret" not in body
    assert "secret" not in caplog.text
    assert "rejected a malformed HTTP request" in caplog.text
    # counted as every other answer is
    assert 'route="other",status="400"' in app[METRICS].exposition().decode()


async def test_an_error_outside_every_handler_is_a_problem_with_its_request_id_logged(
    aiohttp_server: AiohttpServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault in the front door's hit (it runs before the edge that catches the
    handlers' errors) still gets a problem, the caller's request id, and a log line
    that carries it."""
    upstream = await aiohttp_server(create_demo_app())
    app = create_app(make_settings(base_url(upstream), cache={"backend": "memory"}))

    def broken(request: web.Request) -> None:
        raise RuntimeError("a bug in the hit path")

    monkeypatch.setattr(app[RECORDS], "hit", broken)
    raw = (
        b"GET /users HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer demo-token\r\n"
        b"X-Request-ID: caller-id-7\r\n\r\n"
    )
    status_line, headers, body = await exchange_raw(app, raw)
    assert status_line == "HTTP/1.1 500 Internal Server Error"
    assert headers["X-Request-ID"] == "caller-id-7"
    problem = orjson.loads(body)
    assert (problem["type"], problem["status"], problem["requestId"]) == (
        "urn:records-gateway:problem:internal",
        500,
        "caller-id-7",
    )
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == "caller-id-7"]
    # the error line, and the access line as for every answer
    assert [r.getMessage() for r in logged] == ["unhandled error outside the handlers", "request"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "Z", "0", " ", "/", "{", "}", "%", ".", "+", ";", "?", "ñ", "€"]),
            st.booleans(),  # percent-encode this character
        ),
        min_size=0,
        max_size=8,
    )
)
async def test_an_id_the_front_door_reads_is_the_one_the_router_would_give(
    parts: list[tuple[str, bool]],
) -> None:
    """The front door reads an id route's id from the decoded path. Where the router
    gives that route for the same request, it gives the same id; where it does not,
    no request can bring that id to the route's handler (so no shortcut knows it)."""
    app = web.Application()

    async def never(request: web.Request) -> web.StreamResponse:
        raise AssertionError

    app.router.add_get("/accounts/{accountId}", never)
    app.router.add_get("/accounts", never)
    app.freeze()

    async def routed_id(raw_path: str) -> str | None:
        match = await app.router.resolve(make_mocked_request("GET", raw_path, app=app))
        route = match.route.resource
        if route is None or route.canonical != "/accounts/{accountId}":
            return None
        return match["accountId"]

    segment = "".join(quote(c, safe="") if encode else c for c, encode in parts)
    raw_path = "/accounts/" + segment
    try:
        request = make_mocked_request("GET", raw_path, app=app)
    except ValueError:
        return  # not a request line aiohttp would take
    parent, _, read = request.path.rpartition("/")
    if parent != "/accounts" or not read:
        return  # the front door leaves it to the router
    routed = await routed_id(raw_path)
    if routed is not None:
        assert routed == read
    else:
        assert await routed_id("/accounts/" + quote(read, safe="")) != read
