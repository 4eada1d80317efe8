"""The reference upstream as a drifting candidate: each kind of drift against an
undrifted twin on the same seed, over real loopback sockets. Every test builds what
the drifted twin should answer from what the undrifted one answers, so anything
changed beyond the drift fails it."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from gateway.demo import DRIFT, Drift, DriftKind, create_demo_app, start_demo_server

DemoClient = TestClient[web.Request, web.Application]

AUTH = {"Authorization": "Bearer demo-token"}
ALL_EXPENSES = [{"limit": "1000", "page": "1"}, {"limit": "1000", "page": "2"}]
PINNED_EXPENSE = "/expenses/b1a6b1f1-620e-49d3-bb33-f3d8269cd696"
CASH_ACCOUNT = "/accounts/Caja%20General"
# (path, query) of every route, list pages with more than one item
ROUTES: list[tuple[str, dict[str, str]]] = [
    ("/users", {}),
    ("/clients", {"limit": "7", "page": "2"}),
    ("/accounts", {}),
    ("/accounts", {"type": "CASH"}),
    ("/accounts/ACC-001", {}),
    (CASH_ACCOUNT, {}),
    ("/expenses", {"limit": "25", "page": "3"}),
    ("/expenses", {"type": "CASH", "limit": "5"}),
    (PINNED_EXPENSE, {}),
]
NOT_EXPENSES = [route for route in ROUTES if not route[0].startswith("/expenses")]
NOT_ACCOUNT_LISTS = [route for route in ROUTES if route[0] != "/accounts"]
LISTS = ["/users", "/clients", "/accounts", "/expenses"]


@pytest.fixture
async def plain(aiohttp_client: AiohttpClient) -> DemoClient:
    return await aiohttp_client(create_demo_app())


async def twin(aiohttp_client: AiohttpClient, *kinds: str) -> DemoClient:
    return await aiohttp_client(create_demo_app(drift=kinds))


async def answer(client: DemoClient, path: str, params: dict[str, str] | None = None) -> bytes:
    async with client.get(path, params=params, headers=AUTH) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "application/json"
        return await response.read()


async def get_json(client: DemoClient, path: str, params: dict[str, str] | None = None) -> Any:
    return orjson.loads(await answer(client, path, params))


async def assert_unchanged(
    drifted: DemoClient, plain: DemoClient, routes: list[tuple[str, dict[str, str]]]
) -> None:
    for path, params in routes:
        assert await answer(drifted, path, params) == await answer(plain, path, params), path


def whole_units(amount: str) -> str:
    return str(Decimal(amount).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def ids(body: Any) -> list[str]:
    return [item["id"] for item in body["data"]]


# --- amount-scale ----------------------------------------------------------------------


async def test_amount_scale_rounds_every_expense_amount_to_whole_units(
    aiohttp_client: AiohttpClient, plain: DemoClient
) -> None:
    drifted = await twin(aiohttp_client, "amount-scale")
    sent: dict[str, str] = {}  # undrifted amount -> drifted amount

    for params in ALL_EXPENSES:
        expected = await get_json(plain, "/expenses", params)
        body = await get_json(drifted, "/expenses", params)
        for want, got in zip(expected["data"], body["data"], strict=True):
            sent[want["amount"]] = got["amount"]
            want["amount"] = whole_units(want["amount"])
        assert body == expected
    single = await get_json(plain, PINNED_EXPENSE)
    assert single["amount"] == "1694.8300"
    assert await get_json(drifted, PINNED_EXPENSE) == {**single, "amount": "1695"}

    assert sent["17385.6800"] == "17386"
    # half up, not to even: an even whole unit and a half goes up
    halves = [a for a in sent if a.endswith(".5000") and int(a[:-5]) % 2 == 0]
    assert halves
    assert {a: sent[a] for a in halves} == {a: str(int(a[:-5]) + 1) for a in halves}
    assert any(Decimal(a) % 1 > Decimal("0.5") for a in sent)
    assert any(Decimal(0) < Decimal(a) % 1 < Decimal("0.5") for a in sent)
    assert all(re.fullmatch("[0-9]+", a) for a in sent.values())
    await assert_unchanged(drifted, plain, NOT_EXPENSES)


async def test_amount_scale_filters_on_the_true_amount(
    aiohttp_client: AiohttpClient, plain: DemoClient
) -> None:
    drifted = await twin(aiohttp_client, "amount-scale")

    true = await get_json(drifted, "/expenses", {"amount": "17385.68"})
    assert [e["amount"] for e in true["data"]] == ["17386"]
    assert ids(true) == ids(await get_json(plain, "/expenses", {"amount": "17385.68"}))
    rounded = await get_json(drifted, "/expenses", {"amount": "17386"})
    assert rounded["total"] == (await get_json(plain, "/expenses", {"amount": "17386"}))["total"]
    assert "3730bf79-913a-47af-a917-9e028868b644" not in ids(rounded)


# --- order -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/users", {}),
        ("/clients", {"limit": "7", "page": "2"}),
        ("/accounts", {}),
        ("/accounts", {"type": "BANK", "limit": "4"}),
        ("/expenses", {"limit": "25", "page": "3"}),
        ("/expenses", {"status": "PENDING", "concept": "a", "limit": "6", "page": "2"}),
    ],
)
async def test_order_reverses_the_items_of_every_list_page(
    aiohttp_client: AiohttpClient, plain: DemoClient, path: str, params: dict[str, str]
) -> None:
    drifted = await twin(aiohttp_client, "order")

    expected = await get_json(plain, path, params)
    body = await get_json(drifted, path, params)

    assert len(set(ids(expected))) > 1
    assert body == {**expected, "data": expected["data"][::-1]}


async def test_order_leaves_single_resources_and_empty_pages_alone(
    aiohttp_client: AiohttpClient, plain: DemoClient
) -> None:
    drifted = await twin(aiohttp_client, "order")

    await assert_unchanged(
        drifted,
        plain,
        [route for route in ROUTES if route[0] not in LISTS]
        + [("/expenses", {"page": "999"}), ("/expenses", {"status": "LOST"})],
    )


# --- drop-bank -------------------------------------------------------------------------


async def test_drop_bank_leaves_the_bank_object_out_of_every_account(
    aiohttp_client: AiohttpClient, plain: DemoClient
) -> None:
    drifted = await twin(aiohttp_client, "drop-bank")

    for params in ({}, {"type": "BANK"}, {"type": "CASH"}, {"limit": "3", "page": "2"}):
        expected = await get_json(plain, "/accounts", params)
        for account in expected["data"]:
            account.pop("bank")
        assert await get_json(drifted, "/accounts", params) == expected

    accounts = (await get_json(plain, "/accounts"))["data"]
    assert {a["type"] for a in accounts} == {"CASH", "BANK"}
    for account in accounts:  # what the drift leaves out: BANK accounts' banks
        assert (account["bank"] is not None) is (account["type"] == "BANK")
    assert all("bank" not in a for a in (await get_json(drifted, "/accounts"))["data"])
    # the single and the embedded account carry bankCode, never bank: nothing to drop
    await assert_unchanged(drifted, plain, NOT_ACCOUNT_LISTS)


# --- enum-case -------------------------------------------------------------------------


async def test_enum_case_sends_expense_status_in_lower_case(
    aiohttp_client: AiohttpClient, plain: DemoClient
) -> None:
    drifted = await twin(aiohttp_client, "enum-case")
    statuses: set[str] = set()

    for params in ALL_EXPENSES:
        expected = await get_json(plain, "/expenses", params)
        for expense in expected["data"]:
            expense["status"] = expense["status"].lower()
        body = await get_json(drifted, "/expenses", params)
        assert body == expected
        statuses |= {expense["status"] for expense in body["data"]}
    assert statuses == {"paid", "pending", "cancelled"}
    single = await get_json(plain, PINNED_EXPENSE)
    assert await get_json(drifted, PINNED_EXPENSE) == {**single, "status": "paid"}

    pending = await get_json(drifted, "/expenses", {"status": "PENDING", "limit": "50"})
    assert {e["status"] for e in pending["data"]} == {"pending"}
    plain_pending = await get_json(plain, "/expenses", {"status": "PENDING", "limit": "50"})
    assert ids(pending) == ids(plain_pending)
    await assert_unchanged(drifted, plain, NOT_EXPENSES)


# --- noise -----------------------------------------------------------------------------


async def test_noise_changes_every_payment_id_on_every_call(
    aiohttp_client: AiohttpClient, plain: DemoClient
) -> None:
    noisy = await twin(aiohttp_client, "noise")
    params = {"limit": "50", "page": "2"}

    expected = await get_json(plain, "/expenses", params)
    first = await get_json(noisy, "/expenses", params)
    second = await get_json(noisy, "/expenses", params)

    for body in (first, second):
        assert {**body, "data": None} == {**expected, "data": None}
        assert len(body["data"]) == len(expected["data"]) == 50
        for got, want in zip(body["data"], expected["data"], strict=True):
            assert re.fullmatch(re.escape(want["paymentId"]) + r"-[0-9a-f]+", got["paymentId"])
            assert {**got, "paymentId": want["paymentId"]} == want
    for one, two in zip(first["data"], second["data"], strict=True):
        assert one["paymentId"] != two["paymentId"]

    single = await get_json(plain, PINNED_EXPENSE)
    once = await get_json(noisy, PINNED_EXPENSE)
    again = await get_json(noisy, PINNED_EXPENSE)
    assert once["paymentId"] != again["paymentId"]
    for body in (once, again):
        assert body["paymentId"].startswith(single["paymentId"] + "-")
        assert {**body, "paymentId": single["paymentId"]} == single
    await assert_unchanged(noisy, plain, NOT_EXPENSES)


async def test_without_noise_the_same_request_gets_the_same_bytes(plain: DemoClient) -> None:
    for path in ("/expenses", PINNED_EXPENSE):
        assert await answer(plain, path) == await answer(plain, path)


async def test_two_noisy_twins_do_not_send_the_same_payment_ids(
    aiohttp_client: AiohttpClient,
) -> None:
    primary = await twin(aiohttp_client, "noise")
    candidate = await twin(aiohttp_client, "noise")

    for _ in range(3):
        one = await get_json(primary, "/expenses", {"limit": "3"})
        two = await get_json(candidate, "/expenses", {"limit": "3"})
        assert ids(one) == ids(two)
        for a, b in zip(one["data"], two["data"], strict=True):
            assert a["paymentId"] != b["paymentId"]


# --- combined, and how a drift is chosen -----------------------------------------------


async def test_kinds_combine(aiohttp_client: AiohttpClient, plain: DemoClient) -> None:
    drifted = await twin(aiohttp_client, "order", "enum-case")
    params = {"limit": "20", "page": "4"}

    expected = await get_json(plain, "/expenses", params)
    for expense in expected["data"]:
        expense["status"] = expense["status"].lower()
    expected["data"].reverse()

    assert await get_json(drifted, "/expenses", params) == expected
    single = await get_json(plain, PINNED_EXPENSE)
    assert await get_json(drifted, PINNED_EXPENSE) == {**single, "status": "paid"}


def test_an_unknown_kind_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown drift kind 'sideways'") as refused:
        create_demo_app(drift=["order", "sideways"])
    for kind in DriftKind:
        assert kind.value in str(refused.value)


async def test_the_app_and_the_server_say_which_kinds_are_on() -> None:
    assert create_demo_app()[DRIFT] == Drift()
    assert str(create_demo_app()[DRIFT]) == "none"

    async with await start_demo_server(drift={"noise", "order"}) as server:
        drift = server.app[DRIFT]
        assert list(drift) == [DriftKind.ORDER, DriftKind.NOISE]
        assert str(drift) == "order, noise"
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{server.url}/users", headers=AUTH) as response,
        ):
            users = (await response.json())["data"]
    names = [user["username"] for user in users]
    assert names == sorted(names, reverse=True)
