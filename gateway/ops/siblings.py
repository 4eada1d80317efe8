"""The other workers of one instance, and how an admin action reaches them.

With ``server.workers`` = N > 1 an admin request reaches one worker of N. The
supervisor makes a private folder (mode 0700, removed when it exits) before it forks;
each worker listens there on a Unix socket of its own (``worker-<index>.sock``) and
writes its configuration's fingerprint beside it (``fingerprint-<index>``). The worker
that takes an admin action applies it, then :meth:`Siblings.tell` sends the same
message to every other worker and waits, at most ``timeout_s``, for each to answer that
the action is in force in it. :class:`Reach` counts the workers: ``told`` (all of them,
this one included) and ``confirmed``; an action is in force everywhere only when the two
are equal.

A message is one JSON object on one line; the answer is ``{"ok": true}`` once the
action is in force in that worker, ``{"ok": false}`` when it refused it. A worker that
cannot be reached, or does not answer in time (stopped, busy), is not confirmed; it
may still apply the message later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.ops.files import write_whole

log = logging.getLogger("gateway.server")

# how long the worker that took an admin action waits for each of the others
SIBLING_TIMEOUT_S = 3.0
# the longest message taken (a reload's live keys are a few KiB)
MAX_MESSAGE_BYTES = 1024 * 1024

OK = "ok"
DEGRADED = "degraded"

Apply = Callable[[dict[str, Any]], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Reach:
    """The workers an action was sent to (this one included) and those that confirmed it."""

    told: int
    confirmed: int

    @property
    def everywhere(self) -> bool:
        return self.confirmed == self.told

    def as_json(self) -> dict[str, int]:
        return {"told": self.told, "confirmed": self.confirmed}


class Siblings:
    """Worker ``index`` of ``count``, whose sockets are in ``folder``."""

    def __init__(
        self, folder: Path, *, index: int, count: int, timeout_s: float = SIBLING_TIMEOUT_S
    ) -> None:
        self.folder = folder
        self.index = index
        self.count = count
        self.timeout_s = timeout_s
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    def _socket(self, index: int) -> Path:
        return self.folder / f"worker-{index}.sock"

    def _fingerprint_file(self, index: int) -> Path:
        return self.folder / f"fingerprint-{index}"

    async def listen(self, apply: Apply) -> None:
        """Take the other workers' messages: ``apply`` each, in the order received, and
        answer whether it is in force here."""
        path = self._socket(self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket left by a worker of the same index that was killed
        lock = asyncio.Lock()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            if task is not None:
                self._handlers.add(task)
            try:
                line = await reader.readline()
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    message = None
                ok = False
                if isinstance(message, dict):
                    async with lock:
                        try:
                            ok = await apply(message)
                        except Exception:
                            log.exception(
                                "an admin action from another worker failed here",
                                extra={"event": "sibling_action", "action": message.get("action")},
                            )
                writer.write(orjson.dumps({"ok": ok}) + b"\n")
                await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError, ValueError):
                pass  # the asking worker gave up (its timeout) or sent too much
            finally:
                writer.close()
                if task is not None:
                    self._handlers.discard(task)

        self._server = await asyncio.start_unix_server(
            serve, path=str(path), limit=MAX_MESSAGE_BYTES
        )

    async def close(self) -> None:
        """Stop listening; remove this worker's socket and fingerprint."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._handlers):
                task.cancel()
            await server.wait_closed()
        for path in (self._socket(self.index), self._fingerprint_file(self.index)):
            with contextlib.suppress(OSError):
                path.unlink()

    async def tell(self, message: dict[str, Any]) -> Reach:
        """Send ``message`` to every other worker; wait for their answers (each at most
        ``timeout_s``). This worker counts as told and confirmed: it applied the action
        before it tells the others."""
        others = [index for index in range(self.count) if index != self.index]
        data = orjson.dumps(message) + b"\n"
        answers = await asyncio.gather(*(self._tell_one(index, data) for index in others))
        reach = Reach(told=self.count, confirmed=1 + sum(answers))
        if not reach.everywhere:
            log.warning(
                "an admin action is not confirmed by every worker",
                extra={
                    "event": "sibling_action",
                    "action": message.get("action"),
                    **reach.as_json(),
                },
            )
        return reach

    async def _tell_one(self, index: int, data: bytes) -> bool:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(
                    str(self._socket(index)), limit=MAX_MESSAGE_BYTES
                )
                writer.write(data)
                await writer.drain()
                answer = orjson.loads(await reader.readline())
        except (OSError, TimeoutError, ValueError):
            return False
        finally:
            if writer is not None:
                writer.close()
        return isinstance(answer, dict) and answer.get("ok") is True

    def publish_fingerprint(self, fingerprint: str) -> None:
        """Say which configuration this worker runs (for :meth:`report`)."""
        try:
            write_whole(self._fingerprint_file(self.index), fingerprint.encode())
        except OSError as exc:
            log.warning(
                "this worker's configuration fingerprint could not be written for the others",
                extra={"event": "sibling_fingerprint", "error": exc.strerror or type(exc).__name__},
            )

    def report(self, mine: str) -> dict[str, Any]:
        """The workers component of /readyz: ``degraded`` when a worker runs another
        configuration than ``mine`` (this worker's fingerprint), with how many run each."""
        configurations: dict[str, int] = {}
        for index in range(self.count):
            if index == self.index:
                fingerprint = mine
            else:
                try:
                    fingerprint = self._fingerprint_file(index).read_text()
                except (OSError, UnicodeDecodeError):
                    continue  # not started yet, or stopped
            configurations[fingerprint] = configurations.get(fingerprint, 0) + 1
        status = OK if set(configurations) == {mine} else DEGRADED
        return {
            "status": status,
            "workers": self.count,
            "fingerprint": mine,
            "configurations": configurations,
        }
