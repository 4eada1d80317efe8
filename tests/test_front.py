"""The front door: which requests a shortcut may answer before the router."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, make_mocked_request
from hypothesis import given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpClient, AiohttpServer
from yarl import URL

from .profiles import examples
from gateway.http.app import create_app
from gateway.demo import create_demo_app
from gateway.fastpath.connection import GatewayRunner, front_door
from gateway.http.records import Shortcut
from gateway.ops.logs import MalformedRequestFilter
from gateway.records.routes import ROUTES
from gateway.http.records import RECORDS
from gateway.http.service import METRICS

from .conftest import AUTH, GatewayTestServer, base_url, gateway_client, make_settings

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
        ("GET", "/accounts/a%2Fb", {}, ANSWER, [("/accounts/{id}", "a/b")]),  # as the router
        ("GET", "/accounts%2Fe-1", {}, ROUTED, []),  # no route has this path: the router's 404
        ("GET", "/expenses%2fe-1", {}, ROUTED, []),
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
    """aiohttp's server log with the filter the gateway installs (gateway.ops.logs)."""
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
            + b"x" * 40_000  # over aiohttp's 8 KiB here, and the served gateway's 32 KiB
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


def parsed_request(app: web.Application, target: str) -> web.Request:
    """A GET of ``target`` (origin-form) with the URL aiohttp's HTTP parser makes of it."""
    path, _, query = target.partition("?")
    url = URL.build(path=path, query_string=query, encoded=True)
    return make_mocked_request("GET", "/", app=app).clone(rel_url=url)


def encoded(text: str, how: int) -> str:
    """``text`` as sent: 0 as it is, 1 every character percent-encoded upper-case, 2
    lower-case."""
    if how == 0:
        return text
    escaped = "".join(f"%{byte:02X}" for byte in text.encode())
    return escaped if how == 1 else escaped.lower()


ID_CHARACTERS = ["a", "Z", "0", "-", ".", "_", "~", "+", ";", " ", "/", "%", "{", "}", "ñ", "?"]


@settings(max_examples=examples(400), deadline=None)
@given(
    parent=st.sampled_from(["accounts", "expenses", "users", "healthz", "other", ""]),
    parent_how=st.sampled_from([0, 0, 1, 2]),
    separator=st.sampled_from(["/", "/", "%2F", "%2f", "//", ""]),
    id_parts=st.lists(
        st.tuples(st.sampled_from(ID_CHARACTERS), st.sampled_from([0, 1, 2])), max_size=6
    ),
    tail=st.sampled_from(["", "", "/", "?limit=1", "%2F"]),
)
async def test_the_front_door_picks_the_route_and_id_the_router_would(
    parent: str, parent_how: int, separator: str, id_parts: list[tuple[str, int]], tail: str
) -> None:
    """For any path, the front door tries a record route's shortcut exactly when
    aiohttp's router would give the request to that route, with the same id."""
    app = create_app(make_settings("http://127.0.0.1:9"))
    app.freeze()
    records = app[RECORDS]
    by_template = {route.template: route for route in ROUTES}
    tried: list[tuple[str, str | None]] = []

    def recording(template: str) -> Shortcut:
        def shortcut(request: web.Request, value: str | None) -> web.StreamResponse | None:
            tried.append((template, value))
            return None

        return shortcut

    list_templates = {path: path for path in records.shortcuts}
    id_templates = {
        template.rpartition("/")[0]: template
        for template, route in by_template.items()
        if route.path_param
    }
    assert set(id_templates) == set(records.id_shortcuts)

    async def application(request: web.BaseRequest) -> web.StreamResponse:
        return ROUTED

    front = front_door(
        application,
        {path: recording(template) for path, template in list_templates.items()},
        {path: recording(template) for path, template in id_templates.items()},
    )
    # the id's characters: unreserved ones may go as they are, the rest always encoded
    segment = "".join(
        encoded(c, how if how or (c.isascii() and (c.isalnum() or c in "-._~+;")) else 1)
        for c, how in id_parts
    )
    target = "/" + encoded(parent, parent_how) + separator + segment + tail
    request = parsed_request(app, target)
    await front(request)
    match = await app.router.resolve(parsed_request(app, target))
    resource = match.route.resource
    route = by_template.get(resource.canonical) if resource is not None else None
    if route is None or match.http_exception is not None:
        assert tried == [], target
    elif route.path_param:
        assert tried == [(route.template, match[route.path_param])], target
    else:
        assert tried == [(route.template, None)], target


async def test_a_path_the_router_reads_otherwise_gets_the_router_s_answer(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    """A served gateway with an account's answer cached: every spelling of its path
    gets from the front door what the full way (a Cache-Control the gateway ignores
    takes it) answers, a 200 or the router's 404."""
    upstream = await aiohttp_server(create_demo_app())
    app = create_app(make_settings(base_url(upstream), cache={"backend": "memory"}))
    client = await gateway_client(aiohttp_client, app)
    account = "Caja%20chica%20Bogot%C3%A1"
    primed = await client.get(f"/accounts/{account}", headers=AUTH)
    assert primed.status == 200

    async def answer(target: str, *extra: str) -> tuple[str, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        lines = [f"GET {target} HTTP/1.1", "Host: g", f"Authorization: {AUTH['Authorization']}"]
        writer.write(("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode())
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            fields = dict(
                line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:-2]
            )
            body = await reader.readexactly(int(fields["Content-Length"]))
        writer.close()
        if fields["Content-Type"] == "application/problem+json":  # the id differs
            body = orjson.dumps({**orjson.loads(body), "requestId": "-"})
        return head.split(b"\r\n", 1)[0].decode(), body

    for target in (
        f"/accounts/{account}",
        f"/%61ccounts/{account}",
        f"/accounts%2F{account}",
        f"/accounts%2f{account}",
        f"/accounts//{account}",
        f"/accounts/{account}/",
        f"/accounts/{account}%2F",
        f"http://g/accounts%2F{account}",
    ):
        front = await answer(target)
        full = await answer(target, "Cache-Control: max-age=60")
        assert front == full, target
        assert front[0] in ("HTTP/1.1 200 OK", "HTTP/1.1 404 Not Found"), target


async def test_a_server_option_aiohttp_does_not_take_fails_the_setup() -> None:
    """aiohttp's own server would drop it with a warning; GatewayServer would fail
    every connection without a word. It fails at once instead."""
    app = create_app(make_settings("http://127.0.0.1:9"))
    runner = GatewayRunner(app, keep_alive_timeout=5)  # keepalive_timeout, misspelt
    with pytest.raises(TypeError):
        await runner.setup()
    await runner.cleanup()
    good = GatewayRunner(create_app(make_settings("http://127.0.0.1:9")), keepalive_timeout=5)
    await good.setup()
    await good.cleanup()
