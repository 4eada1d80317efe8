"""The normalise step as the caller sees it, through the gateway on real sockets.

- The reference document's representations (tests/fixtures/*.upstream.json) come out
  exactly as the hand-written tests/fixtures/*.expected.json.
- A value that cannot be made canonical turns the answer into a 502 problem whose
  detail names the JSON path of the bad value and the reason.
- Every coercion is counted by field and kind; an unknown enumeration value passes
  through upper-cased and is logged once.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator
from pydantic import ValidationError
from pytest_aiohttp import AiohttpServer

from gateway.http.app import COERCIONS
from gateway.normalise.coercions import CanonicalError
from gateway.normalise.normaliser import (
    CoercionCounts,
    Normaliser,
    dump,
    dump_canonical,
    first_problem,
    json_path,
    parse_lossless,
)
from gateway.normalise.pages import canonical_body
from gateway.normalise.schema import Expense, NormaliseContext
from gateway.records.routes import parse_record_query
from gateway.routing.routes import Route
from gateway.routing.standard import ROUTES

from ..conftest import AUTH, GatewayFactory, base_url

Client = TestClient[web.Request, web.Application]
FIXTURES = Path(__file__).parent.parent / "fixtures"
CONTRACT = "urn:records-gateway:problem:upstream-contract"


async def serve(aiohttp_server: AiohttpServer, body: bytes) -> str:
    """A stand-in upstream answering every GET with ``body``; returns its URL."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return base_url(await aiohttp_server(app))


async def gateway_serving(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, body: bytes
) -> Client:
    return await gateway_factory(await serve(aiohttp_server, body))


