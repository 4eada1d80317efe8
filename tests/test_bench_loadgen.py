"""The mix's load client (bench/loadgen.c, bench/loadgen.py): compiled with gcc and run
against a small aiohttp server that records what each connection sent, it counts the
answers, their statuses and bytes, reads Content-Length framing (a body longer than
one read too), refuses chunked answers, and sends each connection's one token; and
its JSON report is read as the bench reads it. Nothing here is timed: the figures
are the client's own counts, compared with what the server saw."""

from __future__ import annotations

import asyncio
import collections
import json
import os
from pathlib import Path
from typing import Any

import loadgen
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from servers import BenchError

BIG = 300_000  # more than the client's 256 KiB read: the body takes several reads
NOT_FOUND = b'{"error":"not_found"}'


@pytest.fixture(scope="module")
def client_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return loadgen.compile_client(tmp_path_factory.mktemp("loadgen"))


class Recorder:
    """The test server: what each client connection (by its port) sent as Authorization."""

    def __init__(self) -> None:
        self.by_connection: dict[int, set[str]] = collections.defaultdict(set)
        self.requests = 0

    def app(self) -> web.Application:
        async def answer(request: web.Request) -> web.StreamResponse:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            self.by_connection[peer[1] if peer else 0].add(request.headers["Authorization"])
            self.requests += 1
            name = request.match_info["name"]
            if name == "small":
                return web.Response(body=b"0123456789", headers={"X-Cache": "HIT"})
            if name == "big":
                headers = {"X-Cache": "MISS", "Content-Encoding": "gzip"}
                return web.Response(body=b"b" * BIG, headers=headers)
            if name == "chunked":
                response = web.StreamResponse()
                response.enable_chunked_encoding()
                await response.prepare(request)
                await response.write(b"part")
                await response.write_eof()
                return response
            return web.Response(status=404, body=NOT_FOUND)

        app = web.Application()
        app.router.add_get("/{name}", answer)
        return app


def keys_file(folder: Path, tokens: list[str], targets: list[tuple[float, str]]) -> Path:
    lines = []
    for token in tokens:
        lines.append(f"token Bearer {token}")
        lines += [f"{weight} {target}" for weight, target in targets]
    path = folder / "keys.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


