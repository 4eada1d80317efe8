"""gateway.eager_tasks: a task whose first step runs inside create_task, and which then
behaves as any task: its result, its errors, its cancellation, its context."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.eager_tasks import (
    NEEDED,
    eager_request_tasks,
    eager_tasks_for,
    installed,
)
from gateway.settings import Settings
from tests.conftest import GatewayFactory

pytestmark = pytest.mark.skipif(not NEEDED, reason="Python 3.12 starts aiohttp's tasks eagerly")

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


async def handler(
    steps: list[str], waits_on: asyncio.Future[int] | None, tasks: list[object]
) -> int:
    """Records its steps and the task it runs in; awaits ``waits_on`` once."""
    steps.append(f"first step, seen={seen.get()}")
    tasks.append(asyncio.current_task())
    seen.set("set by the handler")
    try:
        value = 1 if waits_on is None else await waits_on
    except asyncio.CancelledError:
        steps.append("cancelled where it waited")
        raise
    steps.append("after the wait")
    tasks.append(asyncio.current_task())
    await asyncio.sleep(0)
    return value * 2


async def other(steps: list[str]) -> None:
    steps.append("other ran")


EAGER = eager_tasks_for([handler.__code__])


async def test_the_first_step_runs_inside_create_task_as_the_task_itself() -> None:
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    tasks: list[object] = []
    waits_on: asyncio.Future[int] = loop.create_future()
    with installed(loop, EAGER):
        task = loop.create_task(handler(steps, waits_on, tasks))
        assert steps == ["first step, seen=unset"]  # before the loop had a pass
        assert tasks == [task]  # asyncio.current_task() in that step: timeouts cancel it
        waits_on.set_result(21)
        assert await task == 42
    assert steps == ["first step, seen=unset", "after the wait"]
    assert tasks == [task, task]


async def test_other_coroutines_are_plain_tasks_started_by_the_loop() -> None:
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    with installed(loop, EAGER):
        task = loop.create_task(other(steps))
        assert steps == []
        await task
    assert steps == ["other ran"]


async def test_the_task_has_a_copy_of_the_callers_context() -> None:
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    seen.set("set by the caller")
    with installed(loop, EAGER):
        assert await loop.create_task(handler(steps, None, [])) == 2
    assert steps == ["first step, seen=set by the caller", "after the wait"]
    assert seen.get() == "set by the caller"  # what the handler set stayed in its copy


@pytest.mark.parametrize("passes_first", [0, 1, 3])
async def test_cancelling_the_task_cancels_the_handler_where_it_waits(passes_first: int) -> None:
    """Before the task's first own step (0) as after it (1, 3)."""
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    waits_on: asyncio.Future[int] = loop.create_future()
    with installed(loop, EAGER):
        task = loop.create_task(handler(steps, waits_on, []))
        for _ in range(passes_first):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert steps == ["first step, seen=unset", "cancelled where it waited"]
    assert waits_on.cancelled()  # as a plain task cancels the future it waits on
    assert task.cancelled()


async def test_an_error_set_on_what_it_waits_for_reaches_the_handler() -> None:
    loop = asyncio.get_running_loop()
    waits_on: asyncio.Future[int] = loop.create_future()
    with installed(loop, EAGER):
        task = loop.create_task(handler([], waits_on, []))
        waits_on.set_exception(LookupError("upstream gone"))
        with pytest.raises(LookupError, match="upstream gone"):
            await task


async def test_a_first_step_that_returns_or_raises_ends_the_task() -> None:
    async def quick() -> str:
        return "done"

    async def broken() -> str:
        raise ValueError("bad request")

    loop = asyncio.get_running_loop()
    with installed(loop, eager_tasks_for([quick.__code__, broken.__code__])):
        assert await loop.create_task(quick()) == "done"
        with pytest.raises(ValueError, match="bad request"):
            await loop.create_task(broken())


async def test_installed_sets_the_factory_only_while_inside_and_not_over_another() -> None:
    loop = asyncio.get_running_loop()
    assert loop.get_task_factory() is None
    with installed(loop) as done:
        assert done
        assert loop.get_task_factory() is eager_request_tasks
    assert loop.get_task_factory() is None

    def theirs(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        return asyncio.Task(coro, loop=loop)

    loop.set_task_factory(theirs)
    try:
        with installed(loop) as done:
            assert not done
            assert loop.get_task_factory() is theirs
    finally:
        loop.set_task_factory(None)


async def test_a_served_gateway_starts_its_request_handlers_eagerly(
    gateway_factory: GatewayFactory,
) -> None:
    client = await gateway_factory("http://127.0.0.1:9")  # no upstream needed: /healthz
    loop = asyncio.get_running_loop()
    assert loop.get_task_factory() is eager_request_tasks
    response = await client.get("/healthz")
    assert response.status == 200
    await client.close()


async def test_the_app_hands_the_loop_back_without_its_factory() -> None:
    app = create_app(Settings(upstream={"base_url": "http://127.0.0.1:9"}))
    runner = web.AppRunner(app)
    await runner.setup()
    assert asyncio.get_running_loop().get_task_factory() is eager_request_tasks
    await runner.cleanup()
    assert asyncio.get_running_loop().get_task_factory() is None
