"""The six record routes end to end: gateway and reference upstream on loopback sockets."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from typing import Any, cast

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient
from yarl import URL

from gateway.demo import RequestLog
from gateway.http.app import create_app
from gateway.process.worker import MAX_HEADER_BYTES

from ..conftest import AUTH, TOKEN, GatewayTestServer, base_url, make_settings

Client = TestClient[web.Request, web.Application]
EXPENSE_ID = "b1a6b1f1-620e-49d3-bb33-f3d8269cd696"


async def get_json(client: Client, path: str, **headers: str) -> tuple[int, Any, Any]:
    response = await client.get(URL(path, encoded=True), headers={**AUTH, **headers})
    return response.status, await response.json(content_type=None), response.headers


@pytest.mark.parametrize(
    ("path", "item_keys"),
    [
        ("/users", {"id", "username", "mail", "role", "phone", "accounts"}),
        ("/clients", {"id", "name", "vatNumber", "type", "taxRetentionPercentage"}),
        ("/accounts", {"id", "name", "accountNumber", "description", "type", "bank"}),
        ("/expenses", {"id", "amount", "paidAt", "account", "client", "user", "status"}),
    ],
)
async def test_list_routes_answer_the_upstream_page(
    gateway: Client, upstream_log: RequestLog, path: str, item_keys: set[str]
) -> None:
    status, body, headers = await get_json(gateway, path)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert body["page"] == 1
    assert body["limit"] == 10
    assert body["total"] >= len(body["data"]) > 0
    assert item_keys <= set(body["data"][0])
    assert [(r.path, r.query) for r in upstream_log.entries] == [
        (path, (("page", "1"), ("limit", "10")))
    ]


async def test_expense_by_id(gateway: Client, upstream_log: RequestLog) -> None:
    status, body, _ = await get_json(gateway, f"/expenses/{EXPENSE_ID.upper()}")
    assert status == 200
    assert body["id"] == EXPENSE_ID
    assert Decimal(body["amount"]) > 0
    assert [r.raw_path for r in upstream_log.entries] == [f"/expenses/{EXPENSE_ID}"]


async def test_expenses_filters_reach_the_upstream_canonical(
    gateway: Client, upstream_log: RequestLog
) -> None:
    status, body, _ = await get_json(
        gateway,
        "/expenses?type=bank&dateTo=2025-12-31&dateFrom=2024-01-01&limit=5&concept=a%20b"
        "&amount=12.50&account=ACC-001&status=paid&user=admin&page=2",
    )
    assert status == 200
    assert body["page"] == 2
    (seen,) = upstream_log.entries
    assert seen.query == (
        ("page", "2"),
        ("limit", "5"),
        ("dateFrom", "2024-01-01"),
        ("dateTo", "2025-12-31"),
        ("amount", "12.5"),
        ("concept", "a b"),
        ("account", "ACC-001"),
        ("status", "paid"),
        ("type", "BANK"),
        ("user", "admin"),
    )


async def test_accounts_filters_and_bank_code_name(
    gateway: Client, upstream_log: RequestLog
) -> None:
    status, body, _ = await get_json(gateway, "/accounts?type=Bank&bankCode=007")
    assert status == 200
    assert all(item["type"] == "BANK" for item in body["data"])
    assert upstream_log.entries[0].query == (
        ("page", "1"),
        ("limit", "10"),
        ("type", "BANK"),
        ("bankCode", "007"),
    )


async def test_bank_code_param_name_comes_from_config(
    gateway_factory: Any, upstream: Any, upstream_log: RequestLog
) -> None:
    from ..conftest import base_url

    client = await gateway_factory(base_url(upstream), upstream={"bank_code_param": "bank_code"})
    status, _, _ = await get_json(client, "/accounts?bankCode=007")
    assert status == 200
    assert upstream_log.entries[0].query[-1] == ("bank_code", "007")


@pytest.mark.parametrize(
    ("account_id", "encoded"),
    [
        ("Caja chica Bogotá", "Caja%20chica%20Bogot%C3%A1"),
        ("Tesorería EUR/USD", "Tesorer%C3%ADa%20EUR%2FUSD"),
        ("Cuenta Ñandú Ahorros", "Cuenta%20%C3%91and%C3%BA%20Ahorros"),
    ],
)
async def test_account_ids_reach_the_upstream_as_one_segment(
    gateway: Client, upstream_log: RequestLog, account_id: str, encoded: str
) -> None:
    status, body, _ = await get_json(gateway, f"/accounts/{encoded}")
    assert status == 200
    assert body["id"] == account_id
    assert [r.raw_path for r in upstream_log.entries] == [f"/accounts/{encoded}"]


@pytest.mark.parametrize(
    ("sent", "forwarded"),
    [
        ("a%2F..%2Fusers", "/accounts/a%2F..%2Fusers"),
        ("%2E%2E", "/accounts/%2E%2E"),
        ("x%3Fpage%3D2", "/accounts/x%3Fpage%3D2"),
    ],
)
async def test_hostile_account_ids_never_reach_another_path(
    gateway: Client, upstream_log: RequestLog, sent: str, forwarded: str
) -> None:
    status, body, headers = await get_json(gateway, f"/accounts/{sent}")
    assert status == 404
    assert headers["Content-Type"] == "application/problem+json"
    assert body["title"] == "Record not found"
    assert [r.raw_path for r in upstream_log.entries] == [forwarded]
    assert upstream_log.entries[0].path.startswith("/accounts/")


async def test_unknown_expense_is_a_404_problem(gateway: Client) -> None:
    status, body, _ = await get_json(gateway, "/expenses/00000000-0000-4000-8000-000000000000")
    assert status == 404
    assert body["status"] == 404
    assert body["type"] == "urn:records-gateway:problem:not-found"
    assert body["instance"] == "/expenses/00000000-0000-4000-8000-000000000000"


async def test_head_is_answered_like_get_without_a_body(gateway: Client) -> None:
    response = await gateway.head("/users", headers=AUTH)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    assert await response.read() == b""


async def test_validation_errors_list_every_parameter_and_call_nothing(
    gateway: Client, upstream_log: RequestLog
) -> None:
    status, body, headers = await get_json(
        gateway, "/expenses?page=0&limit=1000&dateFrom=2024-02-30&type=card&sort=asc"
    )
    assert status == 400
    assert headers["Content-Type"] == "application/problem+json"
    assert body["type"] == "urn:records-gateway:problem:invalid-parameters"
    assert body["title"] == "Invalid request parameters"
    assert body["instance"] == "/expenses?page=0&limit=1000&dateFrom=2024-02-30&type=card&sort=asc"
    assert body["requestId"] == headers["X-Request-ID"]
    assert {e["parameter"]: e["message"] for e in body["errors"]} == {
        "sort": "unknown query parameter; allowed: page, limit, dateFrom, dateTo, amount,"
        " concept, account, status, type, user",
        "page": "must be an integer from 1 to 999999999",
        "limit": "must be an integer from 1 to 100",
        "dateFrom": "is not a real calendar date",
        "type": "must be CASH or BANK",
    }
    assert len(upstream_log) == 0


@pytest.mark.parametrize(
    "path",
    [
        "/users?limit=0",
        "/clients?page=-1",
        "/accounts?type=GOLD",
        "/accounts?bankCode=",
        "/expenses?amount=NaN",
        "/expenses?dateFrom=2024-05-01&dateTo=2024-04-01",
        "/expenses?concept=%00",
        "/expenses?user=1&user=2",
        "/expenses/not-a-uuid",
        "/users?limit=5&Limit=5",
    ],
)
async def test_each_invalid_request_is_a_400_that_never_reaches_the_upstream(
    gateway: Client, upstream_log: RequestLog, path: str
) -> None:
    status, body, _ = await get_json(gateway, path)
    assert status == 400
    assert len(body["errors"]) >= 1
    assert len(upstream_log) == 0


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "this route needs an 'Authorization: Bearer <token>' header"),
        ({"Authorization": ""}, "this route needs an 'Authorization: Bearer <token>' header"),
        ({"Authorization": "Bearer "}, "the bearer token is empty"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "the Authorization header must use the"),
        ({"Authorization": "demo-token"}, "the Authorization header must use the Bearer scheme"),
    ],
)
async def test_missing_or_foreign_credentials_are_401_without_upstream_call(
    gateway: Client, upstream_log: RequestLog, headers: dict[str, str], detail: str
) -> None:
    response = await gateway.get("/expenses", headers=headers)
    body = await response.json(content_type=None)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.headers["Content-Type"] == "application/problem+json"
    assert body["title"] == "Authentication required"
    assert body["detail"].startswith(detail)
    assert len(upstream_log) == 0


async def test_token_is_forwarded_verbatim_and_never_echoed(
    gateway: Client, upstream_log: RequestLog
) -> None:
    response = await gateway.get("/users", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200
    response = await gateway.get("/users", headers={"Authorization": "bearer  wrong-secret-token"})
    body = await response.text()
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert "the upstream did not accept the bearer token" in body
    assert "wrong-secret-token" not in body
    assert [r.authorization for r in upstream_log.entries] == [
        f"Bearer {TOKEN}",
        "bearer  wrong-secret-token",
    ]


async def test_request_id_is_kept_or_generated_and_forwarded(
    gateway: Client, upstream_log: RequestLog
) -> None:
    response = await gateway.get("/users", headers={**AUTH, "X-Request-ID": "abc-123.X_y"})
    assert response.headers["X-Request-ID"] == "abc-123.X_y"
    response = await gateway.get("/users?page=2", headers={**AUTH, "X-Request-ID": "bad id!"})
    generated = response.headers["X-Request-ID"]
    assert generated != "bad id!"
    assert len(generated) == 32
    response = await gateway.get("/users", headers={**AUTH, "X-Request-ID": "a" * 129})
    assert response.headers["X-Request-ID"] != "a" * 129
    assert [r.request_id for r in upstream_log.entries][:2] == ["abc-123.X_y", generated]


async def test_unknown_path_is_a_404_problem(gateway: Client) -> None:
    response = await gateway.get("/payments", headers=AUTH)
    body = await response.json(content_type=None)
    assert response.status == 404
    assert response.headers["Content-Type"] == "application/problem+json"
    assert body["status"] == 404
    assert "/expenses/{expenseId}" in body["detail"]
    assert response.headers["X-Request-ID"] == body["requestId"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_other_methods_are_405_with_allow(
    gateway: Client, upstream_log: RequestLog, method: str
) -> None:
    response = await gateway.request(method, "/expenses", headers=AUTH)
    body = await response.json(content_type=None)
    assert response.status == 405
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD"}
    assert body["title"] == "Method Not Allowed"
    assert len(upstream_log) == 0


async def test_healthz_needs_no_token(gateway: Client) -> None:
    response = await gateway.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_an_account_id_with_braces_reaches_the_upstream(
    gateway: Client, upstream_log: RequestLog
) -> None:
    status, body, _ = await get_json(gateway, "/accounts/a%7Bb%7D")
    assert status == 404
    assert body["title"] == "Record not found"  # the upstream's 404, not "no such route"
    assert [r.raw_path for r in upstream_log.entries] == ["/accounts/a%7Bb%7D"]


async def test_an_invalid_percent_escape_is_a_400_not_a_replacement_character(
    gateway: Client, upstream_log: RequestLog
) -> None:
    status, body, _ = await get_json(gateway, "/expenses?concept=20%de")
    assert status == 400
    assert body["errors"] == [
        {"parameter": "concept", "message": "is not valid UTF-8 once percent-decoded"}
    ]
    status, _, _ = await get_json(gateway, "/expenses?concept=20%25de")
    assert status == 200
    assert upstream_log.entries[0].query == (
        ("page", "1"),
        ("limit", "10"),
        ("concept", "20%de"),
    )


@pytest.mark.parametrize(
    ("segment", "message"),
    [
        ("%zz", "has a % that starts no percent-escape (write a % itself as %25)"),
        ("Caja%", "has a % that starts no percent-escape (write a % itself as %25)"),
        ("a%2", "has a % that starts no percent-escape (write a % itself as %25)"),
        ("%ff", "is not valid UTF-8 once percent-decoded"),
        ("a%ffb", "is not valid UTF-8 once percent-decoded"),
        ("Bogot%C3", "is not valid UTF-8 once percent-decoded"),
        ("%ed%a0%80", "is not valid UTF-8 once percent-decoded"),
    ],
)
async def test_an_account_id_with_an_invalid_percent_escape_is_a_400_that_calls_nothing(
    gateway: Client, upstream_log: RequestLog, segment: str, message: str
) -> None:
    """aiohttp's router keeps such an escape as it is: forwarded, ``%zz`` would ask for
    the account the caller spells ``%25zz``."""
    status, body, _ = await get_json(gateway, f"/accounts/{segment}")
    assert status == 400
    assert body["errors"] == [{"parameter": "accountId", "message": message}]
    assert len(upstream_log) == 0
    status, body, _ = await get_json(gateway, "/accounts/%25zz")  # "%zz" itself
    assert (status, body["title"]) == (404, "Record not found")
    assert [r.raw_path for r in upstream_log.entries] == ["/accounts/%25zz"]


async def test_the_list_of_invalid_parameters_is_bounded_whatever_the_caller_sends(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    """10,000 bad parameters (in a request line the served gateway's 32 KiB allow): the
    first 20 are listed, names cut to 100 characters, and ``omittedErrors`` counts the
    rest; the answer stays a few kilobytes."""
    app = create_app(make_settings(base_url(upstream)))
    server = GatewayTestServer(app)
    await server.start_server(max_line_size=MAX_HEADER_BYTES, max_field_size=MAX_HEADER_BYTES)
    client = cast(Client, await aiohttp_client(server))
    long_name = "n" * 500
    query = "&".join([f"{long_name}=1", "page=0", *["a"] * 9_998])
    status, body, headers = await get_json(client, f"/users?{query}")
    assert status == 400
    assert headers["Content-Type"] == "application/problem+json"
    assert len(body["errors"]) == 20
    assert body["errors"][0] == {
        "parameter": "n" * 99 + "…",
        "message": "unknown query parameter; allowed: page, limit",
    }
    assert {error["parameter"] for error in body["errors"][1:]} == {"a"}  # in their order
    assert body["omittedErrors"] == 10_000 - 20
    assert body["detail"] == (
        "10000 request parameter(s) are invalid; see errors (the first 20; 9980 more not listed)"
    )
    assert len(orjson.dumps(body)) < 4_096 + len(body["instance"])
    status, body, _ = await get_json(client, "/users?page=0&limit=0")
    assert "omittedErrors" not in body
    assert body["detail"] == "2 request parameter(s) are invalid; see errors"


def test_a_gateway_without_redis_never_imports_redis_py() -> None:
    """redis-py and hiredis cost megabytes of memory in every worker (the bench's soak
    bound): a gateway on the memory backend, started and stopped, does not load them."""
    script = """
import asyncio, sys
from aiohttp import web
from gateway.config.settings import Settings
from gateway.http.app import create_app

async def main():
    runner = web.AppRunner(create_app(Settings()))
    await runner.setup()
    await runner.cleanup()

asyncio.run(main())
print(sorted(name for name in sys.modules if name.split(".")[0] in ("redis", "hiredis")))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
