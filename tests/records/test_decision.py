"""gateway.records.decision: every combination of facts has exactly one outcome, the
invariants of docs/caching.md, "Freshness", hold over the whole input space, and a
table of named cases states the documented behaviour."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cache.entry import CacheEntry
from gateway.records.decision import (
    SERVES_ENTRY,
    Circuit,
    EntryState,
    Facts,
    Outcome,
    decide,
    entry_state,
)

S = EntryState
C = Circuit
O = Outcome  # noqa: E741

facts_st = st.builds(
    Facts,
    caches=st.booleans(),
    no_store=st.booleans(),
    no_cache=st.booleans(),
    state=st.sampled_from(EntryState),
    circuit=st.sampled_from(Circuit),
    ended_fill_joins=st.booleans(),
)

ALL_FACTS = [
    Facts(*combo)
    for combo in itertools.product(
        (False, True), (False, True), (False, True), EntryState, Circuit, (False, True)
    )
]

STALE_SERVED = {O.STALE_REFRESH, O.STALE_CIRCUIT_TRIAL, O.STALE_CIRCUIT_OPEN}
FILLS = {O.FILL, O.FILL_OR_STALE, O.TAKE_ENDED_FILL}


def test_every_combination_of_facts_has_exactly_one_outcome() -> None:
    seen = {facts: decide(facts) for facts in ALL_FACTS}
    assert len(seen) == 2 * 2 * 2 * len(EntryState) * len(Circuit) * 2
    assert all(isinstance(outcome, Outcome) for outcome in seen.values())
    # and the space reaches every outcome: none is dead
    assert set(seen.values()) == set(Outcome)


@given(facts_st)
def test_the_decision_is_a_function_of_the_facts_alone(facts: Facts) -> None:
    assert decide(facts) is decide(Facts(*facts))


@given(facts_st)
def test_no_store_never_serves_from_the_cache_nor_stores(facts: Facts) -> None:
    if facts.no_store:
        assert decide(facts) in {O.BYPASS, O.BYPASS_NO_STORE}


@given(facts_st)
def test_without_caching_every_read_is_a_bypass(facts: Facts) -> None:
    if not facts.caches:
        assert decide(facts) is O.BYPASS


@given(facts_st)
def test_a_fresh_entry_without_directives_is_always_a_hit(facts: Facts) -> None:
    plain = facts.caches and not facts.no_store and not facts.no_cache
    if plain and facts.state is S.FRESH:
        assert decide(facts) is O.HIT


@given(facts_st)
def test_only_a_fresh_entry_is_a_hit(facts: Facts) -> None:
    if decide(facts) is O.HIT:
        assert facts.state is S.FRESH


@given(facts_st)
def test_an_entry_beyond_both_stale_windows_is_never_served(facts: Facts) -> None:
    if facts.state in {S.EXPIRED, S.ABSENT, S.UNAVAILABLE}:
        outcome = decide(facts)
        assert outcome not in SERVES_ENTRY
        assert outcome is not O.FILL_OR_STALE


@given(facts_st)
def test_stale_entries_are_served_only_within_their_windows(facts: Facts) -> None:
    outcome = decide(facts)
    if outcome in STALE_SERVED:
        assert facts.state in {S.STALE_REVALIDATE, S.STALE_IF_ERROR}
    if outcome is O.FILL_OR_STALE:
        assert facts.state is S.STALE_IF_ERROR


@given(facts_st)
def test_a_held_circuit_never_fills_nor_refreshes(facts: Facts) -> None:
    if facts.circuit is C.HELD:
        outcome = decide(facts)
        assert outcome not in FILLS
        assert outcome not in {O.STALE_REFRESH, O.STALE_CIRCUIT_TRIAL}


@given(facts_st)
def test_an_open_circuit_never_makes_a_caller_with_a_stale_entry_wait(facts: Facts) -> None:
    directives = facts.no_store or facts.no_cache
    stale = facts.state in {S.STALE_REVALIDATE, S.STALE_IF_ERROR}
    if facts.caches and not directives and stale and facts.circuit is not C.CLOSED:
        assert decide(facts) in {O.STALE_CIRCUIT_TRIAL, O.STALE_CIRCUIT_OPEN}


@given(facts_st)
def test_the_cache_is_read_only_when_it_is_not_yet_read(facts: Facts) -> None:
    assert (decide(facts) is O.LOOKUP) == (
        facts.caches and not facts.no_store and not facts.no_cache and facts.state is S.UNREAD
    )


@given(facts_st)
def test_an_ended_fill_is_taken_only_by_a_read_that_would_fill(facts: Facts) -> None:
    if decide(facts) is O.TAKE_ENDED_FILL:
        assert facts.ended_fill_joins
        assert decide(facts._replace(ended_fill_joins=False)) in {O.FILL, O.FILL_OR_STALE}


PLAIN = Facts(caches=True, no_store=False, no_cache=False)
SWR, SIE = S.STALE_REVALIDATE, S.STALE_IF_ERROR


def plain(**changes: Any) -> Facts:
    """A request without cache directives on a caching route, with ``changes``."""
    return PLAIN._replace(**changes)


CASES = [
    ("route-ttl-0-or-no-cache", Facts(False, False, False), O.BYPASS),
    ("no-store-without-cache", Facts(False, True, False), O.BYPASS),
    ("no-store", Facts(True, True, False, S.FRESH), O.BYPASS_NO_STORE),
    ("no-store-beats-no-cache", Facts(True, True, True), O.BYPASS_NO_STORE),
    ("no-cache-honoured", Facts(True, False, True, S.FRESH), O.REVALIDATE),
    ("not-read-yet", PLAIN, O.LOOKUP),
    ("fresh", plain(state=S.FRESH), O.HIT),
    ("fresh-circuit-open", plain(state=S.FRESH, circuit=C.HELD), O.HIT),
    ("absent", plain(state=S.ABSENT), O.FILL),
    ("cache-unavailable", plain(state=S.UNAVAILABLE), O.FILL),
    ("too-old", plain(state=S.EXPIRED), O.FILL),
    ("stale-while-revalidate", plain(state=SWR), O.STALE_REFRESH),
    ("stale-while-revalidate-circuit-held", plain(state=SWR, circuit=C.HELD), O.STALE_CIRCUIT_OPEN),
    (
        "stale-while-revalidate-trial-due",
        plain(state=SWR, circuit=C.TRIAL_DUE),
        O.STALE_CIRCUIT_TRIAL,
    ),
    ("stale-if-error", plain(state=SIE), O.FILL_OR_STALE),
    ("stale-if-error-circuit-held", plain(state=SIE, circuit=C.HELD), O.STALE_CIRCUIT_OPEN),
    ("stale-if-error-trial-due", plain(state=SIE, circuit=C.TRIAL_DUE), O.STALE_CIRCUIT_TRIAL),
    ("absent-circuit-held", plain(state=S.ABSENT, circuit=C.HELD), O.FAIL_CIRCUIT_OPEN),
    ("too-old-circuit-held", plain(state=S.EXPIRED, circuit=C.HELD), O.FAIL_CIRCUIT_OPEN),
    ("absent-trial-due-is-the-trial", plain(state=S.ABSENT, circuit=C.TRIAL_DUE), O.FILL),
    ("ended-fill-joins", plain(state=S.ABSENT, ended_fill_joins=True), O.TAKE_ENDED_FILL),
    ("ended-fill-with-stale-if-error", plain(state=SIE, ended_fill_joins=True), O.TAKE_ENDED_FILL),
    (
        "ended-fill-circuit-held-fails",
        plain(state=S.ABSENT, circuit=C.HELD, ended_fill_joins=True),
        O.FAIL_CIRCUIT_OPEN,
    ),
]


@pytest.mark.parametrize(("facts", "outcome"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_named_case(facts: Facts, outcome: Outcome) -> None:
    assert decide(facts) is outcome


def _entry(stored_at: float, ttl_s: int) -> CacheEntry:
    return CacheEntry(body=b"{}", etag='"e"', stored_at=stored_at, ttl_s=ttl_s)


@pytest.mark.parametrize(
    ("now", "state"),
    [
        (0.0, S.FRESH),
        (59.999, S.FRESH),
        (60.0, S.STALE_REVALIDATE),  # a TTL's last instant is no longer fresh
        (89.999, S.STALE_REVALIDATE),
        (90.0, S.STALE_IF_ERROR),
        (659.999, S.STALE_IF_ERROR),
        (660.0, S.EXPIRED),
    ],
    ids=["stored", "last-fresh", "ttl-over", "last-swr", "swr-over", "last-sie", "sie-over"],
)
def test_entry_state_follows_the_ttl_and_the_windows(now: float, state: EntryState) -> None:
    assert entry_state(_entry(0.0, 60), now, 30, 600) is state


def test_no_entry_is_absent() -> None:
    assert entry_state(None, 5.0, 30, 600) is S.ABSENT


def test_a_stale_if_error_window_within_the_revalidate_one_adds_nothing() -> None:
    entry = _entry(0.0, 60)
    assert entry_state(entry, 70.0, 30, 5) is S.STALE_REVALIDATE
    assert entry_state(entry, 95.0, 30, 5) is S.EXPIRED


@given(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=-1e3, max_value=2e6, allow_nan=False),
)
def test_freshness_is_one_rule(stored_at: float, ttl_s: int, now: float) -> None:
    entry = _entry(stored_at, ttl_s)
    fresh = entry_state(entry, now, 30, 600) is S.FRESH
    assert fresh == entry.is_fresh(now) == (entry.left(now) > 0)