async def run_client(
    binary: Path, port: int | None, keys: Path, *options: str
) -> tuple[int, str, str]:
    assert port is not None
    process = await asyncio.create_subprocess_exec(
        str(binary), "--port", str(port), "--keys", str(keys), *options,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_it_counts_answers_statuses_and_bytes_and_keeps_one_token_per_connection(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    keys = keys_file(tmp_path, ["alpha", "beta", "gamma"], [(3, "/small"), (1, "/big"), (1, "/x")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "2", "--connections", "6", "--warmup", "0.2", "--duration", "0.5",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    report = json.loads(out)

    answered = result.requests + report["warmup"]["requests"]
    # every answer the client counted was served; the ones in flight at the end were not read
    assert answered <= recorder.requests <= answered + 6
    assert result.requests > 0
    assert sum(result.statuses.values()) == result.requests
    assert set(result.statuses) == {"200", "404"}
    assert result.non_200 == result.statuses["404"]
    # the headers counted: /small says HIT, /big MISS and gzip, the 404 has no X-Cache
    small, big, missing = result.x_cache["HIT"], result.x_cache["MISS"], result.x_cache["none"]
    assert small + big + missing == result.requests
    assert result.gzip_answers == big
    assert missing == result.statuses["404"]
    # Content-Length read right, a body over several reads included
    assert result.body_bytes == 10 * small + BIG * big + len(NOT_FOUND) * missing
    assert big > 0
    assert small > big  # weighed 3 to 1

    # one token per connection, for its whole life; two connections per token
    assert all(len(sent) == 1 for sent in recorder.by_connection.values())
    per_token = collections.Counter(next(iter(sent)) for sent in recorder.by_connection.values())
    assert per_token == {"Bearer alpha": 2, "Bearer beta": 2, "Bearer gamma": 2}
    assert len(result.by_token) == 3
    assert sum(result.by_token) == result.requests
    assert result.errors == 0


async def test_a_chunked_answer_stops_the_run_loudly(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    server = await aiohttp_server(Recorder().app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/chunked")])
    code, out, err = await run_client(
        client_binary, server.port, keys, "--connections", "2", "--warmup", "0", "--duration", "1"
    )
    assert code == 2
    assert out == ""
    assert "Transfer-Encoding" in err
    assert "/chunked" in err


async def test_its_cpu_reading_covers_the_pids_it_is_given(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    server = await aiohttp_server(Recorder().app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--connections", "2", "--warmup", "0", "--duration", "0.3", "--cpu-pid", str(os.getpid()),
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    assert [p.pid for p in result.servers] == [os.getpid()]
    assert not result.servers[0].exited
    # this process served every request of the run: it cannot have used no CPU
    assert result.servers[0].total_s > 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0 /small", "positive"),
        ("1 small", "start with '/'"),
        ("1 /with space", "space"),
        ("x /small", "not a number"),
    ],
)
async def test_a_bad_keys_file_is_refused(
    client_binary: Path, tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "keys.txt"
    path.write_text(f"token Bearer alpha\n{line}\n")
    code, _, err = await run_client(client_binary, 9, path)
    assert code == 2
    assert message in err


def _report(**changes: Any) -> dict[str, Any]:
    """A report as bench/loadgen.c prints it."""
    tally = {
        "requests": 1000, "statuses": {"200": 990, "404": 10}, "bytes": 1_200_000,
        "body_bytes": 1_000_000, "gzip_answers": 250,
        "x_cache": {"HIT": 990, "MISS": 0, "other": 0, "none": 10},
        "reconnects": 0, "retries": 1, "read_errors": 1, "connect_errors": 0, "timeouts": 2,
    }  # fmt: skip
    report: dict[str, Any] = {
        "threads": 2, "connections": 48, "tokens": 24, "keys": 6000, "seed": 1,
        "warmup_s": 2.0, "duration_s": 5.0, "elapsed_s": 7.0, "requests_per_s": 200.0,
        "latency_ms": {"p50": 1.5, "p99": 4.25, "p999": 9.0, "mean": 1.7, "max": 12.0},
        "measured": tally, "warmup": {**tally, "statuses": {"200": 400, "503": 1}},
        "requests_by_token": [500, 500],
        "client_cpu": {"user_s": 0.004, "system_s": 0.006},
        "server_cpu": [
            {"pid": 10, "user_s": 0.5, "system_s": 0.25, "exited": False},
            {"pid": 11, "user_s": 0.0, "system_s": 0.0, "exited": True},
        ],
    }  # fmt: skip
    report.update(changes)
    return report


def test_the_report_is_read_into_the_figures_the_bench_uses() -> None:
    result = loadgen.parse(json.dumps(_report()))
    assert (result.requests_per_s, result.p50_ms, result.p99_ms, result.p999_ms) == (
        200.0,
        1.5,
        4.25,
        9.0,
    )
    assert result.requests == 1000
    assert result.non_200 == 10
    assert result.warmup_non_200 == 1
    assert result.errors == 3  # read errors and timeouts; a retried request is no error
    assert result.gzip_answers == 250
    assert result.client_cpu_ms_per_1000 == pytest.approx(10.0)
    assert result.cpu_of([10]) == (0.5, 0.25)
    assert result.cpu_of([10], but=True) == (0.0, 0.0)
    assert [p.exited for p in result.servers] == [False, True]
    assert result.by_token == (500, 500)


@pytest.mark.parametrize("missing", ["latency_ms", "measured", "server_cpu", "requests_per_s"])
def test_a_report_without_a_figure_is_refused(missing: str) -> None:
    report = _report()
    del report[missing]
    with pytest.raises(BenchError, match=missing):
        loadgen.parse(json.dumps(report))


def test_a_report_that_is_not_json_is_refused() -> None:
    with pytest.raises(BenchError, match="not JSON"):
        loadgen.parse("loadgen: something went wrong")
