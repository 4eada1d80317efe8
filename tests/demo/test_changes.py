"""Records that change: the reference upstream with change rates, over real loopback
sockets, on a fake clock. A record's version is read from the body: `` (rev N)`` after
its user's ``phone``, its client's ``vatNumber`` or its expense's ``method``, and N units
added to its account's ``lastBalance``."""

from __future__ import annotations

import math
import random
import re
import statistics
from decimal import Decimal
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from gateway.demo import (
    CHANGE_RATES,
    ChangeRates,
    RecordKind,
    create_demo_app,
    start_demo_server,
)
from gateway.demo.changes import MAX_PER_MINUTE, ChangeTimes, RecordVersions

DemoClient = TestClient[web.Request, web.Application]

AUTH = {"Authorization": "Bearer demo-token"}
PINNED_EXPENSE = "b1a6b1f1-620e-49d3-bb33-f3d8269cd696"  # user admin, 2025-03-26
ROUTES: list[tuple[str, dict[str, str]]] = [
    ("/users", {}),
    ("/clients", {"limit": "50"}),
    ("/accounts", {}),
    ("/accounts", {"type": "BANK", "limit": "3", "page": "2"}),
    ("/accounts/ACC-001", {}),
    ("/accounts/caja%20general", {}),
    ("/expenses", {"limit": "1000", "page": "2"}),
    ("/expenses", {"concept": "a", "status": "paid", "limit": "40", "page": "3"}),
    (f"/expenses/{PINNED_EXPENSE}", {}),
]
HOUR = 3600.0


