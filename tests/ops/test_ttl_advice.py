"""TTL advice: the change-rate estimate against simulated truth, the advice's
direction, and the evidence read back from the gateway's own metrics."""

from __future__ import annotations

import math
import random

import pytest

from gateway.ops.metrics import AGE_BUCKETS, Metrics
from gateway.ops.ttl_advice import (
    MIN_REFRESHES,
    Evidence,
    Policy,
    advise,
    change_rate,
    evidence_of,
    hit_ratio_at,
    stale_share,
)

POLICY = Policy(max_stale_share=0.05, min_ttl_s=5, max_ttl_s=3600)


def simulated(
    rate: float, refreshes: int, ages: tuple[float, float], seed: int = 7, hit_ratio: float = 0.9
) -> Metrics:
    """A Metrics that counted ``refreshes`` replaced answers of route ``expense``, aged
    uniformly within ``ages``, each changed with the probability a Poisson process of
    ``rate`` gives; and a hit ratio of ``hit_ratio`` over 1000 answers."""
    rng = random.Random(seed)
    metrics = Metrics()
    for _ in range(refreshes):
        age = rng.uniform(*ages)
        metrics.refreshed("expense", rng.random() < -math.expm1(-rate * age), age)
    hits = round(1000 * hit_ratio)
    for n in range(1000):
        metrics.count_answer("expense", 200, "hit" if n < hits else "miss", 0.001)
    return metrics


def evidence(metrics: Metrics) -> Evidence:
    return evidence_of(metrics.families())["expense"]


@pytest.mark.parametrize("per_minute", [0.05, 0.5, 2.0, 6.0])
@pytest.mark.parametrize("ages", [(30.0, 60.0), (300.0, 330.0), (2.0, 600.0)])
def test_the_estimated_rate_is_near_the_true_one(
    per_minute: float, ages: tuple[float, float]
) -> None:
    rate = per_minute / 60
    seen = evidence(simulated(rate, 2000, ages))
    if seen.unchanged == 0:  # every answer changed: no finite estimate, and it says so
        assert change_rate(seen) is None
        return
    estimate = change_rate(seen)
    assert estimate is not None
    assert estimate == pytest.approx(rate, rel=0.15)


def test_no_change_seen_is_a_rate_of_zero_and_advice_from_its_upper_bound() -> None:
    seen = evidence(simulated(0.0, 200, (30.0, 60.0)))
    assert change_rate(seen) == 0.0
    advice = advise("expense", 30, seen, POLICY)
    bound = 3 / seen.unchanged_age_sum
    assert advice.changes_per_hour == pytest.approx(bound * 3600)
    assert advice.advised_ttl_s is not None
    assert advice.advised_ttl_s > 30
    assert "no change seen" in advice.reason


def test_every_answer_changed_advises_the_minimum() -> None:
    seen = evidence(simulated(1.0, 100, (300.0, 310.0)))
    assert seen.unchanged == 0
    advice = advise("expense", 300, seen, POLICY)
    assert advice.advised_ttl_s == POLICY.min_ttl_s
    assert "faster than the ages seen tell" in advice.reason


def test_fewer_than_30_refreshes_is_not_enough_data() -> None:
    seen = evidence(simulated(0.01, MIN_REFRESHES - 1, (30.0, 60.0)))
    advice = advise("expense", 30, seen, POLICY)
    assert advice.advised_ttl_s is None
    assert advice.reason == f"not enough data: {MIN_REFRESHES - 1} refreshes seen, 30 needed"
    assert advise("expense", 30, evidence(simulated(0.01, 30, (30.0, 60.0))), POLICY).advised_ttl_s


def test_a_route_with_caching_off_gets_no_advice() -> None:
    advice = advise("expense", 0, evidence(simulated(0.01, 100, (30.0, 60.0))), POLICY)
    assert advice.advised_ttl_s is None
    assert "caching is off" in advice.reason


def test_the_advice_moves_the_right_way() -> None:
    slow = advise("expense", 60, evidence(simulated(0.2 / 60, 1000, (60.0, 90.0))), POLICY)
    fast = advise("expense", 60, evidence(simulated(2 / 60, 1000, (60.0, 90.0))), POLICY)
    assert slow.advised_ttl_s is not None
    assert fast.advised_ttl_s is not None
    assert fast.advised_ttl_s < slow.advised_ttl_s
    strict = Policy(max_stale_share=0.01, min_ttl_s=5, max_ttl_s=3600)
    stricter = advise("expense", 60, evidence(simulated(0.2 / 60, 1000, (60.0, 90.0))), strict)
    assert stricter.advised_ttl_s is not None
    assert stricter.advised_ttl_s < slow.advised_ttl_s
    # the advised TTL keeps the expected stale share at the maximum, or under it
    for advice, policy in ((slow, POLICY), (fast, POLICY), (stricter, strict)):
        assert advice.stale_share_advised is not None
        assert advice.stale_share_advised <= policy.max_stale_share + 1e-9


def test_the_advice_is_within_its_bounds() -> None:
    bounded = Policy(max_stale_share=0.05, min_ttl_s=5, max_ttl_s=600)
    never = advise("expense", 60, evidence(simulated(1e-7, 1000, (60.0, 90.0))), bounded)
    assert never.advised_ttl_s == bounded.max_ttl_s
    always = advise("expense", 60, evidence(simulated(20 / 60, 1000, (5.0, 90.0))), POLICY)
    assert always.advised_ttl_s == POLICY.min_ttl_s


def test_the_model_of_stale_share_and_hit_ratio() -> None:
    assert stale_share(0.0, 60, 0.9) == 0.0
    # a change a minute and a one-minute TTL: hits are stale 1 - (1 - 1/e) = 37% of the time
    assert stale_share(1 / 60, 60, 1.0) == pytest.approx(1 / math.e)
    assert hit_ratio_at(60, 0.9, 60) == pytest.approx(0.9)
    assert hit_ratio_at(120, 0.9, 60) == pytest.approx(18 / 19)  # rT = 18


def test_evidence_counts_and_exact_sums_come_back_from_the_metrics() -> None:
    metrics = Metrics()
    metrics.refreshed("users", True, 40.0)
    metrics.refreshed("users", True, 50.0)
    metrics.refreshed("users", False, 70.0)
    metrics.count_answer("users", 200, "hit", 0.001)
    metrics.count_answer("users", 200, "stale", 0.001)
    metrics.count_answer("users", 200, "miss", 0.001)
    seen = evidence_of(metrics.families())["users"]
    assert (seen.changed, seen.changed_age_sum) == (2, 90.0)
    assert (seen.unchanged, seen.unchanged_age_sum) == (1, 70.0)
    assert seen.hit_ratio == pytest.approx(2 / 3)
    assert sum(count for _, _, count in seen.changed_ages) == 2
    for low, high, _ in seen.changed_ages:  # the buckets of 40 s and 50 s
        assert low in (0.0, *AGE_BUCKETS)
        assert low < 50.0 <= high or low < 40.0 <= high
    text = metrics.exposition().decode()
    assert 'gateway_refreshes_total{changed="true",route="users"} 2.0' in text
    assert 'gateway_refresh_age_seconds_count{changed="false",route="users"} 1.0' in text
    assert 'gateway_refresh_age_seconds_sum{changed="true",route="users"} 90.0' in text
