"""Circuit breakers: how the gateway stops calling a dependency that fails (the cache,
the upstream) and tries it again later, one call at a time.

A :class:`CircuitBreaker` opens (closed -> open) after ``failures`` failures in a row,
or when over the last ``window_s`` seconds at least ``min_calls`` calls were made and
at least ``failure_share`` of them failed (a dependency that fails some calls but not
``failures`` in a row); ``streak_window_s``, when set, keeps only failures that came
within that many seconds of each other in a row (five failures spread over an hour are
not an outage). After ``reset_s`` one call tries the dependency (half-open), whose
success closes the circuit with a fresh window and whose failure opens it again.
State changes are logged once each, not once per call.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable

from gateway.ops.health import Tally

# a window is kept in this many buckets: it spans the last nine tenths of
# ``window_s`` to the whole of it, whatever its length
_BUCKETS = 10


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_HALF_OPEN = CircuitState.HALF_OPEN


class OutcomeWindow:
    """Calls and failures over the last ``window_s`` seconds: a ring of buckets and
    running totals, so that adding an outcome is O(1) and allocates nothing."""

    __slots__ = ("_bucket", "_calls", "_failed", "_per_s", "calls", "failed")

    def __init__(self, window_s: float) -> None:
        self._per_s = _BUCKETS / window_s
        self._calls = [0] * _BUCKETS
        self._failed = [0] * _BUCKETS
        self._bucket = -(2**62)  # the newest bucket's number (time * _per_s)
        self.calls = 0  # totals over the window as of the latest add or tally
        self.failed = 0

    def add(self, now: float, failed: bool) -> None:
        bucket = int(now * self._per_s)
        if bucket != self._bucket:
            self._advance(bucket)
        slot = self._bucket % _BUCKETS
        self._calls[slot] += 1
        self.calls += 1
        if failed:
            self._failed[slot] += 1
            self.failed += 1

    def tally(self, now: float) -> Tally:
        """What passed and failed over the window ending at ``now``."""
        self._advance(int(now * self._per_s))
        return Tally(ok=self.calls - self.failed, failed=self.failed)

    def _advance(self, bucket: int) -> None:
        # empties the buckets between the newest one and ``bucket``, at most all of them
        newest = self._bucket
        if bucket <= newest:
            return  # a clock that went back: keep adding to the newest bucket
        for number in range(newest + 1, newest + 1 + min(bucket - newest, _BUCKETS)):
            slot = number % _BUCKETS
            self.calls -= self._calls[slot]
            self.failed -= self._failed[slot]
            self._calls[slot] = self._failed[slot] = 0
        self._bucket = bucket

    def clear(self) -> None:
        for slot in range(_BUCKETS):
            self._calls[slot] = self._failed[slot] = 0
        self.calls = self.failed = 0


class CircuitBreaker:
    """Opens after ``failures`` failures in a row, or on a failure share of at least
    ``failure_share`` over the last ``window_s`` seconds once ``min_calls`` calls were
    made in it; lets one trial through after ``reset_s``.

    Callers ask :meth:`allow` before a call and report it with :meth:`succeeded` or
    :meth:`failed` (or :meth:`abandoned` when it never finished). Outcomes reported
    while the circuit is open (calls that began before it opened) change nothing.
    """

    def __init__(
        self,
        *,
        failures: int,
        reset_s: float,
        window_s: float = 10.0,
        failure_share: float = 0.5,
        min_calls: int = 20,
        streak_window_s: float | None = None,
        name: str = "cache",
        skipping: str = "skipping the cache",
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[CircuitState], None] | None = None,
    ) -> None:
        """``name`` and ``skipping`` say in the log what is open and what the gateway
        does meanwhile; state changes are logged by ``gateway.<name>``."""
        self._on_change = on_change
        self._threshold = failures
        self._reset_s = reset_s
        self._share = failure_share
        self._min_calls = min_calls
        self._streak_window_s = streak_window_s
        self.name = name
        self._skipping = skipping
        self._event = f"{name}_circuit"
        self._log = logging.getLogger(f"gateway.{name}")
        self.window_s = window_s
        self.monotonic = monotonic
        self._window = OutcomeWindow(window_s)
        self._in_a_row = 0
        self._last_failed_at = -math.inf
        self._opened_at = 0.0
        self._trial_running = False
        # the number of the current period: it moves on when the circuit opens and
        # when a trial begins, so that an outcome reported with an older ticket (a call
        # admitted before) is told from the trial's
        self._period = 0
        self._opening: asyncio.Future[None] | None = None
        self.state = CircuitState.CLOSED
        self.last_error: str | None = None

    def opening(self) -> asyncio.Future[None]:
        """A future done when the circuit next opens: what a caller waiting on a call
        it could do without (it holds a stale answer) waits on beside the call."""
        opening = self._opening
        if opening is None or opening.done():
            opening = self._opening = asyncio.get_running_loop().create_future()
        return opening

    @property
    def reset_s(self) -> float:
        return self._reset_s

    def retry_after_s(self) -> float:
        """Seconds until the open circuit lets a trial through (0 when it is not open)."""
        if self.state is not _OPEN:
            return 0.0
        return max(0.0, self._opened_at + self._reset_s - self.monotonic())

    @property
    def quiet(self) -> bool:
        """Closed, and the latest call did not fail: what a caller checks before
        spending a second attempt on a call (never against a failing dependency)."""
        return self.state is _CLOSED and self._in_a_row == 0

    def admit(self) -> int | None:
        """:meth:`allow` with a ticket to report the call's outcome with (None: not
        allowed). An outcome whose ticket is not the current period's is ignored: a
        call admitted before the circuit opened, which ends during a trial, neither
        ends the trial nor closes or reopens the circuit."""
        return self._period if self.allow() else None

    def trial_due(self) -> bool:
        """Whether :meth:`allow` would let a trial through now (the circuit is not
        closed, and no trial is running), without starting one."""
        if self.state is _OPEN:
            return self.monotonic() - self._opened_at >= self._reset_s
        return self.state is _HALF_OPEN and not self._trial_running

    def allow(self) -> bool:
        """Whether a call may go to the backend now; in half-open, only the trial."""
        if self.state is _CLOSED:
            return True
        if self.state is _OPEN:
            if self.monotonic() - self._opened_at < self._reset_s:
                return False
            self._change(_HALF_OPEN, None)
        if self._trial_running:
            return False
        self._trial_running = True
        self._period += 1
        return True

    def succeeded(self, ticket: int | None = None, *, conclusive: bool = True) -> None:
        """A call passed. ``ticket``: the one :meth:`admit` gave it (None: count it
        whenever it was admitted). A trial that passes without ``conclusive`` (one
        that proves the dependency answers, not that it works: a readiness check
        without credentials) closes the circuit on probation: the next failure opens
        it again."""
        if ticket is not None and ticket != self._period:
            return
        state = self.state
        if state is _CLOSED:
            if not conclusive:
                return  # proves nothing of a closed circuit: no streak broken, no count
            self._in_a_row = 0
            window = self._window
            window.add(self.monotonic(), False)
            # the call that brings the window to min_calls may be a success
            if window.failed and self._share_reached(window):
                self._open(self.last_error)
        elif state is _HALF_OPEN:
            self._trial_running = False
            self._window.clear()  # failures from before the outage must not reopen it
            if conclusive:
                self._in_a_row = 0
            else:
                self._in_a_row = self._threshold - 1
                self._last_failed_at = self.monotonic()
            self._change(_CLOSED, None)

    def failed(self, error: str, ticket: int | None = None) -> None:
        """A call failed with ``error`` (``ticket`` as for :meth:`succeeded`)."""
        if ticket is not None and ticket != self._period:
            return
        self.last_error = error
        state = self.state
        if state is _CLOSED:
            now = self.monotonic()
            window_s = self._streak_window_s
            if window_s is not None and now - self._last_failed_at > window_s:
                self._in_a_row = 0  # the failures before are too long ago to be a streak
            self._last_failed_at = now
            self._in_a_row += 1
            window = self._window
            window.add(now, True)
            if self._in_a_row >= self._threshold or self._share_reached(window):
                self._open(error)
        elif state is _HALF_OPEN:
            self._trial_running = False
            self._open(error)

    def abandoned(self, ticket: int | None = None) -> None:
        """A call :meth:`allow` let through will not report (it was cancelled): in
        half-open, another call may be the trial."""
        if ticket is not None and ticket != self._period:
            return
        if self.state is _HALF_OPEN:
            self._trial_running = False

    def tally(self) -> Tally:
        """Calls that passed and failed over the window (since the circuit last closed)."""
        return self._window.tally(self.monotonic())

    def _share_reached(self, window: OutcomeWindow) -> bool:
        return window.calls >= self._min_calls and window.failed / window.calls >= self._share

    def _open(self, error: str | None) -> None:
        self._opened_at = self.monotonic()
        self._period += 1
        self._change(_OPEN, error)

    def _change(self, state: CircuitState, error: str | None) -> None:
        previous, self.state = self.state, state
        opening = self._opening
        if state is _OPEN and opening is not None:
            self._opening = None
            if not opening.done():
                opening.set_result(None)
        if self._on_change is not None:
            self._on_change(state)
        if state is _OPEN:
            # a warning when it opens; a failed trial that opens it again is info (an
            # outage logs two lines per reset interval, not two warnings)
            level = logging.WARNING if previous is _CLOSED else logging.INFO
            self._log.log(
                level,
                "%s circuit open: %s for %gs",
                self.name,
                self._skipping,
                self._reset_s,
                extra={
                    "event": self._event,
                    "from": previous.value,
                    "to": state.value,
                    "error": error,
                },
            )
        else:
            self._log.info(
                "%s circuit %s",
                self.name,
                state.value,
                extra={"event": self._event, "from": previous.value, "to": state.value},
            )
