"""The matrix's judgement (bench/matrix.py, bench/report.py): which figures PASS issue
32's targets and which FAIL them, at their edges, and what the report's tables show.
Verdicts only: the figures are the bench's to measure."""

from __future__ import annotations

import copy
from typing import Any

import matrix
import pytest
import report
from loadgen import LoadResult, ProcessCpu
from report import Target, matrix_targets

SHAPES = tuple(matrix.SHAPES)


def _cell(rps: float, cpu: float = 20.0, p99: float = 2.0) -> dict[str, Any]:
    return {
        "requests_per_s": rps,
        "p50_ms": 1.0,
        "p99_ms": p99,
        "p999_ms": 2 * p99,
        "cpu_us": {"user": cpu * 0.6, "system": cpu * 0.4, "total": cpu},
        "statuses": {"200": 1000},
        "x_cache": {"HIT": 1000},
        "errors": 0,
    }


def _matrix(**changes: Any) -> dict[str, Any]:
    """Every shape: the gateways at 0.7 x nginx (50,000/s; 0.85 x with a connection per
    request) and above Varnish's 0.6, the plain path at 1.2 x the floor's CPU; the open
    loop kept up; the clients agreeing."""
    cells = {}
    for shape in SHAPES:
        gateway = 42_500 if shape == matrix.PER_REQUEST else 35_000
        cells[shape] = {
            "gateway": _cell(gateway),
            "gateway-redis": _cell(gateway),
            "gateway-plain": _cell(20_000, cpu=36.0),
            "floor": _cell(22_000, cpu=30.0),
            "ceiling": _cell(60_000, cpu=8.0),
            "nginx": _cell(50_000, cpu=10.0),
            "varnish": _cell(45_000, cpu=12.0),
        }
        for cell in cells[shape].values():
            cell["x_nginx"] = round(cell["requests_per_s"] / 50_000, 2)
            cell["x_varnish"] = round(cell["requests_per_s"] / 45_000, 2)
            cell["x_floor"] = round(cell["requests_per_s"] / 22_000, 2)
    row = {"offered_per_s": 25_000, "achieved_per_s": 25_000.0, "kept_up": True,
           "p50_ms": 0.5, "p99_ms": 2.0, "p999_ms": 4.0, "behind_max_ms": 0.1}  # fmt: skip
    data = {
        "settings": {"load": "loadgen", "rounds": 1},
        "cells": cells,
        "open_loop": {
            "0.50": {server: dict(row) for server in matrix.SERVERS},
            "0.80": {server: dict(row, offered_per_s=40_000) for server in matrix.SERVERS},
        },
        "client_check": {
            "loadgen_requests_per_s": 50_000.0,
            "wrk_requests_per_s": 48_000.0,
            "ratio": 1.04,
        },
    }
    for path, value in changes.items():
        target: Any = data
        *parts, last = path.split("__")
        for part in parts:
            target = target[part]
        target[last] = value
    return data


def _verdicts(data: dict[str, Any]) -> dict[str, Target]:
    return {target.name: target for target in matrix_targets(data)}


def test_a_matrix_within_every_target_passes_them_all() -> None:
    verdicts = _verdicts(_matrix())
    assert sorted(verdicts) == sorted(
        [
            *(
                f"matrix {s}{part}"
                for s in ("gateway", "gateway-redis")
                for part in ("", " CPU", " g", " half rate")
            ),
            "matrix gateway-plain",
            "matrix load clients",
        ]
    )
    assert [name for name, v in verdicts.items() if not v.passed] == []


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != matrix.PER_REQUEST])
def test_one_shape_below_six_tenths_of_nginx_fails_the_gateway(shape: str) -> None:
    data = _matrix()
    data["cells"][shape]["gateway"]["x_nginx"] = 0.59
    verdict = _verdicts(data)["matrix gateway"]
    assert not verdict.passed
    assert verdict.measured.startswith(f"worst {shape}: 0.59 x nginx")
    data["cells"][shape]["gateway"]["x_nginx"] = 0.6
    assert _verdicts(data)["matrix gateway"].passed


def test_varnish_counts_as_nginx_does() -> None:
    data = _matrix()
    data["cells"]["b-pooled"]["gateway-redis"]["x_varnish"] = 0.55
    assert not _verdicts(data)["matrix gateway-redis"].passed
    assert _verdicts(data)["matrix gateway"].passed


def test_the_connection_per_request_shape_is_judged_at_eight_tenths_apart() -> None:
    data = _matrix()
    g = data["cells"][matrix.PER_REQUEST]["gateway"]
    g["x_nginx"] = 0.5  # below 0.6: not the keep-alive target, only g's own
    verdicts = _verdicts(data)
    assert verdicts["matrix gateway"].passed
    assert not verdicts["matrix gateway g"].passed
    g["x_nginx"] = 0.8
    assert _verdicts(data)["matrix gateway g"].passed


def test_cpu_per_hit_may_spread_a_quarter_across_shapes() -> None:
    data = _matrix()
    data["cells"]["d-flat"]["gateway"]["cpu_us"]["total"] = 25.0  # 1.25 x 20
    assert _verdicts(data)["matrix gateway CPU"].passed
    data["cells"]["d-flat"]["gateway"]["cpu_us"]["total"] = 25.2
    verdict = _verdicts(data)["matrix gateway CPU"]
    assert not verdict.passed
    assert verdict.measured == "d-flat 25.2 µs vs a-token-per-connection 20.0 µs (1.26 x)"


