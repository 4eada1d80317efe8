"""The gateway as a real process: reload on SIGHUP, graceful SIGTERM, several workers."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.demo import REQUEST_LOG, DemoServer, start_demo_server
from gateway.normalise.rules import compiled_available
from gateway.process.worker import GC_YOUNG_THRESHOLD, settle_collector

from ..redis_server import free_port

ROOT = Path(__file__).parent.parent.parent
AUTH = {"Authorization": "Bearer demo-token"}


class GatewayProcess:
    """``python -m gateway serve`` on a free port, its stdout read line by line."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.config = config
        self.env = env
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, *, workers: int = 1) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(self.config),
            "--port",
            str(self.port),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=self.env,
            cwd=ROOT,
        )
        self._reader = asyncio.ensure_future(self._read())
        await self.wait_for(lambda line: line.get("event") == "start", count=workers)

    async def _read(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(orjson.loads(raw))

    async def wait_for(self, predicate: Any, count: int = 1, within_s: float = 20) -> None:
        async with asyncio.timeout(within_s):
            while sum(1 for line in self.lines if predicate(line)) < count:
                assert self.process is not None
                assert self.process.returncode is None, self.lines[-5:]
                await asyncio.sleep(0.02)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    async def wait(self) -> int:
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout=30)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout=5)
        return code

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


@pytest.fixture
async def slow_upstream() -> AsyncIterator[DemoServer]:
    server = await start_demo_server(latency_ms=300)
    yield server
    await server.close()


@pytest.fixture
async def fast_upstream() -> AsyncIterator[DemoServer]:
    server = await start_demo_server()
    yield server
    await server.close()


def write_config(path: Path, upstream: str, *, users_ttl: int = 300, extra: str = "") -> None:
    path.write_text(
        f"""
[upstream]
base_url = "{upstream}"
[cache]
backend = "memory"
[cache.ttl_s]
users = {users_ttl}
[log]
format = "json"
{extra}
"""
    )


def clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATEWAY_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[list[GatewayProcess]]:
    processes: list[GatewayProcess] = []
    yield processes
    for process in processes:
        await process.kill()


async def serve(
    started: list[GatewayProcess],
    tmp_path: Path,
    upstream: str,
    *,
    users_ttl: int = 300,
    extra: str = "",
    workers: int = 1,
) -> GatewayProcess:
    """A gateway process in front of ``upstream``, its config in ``tmp_path``; started
    (every worker), and killed after the test if it is still running."""
    config = tmp_path / "config.toml"
    write_config(config, upstream, users_ttl=users_ttl, extra=extra)
    gateway = GatewayProcess(config, clean_env())
    started.append(gateway)
    await gateway.start(workers=workers)
    return gateway


