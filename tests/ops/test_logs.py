"""Structured logs: the JSON formatter, the access log of the gateway, configure_logging."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpServer

from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.http.binding import UPSTREAMS
from gateway.ops.logs import JsonFormatter, TextFormatter, configure_logging, report_failure

from ..conftest import AUTH, TOKEN, GatewayFactory, base_url

Client = TestClient[web.Request, web.Application]
WRONG_TOKEN = "wrong-secret-token"
ACCESS_KEYS = {
    "time",
    "level",
    "logger",
    "message",
    "pid",
    "request_id",
    "trace_id",
    "method",
    "route",
    "status",
    "duration_ms",
    "cache",
    "upstream_status",
    "upstream_ms",
    "token_fingerprint",
}
FINGERPRINT = re.compile(r"[0-9a-f]{16,64}")
TRACE_ID = re.compile(r"[0-9a-f]{32}")


def make_record(
    msg: str,
    *args: object,
    level: int = logging.INFO,
    exc_info: Any = None,
    **extra: Any,
) -> logging.LogRecord:
    return logging.getLogger("gateway.test").makeRecord(
        "gateway.test", level, __file__, 1, msg, args, exc_info, extra=extra
    )


def as_json(record: logging.LogRecord) -> dict[str, Any]:
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed: dict[str, Any] = orjson.loads(line)
    return parsed


@contextmanager
def root_logging_restored() -> Iterator[None]:
    """configure_logging replaces the root handlers; put back this test phase's own."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    aiohttp_access = logging.getLogger("aiohttp.access")
    disabled = aiohttp_access.disabled
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        aiohttp_access.disabled = disabled


# The formatters


def test_json_line_has_time_level_logger_message_and_the_extras() -> None:
    record = make_record(
        "served %s",
        "users",
        level=logging.WARNING,
        request_id="req-1",
        status=200,
        duration_ms=1.25,
        upstream_status=None,
        amount=Decimal("10.10"),
        keys=["a", "b"],
    )
    line = as_json(record)
    assert line == {
        "time": line["time"],
        "level": "warning",
        "logger": "gateway.test",
        "message": "served users",
        "pid": os.getpid(),
        "request_id": "req-1",
        "status": 200,
        "duration_ms": 1.25,
        "upstream_status": None,
        "amount": "10.10",
        "keys": ["a", "b"],
    }
    when = datetime.fromisoformat(line["time"])
    assert when.tzinfo == UTC
    assert abs(when.timestamp() - record.created) < 0.001
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", line["time"])


def test_json_line_carries_the_exception_and_stays_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = make_record(
            'failed "quoted"\nsecond line é', level=logging.ERROR, exc_info=sys.exc_info()
        )
    line = as_json(record)
    assert line["level"] == "error"
    assert line["message"] == 'failed "quoted"\nsecond line é'
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert line["exception"].endswith("ValueError: boom")


def test_text_line_for_a_terminal() -> None:
    record = make_record("served", request_id="req-1", status=200)
    text = TextFormatter().format(record)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\S+ INFO    gateway\.test served request_id=req-1 status=200", text
    )


FORGED = "x\n2026-01-01T00:00:00.000+00:00 ERROR   gateway.admin cache purged"


@pytest.mark.parametrize(
    "where",
    ["message", "argument", "field", "exception"],
)
def test_a_text_line_is_one_line_whatever_its_values_hold(where: str) -> None:
    """docs/operations.md, "Logs": with log.format = "text" one record is one line; a line
    break or another control character in any value is written as an escape."""
    hostile = FORGED + "\r\x00\x1b[31m\x7f\x85\u2028\u2029\x1c"
    exc_info = None
    if where == "exception":
        try:
            raise ValueError(hostile)
        except ValueError:
            exc_info = sys.exc_info()
    record = make_record(
        hostile if where == "message" else "upstream said %s",
        *((hostile,) if where == "argument" else ()),
        level=logging.ERROR,
        exc_info=exc_info,
        **({"error": hostile} if where == "field" else {}),
    )
    text = TextFormatter().format(record)
    assert text.splitlines() == [text]
    assert not [c for c in text if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F]
    assert "\u2028" not in text
    assert "\u2029" not in text
    assert "x\\n2026-01-01T00:00:00.000+00:00 ERROR" in text
    assert "\\r\\x00\\x1b[31m\\x7f\\x85\\u2028\\u2029\\x1c" in text


