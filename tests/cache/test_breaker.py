"""The circuit breaker, its window and the guarded cache: faults become misses, logged
once per change; a failure share opens the circuit as failures in a row do; a PING never
closes it. Time is a fake monotonic clock moved by hand."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from gateway.cache.backend import SHARED
from gateway.cache.breaker import GuardedCache
from gateway.cache.entry import CacheEntry, CacheKey, Generations, Lookup
from gateway.cache.memory import MemoryBackend
from gateway.errors import CacheUnavailable
from gateway.ops.circuit import CircuitBreaker, CircuitState, OutcomeWindow
from gateway.ops.health import CacheOutcomes, Tally

OPEN, CLOSED, HALF_OPEN = CircuitState.OPEN, CircuitState.CLOSED, CircuitState.HALF_OPEN
KEY = CacheKey("users", "k")
ENTRY = CacheEntry(b"x", '"x"', 1.0, 30)
OOM = "redis SET: OutOfMemoryError: command not allowed when used memory > 'maxmemory'."


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FaultyBackend(MemoryBackend):
    """A memory backend whose reads, writes and probes fail on demand, and whose PING
    always answers (as a full or read-only Redis's does). Shared, as Redis is, with
    ``held`` standing for what its near cache holds in this process."""

    name = "faulty"
    capabilities = SHARED

    def __init__(self) -> None:
        super().__init__(max_bytes=1024 * 1024, clock=lambda: 1.0)
        self.reads_fail = False
        self.every_other_read_fails = False
        self.writes_fail = False
        self.probe_fails = False
        self.calls = 0
        self.reads = 0
        self.pings = 0
        self.probes = 0
        self.gate: asyncio.Event | None = None
        self.held: CacheEntry | None = None

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return self.held

    async def get(self, key: CacheKey) -> Lookup:
        self.calls += 1
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.reads_fail or (self.every_other_read_fails and self.reads % 2 == 0):
            raise CacheUnavailable(
                "redis GET: ClusterCrossSlotError: Keys in request don't hash to the same slot"
            )
        return Lookup(None, Generations())

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        self.calls += 1
        if self.writes_fail:
            raise CacheUnavailable(OOM)

    async def ping(self) -> None:
        self.pings += 1

    async def probe(self) -> None:
        self.probes += 1
        if self.probe_fails:
            raise CacheUnavailable(OOM)


def breaker(
    monotonic: Monotonic,
    *,
    failures: int = 5,
    reset_s: float = 5.0,
    window_s: float = 10.0,
    failure_share: float = 0.5,
    min_calls: int = 20,
) -> CircuitBreaker:
    return CircuitBreaker(
        failures=failures,
        reset_s=reset_s,
        window_s=window_s,
        failure_share=failure_share,
        min_calls=min_calls,
        monotonic=monotonic,
    )


@pytest.fixture
def monotonic() -> Monotonic:
    return Monotonic()


@pytest.fixture
def backend() -> FaultyBackend:
    return FaultyBackend()


# The breaker alone


def test_a_failure_share_over_the_window_opens_it(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic)
    # one call in two fails, never two in a row: only the share can open it
    for call in range(19):
        assert circuit.allow()
        if call % 2:
            circuit.failed("redis SET: OOM")
        else:
            circuit.succeeded()
        monotonic.now += 0.1
    assert circuit.state is CLOSED  # 19 calls: fewer than min_calls
    assert circuit.tally() == Tally(ok=10, failed=9)
    circuit.failed("redis SET: OOM")  # 20 calls, 10 failed: the share is reached
    assert circuit.state is OPEN
    assert not circuit.allow()


def test_below_the_share_it_stays_closed(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic)
    for call in range(200):
        if call % 3 == 0:
            circuit.failed("redis GET: timeout")
        else:
            circuit.succeeded()
        monotonic.now += 0.01
    assert circuit.state is CLOSED
    assert circuit.tally() == Tally(ok=133, failed=67)


def test_failures_in_a_row_still_open_it(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=3)
    for _ in range(10):
        circuit.succeeded()
    circuit.failed("redis GET: no answer within 50 ms")
    circuit.failed("redis GET: no answer within 50 ms")
    assert circuit.state is CLOSED
    circuit.failed("redis GET: no answer within 50 ms")  # 3 of 13 calls, but in a row
    assert circuit.state is OPEN
    assert circuit.last_error == "redis GET: no answer within 50 ms"


def test_a_success_resets_the_row_but_not_the_windows_failures(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=5, min_calls=20)
    for _ in range(9):
        circuit.failed("redis SET: OOM")
        circuit.succeeded()  # four failures in a row never happen
    circuit.succeeded()
    assert (circuit.state, circuit.tally()) == (CLOSED, Tally(ok=10, failed=9))
    circuit.failed("redis SET: OOM")  # the tenth failure of twenty calls
    assert circuit.state is OPEN


def test_a_success_that_brings_the_window_to_min_calls_opens_it(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=100, min_calls=4)
    circuit.failed("e")
    circuit.succeeded()
    circuit.failed("e")
    assert circuit.state is CLOSED
    circuit.succeeded()  # 4 calls, 2 failed: half of them
    assert circuit.state is OPEN


def test_failures_older_than_the_window_do_not_count(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=100, window_s=10, min_calls=4)
    for _ in range(3):
        circuit.failed("e")
    monotonic.now += 5
    assert circuit.tally() == Tally(ok=0, failed=3)
    monotonic.now += 5.1  # the three failures are now more than the window old
    assert circuit.tally() == Tally(ok=0, failed=0)
    circuit.failed("e")
    circuit.succeeded()
    circuit.succeeded()
    circuit.succeeded()
    assert (circuit.state, circuit.tally()) == (CLOSED, Tally(ok=3, failed=1))


def test_the_window_slides_bucket_by_bucket(monotonic: Monotonic) -> None:
    window = OutcomeWindow(10.0)
    monotonic.now = 1000.0
    for second in range(10):
        window.add(monotonic.now + second, failed=second % 2 == 1)
    assert window.tally(monotonic.now + 9.5) == Tally(ok=5, failed=5)
    # each second drops the oldest second
    assert window.tally(monotonic.now + 10.0) == Tally(ok=4, failed=5)
    assert window.tally(monotonic.now + 11.0) == Tally(ok=4, failed=4)
    assert window.tally(monotonic.now + 18.0) == Tally(ok=0, failed=1)
    assert window.tally(monotonic.now + 19.0) == Tally(ok=0, failed=0)
    window.add(monotonic.now + 19.0, failed=True)
    window.add(monotonic.now + 500.0, failed=False)  # a long quiet: nothing older counts
    assert window.tally(monotonic.now + 500.0) == Tally(ok=1, failed=0)
    # a clock that went back adds to the newest bucket
    window.add(monotonic.now + 499.0, failed=True)
    assert window.tally(monotonic.now + 500.5) == Tally(ok=1, failed=1)


def test_half_open_lets_one_trial_through_whose_outcome_decides(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=1, reset_s=5)
    circuit.failed("redis GET: refused")
    assert circuit.state is OPEN
    monotonic.now += 4.9
    assert not circuit.allow()
    monotonic.now += 0.1
    assert circuit.allow()  # the trial
    assert circuit.state is HALF_OPEN
    assert not circuit.allow()  # one at a time
    circuit.failed("redis GET: refused")
    assert circuit.state is OPEN  # the failed trial opens it again, for reset_s more
    monotonic.now += 4.9
    assert not circuit.allow()
    monotonic.now += 0.1
    assert circuit.allow()
    circuit.abandoned()  # the trial was cancelled: another call may try
    assert circuit.allow()
    circuit.succeeded()
    assert circuit.state is CLOSED
    assert circuit.allow()
    assert circuit.allow()


def test_outcomes_while_open_change_nothing(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=1, reset_s=5)
    circuit.failed("redis GET: refused")
    # calls that began before it opened finish: a success does not close it
    circuit.succeeded()
    assert circuit.state is OPEN
    monotonic.now += 3
    circuit.failed("redis SET: refused")
    assert circuit.state is OPEN
    monotonic.now += 2  # reset_s after the opening, not after the late failure
    assert circuit.allow()


def test_after_closing_the_window_starts_afresh(monotonic: Monotonic) -> None:
    circuit = breaker(monotonic, failures=100, reset_s=5, min_calls=4)
    for _ in range(2):
        circuit.succeeded()
        circuit.failed("redis SET: OOM")
    assert circuit.state is OPEN
    monotonic.now += 5  # still within the window of those failures
    assert circuit.allow()
    circuit.succeeded()
    assert (circuit.state, circuit.tally()) == (CLOSED, Tally(ok=0, failed=0))
    circuit.failed("redis SET: OOM")  # with the old failures it would reopen at once
    circuit.succeeded()
    circuit.succeeded()
    assert circuit.state is CLOSED


def test_state_changes_are_logged_once_each(
    monotonic: Monotonic, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.cache")
    circuit = breaker(monotonic, failures=100, min_calls=4)
    for _ in range(10):
        circuit.failed("redis SET: OOM")
    monotonic.now += 5
    circuit.allow()
    circuit.succeeded()
    assert [(r.levelname, getattr(r, "to", None)) for r in caplog.records] == [
        ("WARNING", "open"),
        ("INFO", "half-open"),
        ("INFO", "closed"),
    ]
    assert getattr(caplog.records[0], "error", None) == "redis SET: OOM"


# The guarded cache


async def test_breaker_opens_skips_then_retries_and_closes(
    backend: FaultyBackend, monotonic: Monotonic, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.cache")
    backend.reads_fail = backend.writes_fail = True
    cache = GuardedCache(backend, breaker(monotonic, failures=3, reset_s=5))
    for _ in range(10):
        assert await cache.get(KEY) is None
    assert backend.calls == 3  # the breaker opened after three failures
    assert cache.breaker.state is OPEN
    assert cache.errors == 3

    monotonic.now += 5
    assert await cache.get(KEY) is None  # the one trial fails: open again
    assert backend.calls == 4
    assert cache.breaker.state is OPEN

    backend.reads_fail = backend.writes_fail = False
    monotonic.now += 5
    assert await cache.get(KEY) == Lookup(None, Generations())
    assert cache.breaker.state is CLOSED
    assert await cache.set(KEY, ENTRY, 60) is True

    transitions = [getattr(r, "to", None) for r in caplog.records]
    assert transitions == ["open", "half-open", "open", "half-open", "closed"]


async def test_a_redis_that_fails_every_write_and_half_the_reads_is_skipped(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    backend.writes_fail = True
    backend.every_other_read_fails = True
    cache = GuardedCache(backend, breaker(monotonic))
    # each request reads and, after a read that worked, stores what the upstream said:
    # never more than two failures in a row, two calls in three failed
    for _ in range(12):
        if await cache.get(KEY) is not None:
            await cache.set(KEY, ENTRY, 60)
        monotonic.now += 0.05
    assert cache.breaker.tally() == Tally(ok=6, failed=12)
    assert await cache.get(KEY) is not None
    assert cache.breaker.state is CLOSED  # 19 calls: fewer than min_calls
    assert await cache.set(KEY, ENTRY, 60) is False
    assert cache.breaker.state is OPEN
    calls = backend.calls
    for _ in range(10):  # skipped: no call reaches the backend
        assert await cache.get(KEY) is None
        assert await cache.set(KEY, ENTRY, 60) is False
    assert backend.calls == calls


async def test_a_full_redis_opens_it_although_every_read_passes(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    backend.writes_fail = True
    cache = GuardedCache(backend, breaker(monotonic))
    for _ in range(10):
        assert await cache.get(KEY) == Lookup(None, Generations())
        assert await cache.set(KEY, ENTRY, 60) is False
    assert cache.breaker.state is OPEN
    assert cache.errors == 10
    assert cache.outcomes() == CacheOutcomes(
        circuit="open",
        last_error=OOM,
        reads=Tally(ok=10, failed=0),
        writes=Tally(ok=0, failed=10),
        probes=Tally(ok=0, failed=0),
    )


async def test_outcomes_are_kept_per_kind_over_the_window(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    cache = GuardedCache(backend, breaker(monotonic, failures=100, window_s=10))
    for _ in range(3):
        await cache.get(KEY)
    backend.writes_fail = True
    await cache.set(KEY, ENTRY, 60)
    backend.probe_fails = True
    with pytest.raises(CacheUnavailable):
        await cache.check()
    seen = cache.outcomes()
    assert (seen.reads, seen.writes, seen.probes) == (
        Tally(ok=3, failed=0),
        Tally(ok=0, failed=1),
        Tally(ok=0, failed=1),
    )
    assert (seen.circuit, seen.last_error) == ("closed", OOM)
    monotonic.now += 10
    seen = cache.outcomes()
    assert (seen.reads, seen.writes, seen.probes) == (Tally(0, 0), Tally(0, 0), Tally(0, 0))
    assert seen.last_error == OOM  # the latest error stays, as the breaker's does


async def test_the_check_probes_and_never_pings(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    cache = GuardedCache(backend, breaker(monotonic, failures=2, reset_s=5))
    await cache.check()
    backend.probe_fails = True
    with pytest.raises(CacheUnavailable, match="OutOfMemoryError"):
        await cache.check()
    with pytest.raises(CacheUnavailable, match="OutOfMemoryError"):
        await cache.check()
    # while closed a probe is an ordinary call: two failed ones in a row opened it
    assert cache.breaker.state is OPEN
    assert (backend.probes, backend.pings) == (3, 0)


async def test_a_probe_closes_an_open_circuit_only_as_its_trial(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    backend.reads_fail = True
    cache = GuardedCache(backend, breaker(monotonic, failures=1, reset_s=5))
    assert await cache.get(KEY) is None
    assert cache.breaker.state is OPEN
    backend.reads_fail = False
    # PING and the probe both pass, but the reset time has not passed: still open
    await cache.check()
    monotonic.now += 4.9
    await cache.check()
    assert cache.breaker.state is OPEN
    assert await cache.get(KEY) is None
    monotonic.now += 0.1
    backend.probe_fails = True
    with pytest.raises(CacheUnavailable):
        await cache.check()  # the trial, failed: open again for reset_s
    assert cache.breaker.state is OPEN
    backend.probe_fails = False
    monotonic.now += 4.9
    await cache.check()
    assert cache.breaker.state is OPEN
    monotonic.now += 0.1
    await cache.check()  # the trial, passed
    assert cache.breaker.state is CLOSED
    assert backend.pings == 0


async def test_a_probe_does_not_take_a_running_trials_place(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    backend.reads_fail = True
    cache = GuardedCache(backend, breaker(monotonic, failures=1, reset_s=5))
    await cache.get(KEY)
    backend.reads_fail = False
    monotonic.now += 5
    backend.gate = asyncio.Event()
    trial = asyncio.ensure_future(cache.get(KEY))
    await asyncio.sleep(0)
    assert cache.breaker.state is HALF_OPEN
    backend.probe_fails = True
    with pytest.raises(CacheUnavailable):
        await cache.check()  # outside the breaker: the trial decides
    assert cache.breaker.state is HALF_OPEN
    backend.gate.set()
    assert await trial == Lookup(None, Generations())
    assert cache.breaker.state is CLOSED


async def test_a_cancelled_trial_frees_the_way_for_the_next(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    backend.reads_fail = True
    cache = GuardedCache(backend, breaker(monotonic, failures=1, reset_s=5))
    await cache.get(KEY)
    backend.reads_fail = False
    monotonic.now += 5
    backend.gate = asyncio.Event()
    trial = asyncio.ensure_future(cache.get(KEY))
    await asyncio.sleep(0)
    trial.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trial
    backend.gate = None
    assert await cache.get(KEY) == Lookup(None, Generations())
    assert cache.breaker.state is CLOSED


async def test_fresh_is_served_only_while_closed(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    backend.held = ENTRY
    cache = GuardedCache(backend, breaker(monotonic, failures=1))
    assert cache.fresh(KEY) is ENTRY
    backend.reads_fail = True
    # a fresh entry held in the process answers get too, without a backend call
    assert (await cache.get(KEY)) == Lookup(ENTRY, ENTRY.generations)
    assert cache.breaker.state is CLOSED
    assert cache.outcomes().reads.ok == 0
    backend.held = None
    await cache.get(KEY)
    assert cache.breaker.state is OPEN
    backend.held = ENTRY
    assert cache.fresh(KEY) is None


async def test_a_hit_held_in_the_process_is_never_the_half_open_trial(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    """A near-cache hit says nothing of Redis: it neither closes a half-open circuit
    nor counts as a passed read."""
    cache = GuardedCache(backend, breaker(monotonic, failures=1))
    backend.reads_fail = True
    await cache.get(KEY)
    assert cache.breaker.state is OPEN
    monotonic.now += 5.0  # the reset time has passed: the next call is the trial
    backend.held = ENTRY  # the near cache holds a copy
    assert await cache.get(KEY) is None  # the trial goes to the backend, and fails
    assert cache.breaker.state is OPEN


async def test_a_store_without_its_purge_number_takes_no_trial_of_the_breaker(
    backend: FaultyBackend, monotonic: Monotonic
) -> None:
    """A fill that began while the breaker was open has no purge number and stores
    nothing; when its upstream call ends after the breaker's reset, the trial stays
    for the next call that uses the cache (before, it was taken and never ended: the
    cache was off in the process for good)."""
    backend.capabilities = replace(SHARED, purges_records=True)
    backend.reads_fail = backend.writes_fail = True
    cache = GuardedCache(backend, breaker(monotonic, failures=3, reset_s=5))
    for _ in range(3):
        assert await cache.get(KEY) is None
    assert cache.breaker.state is OPEN
    since = await cache.purge_sequence()
    assert since is None
    monotonic.now += 5  # the upstream answers after the reset
    backend.reads_fail = backend.writes_fail = False
    assert await cache.set(KEY, ENTRY, 60, held={"user:1": ""}, since=since) is False
    assert await cache.get(KEY) == Lookup(None, Generations())  # the trial: a read
    assert cache.breaker.state is CLOSED