async def test_sighup_applies_a_new_ttl_and_refuses_an_invalid_file(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await serve(started, tmp_path, fast_upstream.url, users_ttl=300)
    config = gateway.config
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/users", headers=AUTH) as response:
            assert response.headers["Cache-Control"] == "private, max-age=300"

        write_config(config, fast_upstream.url, users_ttl=42)
        gateway.signal(signal.SIGHUP)
        await gateway.wait_for(lambda line: line.get("message") == "config reloaded")
        async with http.get(f"{gateway.url}/users?page=2", headers=AUTH) as response:
            assert response.headers["X-Cache"] == "MISS"
            assert response.headers["Cache-Control"] == "private, max-age=42"

        config.write_text("[cache.ttl_s]\nusers = -5\n")
        gateway.signal(signal.SIGHUP)
        await gateway.wait_for(lambda line: line.get("event") == "config_reload" and not line["ok"])
        refused = next(line for line in gateway.lines if line.get("ok") is False)
        assert refused["level"] == "error"
        assert "cache.ttl_s.users" in refused["error"]
        async with http.get(f"{gateway.url}/users?page=3", headers=AUTH) as response:
            assert response.status == 200
            assert response.headers["Cache-Control"] == "private, max-age=42"
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0


async def test_sighup_with_a_hostile_file_keeps_serving_and_logs_the_refusal(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await serve(started, tmp_path, fast_upstream.url, users_ttl=300)

    def refused(line: dict[str, Any]) -> bool:
        return line.get("event") == "config_reload" and line.get("ok") is False

    async with aiohttp.ClientSession() as http:
        # 24 KB: one dotted key of 12,000 parts (quadratic for tomllib)
        gateway.config.write_text("a" + ".a" * 11_999 + " = 1\n")
        gateway.signal(signal.SIGHUP)
        async with http.get(f"{gateway.url}/healthz") as response:
            assert response.status == 200
        # answered while the reload was still being parsed
        assert not any(refused(line) for line in gateway.lines)
        await gateway.wait_for(refused)
        line = next(line for line in gateway.lines if refused(line))
        assert line["level"] == "error"
        assert line["error"] == (
            f"config file {gateway.config}: parsing it needed more than 256 MiB"
            " (the bound on parsing a config file)"
        )
        async with http.get(f"{gateway.url}/users", headers=AUTH) as response:
            assert response.status == 200
            assert response.headers["Cache-Control"] == "private, max-age=300"
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0


async def test_sigterm_lets_requests_in_flight_finish(
    tmp_path: Path, slow_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await serve(started, tmp_path, slow_upstream.url)
    async with aiohttp.ClientSession() as http:

        async def read(page: int) -> tuple[int, Any]:
            async with http.get(f"{gateway.url}/expenses?page={page}", headers=AUTH) as response:
                return response.status, await response.json()

        in_flight = [asyncio.ensure_future(read(page)) for page in range(1, 6)]
        log = slow_upstream.app[REQUEST_LOG]
        async with asyncio.timeout(10):
            while len(log) < 5:  # all five are waiting on the upstream (300 ms latency)
                await asyncio.sleep(0.01)
        gateway.signal(signal.SIGTERM)
        results = await asyncio.gather(*in_flight)
    assert [status for status, _ in results] == [200] * 5
    assert [body["page"] for _, body in results] == [1, 2, 3, 4, 5]
    assert await gateway.wait() == 0
    events = [line.get("event") for line in gateway.lines]
    assert events.index("stop") < events.index("stopped")


async def two_workers(
    tmp_path: Path, upstream: DemoServer, started: list[GatewayProcess]
) -> GatewayProcess:
    """A gateway with ``server.workers = 2``, both workers started."""
    return await serve(started, tmp_path, upstream.url, extra="[server]\nworkers = 2\n", workers=2)


async def test_two_workers_both_answer_and_metrics_sum_them(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await two_workers(tmp_path, fast_upstream, started)
    requests = 0
    connector = aiohttp.TCPConnector(force_close=True)  # a new connection each time
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(200):
            async with http.get(f"{gateway.url}/users", headers=AUTH) as response:
                assert response.status == 200
                requests += 1
            pids = {line["pid"] for line in gateway.lines if line.get("logger") == "gateway.access"}
            if len(pids) == 2 and requests >= 20:
                break
        assert len(pids) == 2, "both workers answered"
        await gateway.wait_for(lambda line: line.get("logger") == "gateway.access", count=requests)
        # each worker hands its tallies over once a second: the sum gets there
        total = 0.0
        async with asyncio.timeout(20):
            while total != requests:
                async with http.get(f"{gateway.url}/metrics") as response:
                    text = await response.text()
                total = sum(
                    sample.value
                    for family in text_string_to_metric_families(text)
                    for sample in family.samples
                    if sample.name == "gateway_requests_total" and sample.labels["route"] == "users"
                )
                assert total <= requests
                await asyncio.sleep(0.1)
    assert total == requests
    # the duration histograms too: every worker's file, summed by the collector
    durations = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gateway_request_duration_seconds_count"
        and sample.labels["route"] == "users"
    ]
    assert sum(durations) == requests
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0
    assert sum(1 for line in gateway.lines if line.get("event") == "stopped") == 2
    assert not any("demo-token" in orjson.dumps(line).decode() for line in gateway.lines)


async def test_sighup_switches_every_worker_to_a_new_base_url(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    """Held for docs/switching-upstreams.md, "4. Switch": every worker switches on SIGHUP."""
    async with await start_demo_server(seed=7) as other:
        gateway = await two_workers(tmp_path, fast_upstream, started)
        workers = {line["pid"] for line in gateway.lines if line.get("event") == "start"}
        assert len(workers) == 2
        write_config(gateway.config, other.url, extra="[server]\nworkers = 2\n")
        gateway.signal(signal.SIGHUP)
        await gateway.wait_for(lambda line: line.get("event") == "upstream_switch", count=2)
        switches = [line for line in gateway.lines if line.get("event") == "upstream_switch"]
        assert {line["pid"] for line in switches} == workers
        assert {(line["from_url"], line["to_url"]) for line in switches} == {
            (fast_upstream.url, other.url)
        }
        old_calls = len(fast_upstream.app[REQUEST_LOG])
        # whichever worker takes a new connection, its miss goes to the new upstream
        answered: set[int] = set()
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            for page in range(1, 201):
                headers = {**AUTH, "X-Request-ID": f"after-sighup-{page}"}
                async with http.get(
                    f"{gateway.url}/users?page={page}", headers=headers
                ) as response:
                    assert response.status == 200
                    assert response.headers["X-Cache"] == "MISS"
                await gateway.wait_for(
                    lambda line, page=page: (
                        line.get("request_id") == f"after-sighup-{page}"
                        and line.get("logger") == "gateway.access"
                    )
                )
                answered = {
                    line["pid"]
                    for line in gateway.lines
                    if str(line.get("request_id", "")).startswith("after-sighup-")
                }
                if answered == workers and page >= 10:
                    break
        assert answered == workers, "both workers answered after the reload"
        assert len(fast_upstream.app[REQUEST_LOG]) == old_calls
        sent = {entry.request_id for entry in other.app[REQUEST_LOG].for_path("/users")}
        assert sent == {f"after-sighup-{n}" for n in range(1, page + 1)}
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0


async def test_workers_stop_when_the_supervisor_is_killed(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await two_workers(tmp_path, fast_upstream, started)
    workers = [line["pid"] for line in gateway.lines if line.get("event") == "start"]
    assert len(workers) == 2
    gateway.signal(signal.SIGKILL)
    assert await gateway.wait() == -signal.SIGKILL
    # each worker got SIGTERM from the kernel and stopped as on a normal shutdown
    assert sum(1 for line in gateway.lines if line.get("event") == "stopped") == 2
    async with asyncio.timeout(10):  # their output ends a moment before they do
        while not all(not_running(pid) for pid in workers):
            await asyncio.sleep(0.02)


async def test_a_worker_that_dies_stops_the_others_and_the_supervisor_exits_1(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await two_workers(tmp_path, fast_upstream, started)
    workers = [line["pid"] for line in gateway.lines if line.get("event") == "start"]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    assert await gateway.wait() == 1
    assert any(line.get("message") == "worker exited" for line in gateway.lines)
    # the other one was told to stop, and stopped as on a normal shutdown
    assert sum(1 for line in gateway.lines if line.get("event") == "stopped") == 1
    async with asyncio.timeout(10):
        while not all(not_running(pid) for pid in workers):
            await asyncio.sleep(0.02)


def not_running(pid: int) -> bool:
    """Gone, or exited and waiting to be reaped (a zombie of whoever adopted it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_the_served_gateway_takes_header_lines_up_to_32_kib(
    tmp_path: Path, started: list[GatewayProcess]
) -> None:
    """A large bearer token (a JWT with many claims) fits in one header line of up to
    32 KiB (docs/calling.md, "Tokens and headers"); a longer line is a malformed-request problem."""
    seen: list[int] = []

    async def users(request: web.Request) -> web.Response:
        seen.append(len(request.headers["Authorization"]))
        user = {"id": "00000000-0000-4000-8000-000000000001", "username": "big-token-user"}
        return web.json_response({"data": [user], "total": 1, "page": 1, "limit": 10})

    upstream_app = web.Application()
    upstream_app.router.add_get("/users", users)
    runner = web.AppRunner(upstream_app, max_field_size=65_536, max_line_size=65_536)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        gateway = await serve(started, tmp_path, f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as http:
            large = {"Authorization": "Bearer " + "t" * 20_000}
            async with http.get(f"{gateway.url}/users", headers=large) as response:
                assert response.status == 200
                assert (await response.json())["data"][0]["username"] == "big-token-user"
            assert seen == [len(large["Authorization"])]
            too_large = {"Authorization": "Bearer " + "t" * 40_000}
            async with http.get(f"{gateway.url}/users", headers=too_large) as response:
                assert response.status == 400
                problem = await response.json(content_type="application/problem+json")
                assert problem["type"] == "urn:records-gateway:problem:malformed-request"
            assert len(seen) == 1
    finally:
        await runner.cleanup()


async def test_an_idle_kept_alive_connection_is_closed_after_its_timeout(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    extra = "[server]\nkeepalive_timeout_s = 0.5\n"
    gateway = await serve(started, tmp_path, fast_upstream.url, extra=extra)
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: g\r\n\r\n")
    async with asyncio.timeout(20):  # a deadline, not a measurement
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"Connection: close" not in head  # kept alive...
        await reader.readexactly(len(b'{"status":"ok"}'))
        assert await reader.read() == b""  # ...until the gateway closed it, idle
    writer.close()


class _Node:
    other: _Node | None = None


def test_settled_collector_leaves_start_up_alone_and_still_collects_cycles() -> None:
    """What serve() does once started: everything alive is frozen (full collections stop
    walking it), the young generation is wider; a cycle made later is still freed."""
    before = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
        first, second = _Node(), _Node()
        first.other, second.other = second, first
        gone = weakref.ref(first)
        del first, second
        assert gone() is not None  # a cycle: reference counting alone cannot free it
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("environment", "extra", "normalise", "fast_path"),
    [
        # the compiled rules where the install built them (make test does, with gcc)
        ({}, "", "compiled" if compiled_available() else "python", True),
        ({"RECORDS_GATEWAY_PURE_PYTHON": "1"}, "[server]\nfast_path = false\n", "python", False),
    ],
    ids=["default", "pure-python-plain-aiohttp"],
)
async def test_the_start_line_says_which_rules_run_and_whether_the_fast_path_is_on(
    tmp_path: Path,
    fast_upstream: DemoServer,
    started: list[GatewayProcess],
    environment: dict[str, str],
    extra: str,
    normalise: str,
    fast_path: bool,
) -> None:
    config = tmp_path / "config.toml"
    write_config(config, fast_upstream.url, extra=extra)
    gateway = GatewayProcess(config, {**clean_env(), **environment})
    started.append(gateway)
    await gateway.start()
    (line,) = [line for line in gateway.lines if line.get("event") == "start"]
    assert (line["normalise"], line["fast_path"]) == (normalise, fast_path)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gateway.url}/expenses?limit=2", headers=AUTH) as response,
    ):
        assert response.status == 200
        assert (await response.json())["data"][0]["amount"].count(".") == 1
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0


def test_the_supervisor_names_the_multiprocess_folder_as_the_metrics_do() -> None:
    from gateway.ops.metrics import MULTIPROC_ENV as METRICS_ENV
    from gateway.process.supervisor import MULTIPROC_ENV

    assert MULTIPROC_ENV == METRICS_ENV


# Workers agree: an admin action taken by one worker is in force in all before the
# answer says so (docs/operations.md, "Workers"; gateway.ops.siblings).

ADMIN_TOKEN = "admin-token-0123456789abcdef"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
_TWO_WORKERS = f'[server]\nworkers = 2\n[admin]\ntoken = "{ADMIN_TOKEN}"\n'


async def _served_by(
    gateway: GatewayProcess, http: aiohttp.ClientSession, path: str, request_id: str
) -> tuple[int, aiohttp.ClientResponse, bytes]:
    """GET ``path`` with the caller's token: the pid of the worker that answered (from
    its access line), the response and its body."""
    headers = {**AUTH, "X-Request-ID": request_id}
    async with http.get(f"{gateway.url}{path}", headers=headers) as response:
        body = await response.read()
    await gateway.wait_for(
        lambda line: line.get("request_id") == request_id and line.get("logger") == "gateway.access"
    )
    (line,) = [
        line
        for line in gateway.lines
        if line.get("request_id") == request_id and line.get("logger") == "gateway.access"
    ]
    return line["pid"], response, body


async def _on_every_worker(
    gateway: GatewayProcess, path: str, prefix: str, *, at_least: int = 30
) -> list[tuple[int, aiohttp.ClientResponse]]:
    """GET ``path`` over new connections, at least ``at_least`` times and until both
    workers answered; every (pid, response) in order."""
    workers = {line["pid"] for line in gateway.lines if line.get("event") == "start"}
    answers: list[tuple[int, aiohttp.ClientResponse]] = []
    connector = aiohttp.TCPConnector(force_close=True)  # a new connection each time
    async with aiohttp.ClientSession(connector=connector) as http:
        for n in range(400):
            pid, response, _ = await _served_by(gateway, http, path, f"{prefix}-{n}")
            assert response.status == 200
            answers.append((pid, response))
            if len(answers) >= at_least and {pid for pid, _ in answers} == workers:
                break
    assert {pid for pid, _ in answers} == workers, "both workers answered"
    return answers


async def test_a_purge_is_in_force_in_every_worker_before_it_is_answered(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await serve(started, tmp_path, fast_upstream.url, extra=_TWO_WORKERS, workers=2)
    # both workers hold the entry: each answered it from its own cache at least once
    filled = await _on_every_worker(gateway, "/users", "fill")
    upstream_log = fast_upstream.app[REQUEST_LOG]
    assert len(upstream_log.for_path("/users")) == 2  # one miss in each worker
    async with (
        aiohttp.ClientSession() as http,
        http.delete(f"{gateway.url}/admin/cache", headers=ADMIN_AUTH) as response,
    ):
        assert response.status == 200
        body = await response.json()
    after = await _on_every_worker(gateway, "/users", "after-purge")
    # no pre-purge entry: each worker's first answer after the purge is a miss, and the
    # upstream was asked once more by each
    for pid in {pid for pid, _ in filled}:
        first = next(response for seen, response in after if seen == pid)
        assert first.headers["X-Cache"] == "MISS"
    assert len(upstream_log.for_path("/users")) == 4
    assert body == {"purged": "all", "backend": "memory", "workers": {"told": 2, "confirmed": 2}}


async def test_a_record_purge_is_in_force_in_every_worker_before_it_is_answered(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await serve(started, tmp_path, fast_upstream.url, extra=_TWO_WORKERS, workers=2)
    filled = await _on_every_worker(gateway, "/users", "fill")
    await _on_every_worker(gateway, "/clients", "fill-clients")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gateway.url}/users", headers=AUTH) as response:
            user = (await response.json())["data"][0]["id"]
        async with http.delete(
            f"{gateway.url}/admin/cache?record=user:{user}", headers=ADMIN_AUTH
        ) as response:
            assert response.status == 200
            body = await response.json()
    assert body == {
        "purged": "records",
        "records": [f"user:{user}"],
        "mode": "hard",
        "entries": 1,  # the answering worker's page of users
        "backend": "memory",
        "workers": {"told": 2, "confirmed": 2},
    }
    upstream_log = fast_upstream.app[REQUEST_LOG]
    after = await _on_every_worker(gateway, "/users", "after-purge")
    for pid in {pid for pid, _ in filled}:
        first = next(response for seen, response in after if seen == pid)
        assert first.headers["X-Cache"] == "MISS"
    assert len(upstream_log.for_path("/users")) == 4
    clients = await _on_every_worker(gateway, "/clients", "clients-after")
    assert {response.headers["X-Cache"] for _, response in clients} == {"HIT"}
    assert len(upstream_log.for_path("/clients")) == 2


async def test_a_reload_is_in_force_in_every_worker_before_it_is_answered(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    gateway = await serve(
        started, tmp_path, fast_upstream.url, users_ttl=300, extra=_TWO_WORKERS, workers=2
    )
    write_config(gateway.config, fast_upstream.url, users_ttl=7, extra=_TWO_WORKERS)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gateway.url}/admin/reload", headers=ADMIN_AUTH) as response,
    ):
        assert response.status == 200
        body = await response.json()
    assert body["applied"] == ["cache.ttl_s"]
    # new connections, a page each (a miss each): every answer has the new TTL
    workers = {line["pid"] for line in gateway.lines if line.get("event") == "start"}
    answered: set[int] = set()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        for page in range(1, 400):
            pid, response, _ = await _served_by(
                gateway, http, f"/users?page={page}", f"after-reload-{page}"
            )
            assert response.status == 200
            assert response.headers["X-Cache"] == "MISS"
            assert response.headers["Cache-Control"] == "private, max-age=7"
            answered.add(pid)
            if page >= 30 and answered == workers:
                break
    assert answered == workers
    assert body["workers"] == {"told": 2, "confirmed": 2}
    # and /readyz sees every worker on one configuration
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/readyz") as response:
        report = await response.json()
    assert report["components"]["workers"]["status"] == "ok"
    assert list(report["components"]["workers"]["configurations"].values()) == [2]
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0


async def test_a_shadow_reset_is_confirmed_by_every_worker(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    async with await start_demo_server(seed=7) as candidate:
        shadow = f'[upstream.shadow]\nbase_url = "{candidate.url}"\nsample_ratio = 1.0\n'
        gateway = await serve(
            started, tmp_path, fast_upstream.url, extra=_TWO_WORKERS + shadow, workers=2
        )
        async with (
            aiohttp.ClientSession() as http,
            http.delete(f"{gateway.url}/admin/shadow", headers=ADMIN_AUTH) as response,
        ):
            assert response.status == 200
            assert await response.json() == {"reset": True, "workers": {"told": 2, "confirmed": 2}}
        await gateway.wait_for(lambda line: line.get("event") == "shadow_reset", count=2)
        resets = [line for line in gateway.lines if line.get("event") == "shadow_reset"]
        assert len({line["pid"] for line in resets}) == 2


async def test_a_worker_that_cannot_confirm_makes_admin_actions_say_so(
    tmp_path: Path, fast_upstream: DemoServer, started: list[GatewayProcess]
) -> None:
    """One worker stopped (SIGSTOP): a purge, a reload and a shadow reset taken by the
    other are 503 problems that count the workers reached; /readyz says the workers run
    different configurations until the stopped one, resumed, takes what it missed."""
    gateway = await serve(started, tmp_path, fast_upstream.url, extra=_TWO_WORKERS, workers=2)
    workers = {line["pid"] for line in gateway.lines if line.get("event") == "start"}
    # one kept-alive connection stays with the worker that accepted it
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        mine, _, _ = await _served_by(gateway, http, "/users", "which-worker")
        (other,) = workers - {mine}
        os.kill(other, signal.SIGSTOP)
        try:
            async with http.delete(f"{gateway.url}/admin/cache", headers=ADMIN_AUTH) as response:
                assert response.status == 503
                problem = await response.json(content_type="application/problem+json")
            assert problem["type"] == "urn:records-gateway:problem:purge-outcome-unknown"
            assert problem["workers"] == {"told": 2, "confirmed": 1}

            write_config(gateway.config, fast_upstream.url, users_ttl=9, extra=_TWO_WORKERS)
            async with http.post(f"{gateway.url}/admin/reload", headers=ADMIN_AUTH) as response:
                assert response.status == 503
                problem = await response.json(content_type="application/problem+json")
            assert problem["type"] == "urn:records-gateway:problem:workers-not-confirmed"
            assert problem["workers"] == {"told": 2, "confirmed": 1}

            async with http.delete(f"{gateway.url}/admin/shadow", headers=ADMIN_AUTH) as response:
                assert response.status == 503
                problem = await response.json(content_type="application/problem+json")
            assert problem["type"] == "urn:records-gateway:problem:workers-not-confirmed"

            async with http.get(f"{gateway.url}/readyz") as response:
                report = await response.json()
            assert report["status"] == "degraded"
            assert report["components"]["workers"]["status"] == "degraded"
            assert sorted(report["components"]["workers"]["configurations"].values()) == [1, 1]
        finally:
            os.kill(other, signal.SIGCONT)
        # resumed, it applies the reload it was sent: one configuration again
        async with asyncio.timeout(20):
            while True:
                async with http.get(f"{gateway.url}/readyz") as response:
                    report = await response.json()
                if report["components"]["workers"]["status"] == "ok":
                    break
                await asyncio.sleep(0.05)
    gateway.signal(signal.SIGTERM)
    assert await gateway.wait() == 0
