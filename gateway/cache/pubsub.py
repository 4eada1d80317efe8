"""Redis pub/sub as the invalidation channel of a Redis backend, on any of the three
topologies (``gateway.cache.topology`` says where a subscription connects and where a
message is published). Every Redis failure becomes CacheUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import redis.asyncio as redis
from redis.asyncio.client import PubSub

from gateway.cache.backend import Heard
from gateway.cache.topology import REDIS_ERRORS, RedisTopology
from gateway.errors import CacheUnavailable


@contextlib.contextmanager
def _faults(what: str) -> Iterator[None]:
    try:
        yield
    except REDIS_ERRORS as exc:
        raise CacheUnavailable(f"redis {what}: {type(exc).__name__}: {exc}") from exc


class RedisSubscription:
    """One subscriber connection and its pub/sub, on the node where publishes go."""

    def __init__(self, topology: RedisTopology, client: redis.Redis, channel: str) -> None:
        self._topology = topology
        self._client = client
        self._channel = channel  # the one whose node the subscription must stay on
        self._pubsub: PubSub = client.pubsub()

    async def subscribe(self, channels: tuple[str, ...]) -> None:
        with _faults("SUBSCRIBE"):
            await self._pubsub.subscribe(*channels)

    async def receive(self, timeout_s: float) -> Heard | None:
        with _faults("pub/sub read"):
            message = await self._pubsub.get_message(timeout=timeout_s)
        if message is None:
            return None
        channel, data = message.get("channel"), message.get("data")
        if message.get("type") != "message" or not isinstance(data, bytes):
            return Heard(None)
        return Heard(bytes(channel).decode("utf-8", "replace"), data)

    async def ping(self) -> None:
        with _faults("pub/sub PING"):
            await self._pubsub.ping()

    def in_place(self) -> bool:
        return self._topology.follows(self._client, self._channel)

    async def close(self) -> None:
        with contextlib.suppress(*REDIS_ERRORS, TimeoutError, RuntimeError):
            async with asyncio.timeout(1.0):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._topology.forget(self._client)


class RedisChannel:
    """PUBLISH and SUBSCRIBE on a Redis topology; its lifetime is the topology's (the
    Sentinel watcher starts with :meth:`start`, every client closes with :meth:`close`)."""

    def __init__(self, topology: RedisTopology) -> None:
        self._topology = topology

    async def publish(self, channel: str, message: bytes) -> int:
        with _faults("PUBLISH"):
            return await self._topology.publish(channel, message)

    async def subscribe(self, *channels: str) -> RedisSubscription:
        with _faults("SUBSCRIBE"):
            client = await self._topology.subscriber(channels[0])
        subscription = RedisSubscription(self._topology, client, channels[0])
        try:
            await subscription.subscribe(channels)
        except BaseException:
            await subscription.close()
            raise
        return subscription

    def start(self) -> None:
        self._topology.start()

    async def close(self) -> None:
        await self._topology.close()
