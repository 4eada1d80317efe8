"""The OpenAPI document: valid OpenAPI 3.1, true to the code, and matched by real answers.

Real answers of the gateway (in front of the reference upstream, or of a stub upstream
for the failures the reference never produces) are held against the served document:
the status must be documented, its required headers present, every documented header
and the body valid under the document's schemas (JSON Schema 2020-12, ``$ref`` resolved
into the document's components).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse, ClientSession, HttpVersion, web
from aiohttp.test_utils import TestClient, TestServer, unused_port
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from pytest_aiohttp import AiohttpClient, AiohttpServer
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from yarl import URL

from gateway import __version__
from gateway.config.live import ConfigSource
from gateway.config.settings import Settings
from gateway.demo import create_demo_app
from gateway.errors import InvalidParameters
from gateway.http.admin import LIVE, SHADOW
from gateway.http.app import create_app
from gateway.http.openapi import openapi_bytes, openapi_document
from gateway.normalise.pages import AccountPage, ClientPage, ExpensePage, UserPage
from gateway.normalise.schema import (
    SCHEMA_VERSION,
    Account,
    Bank,
    CanonicalModel,
    Client,
    Expense,
    User,
)
from gateway.records.routes import parse_record_query
from gateway.routing.parameters import MAX_TEXT_LENGTH
from gateway.routing.standard import MAX_PAGE, ROUTES

from ..config.test_live import to_toml
from ..conftest import (
    AUTH,
    GatewayFactory,
    base_url,
    fleet_of,
    gateway_client,
    redis_cache,
    until,
)
from ..redis_server import RedisServer

Gateway = TestClient[web.Request, web.Application]
EXPENSE_ID = "b1a6b1f1-620e-49d3-bb33-f3d8269cd696"
CAJA_CHICA = "/accounts/Caja%20chica%20Bogot%C3%A1"
_BASE_URI = "https://records-gateway.invalid/openapi.json"
_PROBLEM = "urn:records-gateway:problem:"


def pointer(*parts: str, within: str = "") -> str:
    """A JSON pointer (RFC 6901) to ``parts``, under the pointer ``within``."""
    return within + "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


class Contract:
    """A served document, with the lookups needed to hold answers against it."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        resource = DRAFT202012.create_resource(document)
        self._registry: Registry[Any] = Registry().with_resource(_BASE_URI, resource)

    def _at(self, location: str) -> Any:
        node: Any = self.document
        for part in location.split("/")[1:]:
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def node(self, location: str) -> tuple[str, Any]:
        """The node at ``location`` and where it really is, once every $ref is followed."""
        node = self._at(location)
        while isinstance(node, dict) and "$ref" in node:
            location = node["$ref"].removeprefix("#")
            node = self._at(location)
        return location, node

    def validator(self, location: str) -> Any:
        """A 2020-12 validator of the schema at ``location``; formats are checked too."""
        return Draft202012Validator(
            {"$ref": f"{_BASE_URI}#{location}"},
            registry=self._registry,
            format_checker=Draft202012Validator.FORMAT_CHECKER,
        )

    def operation(self, template: str, method: str = "get") -> dict[str, Any]:
        operation: dict[str, Any] = self.document["paths"][template][method]
        return operation

    def parameters(self, template: str) -> list[dict[str, Any]]:
        return [
            self.node(p["$ref"].removeprefix("#"))[1]
            for p in self.operation(template)["parameters"]
        ]

    async def check(self, template: str, response: ClientResponse, method: str = "get") -> Any:
        """Hold ``response`` to ``method template``'s documented answer; returns the body."""
        responses = self.operation(template, method)["responses"]
        assert str(response.status) in responses, f"{response.status} is not documented"
        where, spec = self.node(
            pointer("paths", template, method, "responses", str(response.status))
        )
        for name in spec.get("headers", {}):
            header_at, header = self.node(pointer("headers", name, within=where))
            value = response.headers.get(name)
            if header.get("required", False):
                assert value is not None, f"required header {name} is missing"
            if value is not None:
                self.validator(header_at + "/schema").validate(typed(value, header["schema"]))
        raw = await response.read()
        content = spec.get("content")
        if content is None:
            assert raw == b""
            return None
        assert list(content) == [response.content_type]
        body = json.loads(raw)
        self.validator(pointer("content", response.content_type, "schema", within=where)).validate(
            body
        )
        return body


def typed(value: str, schema: dict[str, Any]) -> Any:
    """A header or query value as the JSON type its schema names (integers only)."""
    if schema.get("type") == "integer" and re.fullmatch(r"-?[0-9]+", value):
        return int(value)
    return value


@pytest.fixture
async def contract(gateway: Gateway) -> Contract:
    """The document the gateway serves, fetched without a token."""
    response = await gateway.get("/openapi.json")
    assert response.status == 200
    return Contract(await response.json())


