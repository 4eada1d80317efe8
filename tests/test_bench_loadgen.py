"""The mix's load client (bench/loadgen.c, bench/loadgen.py): compiled with gcc and run
against a small aiohttp server that records what each connection sent, it counts the
answers, their statuses and bytes, reads Content-Length framing (a body longer than
one read too), refuses chunked answers, and sends each connection's one token; its
traffic shapes (pooled tokens, a share of gzip callers, conditional requests, a
connection per request, an open loop at a fixed rate) send what they say; and its JSON
report is read as the bench reads it. Nothing here is timed: the figures are the
client's own counts, compared with what the server saw, and the open loop's lower
bounds are set by the server's own sleep."""

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
LONG_ETAG = '"' + "x" * 300 + '"'  # over the client's 256 bytes: not remembered
DELAY_S = 0.3
SPLIT_S = 0.3  # between the head and the body of a "split" answer


@pytest.fixture(scope="module")
def client_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return loadgen.compile_client(tmp_path_factory.mktemp("loadgen"))


class Seen:
    """One request as the test server received it."""

    def __init__(self, request: web.Request) -> None:
        self.transport = request.transport  # held, so that no two connections share an id
        self.path = request.path
        self.authorization = request.headers["Authorization"]
        self.gzip = request.headers.get("Accept-Encoding") == "gzip"
        self.if_none_match = request.headers.get("If-None-Match")
        self.connection = request.headers.get("Connection")


def etag_of(seen: Seen) -> str:
    """/etag's ETag: one per token and form (gzip or not), as a store of variants has."""
    return f'"{seen.authorization.split()[-1]}{"-gzip" if seen.gzip else ""}"'


class Recorder:
    """The test server: what each client connection (by its port) sent as Authorization,
    and every request it received (``seen``); ``delay_request``: the number of the
    request (from 1) answered DELAY_S late."""

    def __init__(self, delay_request: int | None = None) -> None:
        self.by_connection: dict[int, set[str]] = collections.defaultdict(set)
        self.requests = 0
        self.seen: list[Seen] = []
        self.not_modified = 0
        self.delay_request = delay_request

    def app(self) -> web.Application:
        async def answer(request: web.Request) -> web.StreamResponse:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            self.by_connection[peer[1] if peer else 0].add(request.headers["Authorization"])
            self.requests += 1
            seen = Seen(request)
            self.seen.append(seen)
            if self.requests == self.delay_request:
                await asyncio.sleep(DELAY_S)
            name = request.match_info["name"]
            if name == "small":
                return web.Response(body=b"0123456789", headers={"X-Cache": "HIT"})
            if name == "etag":
                etag = etag_of(seen)
                if request.headers.get("If-None-Match") == etag:
                    self.not_modified += 1
                    return web.Response(status=304, headers={"ETag": etag})
                return web.Response(body=b"tagged", headers={"ETag": etag})
            if name == "longetag":
                return web.Response(body=b"long", headers={"ETag": LONG_ETAG})
            if name == "big":
                headers = {"X-Cache": "MISS", "Content-Encoding": "gzip"}
                return web.Response(body=b"b" * BIG, headers=headers)
            if name == "split":  # the head now, the rest of the body SPLIT_S later
                response = web.StreamResponse(headers={"X-Cache": "HIT"})
                response.content_length = 4
                await response.prepare(request)
                await response.write(b"l")  # sends the head with it
                await asyncio.sleep(SPLIT_S)
                await response.write(b"ate")
                await response.write_eof()
                return response
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


