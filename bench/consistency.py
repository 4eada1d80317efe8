"""What one version of a record across views costs (docs/purging.md), and what it buys.

Run it as ``.venv/bin/python bench/consistency.py`` (``make bench-consistency``). It
starts a redis-server on a free port, the reference upstream as its own process
(``records-gateway demo-upstream --change-rate KIND=PER_MINUTE`` for every kind) and,
for each of ``cache.record_consistency`` off, caller and all, two gateway processes
sharing that Redis (a namespace each). Six callers, each with its own token, read for
``SECONDS`` seconds, each read after its previous answer, alternating between the two
instances: pages of expenses, single expenses among those listed, the accounts, single
accounts, the users and the clients (``gateway.demo.monotonic.MixedReads``).

Reported for each mode:

- (a) the share of answers holding a record older than one the same caller was served
  before (and than one anybody was served before), read from the revision each change
  of the reference upstream leaves in its records (``gateway.demo.monotonic``);
- (b) the upstream calls per 1,000 reads (``gateway_upstream_requests_total`` of both
  instances), and the entries removed and answers asked for again.

The figures go to bench/results/consistency.json and .md; a summary to stdout. This is
a measurement, not a test: nothing here asserts (tests/http/test_record_consistency.py
replays a workload of its own and asserts (a) is 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from aiohttp import ClientSession
from normalise import machine  # bench/normalise.py: the CPU model and count

from gateway.demo.dataset import generate_dataset
from gateway.demo.monotonic import MixedReads, Monotonic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.redis_server import RedisServer

RESULTS = Path(__file__).parent / "results"
SECONDS = float(os.environ.get("BENCH_CONSISTENCY_SECONDS", "40"))
PER_MINUTE = 6.0  # each record changes every 10 s on average
CALLERS = tuple(f"bench-caller-{n}-token" for n in range(6))
MODES = ("off", "caller", "all")
KEY_SECRET = "bench-consistency-key-secret-0123"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(url: str, path: str, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + 30
    async with ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + path, headers=headers) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url}{path} did not come up")


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


def gateway_config(folder: Path, upstream: str, redis_url: str, mode: str) -> Path:
    path = folder / f"gateway-{mode}.toml"
    path.write_text(
        f'[upstream]\nbase_url = "{upstream}"\n'
        f'[cache]\nbackend = "redis"\nredis_url = "{redis_url}"\nnamespace = "bench-{mode}"\n'
        f'key_secret = "{KEY_SECRET}"\nrecord_consistency = "{mode}"\n'
        '[log]\naccess = false\nlevel = "warning"\n'
    )
    return path


def counted(scrape: str, name: str) -> float:
    """The sum of every sample of counter ``name`` in a scrape."""
    total = 0.0
    for line in scrape.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def workload(gateways: list[str], seen: Monotonic) -> int:
    """Every caller reading for SECONDS; the reads made."""
    dataset = generate_dataset()
    deadline = time.monotonic() + SECONDS
    reads = 0

    async def caller(number: int, token: str) -> None:
        nonlocal reads
        paths = MixedReads(dataset, seed=number)
        headers = {"Authorization": f"Bearer {token}"}
        turn = number
        async with ClientSession() as session:
            while time.monotonic() < deadline:
                url = gateways[turn % len(gateways)]
                turn += 1
                async with session.get(url + paths.next_path(), headers=headers) as answer:
                    body = await answer.read()
                    if answer.status != 200:
                        continue
                answer_json = orjson.loads(body)
                paths.learn(answer_json)
                seen.served(token, answer_json)
                reads += 1

    await asyncio.gather(*(caller(n, token) for n, token in enumerate(CALLERS)))
    return reads


async def one_mode(folder: Path, upstream: str, redis_url: str, mode: str) -> dict[str, Any]:
    config = gateway_config(folder, upstream, redis_url, mode)
    ports = [free_port(), free_port()]
    processes = [start(["serve", "--config", str(config), "--port", str(port)]) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url in urls:
            await wait_ready(url, "/readyz")
        seen = Monotonic(generate_dataset())
        reads = await workload(urls, seen)
        scrapes = []
        async with ClientSession() as session:
            for url in urls:
                async with session.get(url + "/metrics") as answer:
                    scrapes.append(await answer.text())
    finally:
        for process in processes:
            stop(process)

    def total(name: str) -> float:
        return sum(counted(scrape, name) for scrape in scrapes)

    calls = total("gateway_upstream_requests_total")
    return {
        "mode": mode,
        "reads": reads,
        **seen.report(),
        "upstreamCalls": int(calls),
        "upstreamCallsPer1000": round(1000 * calls / reads, 1) if reads else None,
        "invalidated": int(total("gateway_consistency_invalidations_total")),
        "refetched": int(total("gateway_consistency_refetches_total")),
    }


def markdown(results: dict[str, Any]) -> str:
    rows = [
        "| mode | reads | older for the caller | older for anyone | upstream calls / 1,000 reads"
        " | entries removed | asked again |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in results["modes"]:
        rows.append(
            f"| {mode['mode']} | {mode['reads']} | {mode['olderForCallerShare']:.2%}"
            f" ({mode['olderForCaller']}) | {mode['olderForAnyoneShare']:.2%}"
            f" ({mode['olderForAnyone']}) | {mode['upstreamCallsPer1000']}"
            f" | {mode['invalidated']} | {mode['refetched']} |"
        )
    return (
        f"# One version of a record: what it costs\n\n{results['when']}, {results['machine']},"
        f" Python {results['python']}. Six callers, {results['seconds']:.0f} s a mode, every"
        f" record changing {results['perMinute']:g} times a minute, two instances on one"
        " Redis (bench/consistency.py).\n\n" + "\n".join(rows) + "\n"
    )


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        redis_server = RedisServer()
        redis_server.start()
        port = free_port()
        rates = [
            arg
            for kind in ("expenses", "accounts", "clients", "users")
            for arg in ("--change-rate", f"{kind}={PER_MINUTE:g}")
        ]
        tokens = [arg for token in CALLERS for arg in ("--token", token)]
        demo = start(["demo-upstream", "--port", str(port), *rates, *tokens])
        upstream = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(upstream, "/users", {"Authorization": f"Bearer {CALLERS[0]}"})
            modes = []
            for mode in MODES:
                modes.append(await one_mode(Path(folder), upstream, redis_server.url, mode))
                print(json.dumps(modes[-1]))
        finally:
            stop(demo)
            redis_server.close()
    results = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "python": platform.python_version(),
        "seconds": SECONDS,
        "perMinute": PER_MINUTE,
        "modes": modes,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "consistency.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "consistency.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    asyncio.run(main())