async def test_document_is_served_without_a_token_and_is_valid_openapi_3_1(
    gateway: Gateway,
) -> None:
    """Held for docs/openapi.md, "How it is checked"."""
    response = await gateway.get("/openapi.json")
    assert response.status == 200
    assert response.content_type == "application/json"
    raw = await response.read()
    assert raw == openapi_bytes(gateway.app[LIVE].settings)
    document = json.loads(raw)
    validate(document, cls=OpenAPIV31SpecValidator)
    assert document["openapi"] == "3.1.0"
    assert document["info"]["version"] == SCHEMA_VERSION
    assert document["info"]["x-gateway-version"] == __version__
    assert "every field" in document["info"]["description"]
    bearer = document["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    contract = Contract(document)
    assert await contract.check("/openapi.json", response) == document


# Real requests, at least one for every route of ROUTES (checked below): the route,
# the path, what the body holds, and what every item of a page holds.
RECORD_CALLS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("/users", "/users?limit=3", {"page": 1, "limit": 3, "hasPrevious": False}, {}),
    ("/clients", "/clients?page=2&limit=7", {"page": 2, "limit": 7, "hasPrevious": True}, {}),
    ("/expenses", "/expenses?limit=100", {"page": 1, "limit": 100, "hasNext": True}, {}),
    ("/expenses", "/expenses?type=bank&limit=50", {"limit": 50}, {"type": "BANK"}),
    ("/expenses/{expenseId}", f"/expenses/{EXPENSE_ID}", {"id": EXPENSE_ID}, {}),
    ("/expenses/{expenseId}", f"/expenses/{EXPENSE_ID.upper()}", {"id": EXPENSE_ID}, {}),
    ("/accounts", "/accounts?limit=100", {"page": 1, "total": 8, "totalPages": 1}, {}),
    ("/accounts/{accountId}", CAJA_CHICA, {"name": "Caja chica Bogotá", "type": "CASH"}, {}),
    ("/accounts/{accountId}", "/accounts/ACC-001", {"id": "ACC-001", "type": "BANK"}, {}),
]


def test_every_route_has_a_real_call() -> None:
    assert {call[0] for call in RECORD_CALLS} == {route.template for route in ROUTES}


@pytest.mark.parametrize(("template", "path", "holds", "every_item_holds"), RECORD_CALLS)
async def test_real_answers_of_every_route_match_the_document(
    gateway: Gateway,
    contract: Contract,
    template: str,
    path: str,
    holds: dict[str, Any],
    every_item_holds: dict[str, Any],
) -> None:
    response = await gateway.get(URL(path, encoded=True), headers=AUTH)
    assert response.status == 200
    body = await contract.check(template, response)
    assert {key: body[key] for key in holds} == holds
    assert response.headers["X-Cache"] == "MISS"
    if "data" in body:
        assert body["data"], "an empty page would check nothing"
        first = body["limit"] * (body["page"] - 1)
        assert len(body["data"]) == min(body["limit"], body["total"] - first)
        for item in body["data"]:
            assert {key: item[key] for key in every_item_holds} == every_item_holds


async def test_304_and_cache_bypass_match_the_document(
    gateway: Gateway, contract: Contract
) -> None:
    first = await gateway.get("/users", headers=AUTH)
    await contract.check("/users", first)
    etag = first.headers["ETag"]

    again = await gateway.get("/users", headers={**AUTH, "If-None-Match": etag})
    assert again.status == 304
    assert await contract.check("/users", again) is None
    assert again.headers["ETag"] == etag
    assert again.headers["X-Cache"] == "HIT"

    bypass = await gateway.get("/users", headers={**AUTH, "Cache-Control": "no-store"})
    assert await contract.check("/users", bypass) == json.loads(await first.read())
    assert bypass.headers["X-Cache"] == "BYPASS"


async def test_gateway_routes_match_the_document(gateway: Gateway, contract: Contract) -> None:
    """Held for docs/openapi.md, "What it contains"."""
    response = await gateway.get("/healthz")
    assert await contract.check("/healthz", response) == {"status": "ok"}
    assert contract.operation("/healthz")["security"] == []
    assert contract.operation("/openapi.json")["security"] == []
    await gateway.get("/users", headers=AUTH)
    ready = await gateway.get("/readyz")
    body = await contract.check("/readyz", ready)
    assert body["components"]["cache"]["writes"]["ok"] >= 1
    # every member the gateway sends is one the document names
    component_schema = contract.document["components"]["schemas"]["ComponentHealth"]
    for name, component in body["components"].items():
        assert set(component) <= set(component_schema["properties"]), name
    metrics = await gateway.get("/metrics")
    assert metrics.status == 200
    documented = contract.operation("/metrics")["responses"]["200"]["headers"]
    assert metrics.headers["Cache-Control"] == documented["Cache-Control"]["schema"]["const"]


async def test_readiness_503_matches_the_document(gateway_factory: GatewayFactory) -> None:
    """No upstream and no cache to serve from: 503, as documented, not to be stored."""
    down = await gateway_factory(f"http://127.0.0.1:{unused_port()}", cache={"backend": "none"})
    contract = Contract(openapi_document(down.app[LIVE].settings))
    response = await down.get("/readyz")
    assert response.status == 503
    body = await contract.check("/readyz", response)
    assert body["status"] == "down"
    assert body["components"]["cache"] == {"status": "disabled", "lastError": None}
    # documented as required, so the check above held the answer to it
    assert "Cache-Control" in contract.operation("/readyz")["responses"]["503"]["headers"]


