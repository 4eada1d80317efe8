"""Request coalescing: concurrent misses for one key make one upstream call.

The first caller starts the work as a task of its own; later callers for the same
key wait for that task. The task is shielded, so a caller that goes away (its client
disconnected) does not cancel the work the others wait for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("gateway.coalesce")


class Coalescer(Generic[T]):
    """At most one piece of work in flight per key, in this process."""

    def __init__(self) -> None:
        self._inflight: dict[str, asyncio.Task[T]] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def _start(self, key: str, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        async def run() -> T:
            return await work()

        task = asyncio.ensure_future(run())
        self._inflight[key] = task

        def done(finished: asyncio.Task[T]) -> None:
            if self._inflight.get(key) is finished:
                del self._inflight[key]
            if not finished.cancelled():
                finished.exception()  # retrieved: no "never retrieved" warning

        task.add_done_callback(done)
        return task

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """The result of ``work`` for ``key``, and whether this caller joined another's."""
        task = self._inflight.get(key)
        joined = task is not None
        if task is None:
            task = self._start(key, work)
        return await asyncio.shield(task), joined

    def start(self, key: str, work: Callable[[], Awaitable[T]]) -> bool:
        """Start ``work`` in the background unless one is in flight; True if started."""
        if key in self._inflight:
            return False
        self._start(key, work)
        return True

    async def close(self) -> None:
        """Cancel what is still in flight (at shutdown)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
