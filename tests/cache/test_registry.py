"""The cache backends by name, with what each can do (gateway/cache/registry.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError
from pytest_aiohttp import AiohttpClient

from gateway.cache.backend import (
    IN_PROCESS,
    NOTHING,
    PUBLISHING,
    PUBLISHING_INDEXED,
    SHARED,
    CacheBackend,
)
from gateway.cache.clock import Clock
from gateway.cache.memory import MemoryBackend, NullBackend
from gateway.cache.registry import BackendRegistry, default_registry
from gateway.cache.tiered import TieredBackend
from gateway.config.backends import BACKENDS, BackendCatalogue
from gateway.config.settings import CacheSettings
from gateway.demo import REQUEST_LOG
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS

from ..conftest import AUTH, FakeClock, base_url, gateway_client, make_settings


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
    assert registry.capabilities("redis") == PUBLISHING_INDEXED
    assert registry.capabilities("none") == NOTHING
    for backend in made.values():
        await backend.close()


def test_a_backend_is_one_registration() -> None:
    """A backend of another kind is registered by name with its capabilities; the
    registry makes it for the settings that name it."""

    def make(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
        return MemoryBackend(max_bytes=1024, clock=clock)

    # a catalogue of its own: the settings' is not told of this test's kind of memory
    registry = BackendRegistry(BackendCatalogue())
    registry.register("memory", SHARED, make)
    backend = registry.create(CacheSettings(backend="memory"), prefix="p", clock=FakeClock())
    assert isinstance(backend, MemoryBackend)
    assert registry.capabilities("memory") == SHARED


def test_an_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match=r"cache\.backend: no backend 'memory'; known: "):
        BackendRegistry(BackendCatalogue()).capabilities("memory")


def test_a_backend_that_claims_to_publish_invalidations_must_offer_them() -> None:
    """The near cache is put only in front of a backend with an invalidation channel:
    one registered as publishing without one is refused when it is made."""

    def make(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
        return MemoryBackend(max_bytes=1024, clock=clock)

    registry = BackendRegistry(BackendCatalogue())
    registry.register("memory", PUBLISHING, make)
    with pytest.raises(TypeError, match="memory: a near cache needs a backend that publishes"):
        registry.create(CacheSettings(backend="memory"), prefix="p", clock=FakeClock())


class ScratchBackend(MemoryBackend):
    """A backend of these tests' own, one module's worth: entries in this process."""

    name = "scratch"


def _scratch(settings: CacheSettings, prefix: str, clock: Clock) -> CacheBackend:
    return ScratchBackend(max_bytes=1 << 20, clock=clock)


@pytest.fixture
def scratch_registry() -> Iterator[BackendRegistry]:
    """The shipped backends and two of the tests' own, each one registration: the
    settings take their names while they are registered."""
    registry = default_registry()
    registry.register("scratch", IN_PROCESS, _scratch)
    registry.register("scratch-shared", SHARED, _scratch)
    yield registry
    BACKENDS.withdraw("scratch")
    BACKENDS.withdraw("scratch-shared")


async def test_a_registered_backend_is_taken_by_the_settings_and_serves(
    scratch_registry: BackendRegistry, upstream: TestServer, aiohttp_client: AiohttpClient
) -> None:
    settings = make_settings(base_url(upstream), cache={"backend": "scratch"})
    client = await gateway_client(aiohttp_client, create_app(settings, backends=scratch_registry))
    calls = len(upstream.app[REQUEST_LOG])

    first = await client.get("/users?limit=3", headers=AUTH)
    second = await client.get("/users?limit=3", headers=AUTH)

    assert (first.status, first.headers["X-Cache"]) == (200, "MISS")
    assert (second.status, second.headers["X-Cache"]) == (200, "HIT")
    assert await second.read() == await first.read()
    assert len(upstream.app[REQUEST_LOG]) == calls + 1
    assert isinstance(client.app[UPSTREAMS].current.cache.backend, ScratchBackend)


def test_a_registered_shared_backend_needs_the_key_secret(
    scratch_registry: BackendRegistry,
) -> None:
    """cache.key_secret is required by what a backend declares (shared between
    processes), not by its name."""
    with pytest.raises(
        ValidationError, match="key_secret: required when backend is scratch-shared"
    ):
        CacheSettings(backend="scratch-shared")
    assert CacheSettings(backend="scratch-shared", key_secret="k" * 32).backend == "scratch-shared"
    assert CacheSettings(backend="scratch").key_secret is None


def test_the_settings_refuse_a_backend_no_one_registered(
    scratch_registry: BackendRegistry,
) -> None:
    with pytest.raises(ValidationError) as caught:
        CacheSettings(backend="disk")
    assert caught.value.errors()[0]["msg"] == (
        "Value error, Input should be 'redis', 'memory', 'none', 'scratch' or 'scratch-shared'"
    )


def test_settings_checked_before_any_backend_is_registered_fail_closed() -> None:
    """An entry point that checks settings without importing the registry gets an
    error, not a shared backend without its key secret (a fresh interpreter, so
    that nothing is registered yet)."""
    code = "from gateway.config.settings import CacheSettings\nCacheSettings(backend='redis')\n"
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == 1
    assert "RuntimeError: no cache backend is registered" in ran.stderr


class ClosesBadly(ScratchBackend):
    """A shared store of the tests' own that goes away while it is being closed."""

    async def close(self) -> None:
        await super().close()
        raise ConnectionResetError("the store went away while closing")


async def test_a_backend_that_fails_to_close_leaves_nothing_else_open(
    upstream: TestServer, aiohttp_client: AiohttpClient
) -> None:
    """A shared backend (the binding's own) whose close fails: the binding's other
    parts, its connection pool to the upstream among them, are closed all the same,
    and the error is the one raised."""
    registry = default_registry()
    registry.register(
        "closes-badly",
        SHARED,
        lambda settings, prefix, clock: ClosesBadly(max_bytes=1 << 20, clock=clock),
    )
    try:
        settings = make_settings(
            base_url(upstream), cache={"backend": "closes-badly", "key_secret": "k" * 32}
        )
        client = await gateway_client(aiohttp_client, create_app(settings, backends=registry))
        assert (await client.get("/users?limit=3", headers=AUTH)).status == 200
        binding = client.app[UPSTREAMS].current
        assert binding.own_backend is not None
        with pytest.raises(ConnectionResetError, match="went away while closing"):
            await client.app[UPSTREAMS].close()
        assert binding.link.closed
    finally:
        BACKENDS.withdraw("closes-badly")
