"""Connections to the three Redis topologies, through redis-py's own clients.

- ``standalone``: one server at ``cache.redis_url``.
- ``sentinel``: the primary the sentinels name (``redis.asyncio.sentinel``). Every new
  connection asks the sentinels where the primary is; a watcher asks once a second as
  well and, when the answer changes (a failover), drops every connection to the old
  primary, in use or idle, so that nothing is written to a demoted primary. A write
  that reaches one anyway gets READONLY, which redis-py turns into a reconnection.
- ``cluster``: ``redis.asyncio.cluster.RedisCluster``, which routes every command to
  the shard of its key and follows MOVED and ASK redirections. A subscription goes to
  the primary that owns its channel's slot, where purges publish, and moves with it.

The user name and password are the data nodes', in every mode; the sentinels get
``redis_sentinel_password`` only. TLS (and its CA) applies to every connection, to the
sentinels too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import redis.asyncio as redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from gateway.cache.tasks import stop
from gateway.config.settings import CacheSettings, parse_node

log = logging.getLogger("gateway.cache")

# What the backend sends commands to: a plain client or a cluster client.
Commands: TypeAlias = "redis.Redis | RedisCluster"
# What redis-py raises when Redis fails or cannot be reached (its cluster client
# raises a few errors that are not RedisError: no node for a slot, no cluster at all).
# What the Redis clients raise when Redis or the way to it fails. AttributeError
# among them: redis-py's async cluster client raises it when its view of the cluster
# is out of date (redis-py issue 3835) or when two of its pipelines race on one
# connection (8.1); either is a cache fault, which must never fail a request.
REDIS_ERRORS = (RedisError, RedisClusterException, OSError, AttributeError)

_WATCH_EVERY_S = 1.0
# how long one sentinel may take to answer
SENTINEL_TIMEOUT_S = 0.5


def _tls_kwargs(settings: CacheSettings) -> dict[str, Any]:
    if not settings.redis_tls:
        return {}
    kwargs: dict[str, Any] = {"ssl": True}
    if settings.redis_tls_ca_file is not None:
        kwargs["ssl_ca_certs"] = str(settings.redis_tls_ca_file)
    return kwargs


def _auth_kwargs(settings: CacheSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if settings.redis_username is not None:
        kwargs["username"] = settings.redis_username
    if settings.redis_password is not None:
        kwargs["password"] = settings.redis_password.get_secret_value()
    return kwargs


def _timeouts(timeout_s: float | None) -> dict[str, Any]:
    """``timeout_s`` None: no read timeout (a subscription waits for messages)."""
    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s or 1.0,
        "health_check_interval": 0,
        "decode_responses": False,
    }


def _standalone_url(settings: CacheSettings) -> str:
    url = settings.redis_url
    if settings.redis_tls and url.startswith("redis://"):
        url = "rediss://" + url.removeprefix("redis://")
    return url


def _standalone_kwargs(settings: CacheSettings) -> dict[str, Any]:
    """What a standalone client takes beside its URL (the URL's scheme says TLS)."""
    kwargs = _auth_kwargs(settings)
    if settings.redis_tls_ca_file is not None:
        kwargs["ssl_ca_certs"] = str(settings.redis_tls_ca_file)
    return kwargs


@dataclass(slots=True)
class RedisTopology:
    """The clients of one gateway process for its configured topology."""

    settings: CacheSettings
    commands: Commands
    mode: str
    _sentinel: Sentinel | None = None
    _subscriber_clients: list[redis.Redis] = field(default_factory=list)
    _watcher: asyncio.Task[None] | None = None
    master: tuple[str, int] | None = None

    @property
    def sentinel(self) -> Sentinel | None:
        """The sentinels' client (sentinel mode)."""
        return self._sentinel

    async def subscriber(self, channel: str) -> redis.Redis:
        """A client for a subscription to ``channel``: no read timeout, a small pool of
        its own. In cluster mode it connects to the primary that owns the channel's
        slot, where :meth:`publish` sends, so that PUBLISH counts every subscriber (a
        cluster does broadcast PUBLISH to every node, but each node counts only its
        own subscribers)."""
        settings = self.settings
        kwargs = {**_timeouts(None), "max_connections": 4}
        client: redis.Redis
        if self.mode == "standalone":
            client = redis.Redis.from_url(
                _standalone_url(settings), **kwargs, **_standalone_kwargs(settings)
            )
        elif self.mode == "sentinel":
            assert self._sentinel is not None
            assert settings.redis_sentinel_master is not None
            client = self._sentinel.master_for(
                settings.redis_sentinel_master,
                redis_class=redis.Redis,
                connection_pool_class=SentinelConnectionPool,
                **kwargs,
            )
        else:
            host, port = await self._channel_node(channel)
            client = redis.Redis(
                host=host, port=port, **kwargs, **_auth_kwargs(settings), **_tls_kwargs(settings)
            )
        self._subscriber_clients.append(client)
        return client

    def follows(self, client: redis.Redis, channel: str) -> bool:
        """Whether a subscriber made by :meth:`subscriber` is still where purges
        publish: in cluster mode, on the primary that owns the channel's slot as the
        cluster client last learnt it (a failover or resharding moves it); always
        true in the other modes (sentinel mode follows the primary by itself)."""
        commands = self.commands
        if not isinstance(commands, RedisCluster):
            return True
        try:
            node = commands.get_node_from_key(channel)
        except REDIS_ERRORS:
            return False
        kwargs = client.connection_pool.connection_kwargs
        return node is not None and (node.host, int(node.port)) == (
            kwargs.get("host"),
            kwargs.get("port"),
        )

    async def publish(self, channel: str, message: bytes) -> int:
        """PUBLISH ``message``; the number of subscribers it reached."""
        commands = self.commands
        if isinstance(commands, RedisCluster):
            await commands.initialize()
            node = commands.get_node_from_key(channel)
            told = await commands.execute_command("PUBLISH", channel, message, target_nodes=node)
        else:
            told = await commands.publish(channel, message)
        return int(told)

    async def _channel_node(self, channel: str) -> tuple[str, int]:
        commands = self.commands
        assert isinstance(commands, RedisCluster)
        await commands.initialize()
        node = commands.get_node_from_key(channel)
        if node is None:
            raise RedisError(f"no cluster node serves the slot of {channel}")
        return node.host, int(node.port)

    async def forget(self, client: redis.Redis) -> None:
        """Close a subscriber client made by :meth:`subscriber`."""
        if client in self._subscriber_clients:
            self._subscriber_clients.remove(client)
        with contextlib.suppress(*REDIS_ERRORS, RuntimeError):
            await client.aclose()

    def start(self) -> None:
        """Start following failovers (sentinel mode; nothing to do otherwise)."""
        if self.mode == "sentinel" and self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        assert self._sentinel is not None
        assert self.settings.redis_sentinel_master is not None
        name = self.settings.redis_sentinel_master
        named = True  # logged once when no sentinel names the primary, not every second
        while True:
            # long enough to pass over every sentinel that does not answer
            bound = SENTINEL_TIMEOUT_S * (len(self._sentinel.sentinels) + 1)
            try:
                async with asyncio.timeout(bound):
                    address = await self._sentinel.discover_master(name)
            except (*REDIS_ERRORS, TimeoutError) as exc:
                if named:
                    log.warning(
                        "redis sentinel: no sentinel names the primary",
                        extra={
                            "event": "redis_topology",
                            "error": f"{type(exc).__name__}: {exc}",
                        },
                    )
                named = False
            else:
                named = True
                if self.master is not None and address != self.master:
                    log.warning(
                        "redis sentinel: the primary moved; connections to the old one closed",
                        extra={
                            "event": "redis_failover",
                            "old": f"{self.master[0]}:{self.master[1]}",
                            "new": f"{address[0]}:{address[1]}",
                        },
                    )
                    await self._drop_connections()
                self.master = address
            await asyncio.sleep(_WATCH_EVERY_S)

    async def _drop_connections(self) -> None:
        """Close every connection, in use or idle, of the command and subscriber
        clients: the next command connects to the primary the sentinels name now."""
        clients: list[Commands] = [self.commands, *self._subscriber_clients]
        for client in clients:
            if isinstance(client, redis.Redis):
                with contextlib.suppress(*REDIS_ERRORS):
                    await client.connection_pool.disconnect(inuse_connections=True)

    async def close(self) -> None:
        await stop(self._watcher)
        for client in list(self._subscriber_clients):
            await self.forget(client)
        await self.commands.aclose()
        if self._sentinel is not None:
            for sentinel in self._sentinel.sentinels:
                with contextlib.suppress(*REDIS_ERRORS, RuntimeError):
                    await sentinel.aclose()


def connect(settings: CacheSettings, *, max_connections: int = 256) -> RedisTopology:
    """The clients for ``settings`` (nothing is connected until first use)."""
    timeout_s = settings.redis_timeout_ms / 1000
    kwargs = {**_timeouts(timeout_s), "max_connections": max_connections}
    if settings.redis_mode == "standalone":
        client = redis.Redis.from_url(
            _standalone_url(settings),
            retry_on_timeout=False,
            **kwargs,
            **_standalone_kwargs(settings),
        )
        return RedisTopology(settings, client, "standalone")
    nodes = [parse_node(node) for node in settings.redis_nodes]
    if settings.redis_mode == "cluster":
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in nodes],
            **kwargs,
            **_auth_kwargs(settings),
            **_tls_kwargs(settings),
        )
        return RedisTopology(settings, cluster, "cluster")
    assert settings.redis_sentinel_master is not None
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        # no retries: a sentinel that does not answer is passed over for the next one
        # within SENTINEL_TIMEOUT_S, and the one that answers is asked first from then on
        "retry": Retry(NoBackoff(), 0),
        **_tls_kwargs(settings),
    }
    if settings.redis_sentinel_password is not None:
        sentinel_kwargs["password"] = settings.redis_sentinel_password.get_secret_value()
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        nodes,
        sentinel_kwargs=sentinel_kwargs,
        **_auth_kwargs(settings),
        **_tls_kwargs(settings),
    )
    client = sentinel.master_for(
        settings.redis_sentinel_master,
        redis_class=redis.Redis,
        connection_pool_class=SentinelConnectionPool,
        **kwargs,
    )
    return RedisTopology(settings, client, "sentinel", _sentinel=sentinel)
