"""Coalescing: one piece of work per key; a waiter that leaves does not cancel it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.records.coalesce import Coalescer


async def test_concurrent_callers_share_one_call() -> None:
    calls = 0
    release = asyncio.Event()

    async def work() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "result"

    coalescer: Coalescer[str] = Coalescer()
    waiters = [asyncio.ensure_future(coalescer.run("k", work)) for _ in range(50)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiters)
    assert calls == 1
    assert [r for r, _ in results] == ["result"] * 50
    assert sum(joined for _, joined in results) == 49
    assert len(coalescer) == 0


async def test_errors_are_shared_too() -> None:
    async def work() -> str:
        await asyncio.sleep(0.01)
        raise ValueError("upstream down")

    coalescer: Coalescer[str] = Coalescer()
    results = await asyncio.gather(
        *(coalescer.run("k", work) for _ in range(5)), return_exceptions=True
    )
    assert [str(r) for r in results] == ["upstream down"] * 5


async def test_a_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        return "done"

    coalescer: Coalescer[str] = Coalescer()
    leaving = asyncio.ensure_future(coalescer.run("k", work))
    staying = asyncio.ensure_future(coalescer.run("k", work))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    release.set()
    assert await staying == ("done", True)


async def test_start_runs_once_in_the_background() -> None:
    calls = 0

    async def work() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return "refreshed"

    coalescer: Coalescer[str] = Coalescer()
    assert coalescer.start("k", work) is True
    assert coalescer.start("k", work) is False
    assert await coalescer.run("k", work) == ("refreshed", True)
    assert calls == 1