def test_a_text_line_keeps_printable_text_as_it_is() -> None:
    record = make_record("served é €\\path", route='users "x"', detail="tab\tstop")
    text = TextFormatter().format(record)
    assert text.endswith(' gateway.test served é €\\path route=users "x" detail=tab\\tstop')


def test_the_plain_line_that_says_why_a_command_stops_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A file name the message quotes may hold a line break."""
    report_failure(None, "--token-file /tmp/a" + FORGED, prefix="records-gateway probe", event="x")
    err = capsys.readouterr().err
    assert err == "records-gateway probe: --token-file /tmp/a" + FORGED.replace("\n", "\\n") + "\n"


# The access log through a running gateway


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [as_json(r) for r in caplog.records if r.name == "gateway.access"]


async def send(
    client: Client, path: str, request_id: str, authorization: str | None = f"Bearer {TOKEN}"
) -> int:
    headers = {"X-Request-ID": request_id}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = await client.get(path, headers=headers)
    await response.read()
    assert response.headers["X-Request-ID"] == request_id
    return response.status


async def test_one_access_line_per_request_and_never_a_token(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), cache={"backend": "memory"})
    listed = await (await client.get("/expenses", headers=AUTH)).json()
    expense_id = listed["data"][0]["id"]
    caplog.clear()

    sequence = [
        ("miss", "/users", f"Bearer {TOKEN}", 200),
        ("hit", "/users", f"Bearer {TOKEN}", 200),
        ("one", f"/expenses/{expense_id}", f"Bearer {TOKEN}", 200),
        ("wrong", "/users", f"Bearer {WRONG_TOKEN}", 401),
        ("invalid", "/expenses?limit=0", f"Bearer {TOKEN}", 400),
        ("anonymous", "/clients", None, 401),
        ("scheme", "/clients", f"Basic {TOKEN}", 401),
        ("unknown", "/no/such/route", f"Bearer {TOKEN}", 404),
    ]
    for request_id, path, authorization, status in sequence:
        assert await send(client, path, request_id, authorization) == status, request_id
    await server.close()
    assert await send(client, "/accounts", "down") == 502

    lines = access_lines(caplog)
    assert [line["request_id"] for line in lines] == [*(s[0] for s in sequence), "down"]
    by_id = {line["request_id"]: line for line in lines}
    for line in lines:
        assert set(line) == ACCESS_KEYS
        assert (line["level"], line["logger"], line["message"]) == (
            "info",
            "gateway.access",
            "request",
        )
        assert line["method"] == "GET"
        assert line["pid"] == os.getpid()
        assert isinstance(line["duration_ms"], float)
        assert line["duration_ms"] >= 0
        assert TRACE_ID.fullmatch(line["trace_id"])
    # each request a trace of its own (none of them sent a traceparent)
    assert len({line["trace_id"] for line in lines}) == len(lines)

    def summary(request_id: str) -> tuple[Any, ...]:
        line = by_id[request_id]
        return line["route"], line["status"], line["cache"], line["upstream_status"]

    assert summary("miss") == ("users", 200, "miss", "200")
    assert summary("hit") == ("users", 200, "hit", None)
    assert summary("one") == ("expense", 200, "miss", "200")
    assert summary("wrong") == ("users", 401, "none", "401")
    assert summary("invalid") == ("expenses", 400, "none", None)
    assert summary("anonymous") == ("clients", 401, "none", None)
    assert summary("scheme") == ("clients", 401, "none", None)
    assert summary("unknown") == ("other", 404, "none", None)
    assert summary("down") == ("accounts", 502, "none", "unreachable")
    for request_id in ("miss", "one", "wrong", "down"):
        assert isinstance(by_id[request_id]["upstream_ms"], float)
        assert by_id[request_id]["upstream_ms"] > 0
    for request_id in ("hit", "invalid", "anonymous", "scheme", "unknown"):
        assert by_id[request_id]["upstream_ms"] is None

    # one fingerprint per token, keyed (not a plain hash anyone could compute)
    keyer = client.app[UPSTREAMS].current.pipeline.keyer
    demo = by_id["miss"]["token_fingerprint"]
    assert demo == keyer.fingerprint(f"Bearer {TOKEN}")
    assert FINGERPRINT.fullmatch(demo)
    assert not hashlib.sha256(TOKEN.encode()).hexdigest().startswith(demo)
    for request_id in ("hit", "one", "invalid", "down"):
        assert by_id[request_id]["token_fingerprint"] == demo
    wrong = by_id["wrong"]["token_fingerprint"]
    assert wrong == keyer.fingerprint(f"Bearer {WRONG_TOKEN}")
    assert wrong != demo
    for request_id in ("anonymous", "scheme", "unknown"):
        assert by_id[request_id]["token_fingerprint"] is None

    formatted = [JsonFormatter().format(record) for record in caplog.records]
    assert len(formatted) > len(lines)  # the upstream's and the gateway's other loggers too
    for text in formatted:
        orjson.loads(text)
        assert TOKEN not in text
        assert WRONG_TOKEN not in text


async def test_the_access_line_carries_the_trace_id_the_upstream_got(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller's trace id when it sent a valid traceparent, on a miss and on a hit;
    otherwise the id of the trace the gateway started, which the upstream got."""
    caplog.set_level(logging.DEBUG)
    server = await aiohttp_server(create_demo_app())
    upstream_log = server.app[REQUEST_LOG]
    client = await gateway_factory(base_url(server), cache={"backend": "memory"})
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{caller}-00f067aa0ba902b7-01"
    for request_id in ("miss", "hit"):
        response = await client.get(
            "/users", headers={**AUTH, "X-Request-ID": request_id, "traceparent": traceparent}
        )
        assert response.status == 200
    for request_id in ("own", "invalid"):
        sent = traceparent.upper() if request_id == "invalid" else None
        headers = {**AUTH, "X-Request-ID": request_id, **({"traceparent": sent} if sent else {})}
        response = await client.get(f"/clients?page={len(request_id)}", headers=headers)
        assert response.status == 200
    by_id = {line["request_id"]: line for line in access_lines(caplog)}
    assert (by_id["miss"]["cache"], by_id["hit"]["cache"]) == ("miss", "hit")
    assert by_id["miss"]["trace_id"] == by_id["hit"]["trace_id"] == caller
    forwarded = [entry.traceparent for entry in upstream_log.entries]
    assert len(forwarded) == 3
    for request_id, sent in zip(("miss", "own", "invalid"), forwarded, strict=True):
        assert sent is not None
        assert sent.split("-")[1] == by_id[request_id]["trace_id"]
    assert len({by_id[r]["trace_id"] for r in ("miss", "own", "invalid")}) == 3