def test_half_rate_needs_keeping_up_and_tails_within_two_and_three_times_nginx() -> None:
    data = _matrix()
    half = data["open_loop"]["0.50"]
    half["gateway"]["p99_ms"] = 4.0  # 2 x nginx's 2.0
    half["gateway"]["p999_ms"] = 12.0  # 3 x nginx's 4.0
    assert _verdicts(data)["matrix gateway half rate"].passed
    for key, value in (("p99_ms", 4.1), ("p999_ms", 12.1), ("kept_up", False)):
        failing = copy.deepcopy(data)
        failing["open_loop"]["0.50"]["gateway"][key] = value
        assert not _verdicts(failing)["matrix gateway half rate"].passed, key


def test_the_public_path_may_cost_a_quarter_more_than_the_floor() -> None:
    data = _matrix()
    for cells in data["cells"].values():
        cells["gateway-plain"]["cpu_us"]["total"] = 37.5  # 1.25 x 30
    assert _verdicts(data)["matrix gateway-plain"].passed
    data["cells"]["e-gzip-mixed"]["gateway-plain"]["cpu_us"]["total"] = 37.8
    verdict = _verdicts(data)["matrix gateway-plain"]
    assert not verdict.passed
    assert verdict.measured == "worst e-gzip-mixed: 1.26 x"


@pytest.mark.parametrize(("ratio", "passed"), [(0.9, True), (1.1, True), (0.89, False),
                                               (1.11, False)])  # fmt: skip
def test_the_two_load_clients_must_agree_within_a_tenth(ratio: float, passed: bool) -> None:
    data = _matrix(client_check__ratio=ratio)
    assert _verdicts(data)["matrix load clients"].passed is passed


def test_the_report_shows_every_shape_every_server_and_the_open_loop() -> None:
    text = "\n".join(report._matrix(_matrix()))
    for shape in SHAPES:
        assert f"*{shape}*" in text
    for server in matrix.SERVERS:
        assert f"| {server} | " in text
    assert "| gateway | 35,000 | 1.00 | 2.00 | 4.00 | 0.70 | 0.78 | 1.59 |" in text
    assert "*Open loop, pooled, 50% of nginx's requests/s (25,000 offered" in text
    assert "by wrk (bench/mix.lua): 48,000 (1.04)" in text


def test_the_report_shows_the_gateway_s_own_part_beyond_the_ceiling() -> None:
    """Point 5 of the bench's matrix (bench/README.md): the gateway's CPU per answer
    (20 µs: 12 user, 8 system) beside a bare Protocol's (8 µs: 4.8 and 3.2)."""
    text = "\n".join(report._matrix(_matrix()))
    line = (
        "The gateway's own part: 12.0 µs per answer beyond the ceiling's 8.0 (7.2 user, "
        "4.8 system); nginx's whole is 10.0."
    )
    assert text.count(line) == len(SHAPES)
    without = _matrix()
    for cells in without["cells"].values():
        del cells["ceiling"]
    assert "own part" not in "\n".join(report._matrix(without))


def _run(rps: float, cpu_s: float, requests: int = 10_000, redis: bool = False) -> LoadResult:
    """A measured run with ``cpu_s`` seconds of the server (pid 1), and 0.1 s of Redis
    (pid 9) when it was read."""
    return LoadResult(
        requests_per_s=rps,
        p50_ms=1.0,
        p99_ms=3.0,
        p999_ms=6.0,
        requests=requests,
        seconds=1.0,
        statuses={"200": requests - 10, "304": 10},
        body_bytes=0,
        gzip_answers=0,
        x_cache={"HIT": requests},
        errors=0,
        reconnects=0,
        client_user_s=0.1,
        client_system_s=0.1,
        servers=(ProcessCpu(1, cpu_s * 0.75, cpu_s * 0.25),)
        + ((ProcessCpu(9, 0.05, 0.05),) if redis else ()),
    )


def test_a_cell_is_the_median_of_its_rounds_with_ratios_within_its_shape() -> None:
    results = {
        shape: {
            server: [
                _run(rps, cpu, redis=server == "gateway-redis")
                for rps, cpu in (
                    (10_000, 0.2),
                    (30_000 if server == "nginx" else 20_000, 0.3),
                    (40_000, 0.4),
                )
            ]
            for server in matrix.SERVERS
        }
        for shape in SHAPES
    }
    results["c-hot-key"]["nginx"] = [_run(80_000, 0.1)]
    table = matrix.summarise(results, redis_pid=9)
    gateway = table["b-pooled"]["gateway"]
    assert gateway["requests_per_s"] == 20_000
    assert gateway["cpu_us"] == {"user": 22.5, "system": 7.5, "total": 30.0}
    assert gateway["x_nginx"] == round(20_000 / 30_000, 2)
    assert gateway["statuses"] == {"200": 29_970, "304": 30}
    assert table["c-hot-key"]["gateway"]["x_nginx"] == 0.25
    assert "redis_cpu_us" not in gateway
    # the Redis column's CPU is its server's; Redis's own is apart
    redis = table["b-pooled"]["gateway-redis"]
    assert redis["cpu_us"]["total"] == 30.0
    assert redis["redis_cpu_us"] == 10.0
