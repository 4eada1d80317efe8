"""The records an answer holds and the references that name them (docs/purging.md)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from pytest_aiohttp import AiohttpClient

from gateway.demo import create_demo_app
from gateway.normalise.holdings import FIELD_SEPARATOR, BadReference, RecordRef, parse_ref
from gateway.normalise.normaliser import CoercionCounts, Normaliser
from gateway.records.routes import parse_record_query
from gateway.routing.standard import ACCOUNT, ACCOUNTS, CLIENTS, EXPENSE, EXPENSES, USERS

AUTH = {"Authorization": "Bearer demo-token"}


async def upstream_body(aiohttp_client: AiohttpClient, path: str) -> Any:
    client = await aiohttp_client(create_demo_app())
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    return orjson.loads(await response.read())


def held(route: Any, body: Any, record_id: str | None = None, **query: str) -> dict[str, str]:
    normaliser = Normaliser(CoercionCounts())
    asked = parse_record_query(route, record_id, list(query.items()), max_limit=100)
    published, holdings = normaliser.normalise_held(asked, orjson.dumps(body), versions=True)
    assert published == normaliser.normalise(asked, orjson.dumps(body))
    plain = normaliser.normalise_held(asked, orjson.dumps(body))
    # the same records, no versions (nor the fields some views leave out)
    records = [ref for ref in holdings if FIELD_SEPARATOR not in ref]
    assert plain == (published, dict.fromkeys(records, ""))
    return holdings


def records(holdings: dict[str, str]) -> set[str]:
    """The records themselves, without their separately versioned fields."""
    return {ref for ref in holdings if FIELD_SEPARATOR not in ref}


async def test_a_page_of_expenses_holds_each_expense_and_what_each_embeds(
    aiohttp_client: AiohttpClient,
) -> None:
    page = await upstream_body(aiohttp_client, "/expenses?limit=10")
    holdings = held(EXPENSES, page, limit="10")
    clients = {f"client:{expense['client']['id'].lower()}" for expense in page["data"]}
    # each embedded client's description, versioned on its own
    assert set(holdings) - records(holdings) == {
        c + FIELD_SEPARATOR + "description" for c in clients
    }
    holdings = {ref: v for ref, v in holdings.items() if ref in records(holdings)}
    expected = set()
    for expense in page["data"]:
        expected.add(f"expense:{expense['id'].lower()}")
        expected.add(f"account:{expense['account']['id']}")
        expected.add(f"client:{expense['client']['id'].lower()}")
        expected.add(f"user:{expense['user']['id'].lower()}")
    assert set(holdings) == expected
    assert len(expected) < 40  # accounts are shared: each is held once
    assert all(len(version) == 16 and int(version, 16) >= 0 for version in holdings.values())


async def test_a_version_follows_every_published_byte_of_its_record_and_no_other(
    aiohttp_client: AiohttpClient,
) -> None:
    page = await upstream_body(aiohttp_client, "/expenses?limit=3")
    before = held(EXPENSES, page, limit="3")
    changed = copy.deepcopy(page)
    first = changed["data"][0]
    first["description"] = (first["description"] or "") + " (corrected)"
    after = held(EXPENSES, changed, limit="3")
    expense = f"expense:{first['id'].lower()}"
    assert before[expense] != after[expense]
    assert {ref: v for ref, v in before.items() if ref != expense} == {
        ref: v for ref, v in after.items() if ref != expense
    }
    # the same page asked again: the same versions
    assert held(EXPENSES, page, limit="3") == before


async def test_a_single_record_and_a_page_of_users_hold_themselves(
    aiohttp_client: AiohttpClient,
) -> None:
    page = await upstream_body(aiohttp_client, "/expenses?limit=1")
    expense = page["data"][0]
    one = await upstream_body(aiohttp_client, f"/expenses/{expense['id']}")
    assert f"expense:{expense['id'].lower()}" in held(EXPENSE, one, expense["id"])
    account_id = expense["account"]["id"]
    account = await upstream_body(aiohttp_client, f"/accounts/{account_id}")
    assert records(held(ACCOUNT, account, account_id)) == {f"account:{account['id']}"}
    users = await upstream_body(aiohttp_client, "/users")
    assert set(held(USERS, users)) == {f"user:{user['id'].lower()}" for user in users["data"]}


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        (
            "expense:0C6F8D3E-1111-4000-8000-000000000001",
            RecordRef("expense", "0c6f8d3e-1111-4000-8000-000000000001"),
        ),
        (
            "user:0c6f8d3e-1111-4000-8000-000000000001",
            RecordRef("user", "0c6f8d3e-1111-4000-8000-000000000001"),
        ),
        ("account:Main account", RecordRef("account", "Main account")),
        ("account:acc:1", RecordRef("account", "acc:1")),
        ("account: two  spaces ", RecordRef("account", " two  spaces ")),
    ],
)
def test_a_reference_names_a_record(text: str, ref: RecordRef) -> None:
    assert parse_ref(text) == ref
    assert parse_ref(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("expense", "must be <kind>:<id>"),
        ("bank:1", "the kind must be one of expense, account, client, user"),
        ("client:", "the id is empty"),
        ("client:12", "client ids are UUIDs"),
        ("account:zero\u200bwidth", "printable text"),
        ("account:tab\there", "printable text"),
        ("account:bad\ufffdutf8", "valid UTF-8"),
        ("account:" + "x" * 201, "longer than 200 characters"),
    ],
)
def test_a_bad_reference_says_why(text: str, why: str) -> None:
    with pytest.raises(BadReference, match=why.replace("<", ".").replace(">", ".")):
        parse_ref(text)


async def test_a_record_has_one_version_in_every_view_that_shows_it(
    aiohttp_client: AiohttpClient,
) -> None:
    """An account embedded in an expense has no balance, one in the list a bank, the
    single account neither: their version leaves those out (docs/purging.md), and the
    balance and the bank are versioned on their own where a view shows them."""
    page = await upstream_body(aiohttp_client, "/expenses?limit=5")
    expense = page["data"][0]
    account_id, client_id = expense["account"]["id"], expense["client"]["id"]
    account, client = f"account:{account_id}", f"client:{client_id}"
    in_expense = held(EXPENSES, page, limit="5")
    single = held(
        ACCOUNT, await upstream_body(aiohttp_client, f"/accounts/{account_id}"), account_id
    )
    listed = held(ACCOUNTS, await upstream_body(aiohttp_client, "/accounts?limit=100"), limit="100")
    clients = held(CLIENTS, await upstream_body(aiohttp_client, "/clients?limit=100"), limit="100")
    assert in_expense[account] == single[account] == listed[account]
    assert in_expense[client] == clients[client]
    balance, bank = account + FIELD_SEPARATOR + "lastBalance", account + FIELD_SEPARATOR + "bank"
    assert balance not in in_expense
    assert single[balance] == listed[balance]
    assert bank in listed
    assert bank not in single

    # a new balance: the balance's version changes, the account's does not
    one = await upstream_body(aiohttp_client, f"/accounts/{account_id}")
    one["lastBalance"] = "1.0000"
    moved = held(ACCOUNT, one, account_id)
    assert moved[account] == single[account]
    assert moved[balance] != single[balance]