async def test_every_path_documents_the_405_it_answers(
    gateway: Gateway, contract: Contract
) -> None:
    """Each path answers another method with a documented 405 problem naming what it
    takes (a GET operation holds it: OpenAPI has no responses of a path as such).

    Held for docs/openapi.md, "How it is checked".
    """
    for template in contract.document["paths"]:
        path = template.replace("{expenseId}", EXPENSE_ID).replace("{accountId}", "ACC-001")
        response = await gateway.post(path, headers=AUTH)
        body = await contract.check(template, response)
        assert response.status == 405, template
        assert body["type"] == _PROBLEM + "method-not-allowed"
        assert response.headers["Allow"] == "GET, HEAD"


def test_the_document_says_where_it_is_served_its_licence_and_whom_to_ask() -> None:
    """Held for docs/openapi.md, "What a fuzzer finds"."""
    document = openapi_document(Settings())
    assert document["servers"][0]["url"] == "/"
    assert document["info"]["license"]["identifier"] == "LicenseRef-Proprietary"
    assert document["info"]["contact"]["name"]
    operations = [op for item in document["paths"].values() for op in item.values()]
    ids = [op["operationId"] for op in operations]
    assert len(set(ids)) == len(ids) == len(operations)
    assert all(op["description"] and op["summary"] for op in operations)
    assert [op["operationId"] for op in operations[:6]] == [
        "listUsers",
        "listClients",
        "listExpenses",
        "getExpense",
        "listAccounts",
        "getAccount",
    ]
    # the rule between two parameters that JSON Schema cannot state, stated in words
    expenses = document["paths"]["/expenses"]["get"]["description"]
    assert "`dateFrom` must not be after `dateTo`" in expenses
    assert "dateTo" in document["components"]["parameters"]["dateFrom"]["description"]


@pytest.mark.parametrize(
    ("path", "headers", "status", "slug", "errors"),
    [
        (
            "/users?limit=0",
            AUTH,
            400,
            "invalid-parameters",
            [{"parameter": "limit", "message": "must be an integer from 1 to 100"}],
        ),
        (
            "/expenses?page=0&type=card&colour=red",
            AUTH,
            400,
            "invalid-parameters",
            [
                {
                    "parameter": "colour",
                    "message": "unknown query parameter; allowed: page,"
                    " limit, dateFrom, dateTo, amount, concept, account, status, type, user",
                },
                {"parameter": "page", "message": f"must be an integer from 1 to {MAX_PAGE}"},
                {"parameter": "type", "message": "must be CASH or BANK"},
            ],
        ),
        ("/expenses/not-a-uuid", AUTH, 400, "invalid-parameters", None),
        ("/users", {}, 401, "unauthenticated", None),
        ("/users", {"Authorization": "Basic dXNlcjpwdw=="}, 401, "unauthenticated", None),
        ("/users", {"Authorization": "Bearer wrong-token"}, 401, "upstream-unauthorized", None),
        (f"/expenses/{EXPENSE_ID[:-1]}0", AUTH, 404, "not-found", None),
        ("/accounts/No%20such%20account", AUTH, 404, "not-found", None),
    ],
)
async def test_problems_from_the_reference_upstream_match_the_document(
    gateway: Gateway,
    contract: Contract,
    path: str,
    headers: dict[str, str],
    status: int,
    slug: str,
    errors: list[dict[str, str]] | None,
) -> None:
    response = await gateway.get(URL(path, encoded=True), headers=headers)
    assert response.status == status
    template = "/users" if path.startswith("/users") else _template_of(path)
    body = await contract.check(template, response)
    assert body["type"] == _PROBLEM + slug
    assert body["status"] == status
    assert body["instance"] == path
    assert body["requestId"] == response.headers["X-Request-ID"]
    if errors is not None:
        assert body["errors"] == errors
    if status == 401:
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="records-gateway"'


async def test_edge_problems_match_the_document(gateway: Gateway, contract: Contract) -> None:
    """The 417 of an Expect the gateway does not meet, the 505 of a version it does not
    speak, and a 400 that lists 20 bad parameters of more."""
    expecting = await gateway.get("/users", headers={**AUTH, "Expect": "foo"})
    assert expecting.status == 417
    body = await contract.check("/users", expecting)
    assert body["type"] == _PROBLEM + "expectation-failed"
    async with ClientSession(version=HttpVersion(2, 0)) as session:  # its request line
        versioned = await session.get(gateway.make_url("/users"), headers=AUTH)
        assert versioned.status == 505
        body = await contract.check("/users", versioned)
    assert body["type"] == _PROBLEM + "http-version-not-supported"
    many = await gateway.get("/users?" + "&".join(f"x{n}=1" for n in range(30)), headers=AUTH)
    assert many.status == 400
    body = await contract.check("/users", many)
    assert (len(body["errors"]), body["omittedErrors"]) == (20, 10)


