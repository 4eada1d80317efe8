"""The circuit breaker's tickets, probation and streak window (the upstream's uses;
the cache's breaker is tested in tests/cache/test_breaker.py)."""

from __future__ import annotations

import logging

import pytest

from gateway.ops.circuit import CircuitBreaker, CircuitState

OPEN, CLOSED, HALF_OPEN = CircuitState.OPEN, CircuitState.CLOSED, CircuitState.HALF_OPEN


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def upstream_breaker(monotonic: Monotonic, **options: float) -> CircuitBreaker:
    settings = {"failures": 2, "reset_s": 5.0, "streak_window_s": 10.0, **options}
    return CircuitBreaker(
        failures=int(settings["failures"]),
        reset_s=settings["reset_s"],
        streak_window_s=settings["streak_window_s"],
        name="upstream",
        skipping="not calling it",
        monotonic=monotonic,
    )


def test_a_call_admitted_before_the_circuit_opened_does_not_end_the_trial() -> None:
    clock = Monotonic()
    circuit = upstream_breaker(clock)
    early, late = circuit.admit(), circuit.admit()  # two calls out while closed
    first, second = circuit.admit(), circuit.admit()
    circuit.failed("timeout", first)
    circuit.failed("timeout", second)
    assert circuit.state is OPEN
    clock.now += 5
    trial = circuit.admit()
    assert trial is not None
    assert circuit.state is HALF_OPEN
    assert circuit.admit() is None, "one trial at a time"

    circuit.failed("timeout", early)  # ends during the trial: changes nothing
    assert circuit.state is HALF_OPEN
    assert circuit.admit() is None
    circuit.succeeded(late)  # nor does a late success close it
    assert circuit.state is HALF_OPEN

    circuit.succeeded(trial)
    assert circuit.state is CLOSED
    assert circuit.quiet


def test_a_late_success_never_closes_an_open_circuit() -> None:
    clock = Monotonic()
    circuit = upstream_breaker(clock)
    early = circuit.admit()
    circuit.failed("503", circuit.admit())
    circuit.failed("503", circuit.admit())
    assert circuit.state is OPEN
    circuit.succeeded(early)
    assert circuit.state is OPEN
    assert circuit.retry_after_s() == 5


def test_a_trial_that_only_proves_the_upstream_answers_closes_on_probation() -> None:
    clock = Monotonic()
    circuit = upstream_breaker(clock, failures=5)
    for _ in range(5):
        circuit.failed("503", circuit.admit())
    clock.now += 5
    circuit.succeeded(circuit.admit(), conclusive=False)
    assert circuit.state is CLOSED
    assert not circuit.quiet
    circuit.succeeded(circuit.admit(), conclusive=False)  # the next check ends nothing
    circuit.failed("503", circuit.admit())  # one failure is enough to reopen it
    assert circuit.state is OPEN

    clock.now += 5
    circuit.succeeded(circuit.admit())  # a conclusive trial: a fresh start
    circuit.failed("503", circuit.admit())
    assert circuit.state is CLOSED


def test_failures_further_apart_than_the_window_are_no_streak() -> None:
    clock = Monotonic()
    circuit = upstream_breaker(clock, failures=2, streak_window_s=1.0)
    circuit.failed("503", circuit.admit())
    clock.now += 1.5
    circuit.failed("503", circuit.admit())
    assert circuit.state is CLOSED
    clock.now += 0.5
    circuit.failed("503", circuit.admit())
    assert circuit.state is OPEN


def test_the_first_opening_warns_and_failed_trials_do_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.upstream")
    clock = Monotonic()
    circuit = upstream_breaker(clock)
    circuit.failed("503", circuit.admit())
    circuit.failed("503", circuit.admit())
    for _ in range(3):
        clock.now += 5
        circuit.failed("503", circuit.admit())
    levels = [(r.levelname, getattr(r, "to", None)) for r in caplog.records]
    assert levels == [("WARNING", "open")] + [("INFO", "half-open"), ("INFO", "open")] * 3


def test_an_inconclusive_success_breaks_no_streak_of_failures() -> None:
    circuit = upstream_breaker(Monotonic(), failures=3)
    circuit.failed("503", circuit.admit())
    circuit.failed("503", circuit.admit())
    circuit.succeeded(circuit.admit(), conclusive=False)  # a check's 401 from a proxy
    circuit.failed("503", circuit.admit())
    assert circuit.state is OPEN