def upstream_sample(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.upstream.json").read_text())


def published(name: str) -> bytes:
    """The hand-written expected output, as the compact bytes the gateway writes."""
    return orjson.dumps(orjson.loads((FIXTURES / f"{name}.expected.json").read_bytes()))


# --------------------------------------------------------------- the reference's samples

# (fixture, route, gateway path, coercions counted for it)
SAMPLES: list[tuple[str, str, str, dict[tuple[str, str], int]]] = [
    ("users", "users", "/users?limit=2", {}),
    ("clients", "clients", "/clients?page=2&limit=3", {("Client.description", "missing->null"): 3}),
    (
        "expenses",
        "expenses",
        "/expenses?limit=2",
        {
            ("Account.bank", "missing->null"): 2,
            ("Account.lastBalance", "missing->null"): 2,
            ("Client.taxRetentionPercentage", "string->number"): 2,
        },
    ),
    (
        "expense",
        "expense",
        "/expenses/3730bf79-913a-47af-a917-9e028868b644",
        {
            ("Account.bank", "missing->null"): 1,
            ("Account.lastBalance", "missing->null"): 1,
            ("Client.taxRetentionPercentage", "string->number"): 1,
        },
    ),
    (
        "accounts",
        "accounts",
        "/accounts?page=3&limit=3",
        {
            ("Account.bankCode", "missing->null"): 1,
            ("Account.bankCode", "filled-from-bank.code"): 2,
        },
    ),
    ("account", "account", "/accounts/ACC-001", {("Account.bank", "missing->null"): 1}),
]


@pytest.mark.parametrize(("name", "route", "path", "counts"), SAMPLES)
async def test_reference_samples_are_published_exactly(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    name: str,
    route: str,
    path: str,
    counts: dict[tuple[str, str], int],
) -> None:
    body = (FIXTURES / f"{name}.upstream.json").read_bytes()
    client = await gateway_serving(aiohttp_server, gateway_factory, body)
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    assert await response.read() == published(name)
    assert client.app[COERCIONS].snapshot() == counts


@pytest.mark.parametrize(("name", "route", "path", "counts"), SAMPLES)
def test_reference_samples_take_the_same_form_on_both_paths(
    name: str, route: str, path: str, counts: dict[tuple[str, str], int]
) -> None:
    body = (FIXTURES / f"{name}.upstream.json").read_bytes()
    context = NormaliseContext(page=1, limit=10)
    model = ROUTES.models()[route].model_validate(parse_lossless(body), context=context)
    assert dump(model) == published(name)
    assert dict(context.coercions) == counts
    schema = ROUTES.models()[route].model_json_schema(mode="serialization")
    Draft202012Validator(schema).validate(json.loads(published(name)))


# ------------------------------------------------------------------- bad values: 502

Mutation = Callable[[Any], None]


def expenses_page(mutate: Mutation, items: int = 4) -> bytes:
    page = upstream_sample("expenses")
    page["data"] = [json.loads(json.dumps(page["data"][i % 2])) for i in range(items)]
    page["limit"] = max(page["limit"], items)  # no more items than its limit
    mutate(page)
    return json.dumps(page).encode()


def sample(name: str, mutate: Mutation) -> bytes:
    data = upstream_sample(name)
    mutate(data)
    return json.dumps(data).encode()


def setter(*path_and_value: Any) -> Mutation:
    *path, key, value = path_and_value

    def mutate(document: Any) -> None:
        for part in path:
            document = document[part]
        document[key] = value

    return mutate


# (never the value itself: it is the upstream's, and may be anything, a token included)
_NOT_DECIMAL = "a string that is not a plain decimal number"
_NO_ID = "missing or null; every record has one"
_EXPENSE = "/expenses/3730bf79-913a-47af-a917-9e028868b644"

# (gateway path, upstream body, JSON path, reason)
BAD_VALUES: list[tuple[str, bytes, str, str]] = [
    (
        "/expenses",
        expenses_page(setter("data", 3, "amount", "abc")),
        "data[3].amount",
        _NOT_DECIMAL,
    ),
    (
        "/expenses",
        expenses_page(setter("data", 1, "issueDate", "2024-02-31")),
        "data[1].issueDate",
        "a date that is not a real calendar date",
    ),
    (
        "/expenses",
        expenses_page(setter("data", {"items": []})),
        "data",
        "a JSON object where an array is expected",
    ),
    (
        "/expenses",
        expenses_page(setter("data", 0, "account", "liquidityThreshold", "1,000.00")),
        "data[0].account.liquidityThreshold",
        _NOT_DECIMAL,
    ),
    (
        "/expenses",
        expenses_page(setter("data", 2, "client", "taxRetentionPercentage", "15%")),
        "data[2].client.taxRetentionPercentage",
        _NOT_DECIMAL,
    ),
    (
        "/clients",
        sample("clients", setter("data", 1, "taxRetentionPercentage", "15%")),
        "data[1].taxRetentionPercentage",
        _NOT_DECIMAL,
    ),
    # every record's id is required: missing or null, at any depth, breaks the contract
    (
        "/expenses",
        expenses_page(lambda page: page["data"][2].pop("id")),
        "data[2].id",
        "missing or null; every record has one",
    ),
    (_EXPENSE, sample("expense", setter("account", "id", None)), "account.id", _NO_ID),
    ("/users", sample("users", setter("data", 0, "id", None)), "data[0].id", _NO_ID),
    ("/accounts/ACC-001", sample("account", lambda a: a.pop("id")), "id", _NO_ID),
    ("/clients", sample("clients", setter("data", 1, "id", None)), "data[1].id", _NO_ID),
    (
        "/expenses",
        expenses_page(setter("data", 0, "id", "EXP-2025-0001")),
        "data[0].id",
        "a string that is not a UUID",
    ),
    (
        _EXPENSE,
        sample("expense", setter("id", "3730bf79-913a-47af-a917")),
        "id",
        "a string that is not a UUID",
    ),
    (
        "/accounts",
        sample("accounts", setter("data", 2, "bank", "country", "Colombia")),
        "data[2].bank.country",
        "a JSON string that is not an integer",
    ),
    (
        "/expenses",
        expenses_page(setter("data", 0, "paidAt", "yesterday")),
        "data[0].paidAt",
        "a string that is not an ISO 8601 date-time",
    ),
    (
        "/expenses",
        expenses_page(setter("data", 0, "paidAt", "2024-03-01")),
        "data[0].paidAt",
        "a string that is a date without a time",
    ),
    *(
        (
            "/expenses",
            expenses_page(setter("data", 1, "amount", nan)),
            "data[1].amount",
            _NOT_DECIMAL,
        )
        for nan in ("NaN", "nan", "Infinity", "-Infinity", "inf")
    ),
    (
        "/accounts/ACC-001",
        sample("account", setter("lastBalance", "NaN")),
        "lastBalance",
        _NOT_DECIMAL,
    ),
    (
        "/expenses",
        expenses_page(setter("data", 0, "amount", True)),
        "data[0].amount",
        "a boolean is not a decimal number",
    ),
    (_EXPENSE, sample("expense", setter("amount", "abc")), "amount", _NOT_DECIMAL),
    (
        _EXPENSE,
        b'[{"id": "3730bf79-913a-47af-a917-9e028868b644"}]',
        "(body)",
        "a JSON array where an object is expected",
    ),
    (
        "/expenses",
        expenses_page(setter("data", 2, "user", "accounts", "Caja General")),
        "data[2].user.accounts",
        "a JSON string where an array of strings is expected",
    ),
    (
        "/expenses",
        expenses_page(lambda page: page.pop("total")),
        "total",
        "missing, and it cannot be derived",
    ),
    (
        "/accounts",
        sample("accounts", setter("data", 0, "bank", "country", 2**64)),
        "data[0].bank.country",
        "an integer out of the 64-bit range",
    ),
    (
        "/clients",
        sample("clients", setter("data", 0, "taxRetentionPercentage", [15])),
        "data[0].taxRetentionPercentage",
        "a JSON array is not a decimal number",
    ),
]


def route_of(path: str) -> Route:
    bare = path.split("?")[0]
    for spec in ROUTES:
        prefix = spec.template.split("{")[0]
        if bare == spec.template or (spec.path_param and bare.startswith(prefix)):
            return spec
    raise LookupError(path)


BAD_PARAMS = [pytest.param(*case, id=f"{case[2]}: {case[3]}") for case in BAD_VALUES]


@pytest.mark.parametrize(("path", "body", "where", "reason"), BAD_PARAMS)
async def test_a_value_that_cannot_be_made_canonical_is_a_502_naming_it(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    path: str,
    body: bytes,
    where: str,
    reason: str,
) -> None:
    client = await gateway_serving(aiohttp_server, gateway_factory, body)
    response = await client.get(path, headers=AUTH)
    assert response.status == 502
    assert response.headers["Content-Type"] == "application/problem+json"
    problem = await response.json(content_type=None)
    assert problem["type"] == CONTRACT
    assert problem["status"] == 502
    assert problem["title"] == "The upstream broke the API contract"
    assert problem["detail"] == (
        f"GET {route_of(path).template}: the upstream's {where} cannot be brought to the"
        f" published schema: {reason}"
    )
    assert client.app[COERCIONS].snapshot() == {}  # nothing counted for a refused body


@pytest.mark.parametrize(("path", "body", "where", "reason"), BAD_PARAMS)
def test_the_pydantic_path_names_the_same_bad_value(
    path: str, body: bytes, where: str, reason: str
) -> None:
    context = NormaliseContext(page=1, limit=10)
    with pytest.raises(ValidationError) as caught:
        ROUTES.models()[route_of(path).name].model_validate(parse_lossless(body), context=context)
    got_where, got_reason = first_problem(caught.value)
    assert got_where == where
    if where != "(body)":
        assert got_reason == reason


def testjson_paths() -> None:
    assert json_path(["data", 3, "amount"]) == "data[3].amount"
    assert json_path(["data", 0, "account", "bank", "country"]) == "data[0].account.bank.country"
    assert json_path(["(body)"]) == "(body)"


# ----------------------------------------------------------------- exact end to end


async def test_json_numbers_keep_every_digit_end_to_end(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    # Written by hand: a float-based encoder could not put these digits in the body.
    text = (
        (FIXTURES / "expense.upstream.json")
        .read_text()
        .replace('"1250000.5000"', "12345678901234.5678")
        .replace('"5000.00"', "0.1")
        .replace('"15.0000"', "12345678901234.5678")
    )
    assert "12345678901234.5678," in text
    client = await gateway_serving(aiohttp_server, gateway_factory, text.encode())
    response = await client.get(_EXPENSE, headers=AUTH)
    assert response.status == 200
    body = await response.read()
    assert b'"amount":"12345678901234.5678"' in body
    assert b'"liquidityThreshold":"0.10"' in body
    assert b'"taxRetentionPercentage":12345678901234.5678' in body
    assert client.app[COERCIONS].snapshot() == {
        ("Expense.amount", "number->string"): 1,
        ("Account.liquidityThreshold", "number->string"): 1,
        ("Account.bank", "missing->null"): 1,
        ("Account.lastBalance", "missing->null"): 1,
    }


async def test_exponent_and_short_decimals_are_padded_never_rounded(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    text = (
        (FIXTURES / "account.upstream.json")
        .read_text()
        .replace('"182345.6700"', "1E+2")
        .replace('"5000.00"', '"0.123456789"')
    )
    client = await gateway_serving(aiohttp_server, gateway_factory, text.encode())
    body = await (await client.get("/accounts/ACC-001", headers=AUTH)).read()
    assert b'"liquidityThreshold":"0.123456789","lastBalance":"100.0000"}' in body


# -------------------------------------------------------- counts against the reference


async def test_coercions_are_counted_for_the_reference_upstream(gateway: Client) -> None:
    assert (await gateway.get("/expenses?limit=5", headers=AUTH)).status == 200
    assert gateway.app[COERCIONS].snapshot() == {
        ("Client.taxRetentionPercentage", "string->number"): 5,
        ("Account.bank", "missing->null"): 5,
        ("Account.lastBalance", "missing->null"): 5,
    }
    assert (await gateway.get("/accounts", headers=AUTH)).status == 200
    assert (await gateway.get("/clients?limit=3", headers=AUTH)).status == 200
    snapshot = gateway.app[COERCIONS].snapshot()
    assert snapshot[("Account.bankCode", "missing->null")] == 2  # the cash accounts
    assert snapshot[("Account.bankCode", "filled-from-bank.code")] == 6  # the bank accounts
    assert snapshot[("Client.description", "missing->null")] == 3


def test_coercion_counts_add_up() -> None:
    counts = CoercionCounts()
    page = (FIXTURES / "expenses.upstream.json").read_bytes()
    spec = next(r for r in ROUTES if r.name == "expenses")
    normaliser = Normaliser(counts)
    for _ in range(3):
        normaliser.normalise(parse_record_query(spec, None, [], max_limit=100), page)
    assert counts.snapshot()[("Client.taxRetentionPercentage", "string->number")] == 6


# ------------------------------------------------------------------ unknown enum values


async def test_unknown_enumeration_values_pass_upper_cased_and_are_logged_once(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def unknown(page: Any) -> None:
        for expense in page["data"]:
            expense["status"] = "Refunded"
            expense["user"]["role"] = "auditor"

    url = await serve(aiohttp_server, expenses_page(unknown, items=3))
    client = await gateway_factory(url, cache={"backend": "none"})
    caplog.set_level(logging.WARNING, logger="gateway.normalise")
    for _ in range(2):
        response = await client.get("/expenses", headers=AUTH)
        assert response.status == 200
        data = (await response.json())["data"]
        assert [e["status"] for e in data] == ["REFUNDED"] * 3
        assert [e["user"]["role"] for e in data] == ["AUDITOR"] * 3
    logged = sorted(
        (getattr(r, "field", None), getattr(r, "value", None))
        for r in caplog.records
        if r.name == "gateway.normalise"
    )
    assert logged == [("Expense.status", "REFUNDED"), ("User.role", "AUDITOR")]
    snapshot = client.app[COERCIONS].snapshot()
    assert snapshot[("Expense.status", "unknown-value")] == 6
    assert snapshot[("User.role", "unknown-value")] == 6


def test_both_paths_name_the_same_first_bad_value_of_a_record() -> None:
    def record() -> dict[str, Any]:
        return {
            "id": "3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f",
            "amount": "abc",
            "account": {"id": "ACC-001", "liquidityThreshold": "1,000.00"},
        }

    with pytest.raises(CanonicalError) as direct:
        canonical_body(Expense, record(), NormaliseContext())
    with pytest.raises(ValidationError) as pydantic_path:
        Expense.model_validate(record(), context=NormaliseContext())
    assert json_path(direct.value.path) == "amount"
    assert first_problem(pydantic_path.value)[0] == "amount"


def test_coercion_counts_hand_over_what_is_new_and_keep_every_count() -> None:
    """take() (the metrics' flush) gets each answer's counts once; snapshot() all."""
    counts = CoercionCounts()
    counts.add(Counter({("Expense.amount", "number->string"): 2}))
    counts.add(Counter({("Expense.amount", "number->string"): 1, ("Page", "x"): 1}))
    assert counts.take() == {("Expense.amount", "number->string"): 3, ("Page", "x"): 1}
    assert counts.take() == {}
    counts.add(Counter({("Page", "x"): 4}))
    assert counts.snapshot() == {("Expense.amount", "number->string"): 3, ("Page", "x"): 5}
    assert counts.take() == {("Page", "x"): 4}
    assert counts.snapshot() == {("Expense.amount", "number->string"): 3, ("Page", "x"): 5}


def test_every_decimal_is_written_as_its_own_text_however_often_it_recurs() -> None:
    """dump_canonical remembers the text of the Decimal objects it wrote; equal values
    with other texts (4, 4.0, -0, 0) are never written as one another."""
    texts = ["4", "4.0", "4.00", "-0", "0", "0E+2", "1E+1", "12345678901234.5678", "-1.50"]
    values = [Decimal(text) for text in texts]
    expected = "[" + ",".join(format(value, "f") for value in values) + "]"
    assert expected == "[4,4.0,4.00,-0,0,0,10,12345678901234.5678,-1.50]"
    for _ in range(3):  # the same objects again, then fresh equal ones
        assert dump_canonical(values).decode() == expected
        assert dump_canonical(list(reversed(values))).decode() == (
            "[" + ",".join(reversed(expected[1:-1].split(","))) + "]"
        )
        values = [Decimal(text) for text in texts]
    # past what it keeps: it forgets and goes on writing each right
    many = [Decimal(f"{index}.{index % 7}") for index in range(3000)]
    assert orjson.loads(dump_canonical(many)) == [float(value) for value in many]
    assert dump_canonical(many).decode() == "[" + ",".join(str(value) for value in many) + "]"
    assert dump_canonical(values).decode() == expected


async def test_an_unknown_enumeration_value_that_is_not_shaped_like_one_is_not_logged(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An upstream may echo anything into an enumeration field, the caller's token
    among it: the log names its size, never its text (docs/operations.md, "Logs")."""
    echoed = "Bearer tok-secret-0123456789"

    def unknown(page: Any) -> None:
        for expense in page["data"]:
            expense["status"] = echoed

    url = await serve(aiohttp_server, expenses_page(unknown, items=1))
    client = await gateway_factory(url, cache={"backend": "none"})
    caplog.set_level(logging.WARNING, logger="gateway.normalise")
    assert (await client.get("/expenses", headers=AUTH)).status == 200
    logged = [
        (getattr(r, "field", None), getattr(r, "value", None))
        for r in caplog.records
        if r.name == "gateway.normalise"
    ]
    assert logged == [("Expense.status", f"({len(echoed)} characters)")]
    assert "tok-secret" not in caplog.text.lower()
