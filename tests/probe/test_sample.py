"""The requests ``records-gateway compare`` sends: the sample made from the reference
upstream's data, and requests files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from gateway.config.settings import UpstreamSettings
from gateway.errors import ConfigError
from gateway.probe.replay import generated_sample
from gateway.probe.sample import (
    UNKNOWN_ACCOUNT,
    UNKNOWN_EXPENSE,
    Sample,
    read_requests,
    sample_requests,
    target,
)
from gateway.routing.standard import ROUTES
from gateway.upstream.client import UpstreamClient
from gateway.upstream.link import UpstreamLink
from tests.conftest import AUTH, base_url

EXPENSE_FILTERS = {"dateFrom", "dateTo", "amount", "concept", "account", "status", "type", "user"}


async def reference_sample(upstream: TestServer, max_limit: int = 100) -> Sample:
    settings = UpstreamSettings(base_url=base_url(upstream))
    async with UpstreamLink(settings) as link:
        client = UpstreamClient(link, settings)
        return await generated_sample(client, AUTH["Authorization"], max_limit=max_limit)


async def test_the_sample_covers_every_route_and_every_filter_with_the_primarys_values(
    upstream: TestServer,
) -> None:
    """Held for docs/switching-upstreams.md, "An example": the sample covers every route and every
    filter.
    """
    sample = await reference_sample(upstream)
    queries = sample.queries

    assert sample.gaps == ()
    assert 40 <= len(queries) <= 80
    routes = Counter(query.route.name for query in queries)
    assert set(routes) == {route.name for route in ROUTES}
    params: dict[str, set[str]] = {}
    for query in queries:
        params.setdefault(query.route.name, set()).update(name for name, _ in query.params)
    assert params["expenses"] == {"page", "limit", *EXPENSE_FILTERS}
    assert params["accounts"] == {"page", "limit", "type", "bankCode"}
    assert params["users"] == params["clients"] == {"page", "limit"}
    # each expense filter alone, and combined
    alone = {
        name
        for query in queries
        if query.route.name == "expenses"
        for name, _ in query.params[2:]
        if len(query.params) == 3
    }
    assert alone == EXPENSE_FILTERS
    assert any(len(query.params) > 3 for query in queries if query.route.name == "expenses")
    # pages 1 and 2 of each list, and another limit
    for route in ("users", "clients", "expenses", "accounts"):
        pages = {dict(q.params)["page"] for q in queries if q.route.name == route}
        limits = {dict(q.params)["limit"] for q in queries if q.route.name == route}
        assert {"1", "2"} <= pages
        assert len(limits) >= 2
    targets = [target(query) for query in queries]
    assert len(set(targets)) == len(targets)
    # ids and values are the reference's own (tests/probe/test_conformance.py's first ones)
    assert "/expenses/3730bf79-913a-47af-a917-9e028868b644" in targets
    assert f"/expenses/{UNKNOWN_EXPENSE}" in targets
    assert "/accounts/ACC-001" in targets
    assert "/accounts/Cuenta%20Corriente%20Principal" in targets  # ACC-001 by its name
    assert "/accounts/Tesorer%C3%ADa%20EUR%2FUSD" in targets  # an id with a / in it
    assert f"/accounts/{UNKNOWN_ACCOUNT}" in targets
    assert "/accounts?page=1&limit=10&bankCode=007" in targets
    assert "/expenses?page=1&limit=20&user=admin" in targets


async def test_the_sample_is_the_same_for_the_same_data_and_within_max_limit(
    upstream: TestServer,
) -> None:
    first, second = await reference_sample(upstream), await reference_sample(upstream)
    assert list(map(target, first.queries)) == list(map(target, second.queries))

    small = await reference_sample(upstream, max_limit=5)
    assert {dict(query.params).get("limit", "5") for query in small.queries} == {"5"}


def test_without_the_primarys_first_pages_the_lists_are_asked_and_the_gaps_said() -> None:
    sample = sample_requests({}, max_limit=100)

    assert [target(query) for query in sample.queries] == [
        "/users?page=1&limit=20",
        "/users?page=2&limit=20",
        "/users?page=1&limit=10",
        "/clients?page=1&limit=20",
        "/clients?page=2&limit=20",
        "/clients?page=1&limit=10",
        "/expenses?page=1&limit=20",
        "/expenses?page=2&limit=20",
        "/expenses?page=1&limit=10",
        "/accounts?page=1&limit=20",
        "/accounts?page=2&limit=20",
        "/accounts?page=1&limit=10",
        f"/expenses/{UNKNOWN_EXPENSE}",
        f"/accounts/{UNKNOWN_ACCOUNT}",
        "/accounts?page=1&limit=10&type=CASH",
        "/accounts?page=1&limit=10&type=BANK",
    ]
    assert len(sample.gaps) == 4
    assert sample.gaps[2].startswith("GET /expenses: the primary gave no first page")


def test_a_value_of_the_data_the_gateway_refuses_is_left_out_and_said() -> None:
    seeds = {"accounts": {"data": [{"id": "bad\x00id", "name": "x" * 300}], "totalPages": 1}}
    sample = sample_requests(seeds, max_limit=100)

    assert not any("bad" in target(query) for query in sample.queries)
    refused = [gap for gap in sample.gaps if "refused" in gap]
    assert refused == [
        "GET /accounts/{accountId}: a value of the data is refused (accountId: must not"
        " contain control characters)",
        "GET /accounts/{accountId}: a value of the data is refused (accountId: must be at"
        " most 200 characters)",
    ]


def test_a_requests_file_is_read_as_the_gateway_reads_requests(tmp_path: Path) -> None:
    path = tmp_path / "requests.txt"
    path.write_text(
        "# a comment, then a blank line\n"
        "\n"
        "/expenses?type=bank&limit=20\n"
        "  /accounts/Caja%20chica%20Bogot%C3%A1  \n"
        "/accounts/Tesorer%C3%ADa%20EUR%2FUSD\n"
        "/expenses/3730BF79-913A-47AF-A917-9E028868B644\n"
        "/users\n"
        "/accounts?bankCode=007&type=BANK\n"
        "/expenses?concept=caf%C3%A9+bar&amount=12.50\n"
    )
    queries = read_requests(path, max_limit=100)

    assert [target(query) for query in queries] == [
        "/expenses?page=1&limit=20&type=BANK",
        "/accounts/Caja%20chica%20Bogot%C3%A1",
        "/accounts/Tesorer%C3%ADa%20EUR%2FUSD",
        "/expenses/3730bf79-913a-47af-a917-9e028868b644",
        "/users?page=1&limit=10",
        "/accounts?page=1&limit=10&type=BANK&bankCode=007",
        "/expenses?page=1&limit=10&amount=12.5&concept=caf%C3%A9%20bar",
    ]
    assert queries[1].path_value == "Caja chica Bogotá"
    assert queries[2].path_value == "Tesorería EUR/USD"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("/expenses?limit=1000", "limit: must be an integer from 1 to 100"),
        ("/expenses?colour=red", "colour: unknown query parameter; allowed: page, limit,"),
        ("/expenses?dateFrom=2024-02-30", "dateFrom: is not a real calendar date"),
        ("/expenses/not-a-uuid", "expenseId: must be a UUID"),
        ("/accounts/100%zz", "accountId: has a % that starts no percent-escape"),
        ("/invoices", "'/invoices' is not the path of a record route (/users, /clients,"),
        ("/accounts/a/b", "'/accounts/a/b' is not the path of a record route"),
        ("/accounts/..", "ends in a dot segment"),
        ("https://records.example/users", "is not a path starting with /"),
    ],
)
def test_a_bad_line_of_a_requests_file_is_named_with_its_number_and_problem(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "requests.txt"
    path.write_text(f"# requests\n/users\n\n{line}\n/clients\n")
    with pytest.raises(ConfigError) as caught:
        read_requests(path, max_limit=100)

    message = str(caught.value)
    assert message.startswith(f"--requests {path}, line 4: {line!r}")
    assert problem in message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"# nothing\n\n", "no requests (only blank lines and comments)"),
        (b"/users\n\xff\xfe\n", "not UTF-8 text (invalid start byte)"),
        (None, "cannot be read (No such file or directory)"),
    ],
)
def test_a_requests_file_without_requests_or_unreadable_is_refused(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "requests.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        read_requests(path, max_limit=100)
    assert str(caught.value) == f"--requests {path}: {problem}"
