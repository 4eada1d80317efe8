"""The shadow report of a gateway with two workers (real processes): one report for
both, whichever worker answers it, and one reset for both."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.comparison.diff import Difference
from gateway.comparison.shadow import Shadow
from gateway.comparison.tally import Tally
from gateway.comparison.workers import WorkerReports
from gateway.config.settings import load_settings
from gateway.demo import REQUEST_LOG, DemoServer, start_demo_server
from gateway.records.routes import parse_record_query
from gateway.routing.standard import USERS
from gateway.upstream.client import UpstreamReply

from ..process.test_supervisor import AUTH, GatewayProcess, serve

ADMIN_TOKEN = "admin-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def started() -> AsyncIterator[list[GatewayProcess]]:
    """Gateway processes a test started, killed after it if still running."""
    processes: list[GatewayProcess] = []
    yield processes
    for process in processes:
        await process.kill()


@pytest.fixture
async def twin() -> AsyncIterator[DemoServer]:
    server = await start_demo_server()
    yield server
    await server.close()


async def _reports(gateway: GatewayProcess, count: int) -> list[dict[str, Any]]:
    """``count`` reports, each over a new connection (so both workers answer some)."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        reports = []
        for _ in range(count):
            async with http.get(f"{gateway.url}/admin/shadow", headers=ADMIN) as response:
                assert response.status == 200
                reports.append(await response.json())
        return reports


async def test_two_workers_give_one_report_and_one_reset(
    tmp_path: Path, started: list[GatewayProcess], twin: DemoServer
) -> None:
    """Held for docs/switching-upstreams.md, "What shadow traffic promises": one
    report and one reset for every worker.
    """
    upstream = await start_demo_server()
    try:
        extra = (
            f'[server]\nworkers = 2\n[admin]\ntoken = "{ADMIN_TOKEN}"\n'
            f'[upstream.shadow]\nbase_url = "{twin.url}"\nsample_ratio = 1.0\n'
        )
        gateway = await serve(started, tmp_path, upstream.url, extra=extra, workers=2)
        misses = 40
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection each time
        async with aiohttp.ClientSession(connector=connector) as http:
            for page in range(1, misses + 1):
                async with http.get(f"{gateway.url}/expenses?page={page}", headers=AUTH) as r:
                    assert r.status == 200
        pids = {line["pid"] for line in gateway.lines if line.get("logger") == "gateway.access"}
        assert len(pids) == 2, "both workers answered"
        async with asyncio.timeout(20):
            while len(twin.app[REQUEST_LOG]) < misses:
                await asyncio.sleep(0.05)
        # whichever worker answers, the report counts both workers' comparisons
        async with asyncio.timeout(20):
            while True:
                reports = await _reports(gateway, 6)
                if all(r["totals"]["identical"] == misses for r in reports):
                    break
                await asyncio.sleep(0.1)
        assert {r["workers"] for r in reports} == {2}

        async with (
            aiohttp.ClientSession() as http,
            http.delete(f"{gateway.url}/admin/shadow", headers=ADMIN) as response,
        ):
            assert response.status == 200
        # every report after the reset, from either worker, starts again
        for report in await _reports(gateway, 6):
            assert report["totals"]["compared"] == 0
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{gateway.url}/users", headers=AUTH) as response,
        ):
            assert response.status == 200
        async with asyncio.timeout(20):
            while not all(r["totals"]["compared"] == 1 for r in await _reports(gateway, 6)):
                await asyncio.sleep(0.1)
        assert not any(ADMIN_TOKEN in orjson.dumps(line).decode() for line in gateway.lines)
    finally:
        await upstream.close()


def test_a_worker_takes_a_reset_another_announced_and_reports_add_up(tmp_path: Path) -> None:
    first, second = WorkerReports(tmp_path, pid=1), WorkerReports(tmp_path, pid=2)
    mine = Tally(primary="http://a", candidate="http://b")
    theirs = Tally(primary="http://a", candidate="http://b")
    mine.record("users", "r1", [])
    theirs.record("users", "r2", [])
    theirs.candidate_failed("users", "timeout")
    second.publish(theirs)
    total, workers = first.gather(mine)
    users = total.report()["routes"]["users"]
    assert (workers, users["identical"], users["candidateErrors"]) == (2, 2, {"timeout": 1})

    second.announce_reset()
    assert first.reset_due()
    assert not first.reset_due()
    fresh = Tally(primary="http://a", candidate="http://b")
    total, workers = first.gather(fresh)
    assert (workers, total.report()["routes"]) == (1, {})  # the other's file is older

    # a worker still comparing other upstreams (before its reload) is left out
    other = Tally(primary="http://a", candidate="http://c")
    other.record("users", "r3", [])
    second.publish(other)
    assert first.gather(fresh)[1] == 1


