"""Everything the gateway binds to one upstream, and switching to another while serving.

An :class:`UpstreamBinding` holds what is made for one ``upstream.base_url``: the
record pipeline (its keyer, whose prefix names the upstream, and its upstream client
with its circuit breaker and health), the connection pool (``UpstreamLink``), the
guarded cache, the fleet's announcements and the readiness report. With Redis the
backend is the binding's own as well: the purge generations, the near cache's
invalidation channel and the fleet's hash are named by the prefix, so instances that
started on an upstream and instances that switched to it share them. The memory and
null backends belong to the process and are shared by every binding: their keys carry
the upstream's identity, so an upstream switched back to finds its entries.

:class:`Upstreams` holds the binding requests take now (``current``). A switch
(:meth:`Upstreams.switch`) makes a new binding current in one step, with no await:
a request that took the old pipeline finishes on the old upstream, and every request
after the switch takes the new one. The old binding then drains in the background:
once no read of its pipeline is in progress, or :func:`drain_bound` has passed, it is
closed (its background refreshes cancelled, its fleet field removed, its own backend
and its connection pool closed). Closing the holder at shutdown closes every binding,
draining ones too, without waiting any longer for their reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from aiohttp import web

from gateway.cache.backend import CacheBackend
from gateway.cache.breaker import GuardedCache
from gateway.cache.fleet import Fleet
from gateway.http.records import RecordHandlers
from gateway.ops.health import Readiness
from gateway.records.keys import Keyer
from gateway.records.pipeline import RecordPipeline
from gateway.upstream.client import UpstreamClient
from gateway.upstream.link import UpstreamLink

log = logging.getLogger("gateway.upstream")

# what a drain waits beyond its reads' own bound, for the cache calls around them
DRAIN_GRACE_S = 1.0


def drain_bound(timeout_s: float) -> float:
    """How long a switched-from binding waits for the reads that took its pipeline:
    a read may wait one upstream timeout for another instance's fill before it makes
    its own call, bounded by another."""
    return 2 * timeout_s + DRAIN_GRACE_S


@dataclass(eq=False, slots=True)
class UpstreamBinding:
    """The parts of the gateway bound to one upstream (see the module's docstring).

    ``own_backend`` is the cache backend this binding closes (Redis); None when the
    backend is the process's (memory, none). ``serving`` is true while the binding is
    the current one: its circuit breakers report to the metrics only then."""

    pipeline: RecordPipeline
    cache: GuardedCache
    readiness: Readiness
    link: UpstreamLink
    fleet: Fleet | None = None
    own_backend: CacheBackend | None = None
    serving: bool = True
    closed: bool = False

    @property
    def base_url(self) -> str:
        return self.pipeline.upstream.base_url

    @property
    def keyer(self) -> Keyer:
        return self.pipeline.keyer

    @property
    def upstream(self) -> UpstreamClient:
        return self.pipeline.upstream

    async def close(self) -> None:
        """Close what is the binding's own, once: the pipeline (background refreshes
        cancelled), the fleet's announcements, the backend if it is its own, and the
        connection pool; each of them whatever the others raise (the first error is
        raised once all are closed)."""
        if self.closed:
            return
        self.closed = True
        # each part is closed even when one before it fails (last pushed, first run)
        async with contextlib.AsyncExitStack() as parts:
            parts.push_async_callback(self.link.close)
            if self.own_backend is not None:
                parts.push_async_callback(self.own_backend.close)
            if self.fleet is not None:
                parts.push_async_callback(self.fleet.close)
            parts.push_async_callback(self.pipeline.close)


class Upstreams:
    """The binding requests take now, and those switched away from that still drain."""

    def __init__(self, current: UpstreamBinding, *, records: RecordHandlers) -> None:
        """``records``: the handlers whose ``pipeline`` follows the current binding."""
        self._records = records
        self.current = current
        records.pipeline = current.pipeline
        self._drains: dict[UpstreamBinding, asyncio.Task[None]] = {}
        self._closing = asyncio.Event()

    @property
    def draining(self) -> list[UpstreamBinding]:
        """The bindings switched away from and not closed yet."""
        return list(self._drains)

    def switch(self, binding: UpstreamBinding) -> UpstreamBinding:
        """Make ``binding`` the one requests take, at once; drain the one it replaces
        (returned) in the background, then close it."""
        old = self.current
        self.current = binding
        self._records.pipeline = binding.pipeline
        old.serving = False
        # The drain's first look at the old pipeline's reads comes after the first step
        # of every task created before this switch (asyncio runs first steps in the
        # order the tasks were made): a fast-path read made a task is counted by then.
        drain = asyncio.ensure_future(self._drain(old, drain_bound(old.upstream.timeout_s)))
        self._drains[old] = drain
        drain.add_done_callback(lambda _: self._drains.pop(old, None))
        return old

    async def _drain(self, old: UpstreamBinding, within_s: float) -> None:
        quiet = asyncio.ensure_future(old.pipeline.quiet())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait(
                (quiet, closing), timeout=within_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            quiet.cancel()
            closing.cancel()
        left = old.pipeline.reads_in_progress
        extra = {"event": "upstream_drained", "upstream": old.base_url, "unfinished": left}
        if left:
            log.warning(
                "upstream switch: requests still on the old upstream are cut short;"
                " its connections close",
                extra=extra,
            )
        else:
            log.info("upstream switch: the old upstream's requests are done", extra=extra)
        await old.close()

    async def close(self) -> None:
        """Close every binding: the draining ones without waiting for their reads any
        longer, then the current one."""
        self._closing.set()
        drains = list(self._drains.values())
        if drains:
            await asyncio.wait(drains)
        await self.current.close()


UPSTREAMS = web.AppKey("upstreams", Upstreams)
