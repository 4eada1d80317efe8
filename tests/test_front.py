"""The front door: which requests a shortcut may answer before the router."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request
from pytest_aiohttp import AiohttpServer

from gateway.app import create_app
from gateway.demo import create_demo_app
from gateway.front import front_door
from gateway.logs import MalformedRequestFilter
from gateway.state import METRICS, RECORDS, SHORTCUT_DECLINED

from .conftest import GatewayTestServer, base_url, make_settings

ANSWER = web.Response(text="from the shortcut")
ROUTED = web.Response(text="from the application")


@pytest.mark.parametrize(
    ("method", "path", "headers", "expected", "tried"),
    [
        ("GET", "/expenses?limit=10", {}, ANSWER, ["/expenses"]),
        ("GET", "/expenses/", {}, ROUTED, []),  # not exactly the route's path
        ("GET", "/expenses/e-1", {}, ROUTED, []),
        ("HEAD", "/expenses", {}, ROUTED, []),
        ("POST", "/expenses", {}, ROUTED, []),
        ("GET", "/expenses", {"Expect": "100-continue"}, ROUTED, []),
        ("GET", "/users", {}, ROUTED, ["/users"]),  # the shortcut declined: the app answers
    ],
)
async def test_only_a_plain_get_on_a_shortcut_path_is_tried(
    method: str,
    path: str,
    headers: dict[str, str],
    expected: web.Response,
    tried: list[str],
) -> None:
    calls: list[str] = []

    def answer(request: web.Request) -> web.StreamResponse | None:
        calls.append(request.path)
        return ANSWER

    def decline(request: web.Request) -> web.StreamResponse | None:
        calls.append(request.path)
        return None

    routed: list[str] = []

    async def application(request: web.BaseRequest) -> web.StreamResponse:
        routed.append(request.path)
        return ROUTED

    handle = front_door(application, {"/expenses": answer, "/users": decline})
    request = make_mocked_request(method, path, headers=headers)
    response = await handle(request)
    assert response is expected
    assert calls == tried
    assert routed == ([] if expected is ANSWER else [path.split("?")[0]])
    # a declined shortcut is not tried again by the route's handler
    assert request.get(SHORTCUT_DECLINED, False) == (tried == ["/users"])


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
