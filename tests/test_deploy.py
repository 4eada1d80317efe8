"""deploy/grafana and deploy/prometheus: the dashboard and the alerting rules that ship
with the gateway. promtool checks the rules, runs their unit tests and parses every
dashboard query; every metric a query or a rule names must be in a real scrape of the
gateway, so that a renamed metric breaks the build rather than a panel or an alert."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.http.admin import SHADOW
from gateway.http.app import create_app
from gateway.http.service import METRICS
from gateway.ops.ttl_advice import MIN_REFRESHES

from .conftest import AUTH, FakeClock, base_url, gateway_client, make_settings, until

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "records-gateway.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DEPLOY_README = ROOT / "deploy" / "README.md"
SEVERITIES = {"critical", "warning", "info"}
# names a query may use that the traffic of the scrape test gives no sample of: the
# family must still be in the scrape (its HELP and TYPE), with the type the suffix needs
ADMIN_TOKEN = "admin-token-0123456789abcdef"
NO_SAMPLE_IN_THE_SCRAPE_TEST = {
    # needs an upstream that drops a pooled connection (tests/upstream/test_retry.py)
    "gateway_upstream_retries_total",
    # need records that change upstream (tests/http/test_record_consistency.py)
    "gateway_consistency_invalidations_total",
    "gateway_consistency_refetches_total",
}
Client = TestClient[web.Request, web.Application]


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run promtool; it must be installed (`make test` installs it, `make promtool` alone)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: run `make promtool` (make test does it)")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels of collapsed rows included."""
    for panel in data["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(data: dict[str, Any]) -> list[str]:
    """The PromQL of every panel target and annotation, and the selector of every
    ``label_values`` variable query."""
    queries = [
        target["expr"]
        for panel in panels(data)
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    queries += [item["expr"] for item in data["annotations"]["list"] if "expr" in item]
    for variable in data["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.+), *\w+\)", variable["definition"])
            assert found, variable["definition"]
            queries.append(found.group(1))
    return queries


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert [group["name"] for group in groups] == ["records-gateway"]
    rules: list[dict[str, Any]] = groups[0]["rules"]
    return rules


def as_promql(query: str) -> str:
    """``query`` with Grafana's variables replaced by values Prometheus accepts."""
    durations = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h"}

    def value(match: re.Match[str]) -> str:
        return durations.get(match.group(1), ".*")

    return re.sub(r"\$\{?(\w+)\}?", value, query)


def metric_names(query: str) -> set[str]:
    """The gateway's metric names in a query (label values and other strings left out)."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', query)
    return set(re.findall(r"\bgateway_\w+", code))


def test_promtool_checks_the_alerting_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_the_unit_tests_of_the_alerts_pass() -> None:
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_that_fires_and_one_that_does_not() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    assert tests["rule_files"] == [ALERTS.name]
    fired: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fired == set(), "alerts no test sees firing"
    assert names - silent == set(), "alerts no test sees staying silent"
    assert (fired | silent) - names == set(), "tests of alerts that do not exist"


def test_every_alert_says_how_bad_what_and_where_to_look() -> None:
    readme = DEPLOY_README.read_text()
    anchors = {
        re.sub(r"[^\w-]", "", heading.strip().lower().replace(" ", "-"))
        for heading in re.findall(r"^#+ (.+)$", readme, re.MULTILINE)
    }
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, name
        anchor = name.lower()
        assert annotations["runbook"].startswith(f"deploy/README.md#{anchor}. "), name
        assert anchor in anchors, f"deploy/README.md has no section for {name}"
        grouped = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
        if any("route" in labels for labels in grouped):
            assert "{{ $labels.route }}" in annotations["summary"], name


def test_the_dashboard_has_the_shape_grafana_imports() -> None:
    data = dashboard()
    assert data["schemaVersion"] >= 36
    assert data["uid"] == "records-gateway"
    variables = {variable["name"]: variable for variable in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    route = variables["route"]
    assert route["multi"]
    assert route["includeAll"]
    assert re.fullmatch(r"label_values\(gateway_requests_total\{.*\}, route\)", route["definition"])
    ids: set[int] = set()
    cells: set[tuple[int, int]] = set()
    for panel in panels(data):
        assert panel["id"] not in ids, f"two panels with id {panel['id']}"
        ids.add(panel["id"])
        assert panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert target["expr"].strip(), panel["title"]
    rows = [panel["title"] for panel in data["panels"] if panel["type"] == "row"]
    assert rows == [
        "Traffic",
        "Cache",
        "Latency",
        "Upstream",
        "TTL",
        "Redis",
        "Shadow",
        "Purges and consistency",
    ]


def test_every_dashboard_query_is_promql_promtool_parses(tmp_path: Path) -> None:
    queries = dashboard_queries(dashboard())
    assert len(queries) > 30
    rules = [
        {"record": f"dashboard:query_{index}:check", "expr": as_promql(query)}
        for index, query in enumerate(queries)
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_names_are_read_from_queries_as_prometheus_reads_them() -> None:
    query = (
        'sum by (route) (rate(gateway_requests_total{route=~"$route", status=~"gateway_x"}'
        "[$__rate_interval])) / on (route) gateway_ttl_seconds"
    )
    assert metric_names(query) == {"gateway_requests_total", "gateway_ttl_seconds"}
    assert as_promql(query).startswith(
        'sum by (route) (rate(gateway_requests_total{route=~".*", status=~"gateway_x"}[1m]))'
    )


Start = Callable[[], Awaitable[None]]


async def gated_upstream(aiohttp_server: AiohttpServer) -> tuple[Any, asyncio.Event]:
    """The reference upstream, holding /clients until the event is set."""
    release = asyncio.Event()

    @web.middleware
    async def gate(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/clients":
            await release.wait()
        response: web.StreamResponse = await handler(request)
        return response

    app = create_demo_app()
    app.middlewares.append(gate)
    return await aiohttp_server(app), release


async def get(client: Client, path: str) -> tuple[int, str]:
    response = await client.get(path, headers=AUTH)
    await response.read()
    return response.status, response.headers.get("X-Cache", "")


async def test_every_metric_the_dashboard_and_the_alerts_name_is_in_a_real_scrape(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer, clock: FakeClock
) -> None:
    primary, release = await gated_upstream(aiohttp_server)
    candidate = await aiohttp_server(create_demo_app(drift=["amount-scale"]))
    settings = make_settings(
        base_url(primary),
        cache={"backend": "memory"},
        upstream={
            "shadow": {"base_url": base_url(candidate), "sample_ratio": 1.0, "recheck_ratio": 0},
            "breaker_reset_s": 3600,  # still open at the scrape, however slow the machine
        },
        admin={"token": ADMIN_TOKEN},
    )
    client = await gateway_client(aiohttp_client, create_app(settings, clock=clock))
    metrics = client.app[METRICS]
    # a purge by record, and a change notice
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    record = "user:0c6f8d3e-1111-4000-8000-000000000001"
    assert (await client.delete(f"/admin/cache?record={record}", headers=admin)).status == 200
    notice = {**admin, "Content-Type": "application/json"}
    posted = await client.post(
        "/admin/records/changed", data=f'{{"records":["{record}"]}}', headers=notice
    )
    assert posted.status == 200

    # misses, a hit, coercions, a shadow comparison that differs (amounts scaled)
    assert await get(client, "/expenses") == (200, "MISS")
    assert await get(client, "/expenses") == (200, "HIT")
    # callers that wait for another's upstream call
    burst = [asyncio.create_task(get(client, "/clients")) for _ in range(8)]
    await until(lambda: metrics.busy == 8 and primary.app[REQUEST_LOG].for_path("/clients"))
    release.set()
    assert set(await asyncio.gather(*burst)) == {(200, "MISS")}
    # answers replaced after they expired: enough evidence for a TTL advice (the first
    # request only fills)
    for _ in range(MIN_REFRESHES + 1):
        clock.advance(300 + 30 + 1)  # past the users TTL and its revalidate window
        assert await get(client, "/users") == (200, "MISS")
        assert await get(client, "/users") == (200, "HIT")
    await until(lambda: client.app[SHADOW].in_flight == 0)
    # the upstream goes away: a stale answer, then errors until its circuit opens
    assert await get(client, "/accounts") == (200, "MISS")
    await primary.close()
    clock.advance(60 + 30 + 1)  # past the accounts TTL and window, within stale_if_error_s
    assert await get(client, "/accounts") == (200, "STALE")
    statuses = [(await get(client, f"/expenses?page={page}"))[0] for page in range(2, 9)]
    assert statuses[0] == 502  # unreachable
    assert statuses[-1] == 503  # its circuit open

    response = await client.get("/metrics")
    assert response.status == 200
    exposition = await response.text()
    sampled: set[str] = set()
    possible: set[str] = set()  # every sample name the families exposed can have
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    for family in text_string_to_metric_families(exposition):
        sampled |= {sample.name for sample in family.samples}
        possible |= {family.name + suffix for suffix in suffixes.get(family.type, ())}
    assert "gateway_upstream_circuit_state 2.0" in exposition

    used: dict[str, set[str]] = {}
    for query in dashboard_queries(dashboard()):
        for name in metric_names(query):
            used.setdefault(name, set()).add(DASHBOARD.name)
    for rule in alert_rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(ALERTS.name)
    assert len(used) >= 20
    assert set(used) >= NO_SAMPLE_IN_THE_SCRAPE_TEST
    unknown = {name: sorted(where) for name, where in used.items() if name not in possible}
    assert unknown == {}, "metrics the gateway does not expose (renamed?)"
    unsampled = {
        name: sorted(where)
        for name, where in used.items()
        if name not in sampled and name not in NO_SAMPLE_IN_THE_SCRAPE_TEST
    }
    assert unsampled == {}, "metrics this test's traffic gave no sample of"