async def test_no_access_lines_when_the_access_log_is_off(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), log={"access": False})
    assert await send(client, "/users", "a") == 200
    assert await send(client, "/users", "b", None) == 401
    assert await send(client, "/nowhere", "c") == 404
    assert access_lines(caplog) == []
    assert any(r.name == "aiohttp.access" for r in caplog.records)  # the capture works


# configure_logging


def test_configure_logging_writes_json_lines_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    with root_logging_restored():
        configure_logging("debug", "json")
        configure_logging("info", "json")  # replaces the first setup, no second handler
        root = logging.getLogger()
        assert len(root.handlers) == 1
        assert root.level == logging.INFO
        log = logging.getLogger("gateway.test")
        log.debug("below the level")
        log.info("first", extra={"request_id": "req-1", "status": 200})
        log.warning("second")
        try:
            raise RuntimeError("broken")
        except RuntimeError:
            log.exception("third")
        logging.getLogger("aiohttp.access").info("GET /users?token=x")  # disabled
        captured = capsys.readouterr()
    assert captured.err == ""
    lines = [orjson.loads(line) for line in captured.out.splitlines()]
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        ("info", "gateway.test", "first"),
        ("warning", "gateway.test", "second"),
        ("error", "gateway.test", "third"),
    ]
    assert (lines[0]["request_id"], lines[0]["status"]) == ("req-1", 200)
    assert lines[2]["exception"].endswith("RuntimeError: broken")


