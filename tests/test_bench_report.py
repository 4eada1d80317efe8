"""The bench's judgement (bench/report.py, bench/probes.py): which numbers PASS a target
and which FAIL it, at the targets' edges. A verdict is taken on the figures as the
tables show them (ratios to two decimals, times to the microsecond). Only the verdicts
and their text are tested; the figures themselves are the bench's to measure (no timing
here)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
from probes import MIB, CoalesceResult, InvalidationResult, SoakResult
from report import Summary, Target, targets
from report import machine as machine_of_this_run

MAX_BYTES = 16 * MIB


def _row(requests_per_s: float, p50_ms: float, p99_ms: float) -> dict[str, float]:
    """A table row beside a floor of 20,000/s and nginx at 80,000/s."""
    x_floor, x_nginx = requests_per_s / 20_000, requests_per_s / 80_000
    return Summary(requests_per_s, p50_ms, p99_ms, x_floor, x_nginx).as_dict()


def _data(
    *,
    hit_memory: float = 60_000,
    hit_p99: float = 2.0,
    hit_redis_2w: float = 60_000,
    miss_p50: float = 25.0,
    direct_p50: float = 24.5,
    single_miss_p50: float = 21.0,
    normalise_ms: float = 0.10,
    upstream_calls: int = 1,
    rss_peak: int = 70 * MIB,
    purge_ms: float = 0.5,
) -> dict[str, Any]:
    """A run's results as bench/run.py writes them, made by the bench's own classes."""
    configs = {
        "floor": _row(20_000, 3.0, 5.0),
        "hit-memory": _row(hit_memory, 1.0, hit_p99),
        "hit-redis": _row(hit_memory, 1.0, hit_p99),
        "hit-redis-2w": _row(hit_redis_2w, 1.0, 3.0),
        "nginx": _row(80_000, 0.7, 2.0),
        "miss": _row(2_500, miss_p50, 35.0),
        "miss-floor": _row(2_600, direct_p50 - 0.6, 33.0),
        "direct": _row(2_550, direct_p50, 30.0),
    }
    single = {
        "miss": {"requests_per_s": 46.0, "p50_ms": single_miss_p50, "p99_ms": 22.0},
        "miss-floor": {"requests_per_s": 46.0, "p50_ms": 21.0, "p99_ms": 22.0},
        "direct": {"requests_per_s": 48.0, "p50_ms": 20.0, "p99_ms": 21.0},
    }
    coalesce = CoalesceResult(
        path="/expenses?limit=10&page=7",
        requests=500,
        upstream_calls=upstream_calls,
        statuses={200: 500},
        distinct_bodies=1,
        x_cache={"MISS": 500},
        coalesced=500 - upstream_calls,
        seconds=0.06,
    )
    soak = SoakResult(max_bytes=MAX_BYTES, keys=10_416, concurrency=32, rss_peak=rss_peak)
    return {
        "configs": configs,
        "unloaded": {"configs": single},
        "normalise_ms": {"median_ms": normalise_ms},
        "coalesce": coalesce.as_dict(),
        "invalidation": InvalidationResult(trials=5, milliseconds=[purge_ms]).as_dict(),
        "soak": soak.as_dict(),
    }


def _verdicts(data: dict[str, Any]) -> dict[str, Target]:
    return {target.name: target for target in targets(data)}


def test_a_run_within_every_target_passes_them_all() -> None:
    verdicts = _verdicts(_data())
    assert list(verdicts) == [
        "hit-memory",
        "hit-redis",
        "hit-redis-2w",
        "miss",
        "miss, 1 connection",
        "coalesce",
        "near-cache invalidation",
        "soak",
    ]
    assert all(target.passed for target in verdicts.values())


@pytest.mark.parametrize(
    ("miss_p50", "passed"),
    [
        (25.6, True),  # direct 24.5 + 1 ms + 0.10 normalise: exactly what is allowed
        (25.601, False),
        (23.9, True),  # faster than direct
    ],
)
def test_miss_may_add_one_ms_and_the_normalise_cost_to_direct(
    miss_p50: float, passed: bool
) -> None:
    assert _verdicts(_data(miss_p50=miss_p50))["miss"].passed is passed


def test_the_one_connection_miss_is_judged_on_its_own_rows() -> None:
    verdicts = _verdicts(_data(single_miss_p50=21.11))  # direct 20.0: +1.11 against 1.10
    assert not verdicts["miss, 1 connection"].passed
    assert verdicts["miss"].passed
    assert verdicts["miss, 1 connection"].measured == (
        "p50 21.11 ms vs 20.00 ms (+1.11 ms); miss-floor +1.00 ms"
    )


def test_what_a_miss_adds_is_written_with_its_own_sign() -> None:
    measured = _verdicts(_data(miss_p50=24.31))["miss"].measured
    # the miss 0.19 ms under direct, the floor 0.60 under it: never "+-0.19"
    assert measured == "p50 24.31 ms vs 24.50 ms (-0.19 ms); miss-floor -0.60 ms"


@pytest.mark.parametrize(
    ("hit_memory", "hit_p99", "passed"),
    [
        (17_000, 5.0, True),  # 0.85 x floor, p99 at 5 ms: both at the edge
        (16_990, 2.0, True),  # 0.8495 x floor, shown (and judged) as 0.85
        (16_890, 2.0, False),  # 0.8445 x floor, shown as 0.84
        (60_000, 5.01, False),  # fast, but its p99 over 5 ms
    ],
)
def test_a_hit_needs_its_share_of_the_floor_and_a_p99_within_5_ms(
    hit_memory: float, hit_p99: float, passed: bool
) -> None:
    verdict = _verdicts(_data(hit_memory=hit_memory, hit_p99=hit_p99))["hit-memory"]
    assert verdict.passed is passed


def test_two_workers_need_six_tenths_of_nginx() -> None:
    assert _verdicts(_data(hit_redis_2w=48_000))["hit-redis-2w"].passed  # 0.60 x nginx
    verdict = _verdicts(_data(hit_redis_2w=47_500))["hit-redis-2w"]
    assert not verdict.passed
    assert verdict.measured == "0.59 x nginx"


def test_coalescing_passes_with_exactly_one_upstream_call() -> None:
    verdict = _verdicts(_data(upstream_calls=2))["coalesce"]
    assert not verdict.passed
    assert verdict.measured == "2 upstream calls"
    assert not _verdicts(_data(upstream_calls=0))["coalesce"].passed


def test_a_purge_must_reach_the_other_near_cache_within_a_second() -> None:
    assert _verdicts(_data(purge_ms=1000.0))["near-cache invalidation"].passed
    assert not _verdicts(_data(purge_ms=1000.5))["near-cache invalidation"].passed
    # no purge measured at all is no pass
    assert InvalidationResult(trials=5).as_dict()["pass"] is False


def test_the_soak_bound_is_the_cache_bound_plus_60_mib() -> None:
    at_bound = SoakResult(max_bytes=MAX_BYTES, keys=1, concurrency=1, rss_peak=76 * MIB)
    assert at_bound.bound == 76 * MIB
    assert at_bound.passed
    over = SoakResult(max_bytes=MAX_BYTES, keys=1, concurrency=1, rss_peak=76 * MIB + 1)
    assert not over.passed

    verdict = _verdicts(_data(rss_peak=76 * MIB + 100 * 1024))["soak"]
    assert not verdict.passed
    assert verdict.wanted == "RSS <= memory_max_bytes + 60 MiB = 76 MiB"
    assert verdict.measured == "peak RSS 76.1 MiB"


def test_the_machine_names_the_aiohttp_and_uvloop_the_gateway_ran_on() -> None:
    machine = machine_of_this_run()
    assert machine["aiohttp"] == importlib.metadata.version("aiohttp")
    assert machine["uvloop"] == importlib.metadata.version("uvloop")
