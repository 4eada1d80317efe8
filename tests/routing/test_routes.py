"""A route declared once is a route served: an extra route, declared in a test-only
table with nothing but its declaration and the reference upstream's data for it, is
validated, served, cached under its own TTL, documented, probed and sampled by compare
(docs/routes.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError
from pytest_aiohttp import AiohttpServer

from gateway.config.settings import UpstreamSettings, route_ttls
from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.normalise.pages import UserPage
from gateway.normalise.schema import User
from gateway.probe.conformance import run_probe
from gateway.probe.replay import run_compare
from gateway.probe.sample import sample_requests, target
from gateway.routing.parameters import Choice, Param, Uuid
from gateway.routing.routes import Route, RouteTable
from gateway.routing.sampling import Each, Fixed, Spread
from gateway.routing.standard import PAGING, ROUTES
from gateway.upstream.client import UpstreamClient
from gateway.upstream.link import UpstreamLink

from ..conftest import AUTH, TOKEN, GatewayFactory, base_url

PROBLEM = "application/problem+json"
ADMIN = {"Authorization": "Bearer routes-admin-token-0123"}
STAFF_TTL_S = 17
UNKNOWN_MEMBER = "00000000-0000-4000-8000-0000000000ff"
STAFF = Route(
    "staff",
    "/staff",
    UserPage,
    ttl_s=STAFF_TTL_S,
    operation_id="listStaff",
    text="The staff, a page at a time.",
    query=(
        *PAGING,
        Param(
            "role",
            Choice(("ADMIN", "VIEWER")),
            "in any case; forwarded in upper case.",
            example="ADMIN",
        ),
    ),
    sample=(Each("role", ("role",)),),
)
STAFF_MEMBER = Route(
    "staffMember",
    "/staff/{staffId}",
    User,
    ttl_s=STAFF_TTL_S,
    operation_id="getStaffMember",
    text="One member of staff, by UUID.",
    path=Param("staffId", Uuid(), "The member's UUID."),
    listed_by="staff",
    sample=(Spread("staffId", ("id",), 2), Fixed("staffId", (UNKNOWN_MEMBER,))),
)
EXTRA = RouteTable((*ROUTES, STAFF, STAFF_MEMBER))
PEOPLE: list[dict[str, Any]] = [
    {
        "id": f"00000000-0000-4000-8000-00000000000{n}",
        "username": f"staff{n}",
        "mail": f"staff{n}@example.com",
        "role": "ADMIN" if n % 2 else "VIEWER",
        "phone": None,
        "accounts": [],
    }
    for n in range(1, 4)
]


@pytest.fixture
async def staff_upstream(aiohttp_server: AiohttpServer) -> TestServer:
    """The reference upstream with the staff's records at /staff."""
    return await aiohttp_server(create_demo_app(collections={"/staff": PEOPLE}))


def staff_calls(upstream: TestServer) -> list[tuple[tuple[str, str], ...]]:
    return [entry.query for entry in upstream.app[REQUEST_LOG].for_path("/staff")]


async def test_a_bad_parameter_of_the_extra_route_is_a_problem_that_never_reaches_the_upstream(
    gateway_factory: GatewayFactory, staff_upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(staff_upstream), routes=EXTRA)

    response = await client.get("/staff?role=boss&limit=0", headers=AUTH)

    assert response.status == 400
    assert response.content_type == PROBLEM
    problems = {item["parameter"]: item["message"] for item in (await response.json())["errors"]}
    assert problems == {
        "limit": "must be an integer from 1 to 100",
        "role": "must be ADMIN or VIEWER",
    }
    bad_id = await client.get("/staff/not-a-uuid", headers=AUTH)
    assert bad_id.status == 400
    assert staff_calls(staff_upstream) == []
    assert staff_upstream.app[REQUEST_LOG].for_path("/staff/not-a-uuid") == []