_LONG_REQUEST_ID = "r" * 40_000  # a value the X-Request-ID parameter documents


async def test_what_any_path_answers_before_its_route_is_documented_on_every_operation(
    gateway_factory: GatewayFactory, upstream: TestServer, fast_path: bool
) -> None:
    """Every operation, admin routes too, documents the answers of the edge: the 400 of
    a request the HTTP parser refuses (here a header line too long, for an X-Request-ID
    the document lets a caller send), the 417 of an Expect it does not meet and the 505
    of another HTTP version; each is held to the operation's document.

    Held for docs/openapi.md, "What it contains".
    """
    gateway = await gateway_factory(base_url(upstream), admin={"token": ADMIN})
    contract = Contract(openapi_document(gateway.app[LIVE].settings))
    auth = {"Authorization": f"Bearer {ADMIN}"}
    for template, item in contract.document["paths"].items():
        path = template.replace("{expenseId}", EXPENSE_ID).replace("{accountId}", "ACC-001")
        headers = auth if template.startswith("/admin/") else AUTH
        for method in item:
            refused = await gateway.request(
                method.upper(), path, headers={**headers, "X-Request-ID": _LONG_REQUEST_ID}
            )
            assert refused.status == 400, (method, template)
            if fast_path:
                body = await contract.check(template, refused, method)
                assert body["type"] == _PROBLEM + "malformed-request"
                assert "errors" not in body
            else:  # aiohttp's own plain-text 400, as the 400's description says
                assert refused.content_type == "text/plain"
            expecting = await gateway.request(
                method.upper(), path, headers={**headers, "Expect": "foo"}
            )
            body = await contract.check(template, expecting, method)
            assert body["type"] == _PROBLEM + "expectation-failed"
            async with ClientSession(version=HttpVersion(2, 0)) as session:
                versioned = await session.request(
                    method.upper(), gateway.make_url(path), headers=headers
                )
                body = await contract.check(template, versioned, method)
            assert body["type"] == _PROBLEM + "http-version-not-supported"


def test_a_400_has_errors_only_when_it_is_invalid_parameters() -> None:
    """The 400 of a malformed request has no `errors`; the schema does not require
    them, and says when they are there (what the bad parameters' 400s hold is checked
    on real answers above).

    Held for docs/openapi.md, "What it contains".
    """
    document = openapi_document(Settings())
    validator = Contract(document).validator("/components/schemas/ValidationProblem")
    problem = {
        "type": _PROBLEM + "malformed-request",
        "title": "Malformed HTTP request",
        "status": 400,
        "detail": "the request line or a header is longer than the gateway accepts",
        "instance": "/",
        "requestId": "a1",
    }
    assert validator.is_valid(problem)
    schema = document["components"]["schemas"]["ValidationProblem"]
    assert "errors" not in schema["required"]
    assert (
        "always there on an invalid-parameters problem"
        in schema["properties"]["errors"]["description"]
    )


def _template_of(path: str) -> str:
    bare = path.split("?", 1)[0]
    if bare.startswith("/expenses/"):
        return "/expenses/{expenseId}"
    if bare.startswith("/accounts/"):
        return "/accounts/{accountId}"
    return bare


