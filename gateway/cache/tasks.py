"""Stopping the cache's background tasks (listeners, watchers, announcements)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("gateway.cache")


async def stop(task: asyncio.Future[Any] | None, within_s: float = 2.0) -> None:
    """Cancel ``task`` and wait for it, at most ``within_s``. The cancellation is sent
    again while it runs: on Python 3.11 a redis-py call with a socket timeout (it waits
    through ``asyncio.wait_for``) can swallow one, and a loop would then go on."""
    if task is None:
        return
    deadline = asyncio.get_running_loop().time() + within_s
    while not task.done():
        task.cancel()
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            log.warning("a background task of the cache did not stop", extra={"task": repr(task)})
            return
        await asyncio.wait({task}, timeout=min(0.1, left))
    if not task.cancelled() and task.exception() is not None:
        log.warning("a background task of the cache failed", exc_info=task.exception())