async def test_the_extra_route_is_served_and_cached_under_its_own_ttl(
    gateway_factory: GatewayFactory, staff_upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(staff_upstream), routes=EXTRA)

    first = await client.get("/staff?role=admin", headers=AUTH)
    second = await client.get("/staff?role=ADMIN&page=1", headers=AUTH)

    assert first.status == 200
    body = await first.json()
    assert [person["username"] for person in body["data"]] == ["staff1", "staff2", "staff3"]
    assert (body["page"], body["limit"], body["total"]) == (1, 10, 3)
    assert first.headers["Cache-Control"] == f"private, max-age={STAFF_TTL_S}"
    assert first.headers["X-Cache"] == "MISS"
    assert second.headers["X-Cache"] == "HIT"
    assert await second.json() == body
    # once, with the canonical query the declaration makes
    assert staff_calls(staff_upstream) == [(("page", "1"), ("limit", "10"), ("role", "ADMIN"))]
    one = await client.get(f"/staff/{PEOPLE[1]['id'].upper()}", headers=AUTH)
    assert one.status == 200
    assert (await one.json())["username"] == "staff2"


async def test_the_extra_route_has_its_ttl_metric_and_is_purged_by_its_name(
    gateway_factory: GatewayFactory, staff_upstream: TestServer
) -> None:
    client = await gateway_factory(
        base_url(staff_upstream), routes=EXTRA, admin={"token": ADMIN["Authorization"][7:]}
    )
    await client.get("/staff", headers=AUTH)
    assert (await client.get("/staff", headers=AUTH)).headers["X-Cache"] == "HIT"

    purged = await client.delete("/admin/cache?route=staff", headers=ADMIN)
    after = await client.get("/staff", headers=AUTH)

    assert purged.status == 200
    assert after.headers["X-Cache"] == "MISS"
    assert len(staff_calls(staff_upstream)) == 2
    metrics = await (await client.get("/metrics")).text()
    assert f'gateway_ttl_seconds{{route="staff"}} {STAFF_TTL_S}.0' in metrics
    document = await (await client.get("/openapi.json")).json()
    purge = document["paths"]["/admin/cache"]["delete"]["parameters"][0]
    assert "staff" in purge["schema"]["enum"]


async def test_the_extra_route_is_documented_in_the_openapi_document(
    gateway_factory: GatewayFactory, staff_upstream: TestServer
) -> None:
    client = await gateway_factory(base_url(staff_upstream), routes=EXTRA)

    document = await (await client.get("/openapi.json")).json()

    listing = document["paths"]["/staff"]["get"]
    assert listing["operationId"] == "listStaff"
    refs = [parameter["$ref"].rpartition("/")[2] for parameter in listing["parameters"]]
    assert refs[:3] == ["page", "limit", "role"]
    role = document["components"]["parameters"]["role"]
    assert role["schema"] == {"type": "string", "enum": ["ADMIN", "VIEWER"]}
    assert role["description"] == "ADMIN or VIEWER, in any case; forwarded in upper case."
    assert role["example"] == "ADMIN"
    member = document["paths"]["/staff/{staffId}"]["get"]
    assert member["operationId"] == "getStaffMember"
    assert document["components"]["parameters"]["staffId"]["in"] == "path"


async def test_the_probe_calls_and_checks_the_extra_routes(staff_upstream: TestServer) -> None:
    settings = UpstreamSettings(base_url=base_url(staff_upstream))
    async with UpstreamLink(settings) as link:
        report = await run_probe(UpstreamClient(link, settings), TOKEN, EXTRA)

    outcomes = {route.route: (route.outcome, route.target) for route in report.routes}
    assert outcomes["staff"] == ("ok", "/staff?page=1&limit=10")
    assert outcomes["staffMember"] == ("ok", f"/staff/{PEOPLE[0]['id']}")
    assert [route.route for route in report.routes] == [
        "users",
        "clients",
        "expenses",
        "accounts",
        "staff",
        "expense",
        "account",
        "staffMember",
    ]