def stub_upstream(status: int, body: bytes, headers: dict[str, str]) -> web.Application:
    """An upstream that answers every request with one fixed answer."""

    async def answer(request: web.Request) -> web.Response:
        return web.Response(
            status=status, body=body, headers=headers, content_type="application/json"
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


@pytest.mark.parametrize(
    ("upstream_status", "upstream_body", "upstream_headers", "status", "slug"),
    [
        (401, b'{"error":"unauthorized"}', {}, 401, "upstream-unauthorized"),
        (403, b'{"error":"forbidden"}', {}, 403, "upstream-forbidden"),
        (429, b'{"error":"slow down"}', {"Retry-After": "7"}, 429, "rate-limited"),
        (500, b'{"error":"boom"}', {}, 502, "upstream-failed"),
        (409, b"{}", {}, 502, "upstream-failed"),
        (200, b"<html>not json</html>", {}, 502, "upstream-contract"),
        (200, b'{"data": 3}', {}, 502, "upstream-contract"),
    ],
)
async def test_upstream_failures_match_the_document(
    gateway_factory: GatewayFactory,
    aiohttp_server: AiohttpServer,
    upstream_status: int,
    upstream_body: bytes,
    upstream_headers: dict[str, str],
    status: int,
    slug: str,
) -> None:
    server = await aiohttp_server(stub_upstream(upstream_status, upstream_body, upstream_headers))
    gateway = await gateway_factory(base_url(server))
    contract = Contract(openapi_document(gateway.app[LIVE].settings))
    response = await gateway.get("/users", headers=AUTH)
    assert response.status == status
    body = await contract.check("/users", response)
    assert body["type"] == _PROBLEM + slug
    # The normaliser's contract errors do not say what the upstream answered.
    assert body.get("upstreamStatus") == (None if slug == "upstream-contract" else upstream_status)
    if upstream_status == 429:
        assert response.headers["Retry-After"] == "7"


async def test_unreachable_and_slow_upstreams_match_the_document(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    unreachable = await gateway_factory(f"http://127.0.0.1:{unused_port()}")
    contract = Contract(openapi_document(unreachable.app[LIVE].settings))
    response = await unreachable.get("/clients", headers=AUTH)
    assert response.status == 502
    body = await contract.check("/clients", response)
    assert body["type"] == _PROBLEM + "upstream-unavailable"
    assert "upstreamStatus" not in body

    slow = await aiohttp_server(create_demo_app(latency_ms=1000))
    impatient = await gateway_factory(base_url(slow), upstream={"timeout_s": 0.1})
    response = await impatient.get("/clients", headers=AUTH)
    assert response.status == 504
    body = await contract.check("/clients", response)
    assert body["type"] == _PROBLEM + "upstream-timeout"


def test_every_route_is_a_path_with_exactly_its_parameters() -> None:
    contract = Contract(openapi_document(Settings()))
    paths = contract.document["paths"]
    assert set(paths) == {route.template for route in ROUTES} | {
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
    }
    assert "/docs" not in openapi_document(Settings(server={"docs": False}))["paths"]
    for route in ROUTES:
        operation = contract.operation(route.template)
        parameters = contract.parameters(route.template)
        assert all(p["description"] for p in parameters)
        assert [p["name"] for p in parameters if p["in"] == "path"] == (
            [route.path_param] if route.path_param else []
        )
        assert [p["name"] for p in parameters if p["in"] == "query"] == list(route.query_params)
        assert {p["name"] for p in parameters if p["in"] == "header"} == {
            "If-None-Match",
            "Cache-Control",
            "Pragma",
            "Accept-Encoding",
            "X-Request-ID",
        }
        assert operation["security"] == [{"bearer": []}]
        media = operation["responses"]["200"]["content"]["application/json"]
        assert media["schema"] == {
            "$ref": f"#/components/schemas/{ROUTES.models()[route.name].__name__}"
        }
        # a real answer of the reference upstream, valid under the schema
        (example,) = media["examples"].values()
        contract.validator(
            pointer("paths", route.template, "get", "responses", "200", "content")
            + "/application~1json/schema"
        ).validate(example["value"])
        assert set(operation["responses"]) == {
            "200",
            "304",
            "400",
            "401",
            "403",
            "404",
            "405",
            "417",
            "429",
            "500",
            "502",
            "503",
            "504",
            "505",
        }


# the files of the pages for people (their scripts and styles), beside the pages
PAGE_FILES = ("/docs/", "/admin/console/")


async def test_every_route_of_the_app_is_documented(gateway: Gateway, contract: Contract) -> None:
    """Every path with a GET, but the files of the /docs page (its script and style)."""
    served = {
        resource.canonical
        for resource in gateway.app.router.resources()
        if any(route.method == "GET" for route in resource)
        and not resource.canonical.startswith(PAGE_FILES)
    }
    assert served == set(contract.document["paths"])


MODELS: list[type[Any]] = [
    User,
    Client,
    Bank,
    Account,
    Expense,
    UserPage,
    ClientPage,
    ExpensePage,
    AccountPage,
]


def test_every_model_is_documented() -> None:
    schemas = openapi_document(Settings())["components"]["schemas"]
    expected = {*CanonicalModel.__subclasses__(), *ROUTES.models().values()}
    assert set(MODELS) == expected
    assert {model.__name__ for model in expected} <= set(schemas)


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_every_field_is_documented_and_required(model: type[Any]) -> None:
    schema = openapi_document(Settings())["components"]["schemas"][model.__name__]
    fields = list(model.model_fields)
    assert list(schema["properties"]) == fields
    assert schema["required"] == fields
    assert schema["additionalProperties"] is False
    for name, field in model.model_fields.items():
        published = schema["properties"][name]
        assert published.get("description") == field.description
        assert "default" not in published
        if isinstance(field.json_schema_extra, dict):
            for key, value in field.json_schema_extra.items():
                assert published[key] == value, f"{model.__name__}.{name}: {key}"


def test_ids_are_required_and_never_null_and_other_fields_may_be_null() -> None:
    """Generated clients need not null-check an id: the gateway never sends a record
    without one (tests/normalise/test_normaliser.py: a 502 upstream-contract instead).

    Held for docs/openapi.md, "How it is checked".
    """
    schemas = openapi_document(Settings())["components"]["schemas"]
    for name in ("User", "Client", "Account", "Expense"):
        assert schemas[name]["properties"]["id"]["type"] == "string", name
        nullable = {
            field
            for field, spec in schemas[name]["properties"].items()
            if "null" in spec.get("type", []) or {"type": "null"} in spec.get("anyOf", [])
        }
        assert nullable == set(schemas[name]["properties"]) - {"id"}, name
    for page in ("UserPage", "ClientPage", "ExpensePage", "AccountPage"):
        envelope = schemas[page]["properties"]
        assert all("null" not in str(envelope[key]) for key in envelope), page


def test_percentage_is_a_number_or_null() -> None:
    schemas = openapi_document(Settings())["components"]["schemas"]
    assert schemas["Client"]["properties"]["taxRetentionPercentage"]["type"] == ["number", "null"]


def test_limit_follows_the_settings() -> None:
    document = openapi_document(Settings(limits={"max_limit": 25}))
    limit = document["components"]["parameters"]["limit"]["schema"]
    assert limit == {"type": "integer", "minimum": 1, "maximum": 25, "default": 10}
    validate(document, cls=OpenAPIV31SpecValidator)


async def test_documented_defaults_are_those_the_gateway_fills_in(
    gateway: Gateway, contract: Contract
) -> None:
    parameters = contract.document["components"]["parameters"]
    response = await gateway.get("/expenses", headers=AUTH)
    body = await contract.check("/expenses", response)
    assert body["page"] == parameters["page"]["schema"]["default"]
    assert body["limit"] == parameters["limit"]["schema"]["default"]


_TEXT = ["concept", "account", "status", "user", "bankCode", "accountId"]
_UUID_HEX = EXPENSE_ID.replace("-", "")

# (parameter, raw value, the gateway accepts it, the document accepts it). The two
# differ only where the document's description says so: `type` in any case and the
# 32-digit UUID are accepted, an amount too long once written out is not.
PARAMETER_SAMPLES: list[tuple[str, str, bool, bool]] = [
    ("page", "1", True, True),
    ("page", str(MAX_PAGE), True, True),
    ("page", str(MAX_PAGE + 1), False, False),
    ("page", "0", False, False),
    ("page", "-1", False, False),
    ("page", "1.5", False, False),
    ("page", "one", False, False),
    ("limit", "1", True, True),
    ("limit", "100", True, True),
    ("limit", "101", False, False),
    ("limit", "0", False, False),
    ("dateFrom", "2024-02-29", True, True),
    ("dateFrom", "2023-02-29", False, False),
    ("dateFrom", "2024-2-1", False, False),
    ("dateTo", "20240201", False, False),
    ("dateTo", "2024-12-31", True, True),
    ("amount", "12.50", True, True),
    ("amount", "-3", True, True),
    ("amount", "1E2", True, True),
    ("amount", ".5", True, True),
    ("amount", "+7.", True, True),
    ("amount", "abc", False, False),
    ("amount", "NaN", False, False),
    ("amount", "Infinity", False, False),
    ("amount", "1e", False, False),
    ("amount", "1,5", False, False),
    ("amount", "1e999", False, True),
    ("type", "CASH", True, True),
    ("type", "BANK", True, True),
    ("type", "cash", True, False),
    ("type", "card", False, False),
    ("expenseId", EXPENSE_ID, True, True),
    ("expenseId", EXPENSE_ID.upper(), True, True),
    ("expenseId", _UUID_HEX, True, False),
    ("expenseId", "not-a-uuid", False, False),
    ("expenseId", EXPENSE_ID + "0", False, False),
    *[
        sample
        for name in _TEXT
        for sample in [
            (name, "x", True, True),
            (name, "Caja chica Bogotá / año ✓", True, True),
            (name, "a\u00a0b", True, True),
            (name, "x" * MAX_TEXT_LENGTH, True, True),
            (name, "x" * (MAX_TEXT_LENGTH + 1), False, False),
            (name, "", False, False),
            *[(name, f"a{c}b", False, False) for c in "\x00\t\x1f\x7f\x85\x9f"],
        ]
    ],
]


def _gateway_accepts(name: str, value: str) -> bool:
    route = next(r for r in ROUTES if name in r.query_params or name == r.path_param)
    path_value, query = (value, []) if name == route.path_param else (None, [(name, value)])
    try:
        parse_record_query(route, path_value, query, max_limit=100)
    except InvalidParameters:
        return False
    return True


def test_every_parameter_has_samples() -> None:
    names = {name for route in ROUTES for name in route.query_params}
    names |= {route.path_param for route in ROUTES if route.path_param}
    assert {name for name, *_ in PARAMETER_SAMPLES} == names


@pytest.mark.parametrize(
    ("name", "value", "gateway_accepts", "document_accepts"),
    PARAMETER_SAMPLES,
    ids=lambda value: repr(value)[:24] if isinstance(value, str) else str(value),
)
def test_parameter_schemas_agree_with_the_validation(
    name: str, value: str, gateway_accepts: bool, document_accepts: bool
) -> None:
    """Held for docs/openapi.md, "What a fuzzer finds"."""
    contract = Contract(openapi_document(Settings()))
    location = pointer("components", "parameters", name, "schema")
    schema = contract.node(location)[1]
    assert _gateway_accepts(name, value) is gateway_accepts
    assert contract.validator(location).is_valid(typed(value, schema)) is document_accepts


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        *outer, last = path.split(".")
        for key in outer:
            body = body[key]
        del body[last]

    return change


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        *outer, last = path.split(".")
        for key in outer:
            body = body[key]
        body[last] = value

    return change


@pytest.mark.parametrize(
    "break_it",
    [
        _drop("amount"),
        _drop("user"),
        _drop("account.lastBalance"),
        _set("amount", 12.5),
        _set("amount", "12.5"),
        _set("amount", "1.2e1"),
        _set("id", EXPENSE_ID.upper()),
        _set("paidAt", "2024-01-01T10:00:00+02:00"),
        _set("issueDate", "01/02/2024"),
        _set("client.taxRetentionPercentage", "11.0000"),
        _set("account.bank", "none"),
        _set("colour", "red"),
    ],
)
async def test_bodies_that_break_the_contract_fail_validation(
    gateway: Gateway, contract: Contract, break_it: Callable[[dict[str, Any]], None]
) -> None:
    response = await gateway.get(f"/expenses/{EXPENSE_ID}", headers=AUTH)
    body = await contract.check("/expenses/{expenseId}", response)
    validator = contract.validator("/components/schemas/Expense")
    assert validator.is_valid(body)
    broken = copy.deepcopy(body)
    break_it(broken)
    assert not validator.is_valid(broken)


def test_a_page_without_an_envelope_field_fails_validation() -> None:
    contract = Contract(openapi_document(Settings()))
    validator = contract.validator("/components/schemas/UserPage")
    page = {
        "data": [],
        "total": 0,
        "page": 1,
        "limit": 10,
        "totalPages": 0,
        "hasNext": False,
        "hasPrevious": False,
    }
    assert validator.is_valid(page)
    for key in page:
        assert not validator.is_valid({k: v for k, v in page.items() if k != key}), key


async def test_readiness_with_a_redis_cache_matches_the_document(
    gateway_factory: GatewayFactory, upstream: TestServer, redis_url: str
) -> None:
    client = await gateway_factory(base_url(upstream), cache=redis_cache(redis_url))
    contract = Contract(openapi_document(client.app[LIVE].settings))
    await client.get("/users", headers=AUTH)
    await fleet_of(client).announce()
    response = await client.get("/readyz")
    assert response.status == 200
    body = await contract.check("/readyz", response)
    assert set(body["components"]) == {"upstream", "cache", "fleet"}
    assert body["components"]["fleet"]["status"] == "ok"
    assert body["components"]["cache"]["source"] == "traffic"


ADMIN = "admin-token-0123456789abcdef"
# an id of the published schema's form, for purges by record
UUID = "0c6f8d3e-1111-4000-8000-000000000001"


async def test_admin_routes_are_documented_with_their_own_scheme_and_answer_so(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """Held for docs/openapi.md, "How it is checked"."""
    gateway = await gateway_factory(base_url(upstream), admin={"token": ADMIN})
    response = await gateway.get("/openapi.json")
    contract = Contract(await response.json())
    documented = {
        (path, method.upper())
        for path, item in contract.document["paths"].items()
        for method in item
    }
    served = {
        (resource.canonical, route.method)
        for resource in gateway.app.router.resources()
        for route in resource
        if route.method not in ("HEAD", "*") and not resource.canonical.startswith(PAGE_FILES)
    }
    assert served == documented
    admin = {"Authorization": f"Bearer {ADMIN}"}
    asked = [
        ("get", "/admin/config", "/admin/config", admin, 200),
        ("get", "/admin/ttl", "/admin/ttl", admin, 200),
        ("get", "/admin/shadow", "/admin/shadow", admin, 200),
        ("delete", "/admin/shadow", "/admin/shadow", admin, 200),
        ("delete", "/admin/cache", "/admin/cache?route=users", admin, 200),
        ("delete", "/admin/cache", "/admin/cache?route=nope", admin, 400),
        ("delete", "/admin/cache", f"/admin/cache?record=user:{UUID}&mode=soft", admin, 200),
        ("delete", "/admin/cache", "/admin/cache?record=user:1", admin, 400),
        ("get", "/admin/ttl", "/admin/ttl?x=1", admin, 400),
        ("post", "/admin/reload", "/admin/reload", admin, 200),
        ("get", "/admin/ttl", "/admin/ttl", AUTH, 401),
        ("get", "/admin/config", "/admin/config", {}, 401),
        ("delete", "/admin/ttl", "/admin/ttl", admin, 405),
    ]
    for method, template, path, headers, status in asked:
        answer = await gateway.request(method.upper(), path, headers=headers)
        assert answer.status == status, path
        # a 405 is documented under the path's GET (or, without one, its own method)
        documented_under = "get" if status == 405 else method
        await contract.check(template, answer, documented_under)
    notices = [
        ({"records": [f"user:{UUID}"], "soft": True}, "application/json", 200),
        ({"records": ["user:1"]}, "application/json", 400),
        ({"records": [f"user:{UUID}"]}, "text/plain", 415),
        ({"records": ["account:" + "x" * 200] * 1300}, "application/json", 413),
    ]
    for notice, content_type, status in notices:
        answer = await gateway.post(
            "/admin/records/changed",
            data=json.dumps(notice),
            headers={**admin, "Content-Type": content_type},
        )
        assert answer.status == status, notice
        await contract.check("/admin/records/changed", answer, "post")
    for path, item in contract.document["paths"].items():
        if path == "/admin/records/changed":
            signed: list[dict[str, list[str]]] = [{"adminToken": []}, {"changeFeedSignature": []}]
            assert item["post"]["security"] == signed
        elif path == "/admin/console":
            # the page asks for the token itself and holds no data
            assert item["get"]["security"] == []
        elif path.startswith("/admin/"):
            assert all(op["security"] == [{"adminToken": []}] for op in item.values()), path
    schemes = contract.document["components"]["securitySchemes"]
    assert set(schemes) == {"bearer", "adminToken", "changeFeedSignature"}


@pytest.mark.parametrize("backend", ["memory", "none"])
async def test_a_purge_answers_with_a_backend_the_document_names(
    gateway_factory: GatewayFactory, upstream: TestServer, backend: str
) -> None:
    """The purge names its backend among those the document lists (the registered
    ones), whichever backend serves."""
    gateway = await gateway_factory(
        base_url(upstream), admin={"token": ADMIN}, cache={"backend": backend}
    )
    contract = Contract(await (await gateway.get("/openapi.json")).json())
    for purge in ("route=users", f"record=client:{UUID}&record=account:Main"):
        answer = await gateway.delete(
            f"/admin/cache?{purge}", headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert answer.status == 200
        body = await contract.check("/admin/cache", answer, "delete")
        assert body["backend"] == backend


async def test_a_shadow_report_with_differences_and_noise_matches_the_document(
    gateway_factory: GatewayFactory, aiohttp_server: AiohttpServer
) -> None:
    """The report of a candidate that rounds amounts, both twins adding noise: every
    member it holds (totals, routes, fields, noise and its evidence) is documented.

    Held for docs/openapi.md, "What it contains".
    """
    primary = await aiohttp_server(create_demo_app(drift=["noise"]))
    candidate = await aiohttp_server(create_demo_app(drift=["noise", "amount-scale"]))
    shadow = {"base_url": base_url(candidate), "sample_ratio": 1.0, "recheck_ratio": 1.0}
    gateway = await gateway_factory(
        base_url(primary), upstream={"shadow": shadow}, admin={"token": ADMIN}
    )
    for path in ("/expenses?limit=3", f"/expenses/{EXPENSE_ID}", "/users", "/accounts"):
        assert (await gateway.get(path, headers=AUTH)).status == 200
    await until(lambda: gateway.app[SHADOW].in_flight == 0)
    contract = Contract(openapi_document(gateway.app[LIVE].settings))
    response = await gateway.get("/admin/shadow", headers={"Authorization": f"Bearer {ADMIN}"})
    report = await contract.check("/admin/shadow", response)
    expense = report["routes"]["expense"]
    assert [item["field"] for item in expense["fields"]] == ["amount"]
    assert [item["field"] for item in expense["noise"]] == ["paymentId"]
    assert expense["noise"][0]["evidence"]
    assert report["totals"]["compared"] == 4
    # nothing the report holds is left undocumented
    schemas = contract.document["components"]["schemas"]
    assert set(report) == set(schemas["ShadowReport"]["properties"])
    assert set(report["totals"]) == set(schemas["ShadowTotals"]["properties"])
    assert set(expense) == set(schemas["ShadowRoute"]["properties"])
    assert set(expense["noise"][0]) == set(schemas["ShadowField"]["properties"])


async def test_a_purge_redis_does_not_confirm_and_a_refused_reload_match_the_document(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    own_redis: RedisServer,
    tmp_path: Path,
    fast_path: bool,
) -> None:
    """DELETE /admin/cache with Redis gone: the documented 503 purge-outcome-unknown;
    POST /admin/reload of a file that is no longer TOML: the documented 422."""
    config = tmp_path / "gateway.toml"
    sections: dict[str, dict[str, Any]] = {
        "server": {"fast_path": fast_path},
        "upstream": {"base_url": base_url(upstream)},
        "cache": redis_cache(own_redis.url, redis_timeout_ms=50),
        "admin": {"token": ADMIN},
    }
    config.write_text(to_toml(sections))
    source = ConfigSource(config)
    gateway = await gateway_client(aiohttp_client, create_app(source.load(), source=source))
    contract = Contract(openapi_document(gateway.app[LIVE].settings))
    admin = {"Authorization": f"Bearer {ADMIN}"}
    own_redis.stop()
    purge = await gateway.delete("/admin/cache", headers=admin)
    assert purge.status == 503
    body = await contract.check("/admin/cache", purge, "delete")
    assert (body["type"], body["outcome"]) == (_PROBLEM + "purge-outcome-unknown", "unknown")
    config.write_text("[[[")
    reload = await gateway.post("/admin/reload", headers=admin)
    assert reload.status == 422
    body = await contract.check("/admin/reload", reload, "post")
    assert body["type"] == _PROBLEM + "config-refused"


def test_without_an_admin_token_no_admin_route_is_documented() -> None:
    document = openapi_document(Settings())
    assert not [path for path in document["paths"] if path.startswith("/admin")]
    assert set(document["components"]["securitySchemes"]) == {"bearer"}
