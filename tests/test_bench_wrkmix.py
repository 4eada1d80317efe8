"""The matrix's second load client (bench/mix.lua under wrk, bench/wrkmix.py): run
against a small aiohttp server on loopback that records every request, it sends every
token of the keys file, each target only with its own token, gzip at the share asked,
and its report is read as the bench reads it. Nothing is timed: the figures are
compared with what the server saw."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest
import wrkmix
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from servers import BenchError

KEYS = {
    "Bearer t-0": ("/users?limit=3", "/clients"),
    "Bearer t-1": ("/accounts", "/expenses?page=2"),
    "Bearer t-2": ("/expenses/e-1",),
}


def keys_file(folder: Path) -> Path:
    lines = ["# three tokens"]
    for authorization, targets in KEYS.items():
        lines.append(f"token {authorization}")
        lines += [f"{1 / (rank + 1)!r} {target}" for rank, target in enumerate(targets)]
    path = folder / "keys.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


async def recorder(aiohttp_server: AiohttpServer) -> tuple[str, list[tuple[str, str, bool]]]:
    seen: list[tuple[str, str, bool]] = []

    async def answer(request: web.Request) -> web.Response:
        gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        seen.append((request.headers.get("Authorization", ""), request.raw_path, gzip))
        return web.Response(body=b"{}", content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), seen


async def run(url: str, path: Path, gzip_share: float) -> wrkmix.WrkMixResult:
    settings = wrkmix.WrkMixSettings(threads=2, connections=4, duration_s=1, gzip_share=gzip_share)
    return await asyncio.to_thread(wrkmix.run, settings, url, path)


@pytest.mark.parametrize("gzip_share", [0.0, 0.5])
async def test_every_token_is_sent_with_its_own_targets_and_gzip_at_its_share(
    aiohttp_server: AiohttpServer, tmp_path: Path, gzip_share: float
) -> None:
    url, seen = await recorder(aiohttp_server)
    result = await run(url, keys_file(tmp_path), gzip_share)
    assert 0 < result.requests <= len(seen)
    pairs = collections.Counter((authorization, target) for authorization, target, _ in seen)
    assert {authorization for authorization, _ in pairs} == set(KEYS)
    assert all(target in KEYS[authorization] for authorization, target in pairs)
    # every key is drawn: the lightest weighs a third of its token's draws or more
    assert set(pairs) == {(a, t) for a, targets in KEYS.items() for t in targets}
    gzipped = sum(gzip for _, _, gzip in seen)
    if gzip_share:
        assert 0 < gzipped < len(seen)
    else:
        assert gzipped == 0
    assert result.errors == {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}


async def test_answers_that_are_not_2xx_or_3xx_are_errors(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500)

    app = web.Application()
    app.router.add_get("/{tail:.*}", fail)
    server = await aiohttp_server(app)
    with pytest.raises(BenchError, match=r"wrk with mix.lua saw errors: .*'status': [1-9]"):
        await run(str(server.make_url("")).rstrip("/"), keys_file(tmp_path), 0.0)


def test_a_report_without_its_line_or_its_figures_is_refused() -> None:
    with pytest.raises(BenchError, match="printed no MIXJSON line"):
        wrkmix.parse("Requests/sec: 100\n")
    with pytest.raises(BenchError, match="does not read"):
        wrkmix.parse('MIXJSON {"requests": 1}\n')
    line = (
        'MIXJSON {"requests": 10, "duration_s": 1.0, "requests_per_s": 10.0, "errors": '
        '{"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0}, '
        '"latency_ms": {"p50": 0.1, "p99": 0.2, "p999": 0.3}}'
    )
    result = wrkmix.parse("Running 1s test\n" + line + "\n")
    assert (result.requests, result.requests_per_s, result.p999_ms) == (10, 10.0, 0.3)
