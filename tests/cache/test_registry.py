"""The cache backends by name, with what each can do (gateway/cache/registry.py)."""

from __future__ import annotations

import pytest

from gateway.cache.backend import IN_PROCESS, NOTHING, PUBLISHING, SHARED, CacheBackend
from gateway.cache.clock import Clock
from gateway.cache.memory import MemoryBackend, NullBackend
from gateway.cache.registry import BackendRegistry, default_registry
from gateway.cache.tiered import TieredBackend
from gateway.config.settings import CacheSettings

from ..conftest import FakeClock


async def test_each_shipped_backend_declares_what_it_can_do(redis_url: str) -> None:
    registry = default_registry()
    clock = FakeClock()
    made = {
        name: registry.create(
            CacheSettings.model_validate(
                {"backend": name, "redis_url": redis_url, "key_secret": "k" * 32}
            ),
            prefix="rg:test",
            clock=clock,
        )
        for name in ("memory", "redis", "none")
    }
    assert isinstance(made["memory"], MemoryBackend)
    assert isinstance(made["redis"], TieredBackend)
    assert isinstance(made["none"], NullBackend)
    for name, backend in made.items():
        assert backend.capabilities == registry.capabilities(name)
    assert registry.capabilities("memory") == IN_PROCESS
    assert registry.capabilities("redis") == PUBLISHING
    assert registry.capabilities("none") == NOTHING
    for backend in made.values():
        await backend.close()


def test_a_backend_is_one_registration() -> None:
    """A backend of another kind is registered by name with its capabilities; the
    registry makes it for the settings that name it."""

    def make(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
        return MemoryBackend(max_bytes=1024, clock=clock)

    registry = BackendRegistry()
    registry.register("memory", SHARED, make)
    backend = registry.create(CacheSettings(backend="memory"), prefix="p", clock=FakeClock())
    assert isinstance(backend, MemoryBackend)
    assert registry.capabilities("memory") == SHARED


def test_an_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match=r"cache\.backend: no backend 'memory'; known: "):
        BackendRegistry().capabilities("memory")


def test_a_backend_that_claims_to_publish_invalidations_must_offer_them() -> None:
    """The near cache is put only in front of a backend with an invalidation channel:
    one registered as publishing without one is refused when it is made."""

    def make(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
        return MemoryBackend(max_bytes=1024, clock=clock)

    registry = BackendRegistry()
    registry.register("memory", PUBLISHING, make)
    with pytest.raises(TypeError, match="memory: a near cache needs a backend that publishes"):
        registry.create(CacheSettings(backend="memory"), prefix="p", clock=FakeClock())
