"""What the gateway accepts, the reference upstream accepts: every parameter of the six
routes, just inside and just outside its bounds (gateway/records/routes.py against the
reference document and gateway/demo/params.py), sent through a real gateway to the
real reference upstream over loopback.

A request the gateway refuses is a 400 problem that never reaches the upstream; one it
accepts reaches the upstream, once, and gets the upstream's 200 (or, for an id route,
its 404 of a record that does not exist), never a 502 of an upstream that refused what
the gateway let through. ``limits.max_limit`` is set to the reference upstream's own
largest ``limit`` (1000).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpClient
from yarl import URL

from gateway.demo import REQUEST_LOG
from gateway.demo.params import MAX_LIMIT as UPSTREAM_MAX_LIMIT
from gateway.http.app import create_app
from gateway.routing.parameters import MAX_TEXT_LENGTH
from gateway.routing.routes import Route
from gateway.routing.standard import MAX_PAGE, ROUTES

from ..conftest import AUTH, base_url, gateway_client, make_settings
from ..profiles import examples

Client = TestClient[web.Request, web.Application]
Test = TypeVar("Test", bound=Callable[..., Any])
EXPENSE_ID = "b1a6b1f1-620e-49d3-bb33-f3d8269cd696"
_TEXT = [
    "x",
    "a" * MAX_TEXT_LENGTH,
    "a" * (MAX_TEXT_LENGTH + 1),
    "",
    "Caja chica Bogotá",
    "a b&c=d+e%zz/?#",
    "\u00a0",
    "🙂",
    "a\x00b",
    "a\tb",
    "\x7f",
    "\x85",
    "\ufffd",
]
# (just inside and just outside) every bound of every parameter
BOUNDS: dict[str, list[str]] = {
    "page": ["1", "2", str(MAX_PAGE), str(MAX_PAGE + 1), "0", "-1", "0001", "", "1.0", "1e3"],
    "limit": [
        "1",
        "10",
        str(UPSTREAM_MAX_LIMIT),
        str(UPSTREAM_MAX_LIMIT + 1),
        "0",
        "-1",
        "01",
        "",
    ],
    "dateFrom": [
        "0001-01-01",
        "9999-12-31",
        "2024-02-29",
        "2023-02-29",
        "0000-01-01",
        "2024-13-01",
        "2024-1-01",
        "20240101",
        "10000-01-01",
        "",
    ],
    "dateTo": ["0001-01-01", "9999-12-31", "2023-12-31", "2024-00-10", "2024-12-32", ""],
    "amount": [
        "0",
        "-0",
        "12.50",
        "-3",
        ".5",
        "5.",
        "+7",
        "1E2",
        "1e-3",
        "1e39",
        "9" * 40,
        "0." + "0" * 38 + "1",
        "9" * 41,
        "1e40",
        "1e-999",
        "NaN",
        "Infinity",
        "1e",
        "1,5",
        "",
    ],
    "concept": _TEXT,
    "account": _TEXT,
    "status": ["PAID", "paid", *_TEXT[2:5]],
    "user": _TEXT,
    "type": ["CASH", "bank", "Cash", "caſh", "card", "CASHY", ""],
    "bankCode": _TEXT,
    "expenseId": [
        EXPENSE_ID,
        EXPENSE_ID.upper(),
        EXPENSE_ID.replace("-", ""),
        str(uuid.UUID(int=0)),
        EXPENSE_ID[:-1],
        EXPENSE_ID + "0",
        "not-a-uuid",
    ],
    "accountId": ["ACC-002", "Caja chica Bogotá", "a/b", "..", ".", *_TEXT],
}


def target(route: Route, values: dict[str, str]) -> URL:
    """``route``'s path and query with ``values``, percent-encoded as a client does."""
    path = route.template
    if route.path_param:
        path = path.replace("{" + route.path_param + "}", quote(values[route.path_param], safe=""))
    query = "&".join(
        f"{name}={quote(value, safe='')}"
        for name, value in values.items()
        if name != route.path_param
    )
    return URL(path + ("?" + query if query else ""), encoded=True)


@st.composite
def requests(draw: st.DrawFn) -> tuple[Route, dict[str, str]]:
    """A route and some of its parameters, each at or beside one of its bounds."""
    route = draw(st.sampled_from(ROUTES))
    names = list(route.query_params)
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=3)) if names else []
    if route.path_param:
        chosen = [route.path_param, *chosen]
    return route, {name: draw(st.sampled_from(BOUNDS[name])) for name in chosen}


def each_bound_alone(test: Test) -> Test:
    """``test`` with an explicit example of every bound of every parameter alone (id
    routes with a known id), whatever the profile's example count."""
    for route in ROUTES:
        for name in route.query_params:
            for value in BOUNDS[name]:
                path = {route.path_param: "ACC-002" if route.name == "account" else EXPENSE_ID}
                values = {**(path if route.path_param else {}), name: value}
                test = example(request=(route, values))(test)
        if route.path_param:
            for value in BOUNDS[route.path_param]:
                test = example(request=(route, {route.path_param: value}))(test)
    return test


@pytest.fixture
async def through(aiohttp_client: AiohttpClient, upstream: TestServer) -> Client:
    """A gateway that does not cache (every request it accepts goes upstream), with
    ``limits.max_limit`` at the reference upstream's largest ``limit``."""
    settings_ = make_settings(
        base_url(upstream),
        cache={"backend": "none"},
        limits={"max_limit": UPSTREAM_MAX_LIMIT},
        log={"access": False},
    )
    return await gateway_client(aiohttp_client, create_app(settings_))


@settings(
    max_examples=examples(200),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
@each_bound_alone
async def test_what_the_gateway_accepts_the_reference_upstream_accepts(
    through: Client, upstream: TestServer, request: tuple[Route, dict[str, str]]
) -> None:
    route, values = request
    log = upstream.app[REQUEST_LOG]
    calls = len(log)
    response = await through.get(target(route, values), headers=AUTH)
    body = orjson.loads(await response.read())
    if response.status == 400:
        assert body["type"] == "urn:records-gateway:problem:invalid-parameters", body
        assert len(log) == calls, "a request the gateway refused reached the upstream"
        return
    if response.status == 404 and body["detail"].startswith("no such route"):
        # an empty or dot segment: aiohttp's router gives the path to no route
        assert route.path_param is not None
        assert values[route.path_param] in ("", ".", "..")
        assert len(log) == calls
        return
    assert len(log) == calls + 1
    if route.path_param and response.status == 404:
        assert body["title"] == "Record not found", body  # the upstream has no such id
        return
    assert response.status == 200, (route.name, values, body)
