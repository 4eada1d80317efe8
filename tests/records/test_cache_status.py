"""gateway.records.cache_status: each outcome's ``X-Cache`` and ``Cache-Status``, as
docs/caching.md, "Response headers", documents them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.records.cache_status import circuit_open_label, hit_label, label
from gateway.records.decision import Outcome

O = Outcome  # noqa: E741

LABELS: list[tuple[str, Outcome, dict[str, Any], tuple[str, str]]] = [
    ("hit", O.HIT, {"left": 12.7}, ("HIT", "records-gateway; hit; ttl=12")),
    (
        "stale-refreshing",
        O.STALE_REFRESH,
        {"left": -4.2},
        ("STALE", "records-gateway; hit; ttl=-4"),
    ),
    # an entry less than a second past its TTL still says it is stale
    (
        "stale-just-expired",
        O.STALE_REFRESH,
        {"left": -0.3},
        ("STALE", "records-gateway; hit; ttl=-1"),
    ),
    (
        "stale-circuit-open",
        O.STALE_CIRCUIT_OPEN,
        {"left": -7.0},
        ("STALE", "records-gateway; hit; ttl=-7; detail=upstream-circuit-open"),
    ),
    (
        "stale-circuit-trial",
        O.STALE_CIRCUIT_TRIAL,
        {"left": -0.5},
        ("STALE", "records-gateway; hit; ttl=-1; detail=upstream-circuit-open"),
    ),
    ("bypass", O.BYPASS, {}, ("BYPASS", "records-gateway; fwd=bypass")),
    ("no-store", O.BYPASS_NO_STORE, {}, ("BYPASS", "records-gateway; fwd=request")),
    (
        "no-cache-stored",
        O.REVALIDATE,
        {"stored": True},
        ("BYPASS", "records-gateway; fwd=request; stored"),
    ),
    ("no-cache-not-stored", O.REVALIDATE, {}, ("BYPASS", "records-gateway; fwd=request")),
    ("miss-stored", O.FILL, {"stored": True}, ("MISS", "records-gateway; fwd=miss; stored")),
    ("miss-not-stored", O.FILL, {}, ("MISS", "records-gateway; fwd=miss")),
    (
        "miss-collapsed",
        O.FILL,
        {"collapsed": True},
        ("MISS", "records-gateway; fwd=miss; collapsed"),
    ),
    (
        "miss-cache-unavailable",
        O.FILL,
        {"cache_available": False},
        ("MISS", "records-gateway; fwd=miss; detail=cache-unavailable"),
    ),
    (
        "stale-collapsed",
        O.FILL_OR_STALE,
        {"stale": True},
        ("STALE", "records-gateway; fwd=stale; collapsed"),
    ),
    (
        "stale-instead-of-503",
        O.FILL_OR_STALE,
        {"stale": True, "failed_status": 503},
        ("STALE", "records-gateway; fwd=stale; fwd-status=503"),
    ),
    (
        "stale-instead-of-timeout",
        O.FILL_OR_STALE,
        {"stale": True, "failed_status": 0},
        ("STALE", "records-gateway; fwd=stale"),
    ),
    (
        "ended-fill-stored",
        O.TAKE_ENDED_FILL,
        {"stored": True},
        ("MISS", "records-gateway; fwd=miss; stored"),
    ),
]


@pytest.mark.parametrize(
    ("outcome", "facts", "expected"), [c[1:] for c in LABELS], ids=[c[0] for c in LABELS]
)
def test_label(outcome: Outcome, facts: dict[str, Any], expected: tuple[str, str]) -> None:
    assert label(outcome, **facts) == expected


@pytest.mark.parametrize("outcome", [O.LOOKUP, O.FAIL_CIRCUIT_OPEN])
def test_outcomes_that_serve_nothing_have_no_label(outcome: Outcome) -> None:
    with pytest.raises(ValueError, match="answers nothing from the cache"):
        label(outcome)


def test_every_serving_outcome_is_labelled() -> None:
    served = set(Outcome) - {O.LOOKUP, O.FAIL_CIRCUIT_OPEN}
    assert {outcome for _, outcome, _, _ in LABELS} == served


def test_a_hit_label_is_that_of_the_hit_outcome() -> None:
    assert hit_label(25) == label(O.HIT, left=25.9)[1] == "records-gateway; hit; ttl=25"


def test_the_circuit_open_failure_label() -> None:
    assert circuit_open_label() == "records-gateway; detail=upstream-circuit-open"