def test_configure_logging_text_format(capsys: pytest.CaptureFixture[str]) -> None:
    with root_logging_restored():
        configure_logging("warning", "text")
        logging.getLogger("gateway.test").info("quiet")
        logging.getLogger("gateway.test").warning("loud", extra={"route": "users"})
        out = capsys.readouterr().out
    assert out.endswith(" WARNING gateway.test loud route=users\n")
    assert out.count("\n") == 1


def test_configure_logging_text_format_writes_one_line_per_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with root_logging_restored():
        configure_logging("info", "text")
        logging.getLogger("gateway.test").warning("upstream said %s", FORGED)
        out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "said x\\n2026-01-01T00:00:00.000+00:00 ERROR" in out


async def test_a_running_gateway_writes_only_json_lines_without_tokens(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = await aiohttp_server(create_demo_app())
    client = await gateway_factory(base_url(server), cache={"backend": "memory"})
    with root_logging_restored():
        configure_logging("debug", "json")
        assert await send(client, "/users", "r1") == 200
        assert await send(client, "/users", "r2") == 200
        assert await send(client, "/users", "r3", f"Bearer {WRONG_TOKEN}") == 401
        await server.close()
        assert await send(client, "/clients", "r4") == 502
        out = capsys.readouterr().out
    assert TOKEN not in out
    assert WRONG_TOKEN not in out
    lines = [orjson.loads(line) for line in out.splitlines()]
    access = [line for line in lines if line["logger"] == "gateway.access"]
    assert [(line["request_id"], line["status"]) for line in access] == [
        ("r1", 200),
        ("r2", 200),
        ("r3", 401),
        ("r4", 502),
    ]
    # the test upstream's own access log is off, as it is in the gateway process
    assert not [line for line in lines if line["logger"] == "aiohttp.access"]


async def test_a_token_that_is_not_utf8_is_a_401_not_an_unhandled_error(
    gateway: Client, caplog: pytest.LogCaptureFixture
) -> None:
    assert gateway.server.host is not None
    reader, writer = await asyncio.open_connection(gateway.server.host, gateway.server.port)
    writer.write(
        b"GET /users HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
        b"X-Request-ID: latin1\r\nAuthorization: Bearer t\xf6ken-0123456789\r\n\r\n"
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    # the fingerprint of such a token once failed with UnicodeEncodeError: a 500
    assert [r.getMessage() for r in caplog.records if r.name == "gateway.http"] == []
    assert answer.startswith(b"HTTP/1.1 401 ")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"\r\nWWW-Authenticate: Bearer" in head
    assert orjson.loads(body)["title"] == "Authentication required"
    access = access_lines(caplog)
    assert [(line["request_id"], line["status"]) for line in access] == [("latin1", 401)]
    assert access[0]["token_fingerprint"] is None


async def test_an_upstream_contract_violation_is_logged_once_per_request(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def expenses(request: web.Request) -> web.Response:
        return web.json_response({"data": "not a list", "total": 1, "page": 1, "limit": 10})

    app = web.Application()
    app.router.add_get("/expenses", expenses)
    server = await aiohttp_server(app)
    client = await gateway_factory(base_url(server))
    caplog.set_level(logging.WARNING, logger="gateway.http")
    response = await client.get("/expenses", headers=AUTH)
    assert response.status == 502
    lines = [r for r in caplog.records if getattr(r, "event", None) == "upstream_contract"]
    assert len(lines) == 1
    assert lines[0].route == "expenses"  # type: ignore[attr-defined]
    assert "data" in lines[0].detail  # type: ignore[attr-defined]
    assert lines[0].request_id == response.headers["X-Request-ID"]  # type: ignore[attr-defined]


def test_a_malformed_request_is_logged_without_quoting_it() -> None:
    from aiohttp.http_exceptions import LineTooLong

    from gateway.ops.logs import MalformedRequestFilter

    try:
        raise LineTooLong("Authorization: Bearer wrong-secret-token" * 3, "8190")
    except LineTooLong:
        record = logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            ("127.0.0.1",),
            sys.exc_info(),
        )
    assert MalformedRequestFilter().filter(record)
    line = JsonFormatter().format(record)
    assert "wrong-secret-token" not in line
    assert orjson.loads(line)["message"] == "rejected a malformed HTTP request (LineTooLong)"
    assert orjson.loads(line)["level"] == "warning"
