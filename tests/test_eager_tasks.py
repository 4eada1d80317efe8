"""gateway.eager_tasks: a task whose first step runs inside create_task, and which then
behaves as any task: its result, its errors, its cancellation, its context."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.app import create_app
from gateway.eager_tasks import (
    NEEDED,
    eager_request_tasks,
    eager_tasks_for,
    installed,
)
from gateway.front import GatewayConnection
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


async def test_a_served_gateway_has_the_factory_while_it_runs(
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


async def test_a_cancel_before_the_first_own_step_waits_for_what_it_cancels() -> None:
    """The first step awaits an inner task that needs a pass to clean up: the handler
    gets the cancellation once that task has ended, as from a plain task."""
    loop = asyncio.get_running_loop()
    seen_when_cancelled: list[bool] = []

    async def inner() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0)  # its cleanup takes a pass

    async def waits_on_inner() -> None:
        child = asyncio.ensure_future(inner())
        try:
            await child
        except asyncio.CancelledError:
            seen_when_cancelled.append(child.done())
            raise

    with installed(loop, eager_tasks_for([waits_on_inner.__code__])):
        task = loop.create_task(waits_on_inner())
        task.cancel("client gone")
        with pytest.raises(asyncio.CancelledError, match="client gone"):
            await task
    assert seen_when_cancelled == [True]


async def test_interrupting_the_first_step_leaves_no_task_behind() -> None:
    async def interrupted() -> None:
        raise KeyboardInterrupt

    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks(loop)
    with installed(loop, eager_tasks_for([interrupted.__code__])):
        with pytest.raises(KeyboardInterrupt):
            loop.create_task(interrupted())  # noqa: RUF006 - it raises; no task comes back
        made = asyncio.all_tasks(loop) - before  # the task, scheduled before the step
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    # it ended cancelled, not with "cannot reuse already awaited coroutine"
    assert [task.cancelled() for task in made] == [True]


async def test_blocks_on_one_loop_share_the_factory_until_the_last_ends() -> None:
    loop = asyncio.get_running_loop()
    with installed(loop) as first:
        with installed(loop) as second:
            assert first
            assert second
        assert loop.get_task_factory() is eager_request_tasks  # the first still runs
    assert loop.get_task_factory() is None


async def test_aiohttp_runs_each_request_handler_in_an_eagerly_started_task() -> None:
    """aiohttp's own server (whose connection and request code the gateway's connection
    does not replace) with the factory: a handler's task is one it started."""
    assert GatewayConnection.start is RequestHandler.start
    assert GatewayConnection._handle_request is RequestHandler._handle_request
    coroutines: list[str] = []

    async def record(request: web.Request) -> web.Response:
        task = asyncio.current_task()
        assert task is not None
        coroutines.append(getattr(task.get_coro(), "__name__", "?"))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", record)
    loop = asyncio.get_running_loop()
    with installed(loop):
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2)  # kept alive, pipelined
            await writer.drain()
            answers = b""
            while answers.count(b"ok") < 2:
                answers += await reader.read(65536)
            writer.close()
        finally:
            await runner.cleanup()
    assert answers.count(b"HTTP/1.1 200 OK") == 2
    assert coroutines == ["_carry_on", "_carry_on"]  # not aiohttp's coroutine as is
