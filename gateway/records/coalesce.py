"""Request coalescing: concurrent misses for one key make one upstream call in a
process.

The first caller starts the work as a task of its own; later callers for the same
flight (the cache key and the purge generations it was looked up under) wait for that
task. The task is shielded, so a caller that goes away (its client disconnected) does
not cancel the work the others wait for.

A cache read is an await: a request can read "no entry" while another request's fill
is still running and find, once its read returns, that the fill has ended and is no
longer in flight. So that it does not start a second upstream call, requests say when
their read starts and ends (:meth:`Coalescer.reading`, :meth:`Coalescer.done_reading`);
a fill that ends while some request of its key is reading leaves its result until the
last of them is done, and a request whose read started before that fill ended takes
it. Within one process a burst of misses for one key makes exactly one upstream call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("gateway.coalesce")


class Coalescer(Generic[T]):
    """At most one piece of work in flight per flight key, in this process."""

    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Task[T]] = {}
        # per cache key: the requests between the start and the end of their read
        self._reading: dict[str, int] = {}
        # per cache key: (sequence number, flight key, result) of the last fill that
        # ended while some request of the key was reading
        self._recent: dict[str, tuple[int, Hashable, T]] = {}
        self._ended = 0

    def __len__(self) -> int:
        return len(self._inflight)

    def __contains__(self, flight: Hashable) -> bool:
        return flight in self._inflight

    @property
    def ended(self) -> int:
        """How many flights have ended so far: a read made outside :meth:`reading`
        that notes it knows, later, whether a fill ended since."""
        return self._ended

    def flights(self) -> list[Hashable]:
        """The flights in progress (a few: fills last one upstream call)."""
        return list(self._inflight)

    def reading(self, key: str) -> int:
        """A request of ``key`` starts its cache read; the ticket to hand back."""
        self._reading[key] = self._reading.get(key, 0) + 1
        return self._ended

    def done_reading(self, key: str, ticket: int) -> tuple[Hashable, T] | None:
        """The request's read ended: (flight key, result) of a fill of ``key`` that
        ended after the read began, if there is one."""
        left = self._reading[key] - 1
        recent = self._recent.get(key)
        if left:
            self._reading[key] = left
        else:
            del self._reading[key]
            self._recent.pop(key, None)
        if recent is not None and recent[0] > ticket:
            return recent[1], recent[2]
        return None

    def _start(
        self, flight: Hashable, key: str, work: Callable[[], Awaitable[T]]
    ) -> asyncio.Task[T]:
        async def run() -> T:
            return await work()

        task = asyncio.ensure_future(run())
        self._inflight[flight] = task

        def done(finished: asyncio.Task[T]) -> None:
            if self._inflight.get(flight) is finished:
                del self._inflight[flight]
            self._ended += 1
            if finished.cancelled() or finished.exception() is not None:
                return  # (the exception is retrieved: no "never retrieved" warning)
            if key in self._reading:
                self._recent[key] = (self._ended, flight, finished.result())

        task.add_done_callback(done)
        return task

    async def run(
        self, flight: Hashable, key: str, work: Callable[[], Awaitable[T]]
    ) -> tuple[T, bool]:
        """The result of ``work`` for ``flight`` (of cache key ``key``), and whether
        this caller joined another's."""
        task = self._inflight.get(flight)
        joined = task is not None
        if task is None:
            task = self._start(flight, key, work)
        try:
            return await asyncio.shield(task), joined
        finally:
            # a failed task holds its exception, whose traceback holds this frame: the
            # reference is dropped so that no cycle keeps the exception (and the frames
            # of the fill, with the upstream's body) until the collector comes by
            del task

    def start(self, flight: Hashable, key: str, work: Callable[[], Awaitable[T]]) -> bool:
        """Start ``work`` in the background unless one is in flight; True if started."""
        if flight in self._inflight:
            return False
        self._start(flight, key, work)
        return True

    async def close(self) -> None:
        """Cancel what is still in flight (at shutdown)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
