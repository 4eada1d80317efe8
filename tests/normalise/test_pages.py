"""What the gateway refuses of a whole body, as the caller sees it (docs/normalisation.md,
"Errors"), with either canonicaliser, over real sockets:

- a page with more items than the request's limit or the envelope's own is a 502
  upstream-contract naming ``data``, refused before any item is looked at;
- a single record that is not the one the path asked for is a 502 naming ``id``; an
  expense's UUID is compared in canonical form, an account by its id or its name,
  without case, as the upstream looks it up;
- nothing refused is cached: the next request asks the upstream again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpServer

from gateway.normalise.rules import Engine, compiled_available, use_engine

from ..conftest import AUTH, GatewayFactory, base_url

Client = TestClient[web.Request, web.Application]
FIXTURES = Path(__file__).parent.parent / "fixtures"
CONTRACT = "urn:records-gateway:problem:upstream-contract"
EXPENSE_ID = "3730bf79-913a-47af-a917-9e028868b644"
OTHER_EXPENSE_ID = "3730bf79-913a-47af-a917-9e028868b645"
NOT_BUILT = "gateway.normalise.compiled was not built (installed without a C compiler)"
needs_compiled = pytest.mark.skipif(not compiled_available(), reason=NOT_BUILT)


@pytest.fixture(
    params=[
        pytest.param("compiled", marks=needs_compiled),
        "python",
    ]
)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """Each test runs with either canonicaliser in use."""
    name: Engine = request.param
    use_engine(name)
    yield name
    use_engine()


def sample(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.upstream.json").read_text())


class Upstream:
    """A stand-in upstream answering every GET with one body, counting the calls."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.calls: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append(request.path_qs)
        return web.Response(body=self.body, content_type="application/json")


async def gateway_with(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, body: bytes
) -> tuple[Client, Upstream]:
    upstream = Upstream(body)
    app = web.Application()
    app.router.add_get("/{tail:.*}", upstream.handle)
    return await gateway_factory(base_url(await aiohttp_server(app))), upstream


async def refused(client: Client, path: str) -> str:
    """The detail of the 502 upstream-contract that ``path`` is answered with."""
    response = await client.get(path, headers=AUTH)
    assert response.status == 502
    problem = await response.json(content_type=None)
    assert problem["type"] == CONTRACT
    detail: str = problem["detail"]
    return detail


def expenses_page(items: int, limit: int, *, junk_items: bool = False) -> bytes:
    page = sample("expenses")
    records = page["data"]
    page["data"] = [
        "not a record" if junk_items else records[index % len(records)] for index in range(items)
    ]
    page["limit"] = limit
    page["total"] = max(page["total"], items)
    return json.dumps(page).encode()


# ------------------------------------------------------------------ page larger than limit


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("path", "items", "envelope_limit", "bound"),
    [
        ("/expenses?limit=10", 11, 10, 10),  # more than asked for and than it says
        ("/expenses?limit=10", 11, 100, 10),  # the envelope claims a larger limit
        ("/expenses", 11, 10, 10),  # the request's default limit
        ("/expenses?limit=10", 8, 5, 5),  # within what was asked, past its own limit
    ],
)
async def test_a_page_with_more_items_than_its_limit_is_a_502_and_not_cached(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    path: str,
    items: int,
    envelope_limit: int,
    bound: int,
) -> None:
    client, upstream = await gateway_with(
        aiohttp_server, gateway_factory, expenses_page(items, envelope_limit)
    )
    expected = (
        "GET /expenses: the upstream's data cannot be brought to the published schema:"
        f" {items} items, more than the page's limit of {bound}"
    )
    assert await refused(client, path) == expected
    assert await refused(client, path) == expected
    assert len(upstream.calls) == 2  # refused, so never cached


@pytest.mark.usefixtures("engine")
async def test_a_huge_page_is_refused_before_any_item_is_looked_at(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    # every item is broken: had any been canonicalised, the detail would name data[0]
    body = expenses_page(200_000, 10, junk_items=True)
    client, _ = await gateway_with(aiohttp_server, gateway_factory, body)
    assert await refused(client, "/expenses?limit=10") == (
        "GET /expenses: the upstream's data cannot be brought to the published schema:"
        " 200000 items, more than the page's limit of 10"
    )


@pytest.mark.usefixtures("engine")
async def test_a_page_of_exactly_its_limit_is_published(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory
) -> None:
    client, upstream = await gateway_with(aiohttp_server, gateway_factory, expenses_page(3, 3))
    response = await client.get("/expenses?limit=3", headers=AUTH)
    assert response.status == 200
    published = await response.json()
    assert (len(published["data"]), published["limit"]) == (3, 3)
    assert (await client.get("/expenses?limit=3", headers=AUTH)).status == 200
    assert len(upstream.calls) == 1  # a published page is cached as before


# --------------------------------------------------------------- the record asked for


def expense(record_id: str) -> bytes:
    body = sample("expense")
    body["id"] = record_id
    return json.dumps(body).encode()


def account(record_id: str, name: str) -> bytes:
    body = sample("account")
    body["id"], body["name"] = record_id, name
    return json.dumps(body).encode()


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (f"/expenses/{EXPENSE_ID}", expense(OTHER_EXPENSE_ID)),
        (f"/expenses/{EXPENSE_ID}", expense(OTHER_EXPENSE_ID.upper())),
        ("/accounts/ACC-001", account("ACC-002", "Caja General")),
        ("/accounts/Caja%20General", account("ACC-002", "Caja Chica")),
        ("/accounts/ACC-001", account("ACC-0011", "ACC-00")),
    ],
)
async def test_a_record_other_than_the_one_asked_for_is_a_502_and_not_cached(
    aiohttp_server: AiohttpServer, gateway_factory: GatewayFactory, path: str, body: bytes
) -> None:
    client, upstream = await gateway_with(aiohttp_server, gateway_factory, body)
    template = "/expenses/{expenseId}" if path.startswith("/expenses") else "/accounts/{accountId}"
    expected = (
        f"GET {template}: the upstream's id cannot be brought to the published schema:"
        " not the record asked for"
    )
    assert await refused(client, path) == expected
    assert await refused(client, path) == expected
    assert len(upstream.calls) == 2


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(
    ("path", "body", "published_id"),
    [
        # a UUID in any case or spelling names the same expense
        (f"/expenses/{EXPENSE_ID.upper()}", expense(EXPENSE_ID), EXPENSE_ID),
        (f"/expenses/{EXPENSE_ID}", expense(EXPENSE_ID.upper()), EXPENSE_ID),
        (f"/expenses/{EXPENSE_ID.replace('-', '')}", expense(EXPENSE_ID), EXPENSE_ID),
        # an account by its id or its name, in any case
        ("/accounts/ACC-001", account("ACC-001", "Caja General"), "ACC-001"),
        ("/accounts/acc-001", account("ACC-001", "Caja General"), "ACC-001"),
        ("/accounts/Caja%20General", account("ACC-001", "Caja General"), "ACC-001"),
        ("/accounts/CAJA%20GENERAL", account("ACC-001", "Caja General"), "ACC-001"),
    ],
)
async def test_the_record_asked_for_is_published_however_its_id_is_spelled(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    path: str,
    body: bytes,
    published_id: str,
) -> None:
    client, _ = await gateway_with(aiohttp_server, gateway_factory, body)
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    assert (await response.json())["id"] == published_id
