"""The reference upstream over real loopback sockets: shapes, paging, filters, errors."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from gateway.demo import (
    DATASET,
    REQUEST_LOG,
    DemoServer,
    RequestLog,
    RequestRecord,
    create_demo_app,
    start_demo_server,
)
from gateway.demo.dataset import Dataset, Expense

DemoClient = TestClient[web.Request, web.Application]

AUTH = {"Authorization": "Bearer demo-token"}
USER_KEYS = {"id", "username", "mail", "role", "phone", "accounts"}
LISTED_CLIENT_KEYS = {"id", "name", "vatNumber", "type", "taxRetentionPercentage"}
EMBEDDED_CLIENT_KEYS = LISTED_CLIENT_KEYS | {"description"}
ACCOUNT_BASE_KEYS = {"id", "name", "accountNumber", "description", "type", "liquidityThreshold"}
LISTED_ACCOUNT_KEYS = ACCOUNT_BASE_KEYS | {"bank", "lastBalance"}
SINGLE_ACCOUNT_KEYS = ACCOUNT_BASE_KEYS | {"bankCode", "lastBalance"}
EMBEDDED_ACCOUNT_KEYS = ACCOUNT_BASE_KEYS | {"bankCode"}
BANK_KEYS = {"name", "country", "code", "swiftCode"}
EXPENSE_KEYS = {
    "id", "paymentId", "currencyCode", "amount", "paidAt", "method", "description",
    "category", "issueDate", "dueDate", "type", "status", "account", "client", "user",
}  # fmt: skip
ENVELOPE_KEYS = {"data", "total", "page", "limit", "totalPages", "hasNext", "hasPrevious"}

FOUR_DECIMALS = re.compile(r"-?[0-9]+\.[0-9]{4}")
TWO_DECIMALS = re.compile(r"-?[0-9]+\.[0-9]{2}")
ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
PAID_AT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def client(aiohttp_client: AiohttpClient) -> DemoClient:
    return await aiohttp_client(create_demo_app())


def dataset_of(client: DemoClient) -> Dataset:
    return client.app[DATASET]


def log_of(client: DemoClient) -> RequestLog:
    return client.app[REQUEST_LOG]


async def get_json(
    client: DemoClient,
    path: str,
    params: dict[str, str] | None = None,
    *,
    status: int = 200,
) -> Any:
    async with client.get(path, params=params, headers=AUTH) as response:
        assert response.status == status, await response.text()
        assert response.headers["Content-Type"] == "application/json"
        return await response.json()


async def all_expenses(client: DemoClient, params: dict[str, str] | None = None) -> list[Any]:
    items: list[Any] = []
    page = 1
    while True:
        body = await get_json(
            client, "/expenses", {**(params or {}), "limit": "1000", "page": str(page)}
        )
        items.extend(body["data"])
        if not body["hasNext"]:
            assert len(items) == body["total"]
            return items
        page += 1


def expected_ids(client: DemoClient, keep: Any) -> list[str]:
    """Ids of the dataset's expenses that ``keep`` accepts, in the API's order."""
    chosen: list[Expense] = sorted(
        (e for e in dataset_of(client).expenses if keep(e)), key=lambda e: e.id
    )
    chosen.sort(key=lambda e: e.issue_date, reverse=True)
    return [e.id for e in chosen]


def assert_error(body: Any, error: str) -> None:
    assert set(body) == {"error", "message"}
    assert body["error"] == error
    assert isinstance(body["message"], str)
    assert body["message"]


# --- shapes ------------------------------------------------------------------------


async def test_users_page(client: DemoClient) -> None:
    body = await get_json(client, "/users")

    assert set(body) == ENVELOPE_KEYS
    users = body["data"]
    assert body["total"] == len(dataset_of(client).users) == len(users)
    assert [u["username"] for u in users] == sorted(u["username"] for u in users)
    account_names = {a.name for a in dataset_of(client).accounts}
    for user in users:
        assert set(user) == USER_KEYS
        assert str(uuid.UUID(user["id"])) == user["id"]
        assert all(isinstance(user[key], str) for key in USER_KEYS - {"accounts"})
        assert set(user["accounts"]) <= account_names
    admin = next(u for u in users if u["username"] == "admin")
    assert admin["role"] == "ADMIN"
    assert admin["mail"] == "admin@example.com"


async def test_clients_have_numeric_percentage_and_no_description(client: DemoClient) -> None:
    body = await get_json(client, "/clients", {"limit": "50"})

    clients = body["data"]
    assert body["total"] == 50
    assert len(clients) == 50
    for item in clients:
        assert set(item) == LISTED_CLIENT_KEYS
        percentage = item["taxRetentionPercentage"]
        assert isinstance(percentage, int | float)
        assert not isinstance(percentage, bool)
    percentages = {c["taxRetentionPercentage"] for c in clients}
    assert 2.5 in percentages
    assert any(isinstance(p, int) for p in percentages)
    assert {c["type"] for c in clients} == {"CLIENT", "PROVIDER"}
    assert [c["name"].casefold() for c in clients] == sorted(c["name"].casefold() for c in clients)


async def test_listed_accounts_have_bank_object_and_no_bank_code(client: DemoClient) -> None:
    body = await get_json(client, "/accounts")

    accounts = body["data"]
    assert body["total"] == 8
    assert [a["id"] for a in accounts] == sorted(a["id"] for a in accounts)
    for account in accounts:
        assert set(account) == LISTED_ACCOUNT_KEYS
        assert TWO_DECIMALS.fullmatch(account["liquidityThreshold"])
        assert FOUR_DECIMALS.fullmatch(account["lastBalance"])
        if account["type"] == "CASH":
            assert account["bank"] is None
        else:
            assert set(account["bank"]) == BANK_KEYS
            assert isinstance(account["bank"]["country"], int)
    bancolombia = next(a for a in accounts if a["id"] == "ACC-001")
    assert bancolombia["bank"] == {
        "name": "Bancolombia",
        "country": 170,
        "code": "007",
        "swiftCode": "COLOCOBM",
    }
    assert bancolombia["liquidityThreshold"] == "5000.00"
    swift_codes = [a["bank"]["swiftCode"] for a in accounts if a["bank"] is not None]
    assert None in swift_codes
    assert {a["type"] for a in accounts} == {"CASH", "BANK"}


async def test_single_account_has_bank_code_and_no_bank_object(client: DemoClient) -> None:
    bank = await get_json(client, "/accounts/ACC-001")
    cash = await get_json(client, "/accounts/Caja%20General")

    assert set(bank) == SINGLE_ACCOUNT_KEYS
    assert bank["bankCode"] == "007"
    assert bank["name"] == "Cuenta Corriente Principal"
    assert set(cash) == SINGLE_ACCOUNT_KEYS
    assert cash["type"] == "CASH"
    assert cash["bankCode"] is None
    listed = await get_json(client, "/accounts")
    listed_bank = next(a for a in listed["data"] if a["id"] == "ACC-001")
    assert bank["lastBalance"] == listed_bank["lastBalance"]


async def test_expense_shape_and_embedded_representations(client: DemoClient) -> None:
    expenses = await all_expenses(client)

    assert len(expenses) == 2000
    for expense in expenses:
        assert set(expense) == EXPENSE_KEYS
        assert FOUR_DECIMALS.fullmatch(expense["amount"])
        assert ISO_DATE.fullmatch(expense["issueDate"])
        assert ISO_DATE.fullmatch(expense["dueDate"])
        if expense["status"] == "PAID":
            assert PAID_AT.fullmatch(expense["paidAt"])
        else:
            assert expense["paidAt"] is None
        assert set(expense["account"]) == EMBEDDED_ACCOUNT_KEYS
        assert expense["type"] == expense["account"]["type"]
        assert set(expense["client"]) == EMBEDDED_CLIENT_KEYS
        assert FOUR_DECIMALS.fullmatch(expense["client"]["taxRetentionPercentage"])
        assert set(expense["user"]) == USER_KEYS
    assert {e["status"] for e in expenses} == {"PAID", "PENDING", "CANCELLED"}
    assert len({e["currencyCode"] for e in expenses}) == 5


async def test_embedded_client_percentage_is_a_string_of_the_listed_number(
    client: DemoClient,
) -> None:
    listed = {c["id"]: c for c in (await get_json(client, "/clients", {"limit": "50"}))["data"]}
    expenses = await all_expenses(client)

    for expense in expenses:
        embedded = expense["client"]
        number = listed[embedded["id"]]["taxRetentionPercentage"]
        assert Decimal(embedded["taxRetentionPercentage"]) == Decimal(str(number))
    strings = {e["client"]["taxRetentionPercentage"] for e in expenses}
    assert "2.5000" in strings
    assert "15.0000" in strings


async def test_embedded_account_has_no_balance_and_a_bank_code(client: DemoClient) -> None:
    body = await get_json(client, "/expenses", {"account": "ACC-001", "limit": "1"})

    embedded = body["data"][0]["account"]
    assert embedded == {
        "id": "ACC-001",
        "name": "Cuenta Corriente Principal",
        "accountNumber": "0071234567",
        "description": "Operating account",
        "type": "BANK",
        "bankCode": "007",
        "liquidityThreshold": "5000.00",
    }


async def test_expense_by_id(client: DemoClient) -> None:
    listed = (await get_json(client, "/expenses", {"page": "7"}))["data"][3]

    single = await get_json(client, f"/expenses/{listed['id']}")
    upper = await get_json(client, f"/expenses/{listed['id'].upper()}")

    assert single == listed
    assert upper == listed


async def test_pinned_expense_of_seed_42(client: DemoClient) -> None:
    body = await get_json(client, "/expenses/b1a6b1f1-620e-49d3-bb33-f3d8269cd696")

    assert body["issueDate"] == "2025-03-26"
    assert body["amount"] == "1694.8300"
    assert body["account"]["id"] == "Cuenta Ñandú Ahorros"
    assert body["user"]["username"] == "admin"


@pytest.mark.parametrize(
    "expense_id",
    ["00000000-0000-4000-8000-000000000000", "not-a-uuid", "b1a6b1f1620e49d3bb33f3d8269cd696"],
)
async def test_unknown_expense_is_404(client: DemoClient, expense_id: str) -> None:
    body = await get_json(client, f"/expenses/{expense_id}", status=404)

    assert_error(body, "not_found")
    assert expense_id in body["message"]


async def test_content_type_and_byte_identical_repeats(client: DemoClient) -> None:
    async with client.get("/expenses", params={"page": "3"}, headers=AUTH) as first:
        first_body = await first.read()
    async with client.get("/expenses", params={"page": "3"}, headers=AUTH) as second:
        second_body = await second.read()

    assert first.headers["Content-Type"] == "application/json"
    assert first_body == second_body


# --- pagination --------------------------------------------------------------------


async def test_default_page_envelope(client: DemoClient) -> None:
    body = await get_json(client, "/expenses")

    assert {k: v for k, v in body.items() if k != "data"} == {
        "total": 2000,
        "page": 1,
        "limit": 10,
        "totalPages": 200,
        "hasNext": True,
        "hasPrevious": False,
    }
    assert len(body["data"]) == 10


async def test_last_page_and_beyond(client: DemoClient) -> None:
    last = await get_json(client, "/clients", {"page": "7", "limit": "8"})
    beyond = await get_json(client, "/clients", {"page": "8", "limit": "8"})

    assert len(last["data"]) == 2
    assert (last["total"], last["totalPages"], last["hasNext"], last["hasPrevious"]) == (
        50,
        7,
        False,
        True,
    )
    assert beyond["data"] == []
    assert (beyond["total"], beyond["page"], beyond["totalPages"]) == (50, 8, 7)
    assert (beyond["hasNext"], beyond["hasPrevious"]) == (False, True)


async def test_pages_are_consecutive_slices(client: DemoClient) -> None:
    whole = await get_json(client, "/expenses", {"limit": "30"})
    second = await get_json(client, "/expenses", {"limit": "10", "page": "2"})
    small = await get_json(client, "/expenses", {"limit": "7", "page": "3"})

    assert second["data"] == whole["data"][10:20]
    assert small["data"] == whole["data"][14:21]


async def test_expenses_sorted_by_issue_date_descending_then_id(client: DemoClient) -> None:
    expenses = await all_expenses(client)

    assert [e["id"] for e in expenses] == expected_ids(client, lambda e: True)
    keys = [(e["issueDate"], e["id"]) for e in expenses]
    for (date_a, id_a), (date_b, id_b) in itertools.pairwise(keys):
        assert date_a > date_b or (date_a == date_b and id_a < id_b)


async def test_limit_maximum(client: DemoClient) -> None:
    body = await get_json(client, "/expenses", {"limit": "1000"})

    assert len(body["data"]) == 1000
    assert body["totalPages"] == 2


@pytest.mark.parametrize(
    ("path", "params", "name"),
    [
        ("/users", {"page": "0"}, "page"),
        ("/users", {"page": "-1"}, "page"),
        ("/clients", {"page": "abc"}, "page"),
        ("/clients", {"page": ""}, "page"),
        ("/accounts", {"limit": "0"}, "limit"),
        ("/expenses", {"limit": "1001"}, "limit"),
        ("/expenses", {"limit": "2.5"}, "limit"),
        ("/expenses", {"dateFrom": "2024-13-01"}, "dateFrom"),
        ("/expenses", {"dateTo": "20240101"}, "dateTo"),
        ("/expenses", {"dateTo": "01/02/2024"}, "dateTo"),
        ("/expenses", {"amount": "12,50"}, "amount"),
        ("/expenses", {"amount": "NaN"}, "amount"),
        ("/expenses", {"amount": "1e3"}, "amount"),
        ("/expenses", {"type": "CHEQUE"}, "type"),
        ("/accounts", {"type": "SAVINGS"}, "type"),
    ],
)
async def test_invalid_parameters_are_400(
    client: DemoClient, path: str, params: dict[str, str], name: str
) -> None:
    body = await get_json(client, path, params, status=400)

    assert_error(body, "invalid_parameter")
    assert body["message"].startswith(f"{name}:")


# --- filters of /expenses ----------------------------------------------------------


async def test_date_range_is_inclusive_on_issue_date(client: DemoClient) -> None:
    params = {"dateFrom": "2024-03-01", "dateTo": "2024-03-31"}

    expenses = await all_expenses(client, params)

    ids = expected_ids(client, lambda e: "2024-03-01" <= e.issue_date.isoformat() <= "2024-03-31")
    assert [e["id"] for e in expenses] == ids
    assert {e["issueDate"] for e in expenses} >= {"2024-03-01", "2024-03-31"}


async def test_single_day_and_open_ranges(client: DemoClient) -> None:
    day = await all_expenses(client, {"dateFrom": "2025-06-15", "dateTo": "2025-06-15"})
    since = await get_json(client, "/expenses", {"dateFrom": "2025-12-01"})
    until = await get_json(client, "/expenses", {"dateTo": "2024-01-31"})
    empty = await get_json(client, "/expenses", {"dateFrom": "2025-02-01", "dateTo": "2025-01-01"})

    assert day
    assert {e["issueDate"] for e in day} == {"2025-06-15"}
    assert since["total"] == len(
        expected_ids(client, lambda e: e.issue_date.isoformat() >= "2025-12-01")
    )
    assert until["total"] == len(
        expected_ids(client, lambda e: e.issue_date.isoformat() <= "2024-01-31")
    )
    assert (empty["total"], empty["totalPages"], empty["data"]) == (0, 0, [])


async def test_amount_matches_by_value(client: DemoClient) -> None:
    target = dataset_of(client).expenses[0].amount  # 1694.8300
    short = str(target.normalize())

    body = await get_json(client, "/expenses", {"amount": short})

    assert short == "1694.83"
    assert body["total"] >= 1
    assert body["total"] == len(expected_ids(client, lambda e: e.amount == target))
    assert {e["amount"] for e in body["data"]} == {"1694.8300"}
    assert (await get_json(client, "/expenses", {"amount": "1694.8301"}))["total"] == 0


async def test_concept_searches_description_and_category(client: DemoClient) -> None:
    by_description = await all_expenses(client, {"concept": "INTERNET"})
    by_category = await all_expenses(client, {"concept": "office sup"})

    assert by_description
    assert {e["description"] for e in by_description} == {"Internet y telefonía"}
    assert by_category
    assert {e["category"] for e in by_category} == {"Office supplies"}
    assert [e["id"] for e in by_category] == expected_ids(
        client,
        lambda e: "office sup" in e.description.casefold() or "office sup" in e.category.casefold(),
    )


@pytest.mark.parametrize(
    "value", ["Caja chica Bogotá", "caja chica bogotá", "CAJA CHICA BOGOTÁ", "BANCOLOMBIA_MAIN"]
)
async def test_account_filter_by_id_or_name(client: DemoClient, value: str) -> None:
    expenses = await all_expenses(client, {"account": value})

    assert expenses
    wanted = value.casefold()
    assert [e["id"] for e in expenses] == expected_ids(
        client,
        lambda e: wanted in {e.account.id.casefold(), e.account.name.casefold()},
    )


async def test_account_filter_by_name_of_a_fixed_key_account(client: DemoClient) -> None:
    by_name = await get_json(client, "/expenses", {"account": "Bancolombia Recaudos"})
    by_id = await get_json(client, "/expenses", {"account": "BANCOLOMBIA_MAIN"})
    partial = await get_json(client, "/expenses", {"account": "Bancolombia"})

    assert by_name == by_id
    assert by_name["total"] > 0
    assert partial["total"] == 0


async def test_status_and_type_filters_ignore_case(client: DemoClient) -> None:
    pending = await all_expenses(client, {"status": "pending"})
    cash = await all_expenses(client, {"type": "Cash"})
    unknown = await get_json(client, "/expenses", {"status": "REFUNDED"})

    assert pending
    assert {e["status"] for e in pending} == {"PENDING"}
    assert [e["id"] for e in pending] == expected_ids(client, lambda e: e.status == "PENDING")
    assert {e["type"] for e in cash} == {"CASH"}
    assert [e["id"] for e in cash] == expected_ids(client, lambda e: e.type == "CASH")
    assert unknown["total"] == 0


async def test_user_filter_by_username_or_id(client: DemoClient) -> None:
    user = next(u for u in dataset_of(client).users if u.username == "maria.gomez")

    by_username = await get_json(client, "/expenses", {"user": "Maria.Gomez"})
    by_id = await get_json(client, "/expenses", {"user": user.id.upper()})

    assert by_username == by_id
    assert by_username["total"] == len(expected_ids(client, lambda e: e.user.id == user.id))
    assert {e["user"]["username"] for e in by_username["data"]} == {"maria.gomez"}


async def test_filters_combine_with_and(client: DemoClient) -> None:
    params = {
        "dateFrom": "2024-06-01",
        "dateTo": "2025-05-31",
        "status": "PAID",
        "type": "BANK",
        "user": "admin",
        "concept": "a",
    }

    expenses = await all_expenses(client, params)

    assert expenses
    assert [e["id"] for e in expenses] == expected_ids(
        client,
        lambda e: (
            "2024-06-01" <= e.issue_date.isoformat() <= "2025-05-31"
            and e.status == "PAID"
            and e.type == "BANK"
            and e.user.username == "admin"
            and ("a" in e.description.casefold() or "a" in e.category.casefold())
        ),
    )
    everything_paid = await get_json(client, "/expenses", {"status": "PAID"})
    assert len(expenses) < everything_paid["total"]


async def test_account_of_other_type_matches_nothing(client: DemoClient) -> None:
    body = await get_json(client, "/expenses", {"account": "Caja General", "type": "BANK"})

    assert body["total"] == 0


async def test_unknown_and_empty_parameters_are_ignored(client: DemoClient) -> None:
    plain = await get_json(client, "/expenses")
    noisy = await get_json(
        client, "/expenses", {"sort": "amount", "foo": "bar", "concept": "", "account": ""}
    )

    assert noisy == plain


async def test_first_value_of_a_repeated_parameter_wins(client: DemoClient) -> None:
    async with client.get("/expenses?status=PENDING&status=PAID", headers=AUTH) as response:
        body = await response.json()

    assert {e["status"] for e in body["data"]} == {"PENDING"}


# --- filters of /accounts ----------------------------------------------------------


async def test_accounts_filter_by_type(client: DemoClient) -> None:
    cash = await get_json(client, "/accounts", {"type": "cash"})

    assert [a["id"] for a in cash["data"]] == ["Caja General", "Caja chica Bogotá"]
    assert cash["total"] == 2


async def test_accounts_filter_by_bank_code(client: DemoClient) -> None:
    bancolombia = await get_json(client, "/accounts", {"bankCode": "007"})
    combined = await get_json(client, "/accounts", {"bankCode": "007", "type": "CASH"})
    unknown = await get_json(client, "/accounts", {"bankCode": "999"})
    paged = await get_json(client, "/accounts", {"bankCode": "007", "limit": "1", "page": "2"})

    assert [a["id"] for a in bancolombia["data"]] == ["ACC-001", "BANCOLOMBIA_MAIN"]
    assert combined["total"] == 0
    assert unknown["data"] == []
    assert [a["id"] for a in paged["data"]] == ["BANCOLOMBIA_MAIN"]
    assert (paged["total"], paged["totalPages"], paged["hasNext"]) == (2, 2, False)


# --- single account lookup ---------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "account_id"),
    [
        ("ACC-001", "ACC-001"),
        ("acc-001", "ACC-001"),
        ("Cuenta Corriente Principal", "ACC-001"),
        ("bancolombia recaudos", "BANCOLOMBIA_MAIN"),
        ("Caja chica Bogotá", "Caja chica Bogotá"),
        ("Cuenta Ñandú Ahorros", "Cuenta Ñandú Ahorros"),
        ("cuenta ñandú ahorros", "Cuenta Ñandú Ahorros"),
        ("Tesorería EUR/USD", "Tesorería EUR/USD"),
    ],
)
async def test_account_by_id_or_name(client: DemoClient, segment: str, account_id: str) -> None:
    encoded = quote(segment, safe="")

    body = await get_json(client, f"/accounts/{encoded}")

    assert body["id"] == account_id
    (entry,) = log_of(client).entries
    assert entry.raw_path == f"/accounts/{encoded}"
    assert entry.path == f"/accounts/{segment}"


async def test_percent_encoding_is_what_the_server_sees(client: DemoClient) -> None:
    await get_json(client, "/accounts/Caja%20chica%20Bogot%C3%A1")

    (entry,) = log_of(client).entries
    assert entry.raw_path == "/accounts/Caja%20chica%20Bogot%C3%A1"


@pytest.mark.parametrize("segment", ["ACC-999", "Caja", "Tesorer%C3%ADa%20EUR", "Tesorería EUR"])
async def test_unknown_account_is_404(client: DemoClient, segment: str) -> None:
    body = await get_json(client, f"/accounts/{segment}", status=404)

    assert_error(body, "not_found")


async def test_unencoded_slash_is_another_path(client: DemoClient) -> None:
    body = await get_json(client, "/accounts/Tesorer%C3%ADa%20EUR/USD", status=404)

    assert_error(body, "not_found")


# --- authentication, routing errors, HEAD, latency ---------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": "Basic ZGVtbzpkZW1v"},
        {"Authorization": "demo-token"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer  demo-token"},
    ],
)
@pytest.mark.parametrize("path", ["/users", "/expenses/x", "/accounts/ACC-001", "/nowhere"])
async def test_unauthorized(client: DemoClient, headers: dict[str, str], path: str) -> None:
    async with client.get(path, headers=headers) as response:
        body = await response.json()

    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.headers["Content-Type"] == "application/json"
    assert_error(body, "unauthorized")


async def test_scheme_is_case_insensitive(client: DemoClient) -> None:
    async with client.get("/users", headers={"Authorization": "bearer demo-token"}) as response:
        assert response.status == 200


async def test_configured_tokens(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_demo_app(tokens=frozenset({"alpha", "beta"})))

    for token, status in (("alpha", 200), ("beta", 200), ("demo-token", 401)):
        headers = {"Authorization": f"Bearer {token}"}
        async with client.get("/accounts", headers=headers) as response:
            assert response.status == status


async def test_unknown_path_is_json_404(client: DemoClient) -> None:
    body = await get_json(client, "/invoices", status=404)

    assert_error(body, "not_found")


async def test_other_methods_are_405(client: DemoClient) -> None:
    async with client.post("/expenses", json={}, headers=AUTH) as response:
        body = await response.json()

    assert response.status == 405
    assert "GET" in response.headers["Allow"]
    assert response.headers["Content-Type"] == "application/json"
    assert_error(body, "method_not_allowed")


async def test_head(client: DemoClient) -> None:
    async with client.get("/accounts/ACC-001", headers=AUTH) as get:
        get_body = await get.read()
    async with client.head("/accounts/ACC-001", headers=AUTH) as head:
        head_body = await head.read()
    async with client.head("/accounts/ACC-001") as anonymous:
        pass

    assert head.status == 200
    assert head.headers["Content-Type"] == "application/json"
    assert int(head.headers["Content-Length"]) == len(get_body)
    assert head_body == b""
    assert anonymous.status == 401
    assert [e.method for e in log_of(client).entries] == ["GET", "HEAD", "HEAD"]


async def test_latency(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_demo_app(latency_ms=60))
    loop = asyncio.get_running_loop()

    started = loop.time()
    async with client.get("/users", headers=AUTH) as response:
        assert response.status == 200
    async with client.get("/users") as response:
        assert response.status == 401

    assert loop.time() - started >= 0.12


@pytest.mark.parametrize(
    "kwargs",
    [{"tokens": frozenset()}, {"latency_ms": -1.0}, {"latency_ms": float("nan")}],
)
def test_invalid_configuration(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        create_demo_app(**kwargs)


async def test_seed_selects_the_dataset(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_demo_app(seed=7))

    body = await get_json(client, "/expenses", {"limit": "1000"})

    seed_42_ids = {e.id for e in create_demo_app()[DATASET].expenses}
    assert body["total"] == 2000
    assert seed_42_ids.isdisjoint(e["id"] for e in body["data"])


# --- request log -------------------------------------------------------------------


async def test_request_log_records_every_request(client: DemoClient) -> None:
    log = log_of(client)
    assert len(log) == 0

    await get_json(client, "/expenses", {"status": "PAID", "page": "2"})
    async with client.get(
        "/accounts/Caja%20General?x=1&x=2",
        headers={**AUTH, "X-Request-ID": "req-42", "traceparent": "tp", "tracestate": "ts"},
    ) as response:
        assert response.status == 200
    async with client.get("/users", headers={"Authorization": "Bearer nope"}) as response:
        assert response.status == 401

    assert list(log.entries) == [
        RequestRecord(
            method="GET",
            path="/expenses",
            raw_path="/expenses?status=PAID&page=2",
            query=(("status", "PAID"), ("page", "2")),
            authorization="Bearer demo-token",
            request_id=None,
        ),
        RequestRecord(
            method="GET",
            path="/accounts/Caja General",
            raw_path="/accounts/Caja%20General?x=1&x=2",
            query=(("x", "1"), ("x", "2")),
            authorization="Bearer demo-token",
            request_id="req-42",
            traceparent="tp",
            tracestate="ts",
        ),
        RequestRecord(
            method="GET",
            path="/users",
            raw_path="/users",
            query=(),
            authorization="Bearer nope",
            request_id=None,
        ),
    ]
    assert log.for_path("/users") == [log.entries[2]]


async def test_request_log_clear(client: DemoClient) -> None:
    await get_json(client, "/users")
    log_of(client).clear()

    assert len(log_of(client)) == 0
    await get_json(client, "/clients")
    assert [e.path for e in log_of(client).entries] == ["/clients"]


def test_request_log_is_bounded() -> None:
    log = RequestLog(max_entries=2)
    records = [RequestRecord("GET", f"/{n}", f"/{n}", (), None, None) for n in range(3)]

    for record in records:
        log.record(record)

    assert list(log.entries) == records[1:]


# --- servers -----------------------------------------------------------------------


async def test_start_demo_server_on_a_free_port() -> None:
    server = await start_demo_server(port=0, tokens=frozenset({"t"}))
    assert isinstance(server, DemoServer)
    match = re.fullmatch(r"http://127\.0\.0\.1:([0-9]+)", server.url)
    assert match is not None
    assert int(match.group(1)) > 0

    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"{server.url}/accounts/ACC-001", headers={"Authorization": "Bearer t"}
            ) as response,
        ):
            body = await response.json()
        assert response.status == 200
        assert body["id"] == "ACC-001"
        assert [e.path for e in server.app[REQUEST_LOG].entries] == ["/accounts/ACC-001"]
    finally:
        await server.close()

    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(f"{server.url}/users")


async def test_run_demo_upstream_serves_until_sigterm() -> None:
    code = (
        "from gateway.demo import run_demo_upstream\n"
        "run_demo_upstream(host='127.0.0.1', port=0, latency_ms=0.0, seed=42,"
        " tokens=frozenset({'cli-token'}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=20)).decode()
        match = re.search(r"http://127\.0\.0\.1:[0-9]+", line)
        assert match is not None, line
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                f"{match.group(0)}/users", headers={"Authorization": "Bearer cli-token"}
            ) as response,
        ):
            assert response.status == 200
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert process.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr
