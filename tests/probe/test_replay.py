"""``records-gateway compare`` against twins of the reference upstream: identical ones,
drifting ones (``gateway.demo.drift``), ones that fail, refuse or are down; in process
and as the command."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpServer
from yarl import URL

from gateway.comparison.diff import answer_of
from gateway.comparison.tally import Tally
from gateway.config.settings import Settings, UpstreamSettings
from gateway.demo import REQUEST_LOG, create_demo_app, start_demo_server
from gateway.demo.server import tls_context
from gateway.errors import ConfigError
from gateway.probe.replay import (
    Comparison,
    Exchange,
    candidate_settings,
    compare_upstreams,
    judge,
    to_json,
    to_text,
)
from gateway.probe.sample import read_requests
from gateway.records.routes import parse_record_query
from gateway.routing.standard import EXPENSE
from tests.conftest import base_url

ROOT = Path(__file__).parent.parent.parent
SECRET = "compare-s3cr3t-token"
EXPENSE_ID = "3730bf79-913a-47af-a917-9e028868b644"

# What a twin does to the reference's answer: (path, status, body) -> (status, body)
Change = Callable[[str, int, bytes], tuple[int, bytes]]
REFERENCE = web.AppKey("reference", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
CHANGE: web.AppKey[Change] = web.AppKey("change")


def twin(reference_url: str, change: Change) -> web.Application:
    """Forwards every request (its token and request id) to the reference upstream and
    changes the answers as ``change`` says."""

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            app[SESSION] = session
            yield

    async def forward(request: web.Request) -> web.Response:
        url = URL(request.app[REFERENCE] + request.raw_path, encoded=True)
        names = ("Authorization", "X-Request-ID")
        headers = {name: request.headers[name] for name in names if name in request.headers}
        async with request.app[SESSION].get(url, headers=headers) as response:
            status, body = response.status, await response.read()
        status, body = request.app[CHANGE](request.path, status, body)
        return web.Response(status=status, body=body, content_type="application/json")

    app = web.Application()
    app[REFERENCE] = reference_url
    app[CHANGE] = change
    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/{tail:.*}", forward)
    return app


async def reference(aiohttp_server: AiohttpServer) -> TestServer:
    """The reference upstream, accepting the token SECRET only."""
    return await aiohttp_server(create_demo_app(tokens=frozenset({SECRET})))


async def start_twin(aiohttp_server: AiohttpServer, upstream: TestServer, change: Change) -> str:
    return base_url(await aiohttp_server(twin(base_url(upstream), change)))


async def compare(
    primary_url: str, candidate_url: str, token: str = SECRET, **options: Any
) -> Comparison:
    primary = UpstreamSettings(base_url=primary_url)
    candidate = candidate_settings(primary, candidate_url)
    return await compare_upstreams(primary, candidate, token, max_limit=100, **options)


def fields(report: dict[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """The differing fields (noise apart) of each route that has any, with their kinds."""
    return {
        name: {item["field"]: item["kinds"] for item in route["fields"]}
        for name, route in report["routes"].items()
        if route["fields"]
    }


def noise(report: dict[str, Any]) -> dict[str, set[str]]:
    return {
        name: {item["field"] for item in route["noise"]}
        for name, route in report["routes"].items()
        if route["noise"]
    }


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------------- in process


async def test_an_identical_twin_is_identical_on_every_request_and_exits_0(
    aiohttp_server: AiohttpServer,
) -> None:
    """Held for docs/switching-upstreams.md, "An example": an identical twin: every request
    identical, exit 0; each request twice to the primary and once to the candidate under
    its own id; no token in the report.
    """
    primary, candidate = await reference(aiohttp_server), await reference(aiohttp_server)
    comparison = await compare(base_url(primary), base_url(candidate))
    report = comparison.report()

    sent = len(comparison.requests)
    # (what went wrong, should it ever: the errors and what differed)
    said = {key: report[key] for key in ("totals", "primaryErrors") if key in report}
    assert comparison.exit_code == report["exitCode"] == 0, said
    assert report["totals"] == {
        "compared": sent,
        "identical": sent,
        "identicalShare": 1.0,
        "different": 0,
        "noiseOnly": 0,
        "candidateErrors": 0,
        "skipped": 0,
        "requests": sent,
        "primaryErrors": 0,
    }
    assert set(report["routes"]) == {
        "users",
        "clients",
        "expenses",
        "expense",
        "accounts",
        "account",
    }
    assert fields(report) == {}
    assert noise(report) == {}
    assert report["primaryErrors"] == {}
    assert {request["outcome"] for request in report["requests"]} == {"identical"}
    # every request twice to the primary, once to the candidate, under its own id; the
    # first pages the sample was made from, to the primary only
    ids = [request.request_id for request in comparison.requests]
    assert ids == [f"compare-{n}" for n in range(1, sent + 1)]
    primary_ids = Counter(entry.request_id for entry in primary.app[REQUEST_LOG].entries)
    candidate_log = list(candidate.app[REQUEST_LOG].entries)
    seeds = {f"compare-seed-{name}": 1 for name in ("users", "clients", "expenses", "accounts")}
    assert primary_ids == {**dict.fromkeys(ids, 2), **seeds}
    # what reached the candidate is what the gateway would send for each request
    assert {entry.request_id: entry.raw_path for entry in candidate_log} == {
        request.request_id: request.target for request in comparison.requests
    }
    assert len(candidate_log) == sent
    assert {entry.authorization for entry in candidate_log} == {f"Bearer {SECRET}"}
    assert SECRET not in to_json(comparison) + to_text(comparison)
    assert to_text(comparison).endswith(
        f"Exit 0: {sent} requests compared; nothing but noise differs."
    )


def kinds(report: dict[str, Any]) -> dict[str, dict[str, set[str]]]:
    return {route: {f: set(k) for f, k in found.items()} for route, found in fields(report).items()}


def examples(report: dict[str, Any], route: str, field: str) -> list[dict[str, Any]]:
    found = next(item for item in report["routes"][route]["fields"] if item["field"] == field)
    result: list[dict[str, Any]] = found["examples"]
    return result


async def drift_comparison(kind: str, *, primary_drift: tuple[str, ...] = ()) -> Comparison:
    tokens = frozenset({SECRET})
    async with (
        await start_demo_server(tokens=tokens, drift=primary_drift) as primary,
        await start_demo_server(tokens=tokens, drift=(kind,)) as candidate,
    ):
        return await compare(primary.url, candidate.url)


async def test_an_amount_scale_drift_is_a_value_difference_of_the_amounts_only() -> None:
    """Held for docs/switching-upstreams.md, "An example": `amount-scale`: `data[].amount` and
    `amount`, value.
    """
    comparison = await drift_comparison("amount-scale")
    report = comparison.report()

    assert kinds(report) == {
        "expenses": {"data[].amount": {"value"}},
        "expense": {"amount": {"value"}},
    }
    assert noise(report) == {}
    for route, field in (("expenses", "data[].amount"), ("expense", "amount")):
        for example in examples(report, route, field):
            rounded = Decimal(example["primary"]).quantize(Decimal(1), ROUND_HALF_UP)
            assert example["candidate"] == f"{rounded}.0000"
    # each example names a request of the report, and the request names its field
    example = examples(report, "expense", "amount")[0]
    request = next(r for r in comparison.requests if r.request_id == example["requestId"])
    assert (request.route, request.target.startswith("/expenses/")) == ("expense", True)
    assert request.fields == ("amount",)
    assert comparison.exit_code == report["exitCode"] == 1
    assert to_text(comparison).splitlines()[-1] == (
        f"Exit 1: {report['totals']['different']} different, 0 candidate errors,"
        " 0 primary errors (not compared)."
    )


async def test_an_order_drift_is_an_order_difference_of_every_list_and_nothing_else() -> None:
    """Held for docs/switching-upstreams.md, "An example": `order`: `data` of every list, order."""
    comparison = await drift_comparison("order")
    report = comparison.report()

    lists = ("users", "clients", "expenses", "accounts")
    assert kinds(report) == {route: {"data": {"order"}} for route in lists}
    assert report["routes"]["expense"]["identical"] == report["routes"]["expense"]["compared"]
    assert report["routes"]["account"]["identical"] == report["routes"]["account"]["compared"]
    # a page of one item or none has no order to differ in (the users' page 2)
    same = {r.target for r in comparison.requests if r.route in lists and not r.fields}
    assert "/users?page=2&limit=20" in same
    assert "/expenses?page=1&limit=20" not in same
    assert comparison.exit_code == 1


async def test_an_enum_case_drift_is_a_value_difference_of_the_status_as_sent() -> None:
    """Held for docs/switching-upstreams.md, "An example": `enum-case`: `data[].status` and
    `status`, value, as sent.
    """
    comparison = await drift_comparison("enum-case")
    report = comparison.report()

    assert kinds(report) == {
        "expenses": {"data[].status": {"value"}},
        "expense": {"status": {"value"}},
    }
    shown = examples(report, "expenses", "data[].status") + examples(report, "expense", "status")
    assert {(e["primary"], e["candidate"]) for e in shown} <= {
        ("PAID", "paid"),
        ("PENDING", "pending"),
        ("CANCELLED", "cancelled"),
    }
    assert comparison.exit_code == 1


async def test_a_drop_bank_drift_is_a_missing_bank_and_bank_code_of_listed_accounts() -> None:
    """The drift leaves the bank object out of every account of /accounts, the only
    shape that has one. The gateway publishes bankCode derived from bank.code, so that
    goes missing too; the single and the embedded account carry bankCode themselves
    and their published bank is null on both sides: no difference there.

    Held for docs/switching-upstreams.md, "An example": `drop-bank`: `data[].bank` and
    `data[].bankCode` of `/accounts`, missing.
    """
    comparison = await drift_comparison("drop-bank")
    report = comparison.report()

    assert kinds(report) == {
        "accounts": {"data[].bank": {"missing"}, "data[].bankCode": {"missing"}}
    }
    codes = examples(report, "accounts", "data[].bankCode")
    assert {(type(e["primary"]), e["candidate"]) for e in codes} == {(str, None)}
    banks = examples(report, "accounts", "data[].bank")
    assert all(e["primary"]["code"] and e["candidate"] is None for e in banks)
    outcomes = {r.target: r.outcome for r in comparison.requests if r.route == "accounts"}
    assert outcomes["/accounts?page=1&limit=10&type=CASH"] == "identical"  # no bank to drop
    assert outcomes["/accounts?page=1&limit=10&type=BANK"] == "different"
    for route in ("account", "expense", "expenses"):
        assert report["routes"][route]["identical"] == report["routes"][route]["compared"]
    assert comparison.exit_code == 1


async def test_noise_on_both_twins_is_reported_as_noise_not_differences_and_exits_0() -> None:
    """Held for docs/switching-upstreams.md, "An example": `noise` on both: `paymentId` under
    noise, exit 0.
    """
    comparison = await drift_comparison("noise", primary_drift=("noise",))
    report = comparison.report()

    assert fields(report) == {}
    assert noise(report) == {"expenses": {"data[].paymentId"}, "expense": {"paymentId"}}
    for route, field in (("expenses", "data[].paymentId"), ("expense", "paymentId")):
        item = next(i for i in report["routes"][route]["noise"] if i["field"] == field)
        assert item["kinds"] == {"value": item["total"]}
        assert item["evidence"]  # the primary's two answers that differed
    outcomes = Counter(r.outcome for r in comparison.requests if r.route.startswith("expense"))
    assert set(outcomes) <= {"noise", "identical"}
    assert outcomes["noise"] > 0
    assert (report["totals"]["different"], report["totals"]["candidateErrors"]) == (0, 0)
    assert comparison.exit_code == 0
    text = to_text(comparison)
    assert "   noise (differs between two answers of the primary):" in text
    assert text.splitlines()[-1].startswith("Exit 0: ")


async def test_a_candidate_that_is_down_is_a_candidate_error_on_every_request(
    aiohttp_server: AiohttpServer,
) -> None:
    """Held for docs/switching-upstreams.md, "An example": a candidate that is down: candidate
    errors, exit 1.
    """
    primary = await reference(aiohttp_server)
    comparison = await compare(base_url(primary), closed_port_url())
    report = comparison.report()

    sent = len(comparison.requests)
    assert (report["totals"]["compared"], report["totals"]["candidateErrors"]) == (0, sent)
    assert {name: route["candidateErrors"] for name, route in report["routes"].items()} == {
        name: {"unreachable": count}
        for name, count in Counter(request.route for request in comparison.requests).items()
    }
    assert {request["outcome"] for request in report["requests"]} == {"candidate_error"}
    assert report["requests"][0]["detail"].startswith(
        "GET /users: cannot connect to the upstream ("
    )
    assert comparison.exit_code == 1
    text = to_text(comparison)
    assert (
        "candidate unreachable, e.g. request compare-1 (/users?page=1&limit=20): GET /users:"
        in text
    )


async def test_what_a_candidate_fails_with_is_named_route_by_route(
    aiohttp_server: AiohttpServer,
) -> None:
    primary = await reference(aiohttp_server)

    def failing(path: str, status: int, body: bytes) -> tuple[int, bytes]:
        if path == "/clients":
            return 503, b'{"error": "down"}'
        if path == "/users":
            return 200, b"<html>maintenance</html>"
        if path == "/accounts":
            return 429, b'{"error": "slow down"}'
        if path == f"/expenses/{EXPENSE_ID}":
            return 200, body.replace(b'"amount":"', b'"amount":"x')
        return status, body

    candidate = await start_twin(aiohttp_server, primary, failing)
    comparison = await compare(base_url(primary), candidate)
    report = comparison.report()

    routes = report["routes"]
    lists = Counter(request.route for request in comparison.requests)
    assert routes["clients"]["candidateErrors"] == {"503": lists["clients"]}
    assert routes["users"]["candidateErrors"] == {"invalid-body": lists["users"]}
    assert routes["accounts"]["candidateErrors"] == {"429": lists["accounts"]}
    assert routes["expense"]["candidateErrors"] == {"invalid-body": 1}
    assert (routes["expense"]["compared"], routes["expense"]["identical"]) == (5, 5)
    assert routes["expenses"]["candidateErrors"] == routes["account"]["candidateErrors"] == {}
    assert fields(report) == {}
    invalid = next(r for r in comparison.requests if r.target == f"/expenses/{EXPENSE_ID}")
    assert invalid.error is not None
    assert invalid.error.detail.startswith(
        "GET /expenses/{expenseId}: its amount cannot be brought to the published schema"
    )
    assert comparison.exit_code == 1


async def test_a_candidate_that_refuses_what_the_primary_serves_differs_in_status(
    aiohttp_server: AiohttpServer,
) -> None:
    primary = await reference(aiohttp_server)

    def no_accounts(path: str, status: int, body: bytes) -> tuple[int, bytes]:
        if path.startswith("/accounts/"):
            return 404, b'{"error": "not_found"}'
        return status, body

    candidate = await start_twin(aiohttp_server, primary, no_accounts)
    report = (await compare(base_url(primary), candidate)).report()

    account = report["routes"]["account"]
    # every account but the unknown one, which both upstreams answer 404
    assert (account["compared"], account["identical"]) == (13, 1)
    assert fields(report) == {"account": {"(status)": {"value": 12}}}
    example = account["fields"][0]["examples"][0]
    assert (example["primary"], example["candidate"]) == (200, 404)
    assert report["exitCode"] == 1


async def test_a_request_the_primary_fails_is_not_compared_but_counted_apart(
    aiohttp_server: AiohttpServer,
) -> None:
    """Held for docs/switching-upstreams.md, "An example": a request the primary fails is not
    compared, counted apart, exit 1; a token the primary refuses too.
    """
    upstream = await reference(aiohttp_server)

    def clients_down(path: str, status: int, body: bytes) -> tuple[int, bytes]:
        return (503, b"{}") if path == "/clients" else (status, body)

    primary = await start_twin(aiohttp_server, upstream, clients_down)
    candidate = await reference(aiohttp_server)
    comparison = await compare(primary, base_url(candidate))
    report = comparison.report()

    failed = [r for r in report["requests"] if r["outcome"] == "primary_error"]
    assert {r["route"] for r in failed} == {"clients"}
    assert report["primaryErrors"] == {"clients": {"503": len(failed)}}
    assert report["totals"]["primaryErrors"] == len(failed) == 3  # no last page known
    assert "clients" not in report["routes"]
    assert (
        report["totals"]["compared"] == report["totals"]["identical"] == len(report["requests"]) - 3
    )
    assert report["sample"]["gaps"] == [
        "GET /clients: the primary gave no first page; nothing was taken from it"
    ]
    assert comparison.exit_code == 1
    text = to_text(comparison)
    assert "primary errors (these requests were not compared):\n   clients: 503 x3" in text
    assert (
        text.splitlines()[-1]
        == "Exit 1: 0 different, 0 candidate errors, 3 primary errors (not compared)."
    )


async def test_a_token_the_primary_refuses_is_a_primary_error_never_an_identical_report(
    aiohttp_server: AiohttpServer,
) -> None:
    """Held for docs/switching-upstreams.md, "An example": a request the primary fails is not
    compared, counted apart, exit 1; a token the primary refuses too.
    """
    primary, candidate = await reference(aiohttp_server), await reference(aiohttp_server)
    wrong = "not-the-s3cr3t"
    comparison = await compare(base_url(primary), base_url(candidate), token=wrong)
    report = comparison.report()

    assert report["totals"]["compared"] == 0
    assert {r["error"] for r in report["requests"]} == {"401"}
    assert len(report["sample"]["gaps"]) == 4
    assert comparison.exit_code == 1
    assert wrong not in to_json(comparison) + to_text(comparison)


def test_noise_is_learned_from_every_request_before_any_is_judged() -> None:
    """The first request's candidate differs in paymentId; only the second request's two
    primary answers show that paymentId is noise. Judged in order without the evidence
    of later requests, the first would be a difference.

    Held for docs/switching-upstreams.md, "An example": noise is learned from every request before
    any is judged.
    """
    query = parse_record_query(EXPENSE, EXPENSE_ID, (), max_limit=100)

    def answer(payment_id: str) -> Any:
        body = {"id": EXPENSE_ID, "paymentId": payment_id, "amount": "1.0000"}
        return answer_of(EXPENSE, 200, orjson.dumps(body), {})

    exchanges = [
        Exchange("compare-1", query, answer("P-1"), answer("P-1"), answer("P-1x")),
        Exchange("compare-2", query, answer("P-2"), answer("P-2y"), answer("P-2")),
    ]
    tally = Tally(primary="http://primary", candidate="http://candidate")
    outcomes = judge(tally, exchanges)

    assert [(o.request_id, o.outcome, o.fields) for o in outcomes] == [
        ("compare-1", "noise", ("paymentId",)),
        ("compare-2", "identical", ()),
    ]
    route = tally.report()["routes"]["expense"]
    assert route["fields"] == []
    assert [(n["field"], n["evidence"][0]["requestId"]) for n in route["noise"]] == [
        ("paymentId", "compare-2")
    ]
    assert tally.regressions == 0


async def test_requests_from_a_file_are_the_only_ones_sent(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    primary, candidate = await reference(aiohttp_server), await reference(aiohttp_server)
    path = tmp_path / "requests.txt"
    path.write_text("/expenses?type=BANK&limit=20\n# lookups\n/accounts/Caja%20General\n")
    queries = read_requests(path, max_limit=100)
    comparison = await compare(
        base_url(primary), base_url(candidate), queries=queries, source=str(path)
    )

    assert [(r.request_id, r.target, r.outcome) for r in comparison.requests] == [
        ("compare-1", "/expenses?page=1&limit=20&type=BANK", "identical"),
        ("compare-2", "/accounts/Caja%20General", "identical"),
    ]
    primary_log = primary.app[REQUEST_LOG]
    assert sorted((e.request_id or "", e.raw_path) for e in primary_log.entries) == [
        ("compare-1", "/expenses?page=1&limit=20&type=BANK"),
        ("compare-1", "/expenses?page=1&limit=20&type=BANK"),
        ("compare-2", "/accounts/Caja%20General"),
        ("compare-2", "/accounts/Caja%20General"),
    ]
    assert len(candidate.app[REQUEST_LOG]) == 2
    assert comparison.report()["sample"] == {"source": str(path), "gaps": []}
    assert to_text(comparison).splitlines()[-2] == f"sample: 2 requests, from {path}"


async def test_the_bank_code_filter_goes_out_under_the_upstreams_own_name(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    primary, candidate = await reference(aiohttp_server), await reference(aiohttp_server)
    path = tmp_path / "requests.txt"
    path.write_text("/accounts?bankCode=007\n")
    upstream = UpstreamSettings(base_url=base_url(primary), bank_code_param="bank_code")
    comparison = await compare_upstreams(
        upstream,
        candidate_settings(upstream, base_url(candidate)),
        SECRET,
        max_limit=100,
        queries=read_requests(path, max_limit=100),
    )

    assert [r.target for r in comparison.requests] == ["/accounts?page=1&limit=10&bankCode=007"]
    for server in (primary, candidate):
        assert {e.raw_path for e in server.app[REQUEST_LOG].entries} == {
            "/accounts?page=1&limit=10&bank_code=007"
        }


async def test_an_https_candidate_is_reached_with_the_tls_keys_of_the_shadow_section(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    ca, client_ca = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1"), client_ca.issue_cert("compare@example.test")
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key", "client_ca")}
    files.update(client_cert=tmp_path / "client.pem", client_key=tmp_path / "client.key")
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    client_ca.cert_pem.write_to_path(str(files["client_ca"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    # the candidate asks every caller for a certificate its client CA issued
    tls = tls_context(files["cert"], files["key"], files["client_ca"])
    primary = await reference(aiohttp_server)
    queries = [parse_record_query(EXPENSE, EXPENSE_ID, (), max_limit=100)]
    async with await start_demo_server(tokens=frozenset({SECRET}), tls=tls) as candidate:
        shadow = {
            "base_url": candidate.url,
            "ca_file": files["ca"],
            "client_cert_file": files["client_cert"],
            "client_key_file": files["client_key"],
        }
        for section in ({"shadow": shadow}, {}):
            upstream = Settings(upstream={"base_url": base_url(primary), **section}).upstream
            settings = candidate_settings(upstream, candidate.url)
            comparison = await compare_upstreams(
                upstream, settings, SECRET, max_limit=100, queries=queries
            )
            if section:
                assert (settings.ca_file, settings.client_cert_file) == (
                    files["ca"],
                    files["client_cert"],
                )
                assert [r.outcome for r in comparison.requests] == ["identical"]
                assert comparison.exit_code == 0
            else:
                # without the shadow's keys: the system's trust store, no certificate
                assert (settings.ca_file, settings.client_cert_file) == (None, None)
                assert [r.outcome for r in comparison.requests] == ["candidate_error"]
                error = comparison.requests[0].error
                assert error is not None
                assert (error.what, "certificate was not trusted" in error.detail) == (
                    "unreachable",
                    True,
                )
        received = [entry.request_id for entry in candidate.app[REQUEST_LOG].entries]
    assert received == ["compare-1"]


def test_an_http_candidate_takes_no_tls_key_and_a_bad_url_names_the_flag(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = Settings(
        upstream={
            "base_url": "http://primary.example",
            "timeout_s": 3,
            "bank_code_param": "bank_code",
            "shadow": {"base_url": "https://shadow.example", "ca_file": ca_file},
        }
    ).upstream

    settings = candidate_settings(upstream, "http://candidate.example:8080/v2/")
    assert (settings.base_url, settings.ca_file, settings.timeout_s) == (
        "http://candidate.example:8080/v2",
        None,
        3,
    )
    assert settings.bank_code_param == "bank_code"
    assert candidate_settings(upstream, "https://candidate.example").ca_file == ca_file
    for url, problem in (
        ("candidate.example", "--candidate: must be an absolute http:// or https:// URL"),
        ("https://u:p@candidate.example", "--candidate: must not carry credentials"),
        ("http://candidate.example/?v=2", "--candidate: must not carry a query or a fragment"),
    ):
        with pytest.raises(ConfigError) as caught:
            candidate_settings(upstream, url)
        assert str(caught.value).startswith(problem)


# ---------------------------------------------------------------------- the command


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, **extra}


async def run_compare_command(primary_url: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "compare",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(GATEWAY_UPSTREAM__BASE_URL=primary_url),
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=45)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_command_against_an_identical_twin_exits_0_and_never_prints_the_token() -> None:
    tokens = frozenset({SECRET})
    async with (
        await start_demo_server(tokens=tokens) as primary,
        await start_demo_server(tokens=tokens) as candidate,
    ):
        code, out, err = await run_compare_command(
            primary.url, "--candidate", candidate.url, "--token", SECRET
        )
        sent = len(candidate.app[REQUEST_LOG])

    assert code == 0, err
    lines = out.splitlines()
    assert lines[:2] == [f"primary:   {primary.url}", f"candidate: {candidate.url}"]
    assert f"compared {sent} requests: {sent} identical (100.0%), 0 different," in out
    assert out.rstrip().endswith(f"Exit 0: {sent} requests compared; nothing but noise differs.")
    assert SECRET not in out + err


async def test_command_json_is_the_report_with_the_documented_keys() -> None:
    tokens = frozenset({SECRET})
    async with (
        await start_demo_server(tokens=tokens) as primary,
        await start_demo_server(tokens=tokens) as candidate,
    ):
        code, out, err = await run_compare_command(
            primary.url, "--candidate", candidate.url, "--token", SECRET, "--json"
        )

    assert code == 0, err
    report = json.loads(out)
    assert list(report) == [
        "primary",
        "candidate",
        "since",
        "totals",
        "routes",
        "primaryErrors",
        "requests",
        "sample",
        "exitCode",
    ]
    assert (report["primary"], report["candidate"], report["exitCode"]) == (
        primary.url,
        candidate.url,
        0,
    )
    assert report["totals"]["requests"] == len(report["requests"]) == report["totals"]["identical"]
    assert report["requests"][0] == {
        "id": "compare-1",
        "route": "users",
        "target": "/users?page=1&limit=20",
        "outcome": "identical",
    }
    assert report["sample"] == {"source": "generated", "gaps": []}
    assert SECRET not in out + err


async def test_command_against_a_candidate_that_is_down_exits_1() -> None:
    async with await start_demo_server(tokens=frozenset({SECRET})) as primary:
        code, out, err = await run_compare_command(
            primary.url, "--candidate", closed_port_url(), "--token", SECRET
        )

    assert code == 1, err
    assert "   candidate errors: unreachable x" in out
    assert out.rstrip().splitlines()[-1].startswith("Exit 1: 0 different, ")
    assert SECRET not in out + err


async def test_command_with_a_requests_file_sends_those_requests(tmp_path: Path) -> None:
    path = tmp_path / "requests.txt"
    path.write_text("# two requests\n/accounts?type=CASH\n\n/accounts/Caja%20General\n")
    tokens = frozenset({SECRET})
    async with (
        await start_demo_server(tokens=tokens) as primary,
        await start_demo_server(tokens=tokens) as candidate,
    ):
        code, out, err = await run_compare_command(
            primary.url, "--candidate", candidate.url, "--token", SECRET, "--requests", str(path)
        )
        received = sorted(entry.raw_path for entry in candidate.app[REQUEST_LOG].entries)

    assert code == 0, err
    assert received == ["/accounts/Caja%20General", "/accounts?page=1&limit=10&type=CASH"]
    assert f"sample: 2 requests, from {path}" in out


async def test_command_with_a_bad_line_in_the_requests_file_exits_2_naming_it(
    tmp_path: Path,
) -> None:
    """Held for docs/switching-upstreams.md, "An example": a bad line of a requests file: exit 2
    with its number.
    """
    path = tmp_path / "requests.txt"
    path.write_text("/users\n# then\n/expenses?status=PAID&limit=5000\n")
    async with await start_demo_server(tokens=frozenset({SECRET})) as primary:
        code, out, err = await run_compare_command(
            primary.url, "--candidate", primary.url, "--token", SECRET, "--requests", str(path)
        )
        reached = len(primary.app[REQUEST_LOG])

    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        f"records-gateway compare: --requests {path}, line 3:"
        " '/expenses?status=PAID&limit=5000': limit: must be an integer from 1 to 100"
    ]
    assert reached == 0


async def test_command_with_a_bad_candidate_or_configuration_exits_2() -> None:
    code, out, err = await run_compare_command(
        "http://127.0.0.1:9", "--candidate", "ftp://records.example", "--token", SECRET
    )
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [
        "records-gateway compare: --candidate: must be an absolute http:// or https:// URL"
    ]

    code, out, err = await run_compare_command(
        "ftp://records.example", "--candidate", "http://127.0.0.1:9", "--token", SECRET
    )
    assert (code, out) == (2, "")
    assert err.startswith("records-gateway: configuration error: upstream.base_url:")


async def test_command_with_a_token_the_gateway_would_refuse_exits_2() -> None:
    for token, problem in (("", "the bearer token is empty"), ("a\x7fb", "control characters")):
        code, out, err = await run_compare_command(
            "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9", "--token", token
        )
        assert (code, out) == (2, "")
        assert err.startswith("records-gateway compare: --token: ")
        assert problem in err


async def test_command_help_says_the_token_goes_to_both_upstreams() -> None:
    code, out, _ = await run_compare_command("http://127.0.0.1:9", "--help")
    assert code == 0
    assert "sent to BOTH upstreams" in " ".join(out.split())
