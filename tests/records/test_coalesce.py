"""Coalescing: one piece of work per key; a waiter that leaves does not cancel it."""

from __future__ import annotations

import asyncio
import gc
import weakref

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
    waiters = [asyncio.ensure_future(coalescer.run("k", "k", work)) for _ in range(50)]
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
        *(coalescer.run("k", "k", work) for _ in range(5)), return_exceptions=True
    )
    assert [str(r) for r in results] == ["upstream down"] * 5


async def test_a_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        return "done"

    coalescer: Coalescer[str] = Coalescer()
    leaving = asyncio.ensure_future(coalescer.run("k", "k", work))
    staying = asyncio.ensure_future(coalescer.run("k", "k", work))
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
    assert coalescer.start("k", "k", work) is True
    assert coalescer.start("k", "k", work) is False
    assert await coalescer.run("k", "k", work) == ("refreshed", True)
    assert calls == 1


async def test_a_read_that_outlives_a_fill_takes_its_result() -> None:
    """A request whose cache read began before a fill of its key ended, and returned
    "no entry" after it, takes that fill's result instead of starting another."""
    coalescer: Coalescer[str] = Coalescer()
    calls = 0

    async def work() -> str:
        nonlocal calls
        calls += 1
        return f"result {calls}"

    late = coalescer.reading("k")  # the late request's read starts
    assert await coalescer.run(("k", 1), "k", work) == ("result 1", False)
    # the fill has ended and is no longer in flight; the late read returns
    assert coalescer.done_reading("k", late) == (("k", 1), "result 1")
    assert len(coalescer) == 0
    # a read that starts after the fill ended does not take it
    after = coalescer.reading("k")
    assert coalescer.done_reading("k", after) is None
    assert calls == 1


async def test_a_fill_ended_before_a_read_began_is_not_taken() -> None:
    coalescer: Coalescer[str] = Coalescer()

    async def work() -> str:
        return "old"

    holding = coalescer.reading("k")  # keeps results of "k" around
    await coalescer.run(("k", 1), "k", work)
    fresh = coalescer.reading("k")
    assert coalescer.done_reading("k", fresh) is None
    assert coalescer.done_reading("k", holding) == (("k", 1), "old")
    # every reader is done: nothing of "k" is kept
    assert coalescer.done_reading("k", coalescer.reading("k")) is None


async def test_a_failed_fill_is_never_taken() -> None:
    coalescer: Coalescer[str] = Coalescer()

    async def work() -> str:
        raise ValueError("upstream failed")

    late = coalescer.reading("k")
    with pytest.raises(ValueError, match="upstream failed"):
        await coalescer.run(("k", 1), "k", work)
    assert coalescer.done_reading("k", late) is None


async def test_a_failure_is_freed_once_its_caller_is_done_with_it_without_the_collector() -> None:
    # the worker's collector runs rarely (gateway.process.worker): a failed fill's
    # exception, whose frames hold the upstream's body, must not wait for it
    failures: list[weakref.ref[Exception]] = []

    class Failure(Exception):
        def __init__(self) -> None:
            super().__init__("upstream body not JSON")
            failures.append(weakref.ref(self))

    async def work() -> str:
        await asyncio.sleep(0)
        raise Failure  # (no local holds it: a frame in its traceback would be a cycle)

    coalescer: Coalescer[str] = Coalescer()
    gc.disable()
    try:
        caught = 0
        try:
            await coalescer.run("k", "k", work)
        except Failure:
            caught += 1
        await asyncio.sleep(0)
        assert caught == 1
        assert failures[0]() is None
    finally:
        gc.enable()