async def test_compare_samples_the_extra_routes_as_declared_with_the_primarys_values(
    staff_upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    candidate = await aiohttp_server(create_demo_app(collections={"/staff": PEOPLE}))
    primary_settings = UpstreamSettings(base_url=base_url(staff_upstream))
    candidate_settings = UpstreamSettings(base_url=base_url(candidate))
    async with UpstreamLink(primary_settings) as primary, UpstreamLink(candidate_settings) as other:
        comparison = await run_compare(
            UpstreamClient(primary, primary_settings),
            UpstreamClient(other, candidate_settings),
            TOKEN,
            max_limit=100,
            routes=EXTRA,
        )

    staff = [
        (outcome.target, outcome.outcome)
        for outcome in comparison.requests
        if outcome.route in {"staff", "staffMember"}
    ]
    # the list's pages, then the id route's declared sample (two members spread over
    # the first page, and an unknown one), then the list's (each role of the data)
    assert staff == [
        ("/staff?page=1&limit=20", "identical"),
        ("/staff?page=2&limit=20", "identical"),
        ("/staff?page=1&limit=10", "identical"),
        (f"/staff/{PEOPLE[0]['id']}", "identical"),
        (f"/staff/{PEOPLE[1]['id']}", "identical"),
        (f"/staff/{UNKNOWN_MEMBER}", "identical"),
        ("/staff?page=1&limit=20&role=ADMIN", "identical"),
        ("/staff?page=1&limit=20&role=VIEWER", "identical"),
    ]
    assert comparison.gaps == ()

    # the role filters were sent to both upstreams, as declared (the primary is asked
    # each request twice, to tell noise from differences)
    def roles(server: TestServer) -> list[str]:
        return [dict(query)["role"] for query in staff_calls(server) if "role" in dict(query)]

    assert roles(candidate) == ["ADMIN", "VIEWER"]
    assert roles(staff_upstream) == ["ADMIN", "ADMIN", "VIEWER", "VIEWER"]


def test_a_route_without_a_sample_has_its_pages_asked_for_and_an_id_route_nothing() -> None:
    unsampled = RouteTable((*ROUTES, replace(STAFF, sample=()), replace(STAFF_MEMBER, sample=())))
    seeds = {"staff": {"data": PEOPLE, "totalPages": 1}}
    sample = sample_requests(seeds, max_limit=100, routes=unsampled)

    assert [target(q) for q in sample.queries if q.route.name in {"staff", "staffMember"}] == [
        "/staff?page=1&limit=20",
        "/staff?page=2&limit=20",
        "/staff?page=1&limit=10",
    ]


def test_a_route_refuses_to_sample_a_parameter_it_does_not_declare() -> None:
    with pytest.raises(ValueError, match=r"route staff: sampled \['colour'\] not declared"):
        Route(
            "staff",
            "/staff",
            UserPage,
            1,
            "listStaff",
            "Staff.",
            query=PAGING,
            sample=(Each("colour", ("colour",)),),
        )


def test_the_ttl_settings_are_made_from_the_table() -> None:
    ttls = route_ttls(EXTRA)

    assert ttls().model_dump() == {route.name: route.ttl_s for route in EXTRA}
    assert ttls.model_validate({"staff": 5}).model_dump()["staff"] == 5
    with pytest.raises(ValidationError, match="less than or equal to 86400"):
        ttls.model_validate({"staff": 86_401})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ttls.model_validate({"visitors": 5})


def test_a_table_refuses_a_parameter_declared_two_ways() -> None:
    other_page = Param("page", Choice(("FIRST",)), "Which page.")
    clashing = Route("pages", "/pages", UserPage, 1, "listPages", "Pages.", query=(other_page,))

    with pytest.raises(ValueError, match="parameter page: declared two ways"):
        RouteTable((*ROUTES, clashing))


def test_an_id_route_must_be_listed_by_a_list_route() -> None:
    orphan = Route(
        "orphan",
        "/orphans/{orphanId}",
        User,
        1,
        "getOrphan",
        "One.",
        path=Param("orphanId", Uuid(), "Its id."),
        listed_by="nobody",
    )

    with pytest.raises(ValueError, match="listed_by names no list route"):
        RouteTable((*ROUTES, orphan))
