"""The cache backends by the name ``cache.backend`` gives them, each registered with
what it can do (``Capabilities``) and how it is made: adding a backend is a module and
one :func:`register_backend` call. The rest of the gateway asks a backend's
capabilities, never its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.cache.backend import IN_PROCESS, NOTHING, SHARED, CacheBackend, Capabilities
from gateway.cache.clock import Clock
from gateway.cache.memory import MemoryBackend, NullBackend
from gateway.config.settings import CacheSettings

# how a backend is made: the cache settings, the key prefix of its entries (one
# namespace and upstream), the clock
Factory = Callable[[CacheSettings, str, Clock], CacheBackend]


@dataclass(frozen=True, slots=True)
class Registered:
    capabilities: Capabilities
    factory: Factory


class BackendRegistry:
    """Backends by name."""

    def __init__(self) -> None:
        self._backends: dict[str, Registered] = {}

    def register(self, name: str, capabilities: Capabilities, factory: Factory) -> None:
        """Register the backend ``cache.backend = name`` selects."""
        self._backends[name] = Registered(capabilities, factory)

    def _of(self, name: str) -> Registered:
        try:
            return self._backends[name]
        except KeyError:
            known = ", ".join(sorted(self._backends))
            raise ValueError(f"cache.backend: no backend {name!r}; known: {known}") from None

    def capabilities(self, name: str) -> Capabilities:
        """What the backend of that name can do, before one is made."""
        return self._of(name).capabilities

    def create(self, settings: CacheSettings, *, prefix: str, clock: Clock) -> CacheBackend:
        """The configured backend (not yet connected: Redis connects on first use)."""
        return self._of(settings.backend).factory(settings, prefix, clock)


def _memory(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    return MemoryBackend(max_bytes=settings.memory_max_bytes, clock=clock)


def _nothing(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    return NullBackend()


def _redis(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    # imported here: redis-py costs megabytes of memory the other backends do not need
    from gateway.cache.near import NearCache, TieredBackend
    from gateway.cache.redis import RedisBackend
    from gateway.cache.topology import connect

    topology = connect(settings)
    far = RedisBackend(topology.commands, prefix=prefix, timeout_s=settings.redis_timeout_ms / 1000)
    return TieredBackend(
        far,
        NearCache(max_bytes=settings.near_max_bytes, clock=clock, enabled=settings.near_cache),
        topology=topology,
        prefix=prefix,
    )


def default_registry() -> BackendRegistry:
    """The backends this gateway ships: ``memory``, ``redis`` (Redis standalone,
    Sentinel or Cluster, with the near cache in front) and ``none``."""
    registry = BackendRegistry()
    registry.register("memory", IN_PROCESS, _memory)
    registry.register("redis", SHARED, _redis)
    registry.register("none", NOTHING, _nothing)
    return registry
