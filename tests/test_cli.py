"""The command line, run as real subprocesses: exit codes, output, signals."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.demo import DriftKind, RecordKind

ROOT = Path(__file__).parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or clean_env(),
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_check_config_prints_the_effective_configuration() -> None:
    env = {
        **clean_env(),
        "GATEWAY_UPSTREAM__BASE_URL": "https://records.example/v2",
        "GATEWAY_CACHE__KEY_SECRET": "do-not-print-this-secret",
    }
    # the examples as shipped: config.example.toml alone, the Redis one with its secret
    code, _, err = await run_cli("check-config", "--config", "config.example.toml")
    assert (code, err) == (0, "")
    code, out, _ = await run_cli("check-config", "--config", "deploy/config.redis.toml", env=env)
    assert code == 0
    config = json.loads(out)
    assert config["upstream"]["base_url"] == "https://records.example/v2"
    assert config["server"] == {
        "host": "127.0.0.1",
        "port": 8080,
        "workers": 1,
        "shutdown_timeout_s": 15.0,
        "keepalive_timeout_s": 75.0,
        "fast_path": True,
        "docs": True,
    }
    assert config["cache"]["backend"] == "redis"
    assert config["cache"]["key_secret"] == "**********"
    assert "do-not-print-this-secret" not in out


async def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[upstream]\nmax_connections = 0\n")
    code, out, err = await run_cli("check-config", "--config", str(path))
    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        "records-gateway: configuration error: upstream.max_connections:"
        " Input should be greater than or equal to 1"
    ]


async def test_check_config_refuses_a_file_over_1_mib_unparsed(tmp_path: Path) -> None:
    """docs/operations.md, "Reload without a restart": a file larger than 1 MiB is
    refused at check-config too."""
    path = tmp_path / "big.toml"
    path.write_text("[server\n" + "#" * (1024 * 1024) + "\n")
    code, out, err = await run_cli("check-config", "--config", str(path))
    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        f"records-gateway: configuration error: config file {path}: larger than 1 MiB"
        " (1048576 bytes), the bound on a config file"
    ]


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"GATEWAY_CACHE__REDIS_URL": "redis://h:notaport/0"},
            "cache.redis_url: the port must be a number from 1 to 65535",
        ),
        (
            {"GATEWAY_CACHE__REDIS_URL": "redis://h1:6379,h2:6379/0"},
            "cache.redis_url: one URL only; for several nodes set redis_mode (sentinel or"
            " cluster) and redis_nodes",
        ),
        (
            {"GATEWAY_CACHE__REDIS_NODES": '["h:7000"]'},
            "cache.redis_nodes: used only with redis_mode sentinel or cluster (standalone mode"
            " reads redis_url)",
        ),
        (
            {"GATEWAY_CACHE__REDIS_MODE": "sentinel", "GATEWAY_CACHE__REDIS_NODES": '["h:1"]'},
            "cache.redis_sentinel_master: redis_mode sentinel needs the master's name",
        ),
    ],
)
@pytest.mark.parametrize("command", ["check-config", "serve"])
async def test_bad_redis_settings_exit_2_with_one_line(
    command: str, env: dict[str, str], line: str
) -> None:
    code, out, err = await run_cli(command, env={**clean_env(), **env})
    assert code == 2
    assert out == ""
    (said,) = err.strip().splitlines()
    if command == "serve":  # in the format of its logs: JSON unless log.format says text
        logged = json.loads(said)
        assert logged["event"] == "config_error"
        assert logged["message"] == f"configuration error: {line}"
        assert logged["key"] == line.partition(": ")[0]
    else:
        assert said == f"records-gateway: configuration error: {line}"


async def test_serve_refuses_a_bad_environment_value() -> None:
    env = {**clean_env(), "GATEWAY_SERVER__PORT": "eighty"}
    code, _, err = await run_cli("serve", env=env)
    assert code == 2
    assert "server.port: Input should be a valid integer" in err


async def test_console_script_is_installed() -> None:
    script = shutil.which("records-gateway", path=str(Path(sys.executable).parent))
    assert script is not None
    process = await asyncio.create_subprocess_exec(
        script, "--version", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    assert out.decode().strip() == "records-gateway 0.1.0"


async def _wait_for_line(stream: asyncio.StreamReader, pattern: str) -> re.Match[str]:
    while True:
        line = (await asyncio.wait_for(stream.readline(), timeout=20)).decode()
        assert line, f"process ended before printing {pattern!r}"
        match = re.search(pattern, line)
        if match:
            return match


async def test_serve_demo_answers_the_printed_curl_and_stops_on_sigterm() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--demo",
        "--port",
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
        cwd=ROOT,
    )
    assert process.stdout is not None
    try:
        # the start-up line is JSON like every other, with the curl to try in it
        listening = await _wait_for_line(
            process.stdout, rf"listening on http://127\.0\.0\.1:{port}"
        )
        try_it = json.loads(listening.string)["demo_try"]
        curl = re.fullmatch(r"curl -s -H 'Authorization: Bearer ([^']+)' '([^']+)'", try_it)
        assert curl is not None
        token, url = curl.group(1), curl.group(2)
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
            body = await response.json()
            assert response.status == 200
            assert len(body["data"]) == 2
            assert body["total"] == 2000
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=20)
    assert code == 0


async def test_demo_upstream_command_serves_with_latency_and_its_tokens() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "demo-upstream",
        "--port",
        str(port),
        "--latency-ms",
        "5",
        "--token",
        "t-one",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
        cwd=ROOT,
    )
    assert process.stdout is not None
    try:
        await _wait_for_line(process.stdout, rf"127\.0\.0\.1:{port}")
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/users"
            async with session.get(url, headers={"Authorization": "Bearer t-one"}) as response:
                assert response.status == 200
                assert (await response.json())["page"] == 1
            async with session.get(url, headers={"Authorization": "Bearer demo-token"}) as response:
                assert response.status == 401
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), timeout=20)
    assert code == 0


async def test_demo_upstream_drifts_as_its_drift_flags_say() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "demo-upstream",
        "--port",
        str(port),
        "--drift",
        "order",
        "--drift",
        "noise",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
        cwd=ROOT,
    )
    assert process.stdout is not None
    try:
        await _wait_for_line(process.stdout, rf"127\.0\.0\.1:{port}, drifting: order, noise$")
        headers = {"Authorization": "Bearer demo-token"}
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.get(f"{base}/users") as response:
                names = [user["username"] for user in (await response.json())["data"]]
            payment_ids = []
            for _ in range(2):
                async with session.get(f"{base}/expenses", params={"limit": "3"}) as response:
                    payment_ids.append([e["paymentId"] for e in (await response.json())["data"]])
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), timeout=20)
    assert code == 0
    assert len(names) > 1
    assert names == sorted(names, reverse=True)
    first, second = payment_ids
    assert len(first) == 3
    for one, two in zip(first, second, strict=True):
        assert one != two
        assert one.rsplit("-", 1)[0] == two.rsplit("-", 1)[0]


async def test_demo_upstream_refuses_an_unknown_drift_naming_the_known_ones() -> None:
    code, out, err = await run_cli("demo-upstream", "--drift", "order", "--drift", "sideways")

    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        "records-gateway demo-upstream: unknown drift kind 'sideways'; the known kinds are"
        " amount-scale, order, drop-bank, enum-case, noise"
    ]
    _, usage, _ = await run_cli("demo-upstream", "--help")
    for kind in DriftKind:
        assert kind.value in usage


async def test_demo_upstream_changes_records_as_its_change_rate_flags_say() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "demo-upstream",
        "--port",
        str(port),
        "--seed",
        "7",
        "--drift",
        "order",
        "--change-rate",
        "expenses=2",
        "--change-rate",
        "accounts=0.5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
        cwd=ROOT,
    )
    assert process.stdout is not None
    try:
        await _wait_for_line(
            process.stdout,
            rf"127\.0\.0\.1:{port}, drifting: order, changing: expenses=2/min, accounts=0\.5/min$",
        )
        headers = {"Authorization": "Bearer demo-token"}
        async with (
            aiohttp.ClientSession(headers=headers) as session,
            session.get(f"http://127.0.0.1:{port}/expenses", params={"limit": "5"}) as response,
        ):
            assert response.status == 200
            expenses = (await response.json())["data"]
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), timeout=20)
    assert code == 0
    assert len(expenses) == 5
    # the dataset's method, or a revision of it: how soon one comes is the clock's affair
    for expense in expenses:
        assert re.fullmatch(
            r"(CASH|TRANSFER|CARD|DIRECT_DEBIT)( \(rev [1-9][0-9]*\))?", expense["method"]
        )


@pytest.mark.parametrize(
    ("flag", "line"),
    [
        (
            "bogus=1",
            "--change-rate: unknown record kind 'bogus'; the known kinds are users, clients,"
            " expenses, accounts",
        ),
        (
            "expenses=-1",
            "--change-rate: the rate of expenses must be a number of changes per minute from 0"
            " to 60000, got '-1'",
        ),
        ("expenses", "--change-rate: 'expenses' is not KIND=PER_MINUTE, such as expenses=6"),
    ],
)
async def test_demo_upstream_refuses_a_bad_change_rate_naming_the_problem(
    flag: str, line: str
) -> None:
    code, out, err = await run_cli(
        "demo-upstream", "--change-rate", "users=1", "--change-rate", flag
    )

    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [f"records-gateway demo-upstream: {line}"]


async def test_demo_upstream_help_names_the_change_rate_flag_and_its_kinds() -> None:
    _, usage, _ = await run_cli("demo-upstream", "--help")

    assert "--change-rate KIND=PER_MINUTE" in usage
    for kind in RecordKind:
        assert kind.value in usage


async def test_serve_takes_workers_and_log_flags_and_every_line_is_json() -> None:
    """Held for docs/operations.md, "Logs"."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--demo",
        "--port",
        str(port),
        "--workers",
        "2",
        "--log-format",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(),
        cwd=ROOT,
    )
    assert process.stdout is not None
    lines: list[dict[str, object]] = []
    try:
        async with asyncio.timeout(30):
            while sum(1 for line in lines if line.get("event") == "start") < 2 or not any(
                line.get("event") == "listening" for line in lines
            ):
                raw = await process.stdout.readline()
                assert raw, lines
                lines.append(json.loads(raw))  # every line, start-up ones included, is JSON
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0
    lines += [json.loads(line) for line in rest.decode().splitlines()]
    workers = {line["worker"] for line in lines if line.get("event") == "start"}
    assert workers == {0, 1}
    listening = next(line for line in lines if line.get("event") == "listening")
    assert listening["url"] == f"http://127.0.0.1:{port}"
    assert str(listening["demo_try"]).startswith("curl -s -H 'Authorization: Bearer ")
