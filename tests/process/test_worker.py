"""A worker's memory under its collector tuning (``gateway.process.worker``): what an
upstream sends is released when the request that read it ends, however rarely the
collector runs (docs/sizing.md, "What it means for sizing")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from .test_supervisor import GatewayProcess, serve

MIB = 1024 * 1024
# what the tests send: 30 answers of 9 MiB, 270 MiB in all, within the default
# upstream.max_body_bytes (10 MiB)
ANSWERS = 30
BODY = b"x" * (9 * MIB)
# the bound docs/sizing.md promises on what a worker keeps of failed answers: a few bodies
# in flight at most, never one per answer
BOUND_MIB = 64
AUTH = {"Authorization": "Bearer tok-memory"}


@pytest.fixture
async def started() -> AsyncIterator[list[GatewayProcess]]:
    processes: list[GatewayProcess] = []
    yield processes
    for process in processes:
        await process.kill()


def resident_mib(pid: int) -> float:
    """The process's resident set (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def worker_pid(gateway: GatewayProcess) -> int:
    return next(int(line["pid"]) for line in gateway.lines if line.get("event") == "start")


async def upstream_of(
    aiohttp_server: AiohttpServer, answer: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> str:
    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def resident_growth(gateway: GatewayProcess, expected_status: int) -> float:
    """How far the worker's resident set grew over ANSWERS requests for distinct pages,
    each failing with ``expected_status``."""
    pid = worker_pid(gateway)
    async with aiohttp.ClientSession() as http:
        for _ in range(3):  # the first answers' one-off allocations are not counted
            async with http.get(f"{gateway.url}/healthz") as response:
                await response.read()
        before = resident_mib(pid)
        for page in range(1, ANSWERS + 1):
            async with http.get(f"{gateway.url}/users?page={page}", headers=AUTH) as response:
                assert response.status == expected_status, await response.text()
                await response.read()
        return resident_mib(pid) - before


async def test_bodies_that_are_not_json_are_released_with_their_requests(
    tmp_path: Path, aiohttp_server: AiohttpServer, started: list[GatewayProcess]
) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=BODY, content_type="application/json")

    gateway = await serve(started, tmp_path, await upstream_of(aiohttp_server, answer))
    assert await resident_growth(gateway, 502) < BOUND_MIB


async def test_bodies_over_the_limit_are_released_with_their_requests(
    tmp_path: Path, aiohttp_server: AiohttpServer, started: list[GatewayProcess]
) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        # no Content-Length: read until it passes upstream.max_body_bytes
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for _ in range(12):
            await response.write(BODY[:MIB])
        return response

    gateway = await serve(started, tmp_path, await upstream_of(aiohttp_server, answer))
    assert await resident_growth(gateway, 502) < BOUND_MIB
