"""The conformance probe against the reference upstream and against broken ones, in
process and as the ``records-gateway probe`` command."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpServer
from yarl import URL

from gateway.config.settings import UpstreamSettings
from gateway.demo import start_demo_server
from gateway.normalise.coercions import CanonicalError
from gateway.normalise.schema import NormaliseContext
from gateway.probe.conformance import Failure, ProbeReport, check_body, run_probe
from gateway.probe.report import to_json, to_text
from gateway.upstream.client import UpstreamClient
from gateway.upstream.link import UpstreamLink
from tests.conftest import AUTH, TOKEN, base_url

ROOT = Path(__file__).parent.parent.parent
EXAMPLES = ROOT / "gateway" / "http" / "openapi_examples.json"
FIRST_EXPENSE = "3730bf79-913a-47af-a917-9e028868b644"
FIRST_ACCOUNT = "ACC-001"

# What a broken upstream does to the reference's answer of one path: change the parsed
# body in place, or return bytes to send instead.
Breakage = Callable[[dict[str, Any]], bytes | None]
REFERENCE = web.AppKey("reference", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
BREAKAGES = web.AppKey("breakages", dict[str, Breakage])


async def probe(url: str, token: str = TOKEN) -> ProbeReport:
    settings = UpstreamSettings(base_url=url)
    async with UpstreamLink(settings) as link:
        return await run_probe(UpstreamClient(link, settings), token)


def break_expenses(body: dict[str, Any]) -> None:
    data = body["data"]
    data[3]["amount"] = "abc"
    data[3]["client"]["taxRetentionPercentage"] = "n/a"
    data[5]["paidAt"] = "2024-02-31T10:00:00Z"
    data[1]["internalRef"] = "X-1"
    data[2]["status"] = "refunded"
    data[7]["paidAt"] = None
    del data[8]["paidAt"]


def break_clients(body: dict[str, Any]) -> None:
    del body["total"]
    body["data"][0]["type"] = 7


def broken_upstream(reference_url: str, breakages: dict[str, Breakage]) -> web.Application:
    """Forwards every request to the reference upstream and breaks the listed paths."""

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            app[SESSION] = session
            yield

    async def forward(request: web.Request) -> web.Response:
        url = URL(request.app[REFERENCE] + request.raw_path, encoded=True)
        headers = {"Authorization": request.headers.get("Authorization", "")}
        async with request.app[SESSION].get(url, headers=headers) as response:
            status, body = response.status, await response.read()
        breakage = request.app[BREAKAGES].get(request.path)
        if status == 200 and breakage is not None:
            parsed = json.loads(body)
            body = breakage(parsed) or json.dumps(parsed).encode()
        return web.Response(status=status, body=body, content_type="application/json")

    app = web.Application()
    app[REFERENCE] = reference_url
    app[BREAKAGES] = breakages
    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/{tail:.*}", forward)
    return app


async def start_broken(
    aiohttp_server: AiohttpServer, upstream: TestServer, breakages: dict[str, Breakage]
) -> str:
    server = await aiohttp_server(broken_upstream(base_url(upstream), breakages))
    return base_url(server)


async def reference_body(upstream: TestServer, path: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(base_url(upstream) + path, headers=AUTH) as response,
    ):
        body: dict[str, Any] = await response.json()
        return body


def coercions(report: ProbeReport, route: str, field: str) -> dict[str, int]:
    return next(f.coercions for f in report.route(route).fields if f.field == field)


def variants(report: ProbeReport, route: str, field: str) -> dict[str, int]:
    return next(f.variants for f in report.route(route).fields if f.field == field)


# ------------------------------------------------------------------------- in process


async def test_reference_upstream_normalises_with_its_known_inconsistencies(
    upstream: TestServer,
) -> None:
    report = await probe(base_url(upstream))

    assert [(r.route, r.target, r.outcome) for r in report.routes] == [
        ("users", "/users?page=1&limit=10", "ok"),
        ("clients", "/clients?page=1&limit=10", "ok"),
        ("expenses", "/expenses?page=1&limit=10", "ok"),
        ("accounts", "/accounts?page=1&limit=10", "ok"),
        ("expense", f"/expenses/{FIRST_EXPENSE}", "ok"),
        ("account", f"/accounts/{FIRST_ACCOUNT}", "ok"),
    ]
    assert (report.ok, report.exit_code) == (True, 0)
    assert [r.records for r in report.routes] == [6, 10, 10, 8, 1, 1]
    assert all(not r.failures and not r.dropped for r in report.routes)
    # embedded clients send the percentage as text, listed clients as a number
    assert coercions(report, "expenses", "Client.taxRetentionPercentage") == {"string->number": 10}
    assert variants(report, "clients", "Client.taxRetentionPercentage") == {"number": 10}
    assert report.variants("Client.taxRetentionPercentage") == {"string": 11, "number": 10}
    assert "Client.taxRetentionPercentage" in report.mixed_types()
    # embedded accounts lack lastBalance and bank; listed ones lack bankCode
    assert report.route("expenses").filled_with_null == {
        "Account.bank": 10,
        "Account.lastBalance": 10,
    }
    assert variants(report, "expenses", "Account.lastBalance") == {"missing": 10}
    assert coercions(report, "accounts", "Account.bankCode") == {
        "missing->null": 2,
        "filled-from-bank.code": 6,
    }
    assert report.route("clients").filled_with_null == {"Client.description": 10}
    assert report.route("account").filled_with_null == {"Account.bank": 1}
    assert variants(report, "expenses", "Expense.paidAt") == {"string": 6, "null": 4}
    request_ids = [r.request_id or "" for r in report.routes]
    assert all(
        rid.startswith("probe-") and rid.endswith(r.route)
        for rid, r in zip(request_ids, report.routes, strict=True)
    )
    assert len({rid.split("-")[1] for rid in request_ids}) == 1


async def test_the_text_report_names_routes_fields_and_the_verdict(
    upstream: TestServer,
) -> None:
    text = to_text(await probe(base_url(upstream)))
    lines = text.splitlines()

    assert lines[0] == f"Probe of {base_url(upstream)} (page 1, limit 10 of each list)"
    headers = [line.split("  (")[0] for line in lines if line.startswith("GET ")]
    assert headers == [
        "GET /users?page=1&limit=10  OK",
        "GET /clients?page=1&limit=10  OK",
        "GET /expenses?page=1&limit=10  OK",
        "GET /accounts?page=1&limit=10  OK",
        f"GET /expenses/{FIRST_EXPENSE}  OK",
        f"GET /accounts/{FIRST_ACCOUNT}  OK",
    ]
    assert "  Client.taxRetentionPercentage  string ×10          string->number ×10" in lines
    assert "  missing, filled with null: Client.description ×10" in lines
    assert (
        lines[-1] == "6 routes: 6 OK, 0 failed, 0 skipped. Exit 0: every route probed normalises."
    )


async def test_a_broken_upstream_fails_naming_every_bad_value(
    aiohttp_server: AiohttpServer, upstream: TestServer
) -> None:
    url = await start_broken(
        aiohttp_server, upstream, {"/expenses": break_expenses, "/clients": break_clients}
    )
    report = await probe(url)

    assert (report.ok, report.exit_code) == (False, 1)
    assert [r.outcome for r in report.routes] == ["ok", "failed", "failed", "ok", "ok", "ok"]
    expenses = report.route("expenses")
    # both bad values of data[3] are found, not only the first
    assert expenses.failures == (
        Failure("data[3].amount", "a string that is not a plain decimal number"),
        Failure(
            "data[3].client.taxRetentionPercentage",
            "a string that is not a plain decimal number",
        ),
        Failure(
            "data[5].paidAt",
            "a string that is not an ISO 8601 date-time",
        ),
    )
    assert expenses.dropped == ("Expense.internalRef",)
    unknown = {f.field: f.unknown_values for f in expenses.fields if f.unknown_values}
    assert unknown == {"Expense.status": ("REFUNDED",)}
    assert expenses.filled_with_null["Expense.paidAt"] == 1
    # a missing value is counted as missing, not as null as well
    sent = await reference_body(upstream, "/expenses?page=1&limit=10")
    break_expenses(sent)
    kinds = Counter(
        "missing" if "paidAt" not in item else "null" if item["paidAt"] is None else "string"
        for item in sent["data"]
    )
    assert kinds["missing"] == 1
    assert variants(report, "expenses", "Expense.paidAt") == kinds
    # a bad envelope hides neither the envelope's other fields nor the records
    assert report.route("clients").failures == (
        Failure("total", "missing, and it cannot be derived"),
        Failure("data[0].type", "a JSON number where an enumeration value is expected"),
    )

    text = to_text(report)
    assert "GET /expenses?page=1&limit=10  FAILED" in text
    assert "    data[3].amount                         a string that is not a plain" in text
    assert "  extra fields dropped: Expense.internalRef" in text
    assert "  unknown enumeration values: Expense.status REFUNDED" in text
    assert text.endswith("6 routes: 4 OK, 2 failed, 0 skipped. Exit 1: not every route normalises.")


async def test_a_body_that_is_not_json_fails_and_an_empty_list_skips_its_detail(
    aiohttp_server: AiohttpServer, upstream: TestServer
) -> None:
    def not_json(body: dict[str, Any]) -> bytes:
        return b"<html>maintenance</html>"

    def empty(body: dict[str, Any]) -> None:
        body["data"] = []

    url = await start_broken(aiohttp_server, upstream, {"/users": not_json, "/accounts": empty})
    report = await probe(url)

    users = report.route("users")
    assert (users.outcome, users.upstream_status) == ("failed", 200)
    assert users.detail is not None
    assert users.detail.startswith("GET /users: the upstream answered with a body that is not JSON")
    account = report.route("account")
    assert (account.outcome, account.target) == ("skipped", None)
    assert account.detail == "GET /accounts returned no records to take an id from"
    assert report.route("accounts").outcome == "ok"
    assert report.exit_code == 1  # for /users; a skipped route alone does not fail


async def test_an_unreachable_upstream_fails_every_list_and_skips_the_details() -> None:
    report = await probe(f"http://127.0.0.1:{closed_port()}")

    assert [r.outcome for r in report.routes] == ["failed"] * 4 + ["skipped"] * 2
    assert all(
        r.detail is not None and "cannot connect to the upstream" in r.detail
        for r in report.routes[:4]
    )
    assert report.route("expense").detail == "GET /expenses failed, so there is no id to ask for"
    assert report.exit_code == 1


def test_a_bad_or_missing_id_hides_none_of_the_records_other_bad_values() -> None:
    """An id may not be null, so the probe cannot null it to look further: it puts a
    stand-in there, and the record's other bad values are still named, in the record
    and in those it embeds.

    Held for docs/probe.md, "What it does".
    """
    expense = json.loads(EXAMPLES.read_bytes())["expense"]["body"]
    expense["id"] = "not-a-uuid"
    expense["amount"] = "abc"
    del expense["account"]["id"]
    expense["account"]["lastBalance"] = "n/a"
    expense["user"]["id"] = None
    expense["user"]["role"] = 7

    _, failures = check_body("expense", expense)

    # found round by round, so in no particular order
    assert sorted(failures, key=lambda failure: failure.path) == [
        Failure("account.id", "missing or null; every record has one"),
        Failure("account.lastBalance", "a string that is not a plain decimal number"),
        Failure("amount", "a string that is not a plain decimal number"),
        Failure("id", "a string that is not a UUID"),
        Failure("user.id", "missing or null; every record has one"),
        Failure("user.role", "a JSON number where an enumeration value is expected"),
    ]
    page = {"data": [dict(expense["user"]), dict(expense["user"], id=7)], "total": 2}
    _, failures = check_body("users", page)
    assert sorted(failure.path for failure in failures) == [
        "data[0].id",
        "data[0].role",
        "data[1].id",
        "data[1].role",
    ]


def test_what_the_gateway_refuses_fails_even_when_the_models_accept_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(route_name: str, data: Any, context: NormaliseContext) -> Any:
        raise CanonicalError("amount", "refused by the gateway").within(0).within("data")

    monkeypatch.setattr("gateway.probe.conformance.canonical_body", refuse)
    body = {"data": [], "total": 0, "page": 1, "limit": 10}

    _, failures = check_body("expenses", body)

    assert failures == [Failure("data[0].amount", "refused by the gateway")]


# ---------------------------------------------------------------------- the command


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, **extra}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def run_probe_command(upstream_url: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "probe",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(GATEWAY_UPSTREAM__BASE_URL=upstream_url),
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_command_against_the_reference_upstream_exits_0() -> None:
    async with await start_demo_server(port=0) as server:
        code, out, err = await run_probe_command(server.url, "--token", TOKEN)

    assert code == 0, err
    assert f"GET /expenses/{FIRST_EXPENSE}  OK" in out
    for target in ("/users", "/clients", "/expenses", "/accounts"):
        assert f"GET {target}?page=1&limit=10  OK" in out
    assert out.rstrip().endswith("Exit 0: every route probed normalises.")
    assert TOKEN not in out + err


async def test_command_json_is_the_same_report() -> None:
    async with await start_demo_server(port=0) as server:
        code, out, _ = await run_probe_command(server.url, "--token", TOKEN, "--json")
        expected = json.loads(to_json(await probe(server.url)))

    assert code == 0
    report = json.loads(out)
    assert list(report) == ["base_url", "ok", "exit_code", "summary", "routes", "mixed_types"]
    assert (report["ok"], report["exit_code"]) == (True, 0)
    assert report["summary"] == {"routes": 6, "ok": 6, "failed": 0, "skipped": 0}
    assert [r["route"] for r in report["routes"]] == [r["route"] for r in expected["routes"]]
    for got, want in zip(report["routes"], expected["routes"], strict=True):
        for key in ("request_id", "elapsed_ms"):
            del got[key], want[key]
        assert got == want
    assert report["mixed_types"]["Client.taxRetentionPercentage"] == {
        "/clients": {"number": 10},
        "/expenses": {"string": 10},
        "/expenses/{expenseId}": {"string": 1},
    }


async def test_command_against_a_broken_upstream_exits_1_naming_the_path(
    aiohttp_server: AiohttpServer, upstream: TestServer
) -> None:
    url = await start_broken(aiohttp_server, upstream, {"/expenses": break_expenses})
    code, out, _ = await run_probe_command(url, "--token", TOKEN)

    assert code == 1
    assert "GET /expenses?page=1&limit=10  FAILED" in out
    assert "data[3].amount" in out
    assert "a string that is not a plain decimal number" in out
    assert out.rstrip().endswith("Exit 1: not every route normalises.")


async def test_command_with_a_wrong_token_reports_401_and_never_prints_the_token() -> None:
    secret = "wrong-s3cr3t-token"
    async with await start_demo_server(port=0) as server:
        code, out, err = await run_probe_command(server.url, "--token", secret)

    assert code == 1
    assert "GET /users: the upstream did not accept the bearer token (upstream status 401)" in out
    assert Counter(line.split("  ")[1] for line in out.splitlines() if line.startswith("GET ")) == {
        "FAILED": 4,
        "SKIPPED": 2,
    }
    assert secret not in out + err


async def test_command_with_a_bad_configuration_exits_2() -> None:
    code, out, err = await run_probe_command("ftp://records.example", "--token", TOKEN)

    assert code == 2
    assert out == ""
    assert err.startswith("records-gateway: configuration error: upstream.base_url:")


# ------------------------------------------- what the gateway refuses of a whole body

_FIXTURES = Path(__file__).parent.parent / "fixtures"


def _fixture(name: str) -> Any:
    return json.loads((_FIXTURES / f"{name}.upstream.json").read_text())


async def test_the_probe_reports_a_large_page_another_record_and_a_repeated_key(
    aiohttp_server: AiohttpServer,
) -> None:
    expenses = _fixture("expenses")
    expenses["data"] = [expenses["data"][i % 2] for i in range(11)]
    expenses["limit"] = 10
    other = _fixture("expense")
    other["id"] = "3730bf79-913a-47af-a917-9e028868b645"  # not the first item's id
    accounts = json.dumps(_fixture("accounts")).replace(
        '"lastBalance": ', '"lastBalance": "1.0000", "lastBalance": ', 1
    )
    bodies = {
        "/users": json.dumps(_fixture("users")),
        "/clients": json.dumps(_fixture("clients")),
        "/expenses": json.dumps(expenses),
        "/accounts": accounts,
    }

    async def handle(request: web.Request) -> web.Response:
        if request.path.startswith("/expenses/"):
            return web.json_response(other)
        if request.path.startswith("/accounts/"):
            return web.json_response(_fixture("account"))
        return web.Response(text=bodies[request.path], content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    report = await probe(base_url(await aiohttp_server(app)))

    def failures(route: str) -> list[tuple[str, str]]:
        return [(failure.path, failure.reason) for failure in report.route(route).failures]

    assert failures("expenses") == [("data", "11 items, more than the page's limit of 10")]
    assert failures("expense") == [("id", "not the record asked for")]
    assert failures("accounts") == [
        ("data[0].lastBalance", "the key appears more than once in its object")
    ]
    assert report.route("accounts").outcome == "failed"
    assert report.route("account").outcome == "skipped"  # no list it could read an id from
    assert [report.route(name).outcome for name in ("users", "clients")] == ["ok"] * 2
    assert report.exit_code == 1