def test_a_new_report_is_written_even_with_as_many_counts_as_the_old(tmp_path: Path) -> None:
    """A reload to another candidate starts a new tally; once it has counted as much as
    the old one had, its file must still be written (not taken for the old one)."""
    own, other = WorkerReports(tmp_path, pid=1), WorkerReports(tmp_path, pid=2)
    old = Tally(primary="http://a", candidate="http://b")
    old.record("users", "r1", [])
    own.publish(old)
    new = Tally(primary="http://a", candidate="http://c")
    new.record("users", "r2", [])
    assert new.changes == old.changes
    own.publish(new)
    total, workers = other.gather(Tally(primary="http://a", candidate="http://c"))
    assert (workers, total.report()["routes"]["users"]["identical"]) == (2, 1)


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"epoch": 0}',
        b'{"epoch": 0, "tally": {"primary": "http://a", "candidate": "http://b"}}',
        b'{"epoch": 0, "tally": {"primary": "http://a", "candidate": "http://b", "since": "x",'
        b' "routes": {}}}',
        b'{"epoch": 0, "tally": {"primary": "http://a", "candidate": "http://b", "since": 1,'
        b' "routes": {"users": {"outcomes": {"identical": "many"}}}}}',
        b'{"epoch": 0, "tally": {"primary": "http://a", "candidate": "http://b", "since": 1,'
        b' "routes": {"users": {"outcomes": {}, "candidateErrors": {}, "spots": [["a"]],'
        b' "noise": [], "rechecked": []}}}}',
    ],
)
def test_a_damaged_worker_file_is_left_out(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "shadow-99.json").write_bytes(content)
    mine = Tally(primary="http://a", candidate="http://b")
    mine.record("users", "r1", [])
    total, workers = WorkerReports(tmp_path, pid=1).gather(mine)
    assert workers == 1
    assert total.report()["routes"]["users"]["identical"] == 1


async def test_a_comparison_after_another_workers_reset_is_counted_not_lost(
    tmp_path: Path, twin: DemoServer
) -> None:
    """A worker that has not yet taken a reset another announced (it does once a
    second) counts a comparison ending meanwhile in the new report, not the old."""
    upstream = await start_demo_server()
    try:
        settings = load_settings(
            None,
            {
                "upstream": {
                    "base_url": upstream.url,
                    "shadow": {"base_url": twin.url, "sample_ratio": 1.0},
                }
            },
        )
        shadow = Shadow(settings.upstream, shared=tmp_path)
        query = parse_record_query(USERS, None, [], max_limit=100)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{upstream.url}/users?page=1&limit=10", headers=AUTH) as answer,
        ):
            body = await answer.read()

        async def again() -> UpstreamReply:
            raise AssertionError("identical answers need no second primary answer")

        WorkerReports(tmp_path, pid=2).announce_reset()  # another worker's DELETE
        shadow.offer(
            query, authorization=AUTH["Authorization"], request_id="r1", status=200, body=body,
            again=again,
        )  # fmt: skip
        async with asyncio.timeout(10):
            while shadow.in_flight:
                await asyncio.sleep(0.01)
        report = shadow.report()
        assert (report["totals"]["compared"], report["totals"]["identical"]) == (1, 1)
        await shadow.close()
    finally:
        await upstream.close()


def test_the_whole_answers_a_worker_kept_are_in_every_worker_s_report() -> None:
    """docs/console.md, "Switching upstreams": the answers kept by one worker are found
    through another (what a worker hands the others carries them), for the requests
    the report's examples name, within the bound of ten a route; a pair over 32 KiB, or
    a token in it, is not kept as it came."""
    mine = Tally(primary="http://a", candidate="http://b")
    theirs = Tally(primary="http://a", candidate="http://b")
    token = "Bearer secret-token"
    for number in range(12):
        request_id = f"r{number}"
        theirs.record("users", request_id, [Difference(f"f{number}", "value", 1, 2)])
        theirs.keep_answers("users", request_id, "/users?page=1", b'{"a":1}', b'{"a":2}', (token,))
    theirs.keep_answers("users", "unnamed", "/users", b"{}", b"[]")
    theirs.record("clients", "big", [Difference("f", "value", 1, 2)])
    theirs.keep_answers("clients", "big", "/clients", b"{}", b" " * (33 * 1024))
    theirs.record("clients", "c0", [Difference("g", "value", 1, 2)])
    theirs.keep_answers(
        "clients", "c0", "/clients", b'{"t":"Bearer secret-token"}', b"{}", (token,)
    )
    mine.absorb(json.loads(json.dumps(theirs.snapshot())))
    assert mine.answers("r0") == {
        "requestId": "r0",
        "route": "users",
        "target": "/users?page=1",
        "primary": '{"a":1}',
        "candidate": '{"a":2}',
    }
    kept = [mine.answers(f"r{number}") is not None for number in range(12)]
    assert kept == [True] * 10 + [False] * 2
    assert mine.answers("unnamed") is None
    assert mine.answers("big") is None
    clients = mine.answers("c0")
    assert clients is not None
    assert "secret-token" not in clients["primary"]
