"""Eager start of aiohttp's per-connection and per-request tasks on Python 3.11.

aiohttp's server runs each connection in a task (``RequestHandler.start``) and each
request in a task of its own (``RequestHandler._handle_request``, "a new task is used
for copy context vars"). From Python 3.12 it creates both with ``eager_start=True``:
the task's first step runs at once, inside ``create_task``. On 3.11 there is no eager
start, so a request's handler waits for the event loop's next pass before it runs at
all, behind every callback queued in this one. Under load a pass of a gateway's loop
runs the normalising of every upstream answer that came in, so a miss's upstream call
went out one such pass later than it had to: at 64 connections its p50 was 1.3-1.6 ms
longer than with the handler started at once (bench/README.md, "The handler's task",
which also gives what it costs in CPU).

:data:`eager_request_tasks` is a task factory that does for those two coroutines on
3.11 what ``eager_start=True`` does on 3.12: it makes the task, runs the coroutine's
first step at once in the task's own context with the task as the current task (so
``asyncio.current_task()``, which timeouts cancel, is the task itself), and lets the
task carry on from where that step stopped. Every other coroutine gets a plain
``asyncio.Task``, as without a factory. :func:`installed` sets it on the running loop
for as long as the application runs (``create_app``); on 3.12 and later it does
nothing.

Making another task current for a moment is what 3.12's eager start does itself, with
``asyncio.tasks._enter_task`` and ``_leave_task`` (there since 3.7). One difference is
left: a task cancelled before its own first step, whose eager step had already
finished, ends with that step's result here and cancelled on 3.12. aiohttp never
cancels a request's task before awaiting it. The task's ``get_coro()`` (and so its
repr) is the generator that carries the coroutine on, not aiohttp's coroutine, and a
``name`` given to ``create_task`` is set after the first step, not before it.
tests/test_eager_tasks.py holds the rest
to a plain task's behaviour: result, errors, cancellation where it waits, context.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Callable, Collection, Coroutine, Generator, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp.web_protocol import RequestHandler

NEEDED = sys.version_info < (3, 12)  # 3.12 has eager_start, and aiohttp uses it
# how many of installed()'s blocks are open on each loop
_USERS: dict[asyncio.AbstractEventLoop, int] = {}


class _FirstStep:
    """How a coroutine's first step ended: suspended on ``awaited``, returned
    ``result``, or raised ``error``."""

    __slots__ = ("abandoned", "awaited", "error", "finished", "result")

    def __init__(self) -> None:
        self.abandoned = False  # it raised KeyboardInterrupt or SystemExit out of create_task
        self.awaited: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.result: Any = None


TaskFactory = Callable[..., "asyncio.Task[Any]"]


def eager_tasks_for(codes: Collection[types.CodeType]) -> TaskFactory:
    """A loop task factory that starts the coroutines of the functions whose code is
    in ``codes`` eagerly, and makes a plain task of every other coroutine."""
    eager = frozenset(codes)

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        *,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        if getattr(coro, "cr_code", None) not in eager:
            return asyncio.Task(coro, loop=loop, context=context)
        return _started(loop, coro, context)

    return factory


def _started(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    context: contextvars.Context | None,
) -> asyncio.Task[Any]:
    """A task of ``coro`` whose first step has run already, in the task's context and
    as the loop's current task."""
    ctx = contextvars.copy_context() if context is None else context
    first = _FirstStep()
    rest = _carry_on(coro, first)
    rest.send(None)  # primed: see _carry_on
    task: asyncio.Task[Any] = asyncio.Task(rest, loop=loop, context=ctx)
    with _current(loop, task):
        try:
            first.awaited = ctx.run(coro.send, None)
        except StopIteration as stop:
            first.finished, first.result = True, stop.value
        except (KeyboardInterrupt, SystemExit):
            coro.close()
            first.abandoned = True  # the task, already scheduled, ends cancelled
            task.cancel()
            raise
        except BaseException as exc:
            first.error = exc
    return task


# what aiohttp starts eagerly from Python 3.12 (web_protocol: connection_made, start)
eager_request_tasks = eager_tasks_for(
    (RequestHandler.start.__code__, RequestHandler._handle_request.__code__)
)


@contextmanager
def _current(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> Iterator[None]:
    """``task`` is the loop's current task inside, as while one of its steps runs; the
    task that was current (the caller's, or none in a plain callback) is again after."""
    caller = asyncio.current_task(loop)
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)
    asyncio.tasks._enter_task(loop, task)
    try:
        yield
    finally:
        asyncio.tasks._leave_task(loop, task)
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)


_PRIMED = object()


@types.coroutine
def _carry_on(coro: Coroutine[Any, Any, Any], first: _FirstStep) -> Generator[Any, Any, Any]:
    """The rest of ``coro`` after ``first``: what the task runs.

    The factory primes it (one step, to the first ``yield``) before the task exists,
    so that a cancellation before the task's first step reaches the ``try`` here: it
    then does what a task's cancel() does to a task that waits, it cancels what the
    first step awaits (with the same message) and the task waits for that to end, so
    the handler gets the cancellation from it, once it has ended (an inner task may
    take passes to clean up). What cannot be cancelled (done already, or not a future)
    gets the cancellation thrown into ``coro``. Otherwise the task waits for what that
    step awaits; an exception it gets meanwhile (a cancellation, an error set on the
    awaited) is thrown into ``coro`` where it waits, as ``await`` would deliver it.
    Then ``yield from`` hands ``coro`` to the task for good, so every later step goes
    straight to it (a started coroutine cannot be awaited, but it can be yielded from
    once what it waits for is done)."""
    pending: BaseException | None = None
    try:
        yield _PRIMED
    except GeneratorExit:  # the task was dropped before it ever ran
        coro.close()
        raise
    except BaseException as exc:  # cancelled before the task's first step
        pending = exc
    if first.abandoned:
        raise asyncio.CancelledError
    if first.finished:
        return first.result
    if first.error is not None:
        raise first.error
    awaited = first.awaited
    del first
    if (
        isinstance(pending, asyncio.CancelledError)
        and isinstance(awaited, asyncio.Future)
        and awaited.cancel(pending.args[0] if pending.args else None)
    ):
        pending = None  # delivered by what it awaits, once that has ended
    while True:
        if pending is None:
            try:
                yield awaited
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                pending = exc
            else:
                return (yield from coro)
        try:
            awaited = coro.throw(pending)
        except StopIteration as stop:
            return stop.value
        pending = None


@contextmanager
def installed(
    loop: asyncio.AbstractEventLoop, factory: TaskFactory | None = None
) -> Iterator[bool]:
    """``factory`` (:data:`eager_request_tasks`) as ``loop``'s task factory inside, on
    Python 3.11 and unless another factory is set; whether it is. Blocks of the same
    factory may nest or overlap (two apps on one loop): the loop has no factory again
    once the last of them has ended."""
    factory = eager_request_tasks if factory is None else factory
    current = loop.get_task_factory()
    if not NEEDED or (current is not None and current is not factory):
        yield False
        return
    # two apps on one loop: the factory stays until the last of them has ended
    _USERS[loop] = _USERS.get(loop, 0) + 1
    loop.set_task_factory(factory)
    try:
        yield True
    finally:
        _USERS[loop] -= 1
        if not _USERS[loop]:
            del _USERS[loop]
            if loop.get_task_factory() is factory:
                loop.set_task_factory(None)
