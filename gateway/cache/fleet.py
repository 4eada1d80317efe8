"""Fleet agreement: every instance sharing a Redis prefix announces a fingerprint of its
cache-relevant live configuration, and notices when another's differs.

Each process writes ``<fingerprint> <expiry>`` under its own field of one Redis hash
(``<prefix>:fleet``) every ``every_s`` seconds, and reads the whole hash back. Fields
whose expiry has passed (an instance that stopped or was killed) are deleted by whoever
sees them. An instance that sees a fingerprint other than its own logs it once per
fingerprint, and reports the fleet ``degraded`` in /readyz and in
``gateway_fleet_configurations`` (the count of distinct configurations seen).

Instances that disagree are not stopped: an entry carries the TTL it was stored with,
so each answer is still served for the freshness its filler gave it; what differs is
which instance's TTL an entry gets, and that is what operators need to know.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.cache.keyspace import fleet_key, fleet_ready_key
from gateway.cache.tasks import stop

if TYPE_CHECKING:  # redis-py is imported only by a gateway that uses Redis
    from gateway.cache.topology import Commands

log = logging.getLogger("gateway.cache")

OK = "ok"
DEGRADED = "degraded"
UNKNOWN = "unknown"


def instance_id() -> str:
    """This process, as the fleet sees it: host, pid and a random part (pids repeat
    across containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Fleet:
    """This process's announcements and what it has seen of the others."""

    def __init__(
        self,
        commands: Commands,
        *,
        prefix: str,
        fingerprint: Callable[[], str],
        every_s: float = 5.0,
        timeout_s: float = 1.0,
        wall: Callable[[], float] = time.time,
        instance: str | None = None,
        on_read: Callable[[int], None] | None = None,
    ) -> None:
        """``on_read`` is told the number of distinct configurations after each read."""
        self._on_read = on_read
        self._commands = commands
        self._key = fleet_key(prefix)
        self._ready_key = fleet_ready_key(prefix)
        self._fingerprint = fingerprint
        self.every_s = every_s
        self._timeout_s = timeout_s
        self._wall = wall
        self.instance = instance or instance_id()
        self._seen: dict[str, str] = {}  # instance -> fingerprint, as last read
        self._reported: set[str] = set()  # other fingerprints already logged
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._readiness: Callable[[], Mapping[str, Any]] | None = None
        self._announced: dict[str, dict[str, Any]] = {}  # instance -> its last readiness

    def start(self, readiness: Callable[[], Mapping[str, Any]] | None = None) -> None:
        """Announce every ``every_s``; with ``readiness``, this instance's readiness
        too (a short summary of /readyz), which :meth:`instances` reads back."""
        self._readiness = readiness
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        from gateway.cache.topology import REDIS_ERRORS

        await stop(self._task)
        self._task = None
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._commands.hdel(self._key, self.instance)
                await self._commands.hdel(self._ready_key, self.instance)
        except (*REDIS_ERRORS, TimeoutError):
            pass  # its field expires on its own

    async def _run(self) -> None:
        while True:
            await self.announce()
            await asyncio.sleep(self.every_s)

    async def announce(self) -> None:
        """Write this instance's fingerprint, read everyone's (one round of the loop)."""
        from gateway.cache.topology import REDIS_ERRORS

        mine = self._fingerprint()
        now = self._wall()
        expiry = now + 3 * self.every_s
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._commands.hset(self._key, self.instance, f"{mine} {expiry:.3f}")
                await self._commands.pexpire(self._key, int(6 * self.every_s * 1000))
                raw: dict[Any, Any] = await self._commands.hgetall(self._key)
                gone = self._read(raw, now)
                if gone:
                    await self._commands.hdel(self._key, *gone)
        except (*REDIS_ERRORS, TimeoutError) as exc:
            self.last_error = f"redis fleet announcement: {type(exc).__name__}: {exc}"
            return
        self.last_error = None
        self._notice(mine)
        if self._on_read is not None:
            self._on_read(self.configurations())
        if self._readiness is not None:
            await self._announce_readiness(now, expiry)

    async def _announce_readiness(self, now: float, expiry: float) -> None:
        """Write this instance's readiness, read every instance's (in a hash of its own:
        the fingerprints' hash keeps the form every version reads)."""
        from gateway.cache.topology import REDIS_ERRORS

        assert self._readiness is not None
        summary = {"expiry": expiry, "at": now, **self._readiness()}
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._commands.hset(self._ready_key, self.instance, json.dumps(summary))
                await self._commands.pexpire(self._ready_key, int(6 * self.every_s * 1000))
                raw: dict[Any, Any] = await self._commands.hgetall(self._ready_key)
                ready: dict[str, dict[str, Any]] = {}
                gone = []
                for field, value in raw.items():
                    try:
                        seen = json.loads(bytes(value))
                        live = float(seen["expiry"]) >= now
                    except (ValueError, KeyError, TypeError):
                        seen, live = None, False
                    if live and isinstance(seen, dict):
                        ready[bytes(field).decode("utf-8", "replace")] = seen
                    else:
                        gone.append(field)
                if gone:
                    await self._commands.hdel(self._ready_key, *gone)
        except (*REDIS_ERRORS, TimeoutError) as exc:
            self.last_error = f"redis fleet readiness: {type(exc).__name__}: {exc}"
            return
        self._announced = ready

    def instances(self) -> list[dict[str, Any]]:
        """Every live process's readiness as it last announced it, with how many seconds
        ago, and this one's as it is now; sorted by instance. An announcement past its
        expiry, or not of the form announced, is left out."""
        now = self._wall()
        rows = []
        for name, seen in self._announced.items():
            try:
                at, expiry = float(seen["at"]), float(seen["expiry"])
                told = {"status": str(seen["status"]), "circuit": seen.get("circuit")}
                parts = {str(part): str(word) for part, word in dict(seen["components"]).items()}
            except (KeyError, TypeError, ValueError):
                continue
            if name == self.instance or expiry < now:
                continue
            ago = round(max(now - at, 0.0), 1)
            rows.append({**told, "components": parts, "instance": name, "mine": False,
                         "fingerprint": self._seen.get(name), "secondsAgo": ago})  # fmt: skip
        if self._readiness is not None:
            mine = {"instance": self.instance, "mine": True, "fingerprint": self._fingerprint()}
            rows.append({**self._readiness(), **mine, "secondsAgo": 0.0})
        return sorted(rows, key=lambda row: str(row["instance"]))

    def _read(self, raw: dict[Any, Any], now: float) -> list[bytes]:
        seen: dict[str, str] = {}
        gone: list[bytes] = []
        for field, value in raw.items():
            fingerprint, _, expiry = bytes(value).decode("utf-8", "replace").partition(" ")
            try:
                expired = float(expiry) < now
            except ValueError:
                expired = True
            if expired:
                gone.append(field)
            else:
                seen[bytes(field).decode("utf-8", "replace")] = fingerprint
        self._seen = seen
        return gone

    def _notice(self, mine: str) -> None:
        for fingerprint in sorted(set(self._seen.values()) - {mine} - self._reported):
            self._reported.add(fingerprint)
            others = sorted(name for name, seen in self._seen.items() if seen == fingerprint)
            log.warning(
                "fleet: instances sharing this cache run another cache configuration",
                extra={
                    "event": "fleet_disagreement",
                    "mine": mine,
                    "theirs": fingerprint,
                    "instances": others[:10],
                },
            )

    def configurations(self) -> int:
        """Distinct cache configurations among the live instances seen (0: none read yet)."""
        return len(set(self._seen.values()))

    def report(self) -> dict[str, Any]:
        """The fleet component of /readyz."""
        mine = self._fingerprint()
        if not self._seen:
            return {"status": UNKNOWN, "fingerprint": mine, "lastError": self.last_error}
        by_fingerprint: dict[str, int] = {}
        for fingerprint in self._seen.values():
            by_fingerprint[fingerprint] = by_fingerprint.get(fingerprint, 0) + 1
        status = OK if set(by_fingerprint) <= {mine} else DEGRADED
        return {
            "status": status,
            "fingerprint": mine,
            "instances": len(self._seen),
            "configurations": by_fingerprint,
            "lastError": self.last_error,
        }
