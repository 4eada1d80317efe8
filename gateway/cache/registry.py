"""The cache backends by the name ``cache.backend`` gives them, each registered with
what it can do (``Capabilities``) and how it is made: adding a backend is a module and
one :meth:`BackendRegistry.register` call. The rest of the gateway asks a backend's
capabilities, never its name. A backend registered as publishing invalidations is made
with the near cache in front of it (``gateway.cache.tiered``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.cache.backend import (
    IN_PROCESS,
    NOTHING,
    PUBLISHING_INDEXED,
    CacheBackend,
    Capabilities,
)
from gateway.cache.clock import Clock
from gateway.cache.memory import MemoryBackend, NullBackend
from gateway.cache.near import NearCache
from gateway.cache.tiered import TieredBackend
from gateway.config.backends import BACKENDS, BackendCatalogue, BackendKind
from gateway.config.settings import CacheSettings

# how a backend is made: the cache settings, the key prefix of its entries (one
# namespace and upstream), the clock. One registered with ``publishes_invalidations``
# makes a backend that is also ``Publishing``.
Factory = Callable[[CacheSettings, str, Clock], CacheBackend]


@dataclass(frozen=True, slots=True)
class Registered:
    capabilities: Capabilities
    factory: Factory


class BackendRegistry:
    """Backends by name. Each registered is declared to ``catalogue``, the backends the
    settings take (``gateway.config.backends.BACKENDS`` unless another is given)."""

    def __init__(self, catalogue: BackendCatalogue = BACKENDS) -> None:
        self._backends: dict[str, Registered] = {}
        self._catalogue = catalogue

    def register(self, name: str, capabilities: Capabilities, factory: Factory) -> None:
        """Register the backend ``cache.backend = name`` selects, and declare it to the
        catalogue (the names the settings take, and which need ``cache.key_secret``)."""
        self._backends[name] = Registered(capabilities, factory)
        self._catalogue.declare(name, BackendKind(shared=capabilities.shared))

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
        """The configured backend (not yet connected: Redis connects on first use), the
        near cache in front of it when it publishes invalidations."""
        registered = self._of(settings.backend)
        made = registered.factory(settings, prefix, clock)
        if not registered.capabilities.publishes_invalidations:
            return made
        near = NearCache(
            max_bytes=settings.near_max_bytes, clock=clock, enabled=settings.near_cache
        )
        return TieredBackend(made, near, prefix=prefix)


def _memory(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    return MemoryBackend(max_bytes=settings.memory_max_bytes, clock=clock)


def _nothing(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    return NullBackend()


def _redis(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    # imported here: redis-py costs megabytes of memory the other backends do not need
    from gateway.cache.pubsub import RedisChannel
    from gateway.cache.redis import RedisBackend
    from gateway.cache.topology import connect

    topology = connect(settings)
    return RedisBackend(
        topology.commands,
        prefix=prefix,
        timeout_s=settings.redis_timeout_ms / 1000,
        invalidations=RedisChannel(topology),
        clock=clock,
    )


def default_registry() -> BackendRegistry:
    """The backends this gateway ships: ``memory``, ``redis`` (Redis standalone,
    Sentinel or Cluster, with the near cache in front) and ``none``."""
    registry = BackendRegistry()
    registry.register("redis", PUBLISHING_INDEXED, _redis)
    registry.register("memory", IN_PROCESS, _memory)
    registry.register("none", NOTHING, _nothing)
    return registry


# the shipped backends declared to the settings as soon as the cache layer is imported
default_registry()
