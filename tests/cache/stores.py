"""The two backends that purge by record, made alike for the tests of the index."""

from __future__ import annotations

import redis.asyncio as redis

from gateway.cache.backend import CacheBackend
from gateway.cache.clock import Clock
from gateway.cache.memory import MemoryBackend
from gateway.cache.redis import RedisBackend


async def fresh_redis(redis_url: str, prefix: str, clock: Clock) -> RedisBackend:
    """A Redis backend of ``prefix``, none of whose keys an earlier test left."""
    client = redis.Redis.from_url(redis_url)
    for old in await client.keys(prefix + ":*"):
        await client.delete(old)
    return RedisBackend(client, prefix=prefix, timeout_s=1.0, clock=clock)


async def indexed_store(kind: str, clock: Clock, redis_url: str, prefix: str) -> CacheBackend:
    """A memory backend (``kind`` "memory") or a fresh Redis one."""
    if kind == "memory":
        return MemoryBackend(max_bytes=1 << 20, clock=clock)
    return await fresh_redis(redis_url, prefix, clock)