class FakeClock:
    """Seconds since the epoch that move only when a test moves them."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def changing(
    aiohttp_client: AiohttpClient, clock: FakeClock, rates: dict[str, float], *, seed: int = 42
) -> DemoClient:
    """A reference upstream whose records change at ``rates`` on ``clock``."""
    return await aiohttp_client(create_demo_app(seed=seed, change_rates=rates, clock=clock))


async def answer(client: DemoClient, path: str, params: dict[str, str] | None = None) -> bytes:
    async with client.get(path, params=params, headers=AUTH) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def get_json(client: DemoClient, path: str, params: dict[str, str] | None = None) -> Any:
    return orjson.loads(await answer(client, path, params))


async def every(client: DemoClient, path: str, params: dict[str, str] | None = None) -> list[Any]:
    """Every item of a list, page after page."""
    items: list[Any] = []
    page = 1
    while True:
        body = await get_json(client, path, {**(params or {}), "limit": "1000", "page": str(page)})
        items.extend(body["data"])
        if not body["hasNext"]:
            return items
        page += 1


def revision(text: str, original: str) -> int:
    """N of ``original (rev N)``, 0 for ``original``; fails on anything else."""
    if text == original:
        return 0
    match = re.fullmatch(re.escape(original) + r" \(rev ([1-9][0-9]*)\)", text)
    assert match, f"{text!r} is not a revision of {original!r}"
    return int(match.group(1))


def version_in(text: str) -> int:
    """N of a text ending in `` (rev N)``, else 0."""
    match = re.search(r" \(rev ([1-9][0-9]*)\)$", text)
    return 0 if match is None else int(match.group(1))


def balance_version(balance: str, original: str) -> int:
    assert re.fullmatch(r"-?[0-9]+\.[0-9]{4}", balance)
    moved = Decimal(balance) - Decimal(original)
    assert moved == moved.to_integral_value()
    assert moved >= 0
    return int(moved)


def ids(items: list[Any]) -> list[str]:
    return [item["id"] for item in items]


# --- without change rates --------------------------------------------------------------


@pytest.mark.parametrize("rates", [{}, {"expenses": 0.0, "users": 0.0}])
async def test_without_rates_every_answer_is_todays_at_any_time(
    aiohttp_client: AiohttpClient, rates: dict[str, float]
) -> None:
    plain = await aiohttp_client(create_demo_app())
    clock = FakeClock()
    still = await changing(aiohttp_client, clock, rates)

    for seconds in (0.0, HOUR, 10 * 365 * 24 * HOUR):
        clock.now = 1_700_000_000.0 + seconds
        for path, params in ROUTES:
            assert await answer(still, path, params) == await answer(plain, path, params), path


async def test_a_kind_that_changes_leaves_answers_that_do_not_show_it_alone(
    aiohttp_client: AiohttpClient,
) -> None:
    plain = await aiohttp_client(create_demo_app())
    clock = FakeClock()
    accounts_changing = await changing(aiohttp_client, clock, {"accounts": 30})
    clock.advance(HOUR)

    for path, params in ROUTES:
        body = await answer(accounts_changing, path, params)
        if path.startswith("/accounts"):  # lastBalance: never embedded in an expense
            assert body != await answer(plain, path, params), path
        else:
            assert body == await answer(plain, path, params), path


# --- one record over time --------------------------------------------------------------


async def test_an_expense_changes_in_its_method_alone_one_version_at_a_time(
    aiohttp_client: AiohttpClient,
) -> None:
    plain = await aiohttp_client(create_demo_app())
    clock = FakeClock()
    client = await changing(aiohttp_client, clock, {"expenses": 6})
    path = f"/expenses/{PINNED_EXPENSE}"
    same_day = {"user": "admin", "dateFrom": "2025-03-26", "dateTo": "2025-03-26"}
    original = await get_json(plain, path)

    assert await answer(client, path) == await answer(plain, path)
    seen = [0]
    for _ in range(2400):  # 20 minutes in steps of half a second: about 120 changes
        clock.advance(0.5)
        body = await get_json(client, path)
        version = revision(body["method"], original["method"])
        assert body == {**original, "method": body["method"]}
        if version != seen[-1]:
            seen.append(version)
            listed = await get_json(client, "/expenses", same_day)
            assert [e for e in listed["data"] if e["id"] == PINNED_EXPENSE] == [body]
            if len(seen) == 5:
                break
    assert seen == [0, 1, 2, 3, 4]
    assert original["method"] == "TRANSFER"


async def test_versions_depend_on_the_time_alone_not_on_the_requests_made(
    aiohttp_client: AiohttpClient,
) -> None:
    plain = await aiohttp_client(create_demo_app())
    expense_ids = ids((await get_json(plain, "/expenses", {"limit": "40"}))["data"])
    requests: list[tuple[str, dict[str, str]]] = [
        *((f"/expenses/{expense_id}", {}) for expense_id in expense_ids),
        ("/expenses", {"limit": "40"}),
    ]
    start = 1_700_000_000.0
    often, once, backwards = FakeClock(start), FakeClock(start), FakeClock(start)
    asked_often = await changing(aiohttp_client, often, {"expenses": 6})
    asked_once = await changing(aiohttp_client, once, {"expenses": 6})
    asked_backwards = await changing(aiohttp_client, backwards, {"expenses": 6})

    async def ask(client: DemoClient, order: list[int]) -> list[bytes]:
        """The answers to ``requests``, asked in ``order``."""
        answers = {i: await answer(client, *requests[i]) for i in order}
        return [answers[i] for i in range(len(requests))]

    in_order = list(range(len(requests)))
    seen_often = {}
    for seconds in (0.0, 10.0, 11.0, 70.0, 200.0, 1800.0, HOUR):
        often.now = start + seconds
        seen_often[seconds] = await ask(asked_often, in_order)
    once.now = start + HOUR
    assert await ask(asked_once, in_order[::-1]) == seen_often[HOUR]
    # asked at the end first, then earlier (the clock going back), in another order
    for seconds in (HOUR, 70.0, 10.0, 1800.0):
        backwards.now = start + seconds
        assert await ask(asked_backwards, in_order[1::2] + in_order[::2]) == seen_often[seconds]

    versions = [version_in(orjson.loads(body)["method"]) for body in seen_often[HOUR][:-1]]
    assert len(set(versions)) > 10
    assert min(versions) > 0
    assert seen_often[0.0] == await ask(plain, in_order)


async def test_another_seed_draws_other_change_times(aiohttp_client: AiohttpClient) -> None:
    clock = FakeClock()
    forty_two = await changing(aiohttp_client, clock, {"clients": 6}, seed=42)
    forty_three = await changing(aiohttp_client, clock, {"clients": 6}, seed=43)
    clock.advance(HOUR)

    one = [version_in(c["vatNumber"]) for c in await every(forty_two, "/clients")]
    other = [version_in(c["vatNumber"]) for c in await every(forty_three, "/clients")]
    assert min(one) > 0
    assert min(other) > 0
    assert sorted(one) != sorted(other)
    # the same records too: the seed, not the ids, makes the difference
    rates = ChangeRates({"clients": 6})
    by_seed = [RecordVersions(rates, seed, lambda: 0.0) for seed in (42, 43)]
    same_ids = [f"client-{n}" for n in range(50)]
    assert [by_seed[0].version(RecordKind.CLIENTS, i, HOUR) for i in same_ids] != [
        by_seed[1].version(RecordKind.CLIENTS, i, HOUR) for i in same_ids
    ]


# --- the rate ---------------------------------------------------------------------------


async def test_each_kind_changes_at_its_rate(aiohttp_client: AiohttpClient) -> None:
    plain = await aiohttp_client(create_demo_app())
    clock = FakeClock()
    rates = {"users": 2.0, "clients": 3.0, "accounts": 0.5, "expenses": 6.0}
    client = await changing(aiohttp_client, clock, rates)
    minutes = 6000  # 100 hours
    expense_ids = ids((await get_json(plain, "/expenses", {"limit": "200"}))["data"])
    assert len(expense_ids) == 200

    def original_of(items: list[Any]) -> dict[str, Any]:
        return {item["id"]: item for item in items}

    users = original_of(await every(plain, "/users"))
    clients = original_of(await every(plain, "/clients"))
    accounts = original_of(await every(plain, "/accounts"))
    clock.advance(minutes * 60)

    counts: dict[str, list[int]] = {
        "users": [
            revision(u["phone"], users[u["id"]]["phone"]) for u in await every(client, "/users")
        ],
        "clients": [
            revision(c["vatNumber"], clients[c["id"]]["vatNumber"])
            for c in await every(client, "/clients")
        ],
        "accounts": [
            balance_version(a["lastBalance"], accounts[a["id"]]["lastBalance"])
            for a in await every(client, "/accounts")
        ],
        "expenses": [
            revision(
                (await get_json(client, f"/expenses/{i}"))["method"],
                (await get_json(plain, f"/expenses/{i}"))["method"],
            )
            for i in expense_ids
        ],
    }

    for kind, per_record in counts.items():
        assert len(per_record) == {"users": 6, "clients": 50, "accounts": 8}.get(kind, 200)
        measured = sum(per_record) / len(per_record) / minutes
        assert measured == pytest.approx(rates[kind], rel=0.03), kind
    # independent records: the counts spread as a Poisson count's do (variance = mean)
    expenses = counts["expenses"]
    dispersion = statistics.variance(expenses) / statistics.mean(expenses)
    assert 0.6 < dispersion < 1.4


def test_change_counts_are_poisson_far_from_the_start() -> None:
    """Deep in the tree of a record's changes (a million mean gaps in), the counts in
    a window are Poisson: mean and variance the window's length, none at all with
    probability e**-length."""
    far = 1_000_000.0
    for window in (1.0, 50.0):
        counts = []
        for n in range(3000):
            times = ChangeTimes(f"record-{n}")
            counts.append(times.changes_by(far + window) - times.changes_by(far))
        assert statistics.mean(counts) == pytest.approx(window, rel=0.05)
        assert statistics.variance(counts) == pytest.approx(window, rel=0.15)
        if window == 1.0:
            assert counts.count(0) / len(counts) == pytest.approx(math.exp(-1), abs=0.03)


def test_a_question_costs_draws_by_the_log_of_the_changes_not_by_their_number() -> None:
    drawn: list[str] = []

    class Counted(ChangeTimes):
        def _random(self, node: str) -> random.Random:
            drawn.append(node)
            return super()._random(node)

    times = Counted("record")
    year_at_most = MAX_PER_MINUTE * 60 * 24 * 365  # mean gaps in a year at the top rate
    changes = times.changes_by(year_at_most)
    assert changes == pytest.approx(year_at_most, rel=0.001)
    assert 0 < len(drawn) <= 3 * math.log2(year_at_most)
    drawn.clear()
    # the next questions in the same block cost nothing drawn
    assert times.changes_by(year_at_most + 1e-6) >= changes
    assert drawn == []


# --- pages, filters, representations ---------------------------------------------------


async def test_a_page_changes_when_one_of_its_items_changes(
    aiohttp_client: AiohttpClient,
) -> None:
    clock = FakeClock()
    client = await changing(aiohttp_client, clock, {"expenses": 6})
    params = {"limit": "5", "page": "3"}
    before = await get_json(client, "/expenses", params)

    for _ in range(1200):
        clock.advance(0.25)
        after = await get_json(client, "/expenses", params)
        if after != before:
            break
    assert after != before
    assert {**after, "data": None} == {**before, "data": None}
    changed = [
        (old, new) for old, new in zip(before["data"], after["data"], strict=True) if old != new
    ]
    assert len(changed) == 1
    old, new = changed[0]
    assert new == {**old, "method": f"{old['method']} (rev 1)"}
    assert await get_json(client, f"/expenses/{new['id']}") == new


async def test_an_expense_page_changes_with_the_user_it_embeds(
    aiohttp_client: AiohttpClient,
) -> None:
    clock = FakeClock()
    client = await changing(aiohttp_client, clock, {"users": 6})
    params = {"user": "maria.gomez", "limit": "20"}
    before = await get_json(client, "/expenses", params)
    phone = before["data"][0]["user"]["phone"]

    for _ in range(1200):
        clock.advance(0.25)
        after = await get_json(client, "/expenses", params)
        if after != before:
            break
    revised = f"{phone} (rev 1)"
    assert after == {
        **before,
        "data": [{**e, "user": {**e["user"], "phone": revised}} for e in before["data"]],
    }
    listed = await every(client, "/users")
    assert [u["phone"] for u in listed if u["username"] == "maria.gomez"] == [revised]


async def test_every_representation_shows_the_same_version(
    aiohttp_client: AiohttpClient,
) -> None:
    plain = await aiohttp_client(create_demo_app())
    clock = FakeClock()
    client = await changing(aiohttp_client, clock, {"users": 1, "clients": 1, "accounts": 1})
    clock.advance(HOUR)

    accounts = await every(client, "/accounts")
    assert len(accounts) == 8
    for account, original in zip(accounts, await every(plain, "/accounts"), strict=True):
        single = await get_json(client, f"/accounts/{account['id'].replace('/', '%2F')}")
        assert single["lastBalance"] == account["lastBalance"]
        assert balance_version(account["lastBalance"], original["lastBalance"]) > 0
        assert {**account, "lastBalance": None} == {**original, "lastBalance": None}
    vat_numbers = {c["id"]: c["vatNumber"] for c in await every(client, "/clients")}
    phones = {u["id"]: u["phone"] for u in await every(client, "/users")}
    plain_expenses = await every(plain, "/expenses")
    for expense, original in zip(await every(client, "/expenses"), plain_expenses, strict=True):
        assert expense["client"]["vatNumber"] == vat_numbers[expense["client"]["id"]]
        assert expense["user"]["phone"] == phones[expense["user"]["id"]]
        assert expense["account"] == original["account"]  # no lastBalance embedded
        assert revision(expense["client"]["vatNumber"], original["client"]["vatNumber"]) > 0
        assert expense == {
            **original,
            "client": {**original["client"], "vatNumber": expense["client"]["vatNumber"]},
            "user": {**original["user"], "phone": expense["user"]["phone"]},
        }


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/users", {}),
        ("/clients", {}),
        ("/accounts", {"type": "BANK"}),
        ("/accounts", {"bankCode": "007"}),
        ("/expenses", {}),
        ("/expenses", {"concept": "rev"}),
        ("/expenses", {"concept": "a", "status": "PAID"}),
        ("/expenses", {"type": "CASH", "dateFrom": "2025-01-01"}),
        ("/expenses", {"user": "admin", "account": "ACC-001"}),
        ("/expenses", {"amount": "17385.68"}),
    ],
)
async def test_filters_and_order_select_the_same_records_at_any_version(
    aiohttp_client: AiohttpClient, path: str, params: dict[str, str]
) -> None:
    clock = FakeClock()
    client = await changing(
        aiohttp_client, clock, {"users": 30, "clients": 30, "accounts": 30, "expenses": 30}
    )
    at_start = await every(client, path, params)
    clock.advance(HOUR)
    an_hour_on = await every(client, path, params)

    assert ids(an_hour_on) == ids(at_start)
    if params.get("concept") != "rev":  # matches nothing, before or after
        assert at_start
        assert an_hour_on != at_start


@pytest.mark.parametrize("concept", ["rev", "REV", "a", "papel", "(rev 1)"])
async def test_the_concept_filter_matches_what_the_answers_show(
    aiohttp_client: AiohttpClient, concept: str
) -> None:
    clock = FakeClock()
    client = await changing(aiohttp_client, clock, {"expenses": 30})
    clock.advance(HOUR)

    shown = await every(client, "/expenses")
    assert all("(rev " in expense["method"] for expense in shown)
    wanted = concept.casefold()
    assert ids(await every(client, "/expenses", {"concept": concept})) == [
        expense["id"]
        for expense in shown
        if wanted in expense["description"].casefold() or wanted in expense["category"].casefold()
    ]


# --- with the other options, and how rates are given ------------------------------------


async def test_changes_combine_with_drift_latency_and_seed(
    aiohttp_client: AiohttpClient,
) -> None:
    clock = FakeClock()
    changes_alone = await changing(aiohttp_client, clock, {"expenses": 6, "accounts": 6}, seed=7)
    drifted = await aiohttp_client(
        create_demo_app(
            seed=7,
            latency_ms=1,
            drift={"order", "enum-case"},
            change_rates={"expenses": 6, "accounts": 6},
            clock=clock,
        )
    )
    clock.advance(HOUR)
    params = {"limit": "30", "page": "2"}

    expected = await get_json(changes_alone, "/expenses", params)
    assert all("(rev " in e["method"] for e in expected["data"])
    for expense in expected["data"]:
        expense["status"] = expense["status"].lower()
    expected["data"].reverse()
    assert await get_json(drifted, "/expenses", params) == expected
    accounts = await get_json(changes_alone, "/accounts")
    assert await get_json(drifted, "/accounts") == {**accounts, "data": accounts["data"][::-1]}


@pytest.mark.parametrize(
    ("rates", "message"),
    [
        ({"bogus": 1.0}, "unknown record kind 'bogus'; the known kinds are"),
        ({"expenses": -1.0}, "the rate of expenses must be a number of changes per minute"),
        ({"users": math.nan}, "the rate of users must be"),
        ({"users": math.inf}, "the rate of users must be"),
        ({"clients": MAX_PER_MINUTE * 2}, "the rate of clients must be"),
        ({"accounts": True}, "the rate of accounts must be"),
        ({"accounts": "6"}, "the rate of accounts must be"),
    ],
)
def test_a_bad_rate_is_refused_naming_the_problem(rates: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        create_demo_app(change_rates=rates)
    if "unknown" in message:
        for kind in RecordKind:
            assert kind.value in str(refused.value)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["bogus=1"], "unknown record kind 'bogus'"),
        (["expenses=-1"], "the rate of expenses must be a number of changes per minute from 0"),
        (["expenses=fast"], "got 'fast'"),
        (["expenses"], "'expenses' is not KIND=PER_MINUTE"),
        (["=6"], "'=6' is not KIND=PER_MINUTE"),
        (["expenses=1", "expenses=2"], "expenses is given twice"),
    ],
)
def test_rates_written_kind_equals_per_minute(texts: list[str], message: str) -> None:
    assert ChangeRates.parse(["expenses=2", "accounts=0.5"]) == {"expenses": 2.0, "accounts": 0.5}
    with pytest.raises(ValueError, match=re.escape(message)):
        ChangeRates.parse(texts)


async def test_the_app_and_the_server_say_which_rates_are_on() -> None:
    assert create_demo_app()[CHANGE_RATES] == {}
    assert str(create_demo_app()[CHANGE_RATES]) == "none"
    clock = FakeClock()

    async with await start_demo_server(
        change_rates={"accounts": 0.5, "users": 2}, clock=clock
    ) as server:
        rates = server.app[CHANGE_RATES]
        assert list(rates) == ["users", "accounts"]
        assert str(rates) == "users=2/min, accounts=0.5/min"
        async with aiohttp.ClientSession(headers=AUTH) as http:
            async with http.get(f"{server.url}/accounts/ACC-001") as response:
                first = (await response.json())["lastBalance"]
            clock.advance(24 * HOUR)
            async with http.get(f"{server.url}/accounts/ACC-001") as response:
                later = (await response.json())["lastBalance"]
    assert balance_version(later, first) > 0
