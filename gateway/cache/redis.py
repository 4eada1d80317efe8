"""The Redis cache backend: one connection pool per process, every call bounded in time.

A read is one MGET of the entry and the two purge generations; a store is one SET
with an expiry; a purge is one INCR. Every Redis failure or timeout becomes
CacheUnavailable, which the pipeline treats as a miss.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.cache.backend import QuietBackend
from gateway.cache.entry import (
    GENERATION_LIFETIME_S,
    CacheCorrupt,
    CacheEntry,
    CacheKey,
    Generations,
    Lookup,
    generation_key,
)
from gateway.errors import CacheUnavailable

T = TypeVar("T")


def create_client(url: str, *, timeout_s: float | None, max_connections: int = 256) -> redis.Redis:
    """A client with its own pool; hiredis parses replies when it is installed.

    ``timeout_s`` None: no read timeout (a pub/sub subscription waits for messages).
    """
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s or 1.0,
        max_connections=max_connections,
        retry_on_timeout=False,
        health_check_interval=0,
        decode_responses=False,
    )


class RedisBackend(QuietBackend):
    """Entries in a Redis shared by every gateway instance of one namespace and upstream."""

    name = "redis"

    def __init__(self, client: redis.Redis, *, prefix: str, timeout_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._everything_key = generation_key(prefix, None)

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call()
        except TimeoutError as exc:
            raise CacheUnavailable(
                f"redis {what}: no answer within {self._timeout_s * 1000:g} ms"
            ) from exc
        except (RedisError, OSError) as exc:
            raise CacheUnavailable(f"redis {what}: {type(exc).__name__}: {exc}") from exc

    async def get(self, key: CacheKey) -> Lookup:
        route_key = generation_key(self._prefix, key.route)
        raw, everything, route = await self._call(
            "GET", lambda: self._client.mget(key.text, self._everything_key, route_key)
        )
        try:
            current = Generations(int(everything or 0), int(route or 0))
        except ValueError as exc:
            raise CacheUnavailable(f"redis GET: a purge generation is not a number: {exc}") from exc
        if not isinstance(raw, bytes):
            return Lookup(None, current)
        try:
            entry = CacheEntry.decode(raw)
        except (CacheCorrupt, UnicodeDecodeError, ValueError):
            return Lookup(None, current)
        if entry.generations != current:
            return Lookup(None, current)
        return Lookup(entry, current)

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        milliseconds = max(1, int(lifetime_s * 1000))
        await self._call("SET", lambda: self._client.set(key.text, entry.encode(), px=milliseconds))

    async def purge(self, route: str | None) -> None:
        counter = generation_key(self._prefix, route)

        async def incr() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.incr(counter)
                pipe.expire(counter, GENERATION_LIFETIME_S)
                await pipe.execute()

        await self._call("INCR", incr)

    async def ping(self) -> None:
        await self._call("PING", self._client.ping)

    async def probe(self) -> None:
        probe_key = CacheKey("probe", f"{self._prefix}:probe")
        await self._call("SET", lambda: self._client.set(probe_key.text, b"1", px=10_000))
        await self.get(probe_key)

    async def close(self) -> None:
        await self._client.aclose()