async def test_an_answer_is_counted_whole_in_the_phase_its_body_ends_in(
    client_binary: Path, aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """Answers whose head comes at once and body SPLIT_S later: one crosses from the
    warm-up into the measured phase, one is cut by the end. Each phase's statuses and
    X-Cache counts add up to its requests (an answer's head was counted where it
    arrived, its request where it ended: one apart)."""
    server = await aiohttp_server(Recorder().app())
    keys = keys_file(tmp_path, ["t"], [(1.0, "/split")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "1", "--connections", "1", "--warmup", "0.2", "--duration", "0.45",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    for phase in ("warmup", "measured"):
        tally = report[phase]
        assert sum(tally["statuses"].values()) == tally["requests"], phase
        assert sum(tally["x_cache"].values()) == tally["requests"], phase
    assert report["measured"]["requests"] >= 1, report


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


def _answered(out: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The requests the client counted in both phases, and the two phases' tallies."""
    report = json.loads(out)
    measured, warmup = report["measured"], report["warmup"]
    return measured["requests"] + warmup["requests"], measured, warmup


async def test_pooled_connections_carry_many_tokens(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    tokens = ["alpha", "beta", "gamma", "delta"]
    keys = keys_file(tmp_path, tokens, [(1, "/small")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "1", "--connections", "2", "--warmup", "0", "--duration", "0.3", "--pooled",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    assert result.shape == {
        "pooled": True, "gzip_share": 0, "conditional_share": 0, "close": False
    }  # fmt: skip
    assert len(recorder.by_connection) == 2
    assert max(len(sent) for sent in recorder.by_connection.values()) > 1
    assert set().union(*recorder.by_connection.values()) == {f"Bearer {t}" for t in tokens}
    # counted by each request's own token
    assert len(result.by_token) == 4
    assert sum(result.by_token) == result.requests
    assert all(count > 0 for count in result.by_token)


@pytest.mark.parametrize("share", ["0", "0.5", "1"])
async def test_a_share_of_requests_asks_for_gzip(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path, share: str
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    keys = keys_file(tmp_path, ["alpha", "beta"], [(1, "/small"), (1, "/x")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "2", "--connections", "4", "--warmup", "0.1", "--duration", "0.3",
        "--gzip-share", share,
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    answered, measured, warmup = _answered(out)
    with_gzip = sum(seen.gzip for seen in recorder.seen)
    # the requests in flight when the client stopped reached the server, not the report
    in_flight = recorder.requests - answered
    assert 0 <= in_flight <= 4
    assert 0 <= with_gzip - (measured["gzip_requests"] + warmup["gzip_requests"]) <= in_flight
    assert result.gzip_requests == measured["gzip_requests"] <= result.requests
    assert result.shape["gzip_share"] == float(share)
    if share == "0":
        assert with_gzip == 0
    elif share == "1":
        assert with_gzip == recorder.requests
    else:
        assert 0 < with_gzip < recorder.requests


async def test_a_conditional_request_sends_the_etag_of_its_variant_and_counts_the_304(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    targets: list[tuple[float, str]] = [(1, "/etag"), (1, "/small"), (1, "/longetag")]
    keys = keys_file(tmp_path, ["alpha", "beta"], targets)
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "2", "--connections", "4", "--warmup", "0.1", "--duration", "0.3",
        "--gzip-share", "0.5", "--conditional-share", "1",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    answered, measured, warmup = _answered(out)
    assert result.statuses["304"] > 0
    # every conditional request was answered 304 (the ETag never changes), so the client's
    # two counts agree, phase by phase
    assert measured["conditional_requests"] == measured["statuses"]["304"]
    assert warmup["conditional_requests"] == warmup["statuses"].get("304", 0)
    in_flight = recorder.requests - answered
    assert 0 <= in_flight <= 4
    client_304 = measured["statuses"]["304"] + warmup["statuses"].get("304", 0)
    assert 0 <= recorder.not_modified - client_304 <= in_flight
    # the ETag sent is the one answered to the same token, key and form; no ETag (or one
    # over 256 bytes) leaves nothing
    conditional = [seen for seen in recorder.seen if seen.if_none_match is not None]
    assert all(seen.path == "/etag" for seen in conditional)
    assert all(seen.if_none_match == etag_of(seen) for seen in conditional)
    # a thread sends a variant without the ETag only until its first answer: at most one
    # per connection of the thread; after that, always with it (the share is 1)
    for token in ("Bearer alpha", "Bearer beta"):
        for gzip in (False, True):
            variant = [
                seen
                for seen in recorder.seen
                if (seen.path, seen.authorization, seen.gzip) == ("/etag", token, gzip)
            ]
            assert sum(seen.if_none_match is None for seen in variant) <= 4
            assert sum(seen.if_none_match is not None for seen in variant) > 4


async def test_close_sends_each_request_on_a_connection_of_its_own(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "1", "--connections", "2", "--warmup", "0.1", "--duration", "0.3", "--close",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    answered, measured, warmup = _answered(out)
    assert result.requests > 0
    assert all(seen.connection == "close" for seen in recorder.seen)
    per_connection = collections.Counter(id(seen.transport) for seen in recorder.seen)
    assert set(per_connection.values()) == {1}  # as many connections as requests
    # a connect for every request answered, and none beyond the ones still in flight
    connects = measured["connects"] + warmup["connects"]
    assert answered <= connects <= answered + 2
    assert result.connects == measured["connects"]
    assert result.reconnects == 0
    assert result.errors == 0
    assert result.shape["close"] is True


async def test_an_open_loop_keeps_to_its_schedule(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "2", "--connections", "4", "--warmup", "0.5", "--duration", "1",
        "--rate", "200",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    assert result.requests > 0
    assert result.offered_per_s == 200
    # a closed loop would send thousands here: the schedule allows 200/s over 1.5 s, plus
    # each connection's first request at its start
    assert recorder.requests <= 200 * 1.5 * 1.2 + 4
    assert result.achieved_per_s == result.requests_per_s


async def test_an_open_loop_measures_latency_from_the_intended_time(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder(delay_request=5)
    server = await aiohttp_server(recorder.app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "1", "--connections", "4", "--warmup", "0", "--duration", "1",
        "--rate", "200",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    report = json.loads(out)
    # the late answer's latency holds the server's sleep, and the connection's next request,
    # due one interval (4 / 200 s) after it, went out behind its time by the rest of it
    interval_ms = 4 / 200 * 1000
    assert report["latency_ms"]["max"] >= DELAY_S * 1000
    assert result.behind_max_ms >= DELAY_S * 1000 - interval_ms
    # its j-th follow-up was due j intervals after it and sent after the late answer: its
    # latency, from the intended time, is at least the sleep less j intervals. With at most
    # 400 requests, no more than 4 lie above p99, so p99 is at least the 4th follow-up's
    # (less the histogram's 0.4 %)
    assert result.requests <= 400  # the schedule allows about 200 in the second
    assert result.p99_ms >= (DELAY_S * 1000 - 4 * interval_ms) * 0.99


async def test_the_wrapper_runs_the_shape_of_its_settings(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    recorder = Recorder()
    server = await aiohttp_server(recorder.app())
    keys = keys_file(tmp_path, ["alpha", "beta", "gamma"], [(1, "/small"), (1, "/etag")])
    settings = loadgen.LoadSettings(
        threads=1, connections=2, duration_s=0.3, warmup_s=0.1,
        pooled=True, gzip_share=1.0, conditional_share=1.0, close=True,
    )  # fmt: skip
    result = await asyncio.to_thread(
        loadgen.run, client_binary, f"http://127.0.0.1:{server.port}", keys, settings
    )
    assert result.shape == {
        "pooled": True, "gzip_share": 1, "conditional_share": 1, "close": True
    }  # fmt: skip
    assert max(len(sent) for sent in recorder.by_connection.values()) == 1  # --close
    assert len({seen.authorization for seen in recorder.seen}) == 3  # --pooled
    assert all(seen.gzip and seen.connection == "close" for seen in recorder.seen)
    assert any(seen.if_none_match == etag_of(seen) for seen in recorder.seen)
    assert result.conditional_requests == result.statuses["304"] > 0
    assert settings.shown() == (
        "loadgen -t 1 -c 2 -d 0.3s --pooled --gzip-share 1 --conditional-share 1 --close "
        "(after 0.1 s of warm-up)"
    )


async def test_without_shape_options_the_report_says_so(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    server = await aiohttp_server(Recorder().app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    settings = loadgen.LoadSettings(threads=1, connections=2, duration_s=0.2, warmup_s=0)
    result = await asyncio.to_thread(
        loadgen.run, client_binary, f"http://127.0.0.1:{server.port}", keys, settings
    )
    assert settings.options() == []
    assert settings.shown() == "loadgen -t 1 -c 2 -d 0.2s (after 0 s of warm-up)"
    assert result.shape == {
        "pooled": False, "gzip_share": 0, "conditional_share": 0, "close": False
    }  # fmt: skip
    assert (result.offered_per_s, result.behind_max_ms) == (0.0, 0.0)
    assert result.achieved_per_s == result.requests_per_s
    assert (result.gzip_requests, result.conditional_requests) == (0, 0)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--gzip-share", "1.5"), ("--conditional-share", "-0.1"), ("--rate", "x"), ("--rate", "-1")],
)
async def test_a_bad_shape_option_is_refused(
    client_binary: Path, tmp_path: Path, option: str, value: str
) -> None:
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    code, out, err = await run_client(client_binary, 9, keys, option, value)
    assert code == 2
    assert out == ""
    assert option in err


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
        "gzip_requests": 260, "conditional_requests": 40, "connects": 30,
        "reconnects": 0, "retries": 1, "read_errors": 1, "connect_errors": 0, "timeouts": 2,
    }  # fmt: skip
    report: dict[str, Any] = {
        "threads": 2, "connections": 48, "tokens": 24, "keys": 6000, "seed": 1,
        "warmup_s": 2.0, "duration_s": 5.0, "elapsed_s": 7.0, "requests_per_s": 200.0,
        "latency_ms": {"p50": 1.5, "p99": 4.25, "p999": 9.0, "mean": 1.7, "max": 12.0},
        "shape": {"pooled": True, "gzip_share": 0.25, "conditional_share": 0.05, "close": False},
        "rate": {"offered_per_s": 250.0, "achieved_per_s": 200.0, "behind_max_ms": 3.5},
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
    assert (result.gzip_requests, result.conditional_requests, result.connects) == (260, 40, 30)
    assert (result.offered_per_s, result.achieved_per_s, result.behind_max_ms) == (
        250.0,
        200.0,
        3.5,
    )
    assert result.shape == {
        "pooled": True, "gzip_share": 0.25, "conditional_share": 0.05, "close": False
    }  # fmt: skip


def test_a_closed_loop_report_has_no_offered_rate() -> None:
    result = loadgen.parse(json.dumps(_report(rate=None)))
    assert (result.offered_per_s, result.behind_max_ms) == (0.0, 0.0)
    assert result.achieved_per_s == 200.0  # the measured requests/s


@pytest.mark.parametrize(
    "missing", ["latency_ms", "measured", "server_cpu", "requests_per_s", "shape", "rate"]
)
def test_a_report_without_a_figure_is_refused(missing: str) -> None:
    report = _report()
    del report[missing]
    with pytest.raises(BenchError, match=missing):
        loadgen.parse(json.dumps(report))


@pytest.mark.parametrize(
    ("part", "missing"),
    [
        ("measured", "gzip_requests"),
        ("measured", "conditional_requests"),
        ("measured", "connects"),
        ("rate", "offered_per_s"),
        ("rate", "achieved_per_s"),
        ("rate", "behind_max_ms"),
    ],
)
def test_a_report_without_a_shape_figure_is_refused(part: str, missing: str) -> None:
    report = _report()
    report[part] = {name: value for name, value in report[part].items() if name != missing}
    with pytest.raises(BenchError, match=missing):
        loadgen.parse(json.dumps(report))


@pytest.mark.parametrize(
    "changes",
    [{"gzip_share": 1.5}, {"conditional_share": -0.1}, {"rate": -1.0}, {"rate": float("nan")}],
)
def test_settings_out_of_range_are_refused(changes: dict[str, float]) -> None:
    with pytest.raises(BenchError, match=next(iter(changes))):
        loadgen.LoadSettings(**changes)  # type: ignore[arg-type]


def test_a_report_that_is_not_json_is_refused() -> None:
    with pytest.raises(BenchError, match="not JSON"):
        loadgen.parse("loadgen: something went wrong")


def test_settings_give_the_client_their_figures_whole() -> None:
    settings = loadgen.LoadSettings(gzip_share=0.125, conditional_share=0.05, rate=123_456.7)
    assert settings.options() == [
        "--gzip-share", "0.125", "--conditional-share", "0.05", "--rate", "123456.7"
    ]  # fmt: skip


async def test_the_report_gives_the_offered_rate_and_shares_whole(
    aiohttp_server: AiohttpServer, client_binary: Path, tmp_path: Path
) -> None:
    server = await aiohttp_server(Recorder().app())
    keys = keys_file(tmp_path, ["alpha"], [(1, "/small")])
    code, out, err = await run_client(
        client_binary, server.port, keys,
        "--threads", "1", "--connections", "2", "--warmup", "0", "--duration", "0.2",
        "--rate", "1234567.5", "--gzip-share", "0.1234567",
    )  # fmt: skip
    assert code == 0, err
    result = loadgen.parse(out)
    assert result.offered_per_s == 1234567.5
    assert result.shape["gzip_share"] == 0.1234567
