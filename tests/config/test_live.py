"""Reloading the configuration while serving: LiveConfig and the admin routes."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.config.live import ConfigSource, LiveConfig
from gateway.config.settings import Settings
from gateway.demo import REQUEST_LOG, create_demo_app
from gateway.errors import ConfigError
from gateway.http.admin import LIVE
from gateway.http.app import create_app
from gateway.http.binding import UPSTREAMS

from ..conftest import AUTH, FakeClock, base_url, gateway_client

Client = TestClient[web.Request, web.Application]
SECRET = "test-key-secret-0123456789"
ADMIN = "admin-token-0123456789abcdef"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
REDACTED = "**********"
Sections = dict[str, dict[str, Any]]


def to_toml(sections: Sections) -> str:
    """TOML for two levels of tables of plain values (enough for the settings)."""
    lines: list[str] = []

    def table(name: str, values: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        for key, value in values.items():
            if key not in nested:
                lines.append(f"{key} = {json.dumps(value)}")
        for key, value in nested.items():
            table(f"{name}.{key}", value)

    for name, values in sections.items():
        table(name, values)
    return "\n".join(lines) + "\n"


class ConfigFile:
    """A TOML config file that a test rewrites between reloads."""

    def __init__(self, path: Path, sections: Sections) -> None:
        self.path = path
        self.sections = sections
        self.write()

    def write(self) -> None:
        self.path.write_text(to_toml(self.sections))

    def set(self, section: str, key: str, value: Any) -> None:
        target = self.sections.setdefault(section, {})
        *parents, last = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
        self.write()


@pytest.fixture
def root_level() -> Iterator[None]:
    """A reload sets the root logger's level; put it back."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture
def config(tmp_path: Path, upstream: TestServer) -> ConfigFile:
    return ConfigFile(
        tmp_path / "gateway.toml",
        {
            "server": {"port": 8080},
            "upstream": {"base_url": base_url(upstream)},
            "cache": {"backend": "memory", "key_secret": SECRET, "ttl_s": {"users": 300}},
            "admin": {"token": ADMIN},
            "log": {"level": "info", "access": True},
        },
    )


Start = Callable[..., Awaitable[Client]]


@pytest.fixture
def start(aiohttp_client: AiohttpClient, clock: FakeClock, root_level: None) -> Start:
    """A gateway whose settings come from ``config`` (plus ``overrides``), as the CLI makes it."""

    async def start(config: ConfigFile, **overrides: Any) -> Client:
        source = ConfigSource(config.path, overrides)
        app = create_app(source.load(), clock=clock, source=source)
        return await gateway_client(aiohttp_client, app)

    return start


def live(client: Client) -> LiveConfig:
    return client.app[LIVE]


async def cache_control(client: Client, path: str) -> tuple[str, str]:
    response = await client.get(path, headers=AUTH)
    assert response.status == 200
    return response.headers["X-Cache"], response.headers["Cache-Control"]


async def reload(client: Client) -> tuple[int, Any]:
    response = await client.post("/admin/reload", headers=ADMIN_AUTH)
    return response.status, await response.json(content_type=None)


# LiveConfig.reload


async def test_a_new_ttl_applies_to_the_next_miss(start: Start, config: ConfigFile) -> None:
    client = await start(config)
    assert await cache_control(client, "/users") == ("MISS", "private, max-age=300")
    config.set("cache", "ttl_s.users", 120)
    config.set("cache", "ttl_s.clients", 0)
    result = await live(client).reload()
    assert (result.ok, result.applied, result.needs_restart, result.error) == (
        True,
        ["cache.ttl_s"],
        [],
        None,
    )
    assert live(client).settings.cache.ttl_s.users == 120
    assert client.app[UPSTREAMS].current.pipeline.policy.ttl_s["users"] == 120
    assert await cache_control(client, "/users?page=2") == ("MISS", "private, max-age=120")
    # an entry stored before the reload keeps the TTL it was stored with
    assert await cache_control(client, "/users") == ("HIT", "private, max-age=300")
    assert await cache_control(client, "/clients") == ("BYPASS", "private, max-age=0")


async def test_the_log_level_and_the_access_log_apply(
    start: Start, config: ConfigFile, caplog: pytest.LogCaptureFixture
) -> None:
    client = await start(config)
    config.set("log", "level", "warning")
    config.set("log", "access", False)
    result = await live(client).reload()
    assert (result.ok, result.applied) == (True, ["log.access", "log.level"])
    assert logging.getLogger().level == logging.WARNING
    caplog.set_level(logging.INFO, logger="gateway.access")
    assert (await client.get("/users", headers=AUTH)).status == 200
    assert [r for r in caplog.records if r.name == "gateway.access"] == []
    # on again: each line has what its request did upstream, gathered while it ran
    config.set("log", "access", True)
    assert (await live(client).reload()).applied == ["log.access"]
    assert (await client.get("/users?page=3", headers=AUTH)).status == 200
    (line,) = [r for r in caplog.records if r.name == "gateway.access"]
    assert (line.cache, line.upstream_status) == ("miss", "200")  # type: ignore[attr-defined]
    assert line.upstream_ms > 0  # type: ignore[attr-defined]


async def test_upstream_timeout_limits_and_check_interval_apply(
    start: Start, config: ConfigFile, aiohttp_server: AiohttpServer
) -> None:
    slow = await aiohttp_server(create_demo_app(latency_ms=200))
    config.set("upstream", "base_url", base_url(slow))
    client = await start(config)
    assert (await client.get("/clients?limit=50", headers=AUTH)).status == 200
    config.set("upstream", "timeout_s", 0.05)
    config.set("limits", "max_limit", 20)
    config.set("health", "check_interval_s", 0.5)
    result = await live(client).reload()
    assert result.applied == ["health.check_interval_s", "limits.max_limit", "upstream.timeout_s"]
    assert client.app[UPSTREAMS].current.readiness.interval_s == 0.5

    too_many = await client.get("/clients?limit=50", headers=AUTH)
    assert too_many.status == 400
    assert (await too_many.json(content_type=None))["errors"][0]["parameter"] == "limit"
    timed_out = await client.get("/accounts", headers=AUTH)
    assert timed_out.status == 504
    body = await timed_out.json(content_type=None)
    assert body["type"] == "urn:records-gateway:problem:upstream-timeout"
    assert "within 0.05 s" in body["detail"]


async def test_turning_the_fast_path_on_or_off_needs_a_restart(
    start: Start, config: ConfigFile
) -> None:
    client = await start(config)
    before = live(client).settings.server.fast_path
    config.set("server", "fast_path", not before)
    result = await live(client).reload()
    assert (result.ok, result.applied, result.needs_restart) == (True, [], ["server.fast_path"])
    assert live(client).settings.server.fast_path == before


async def test_the_tracing_keys_need_a_restart(start: Start, config: ConfigFile) -> None:
    client = await start(config)
    config.set("tracing", "service_name", "renamed")
    config.set("tracing", "sample_ratio", 0.5)
    result = await live(client).reload()
    assert (result.ok, result.applied) == (True, [])
    assert result.needs_restart == ["tracing.sample_ratio", "tracing.service_name"]
    assert live(client).settings.tracing.service_name == "records-gateway"


async def test_changes_that_need_a_restart_are_reported_not_applied(
    start: Start, config: ConfigFile, upstream: TestServer
) -> None:
    client = await start(config)
    before = live(client).settings
    config.set("server", "port", 9999)
    config.set("upstream", "max_connections", 7)
    config.set("cache", "backend", "none")
    config.set("cache", "ttl_s.users", 100)
    result = await live(client).reload()
    assert result.ok
    assert result.applied == ["cache.ttl_s"]
    assert result.needs_restart == ["cache.backend", "server.port", "upstream.max_connections"]
    settings = live(client).settings
    assert settings.server.port == before.server.port == 8080
    assert settings.upstream.max_connections == before.upstream.max_connections
    assert settings.cache.backend == "memory"
    assert settings.cache.ttl_s.users == 100
    # still cached
    assert (await client.get("/users", headers=AUTH)).headers["X-Cache"] == "MISS"
    assert (await client.get("/users", headers=AUTH)).headers["X-Cache"] == "HIT"
    assert len(upstream.app[REQUEST_LOG].for_path("/users")) == 1


async def test_a_new_base_url_is_applied_and_a_restart_only_change_beside_it_is_not(
    start: Start, config: ConfigFile, upstream: TestServer, aiohttp_server: AiohttpServer
) -> None:
    client = await start(config)
    other = await aiohttp_server(create_demo_app())
    config.set("upstream", "base_url", base_url(other))
    config.set("server", "port", 9999)
    result = await live(client).reload()
    assert (result.ok, result.applied, result.needs_restart) == (
        True,
        ["upstream.base_url"],
        ["server.port"],
    )
    assert live(client).settings.upstream.base_url == base_url(other)
    assert live(client).settings.server.port == 8080
    assert (await client.get("/users", headers=AUTH)).status == 200
    assert len(other.app[REQUEST_LOG].for_path("/users")) == 1
    assert len(upstream.app[REQUEST_LOG]) == 0


async def test_a_part_that_refuses_new_settings_refuses_the_reload(
    start: Start, config: ConfigFile, caplog: pytest.LogCaptureFixture
) -> None:
    client = await start(config)
    seen: list[int] = []
    live(client).on_change(lambda new: seen.append(new.cache.ttl_s.users))

    def refuse(new: Settings) -> None:
        if new.cache.ttl_s.users == 7:
            raise ConfigError("cache.ttl_s.users: this part does not take 7")

    live(client).on_change(refuse)
    config.set("cache", "ttl_s.users", 7)
    result = await live(client).reload()
    assert (result.ok, result.applied, result.error) == (
        False,
        [],
        "cache.ttl_s.users: this part does not take 7",
    )
    # the part before the one that refused was given the new settings, then the running ones
    assert seen == [7, 300]
    assert live(client).settings.cache.ttl_s.users == 300
    assert client.app[UPSTREAMS].current.pipeline.policy.ttl_s["users"] == 300
    assert (await client.get("/users", headers=AUTH)).headers["Cache-Control"] == (
        "private, max-age=300"
    )
    refused = [r for r in caplog.records if getattr(r, "ok", None) is False]
    assert [r.getMessage() for r in refused] == [
        "config reload refused; the running configuration stays"
    ]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (("cache", "ttl_s.users", -5), "cache.ttl_s.users: Input should be greater than or equal"),
        (("cache", "ttl", 5), "cache.ttl: unknown key"),
        (("log", "level", "loud"), "log.level: Input should be"),
        (("cache", "key_secret", "short-secret"), "cache.key_secret: must be at least 16"),
    ],
)
async def test_an_invalid_file_is_refused_and_the_settings_stay(
    start: Start,
    config: ConfigFile,
    caplog: pytest.LogCaptureFixture,
    change: tuple[str, str, Any],
    error: str,
) -> None:
    client = await start(config)
    before = live(client).settings
    policy = client.app[UPSTREAMS].current.pipeline.policy
    config.set(*change)
    result = await live(client).reload()
    assert (result.ok, result.applied, result.needs_restart) == (False, [], [])
    assert result.error is not None
    assert result.error.startswith(error)
    assert "short-secret" not in result.error
    assert live(client).settings is before
    assert client.app[UPSTREAMS].current.pipeline.policy is policy
    refused = [r for r in caplog.records if r.name == "gateway.config"]
    assert [(r.levelname, r.getMessage()) for r in refused] == [
        ("ERROR", "config reload refused; the running configuration stays")
    ]
    assert refused[0].__dict__["error"] == result.error


async def test_a_file_that_is_not_toml_is_refused(start: Start, config: ConfigFile) -> None:
    client = await start(config)
    config.path.write_text("[cache\nttl = 3\n")
    result = await live(client).reload()
    assert not result.ok
    assert result.error is not None
    assert result.error.startswith(f"config file {config.path}: not valid TOML")
    config.path.unlink()
    result = await live(client).reload()
    assert result.error == f"config file {config.path}: not found"


async def test_flags_and_environment_still_win_on_reload(
    start: Start, config: ConfigFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await start(config, log={"level": "error"})
    config.set("log", "level", "debug")
    monkeypatch.setenv("GATEWAY_CACHE__TTL_S__USERS", "42")
    result = await live(client).reload()
    assert (result.ok, result.applied) == (True, ["cache.ttl_s"])
    assert live(client).settings.log.level == "error"
    assert await cache_control(client, "/users") == ("MISS", "private, max-age=42")


async def test_a_changed_secret_is_reported_as_needing_a_restart(
    start: Start, config: ConfigFile
) -> None:
    client = await start(config)
    config.set("admin", "token", "another-admin-token-0123456789")
    config.set("cache", "key_secret", "another-key-secret-0123456789")
    result = await live(client).reload()
    assert result.ok
    assert result.needs_restart == ["admin.token", "cache.key_secret"]


async def test_a_file_that_is_not_utf8_is_refused(start: Start, config: ConfigFile) -> None:
    client = await start(config)
    config.path.write_bytes(b'[log]\nlevel = "w\xe4rning"\n')
    status, body = await reload(client)
    assert status == 422
    assert body["detail"].startswith(f"the running configuration stays: config file {config.path}")
    assert live(client).settings.log.level == "info"


# Bounds on a reload's file (gateway.config.tomlfile; docs/operations.md, "Reload without a
# restart")

# 24 KB: one dotted key of 12,000 parts, which tomllib parses in quadratic time and
# memory (seconds and hundreds of MiB)
HOSTILE = "a" + ".a" * 11_999 + " = 1\n"


async def test_a_hostile_file_is_refused_and_the_loop_answers_meanwhile(
    start: Start, config: ConfigFile
) -> None:
    client = await start(config)
    config.path.write_text(HOSTILE)
    order: list[str] = []
    reloading = asyncio.ensure_future(client.post("/admin/reload", headers=ADMIN_AUTH))
    reloading.add_done_callback(lambda _: order.append("reload"))
    # time for the gateway to take the reload up (it has it within a few loop turns)
    await asyncio.sleep(0.05)
    health = await client.get("/healthz")
    order.append("healthz")
    assert health.status == 200
    response = await reloading
    assert order == ["healthz", "reload"]
    assert response.status == 422
    body = await response.json(content_type=None)
    assert body["type"] == "urn:records-gateway:problem:config-refused"
    assert body["detail"] == (
        f"the running configuration stays: config file {config.path}: parsing it needed"
        " more than 256 MiB (the bound on parsing a config file)"
    )
    assert live(client).settings.cache.ttl_s.users == 300
    config.set("cache", "ttl_s.users", 61)
    assert (await reload(client))[0] == 200
    assert await cache_control(client, "/users") == ("MISS", "private, max-age=61")


async def test_a_file_over_the_size_bound_is_refused_unparsed(
    start: Start, config: ConfigFile
) -> None:
    client = await start(config)
    # not TOML from its first line: parsed, it would be refused as "not valid TOML"
    config.path.write_text("[cache\n" + "#" * (1024 * 1024) + "\n")
    status, body = await reload(client)
    assert status == 422
    assert body["detail"] == (
        f"the running configuration stays: config file {config.path}: larger than"
        " 1 MiB (1048576 bytes), the bound on a config file"
    )
    assert live(client).settings.cache.ttl_s.users == 300
    # a file of exactly the bound is read and parsed
    exact = to_toml(config.sections)
    config.path.write_text(exact + "#" * (1024 * 1024 - len(exact) - 1) + "\n")
    assert config.path.stat().st_size == 1024 * 1024
    assert (await reload(client))[0] == 200


# The admin routes


async def test_admin_config_shows_the_effective_settings_with_secrets_redacted(
    start: Start, config: ConfigFile
) -> None:
    client = await start(config)
    response = await client.get("/admin/config", headers=ADMIN_AUTH)
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/json"
    text = await response.text()
    assert SECRET not in text
    assert ADMIN not in text
    body = json.loads(text)
    assert body["cache"]["key_secret"] == REDACTED
    assert body["admin"]["token"] == REDACTED
    assert body["cache"]["ttl_s"]["users"] == 300
    assert body["upstream"]["base_url"] == config.sections["upstream"]["base_url"]
    assert set(body) == set(Settings.model_fields)

    config.set("cache", "ttl_s.users", 77)
    assert (await reload(client))[0] == 200
    response = await client.get("/admin/config", headers=ADMIN_AUTH)
    assert (await response.json())["cache"]["ttl_s"]["users"] == 77


async def test_admin_reload_answers_what_it_applied(start: Start, config: ConfigFile) -> None:
    client = await start(config)
    config.set("cache", "ttl_s.users", 60)
    config.set("server", "port", 8081)
    assert await reload(client) == (
        200,
        {"ok": True, "applied": ["cache.ttl_s"], "needsRestart": ["server.port"], "error": None},
    )
    assert await cache_control(client, "/users") == ("MISS", "private, max-age=60")
    assert await reload(client) == (
        200,
        {"ok": True, "applied": [], "needsRestart": ["server.port"], "error": None},
    )


async def test_the_openapi_document_states_what_a_reload_applied(
    start: Start, config: ConfigFile
) -> None:
    """limits.max_limit and cache.honor_client_no_cache are live keys and in the
    document: after a reload it says what the gateway now does.

    Held for docs/openapi.md, "The OpenAPI document".
    """

    async def document() -> tuple[dict[str, Any], str]:
        response = await client.get("/openapi.json")
        parameters = (await response.json())["components"]["parameters"]
        return parameters["limit"]["schema"], parameters["Cache-Control"]["description"]

    client = await start(config)
    limit, no_cache = await document()
    assert (limit["maximum"], limit["default"]) == (100, 10)
    assert no_cache.startswith("no-cache: do not serve a stored answer")
    config.set("limits", "max_limit", 5)
    config.set("cache", "honor_client_no_cache", False)
    assert (await reload(client))[0] == 200
    limit, no_cache = await document()
    assert (limit["maximum"], limit["default"]) == (5, 5)
    assert no_cache.startswith("no-cache: ignored by this deployment")
    refused = await client.get("/users?limit=6", headers=AUTH)
    assert refused.status == 400
    assert (await client.get("/users?limit=5", headers=AUTH)).status == 200


async def test_admin_reload_refuses_an_invalid_file_with_a_problem(
    start: Start, config: ConfigFile
) -> None:
    client = await start(config)
    config.set("cache", "ttl_s.users", "soon")
    response = await client.post(
        "/admin/reload", headers={**ADMIN_AUTH, "X-Request-ID": "reload-1"}
    )
    assert response.status == 422
    assert response.headers["Content-Type"] == "application/problem+json"
    body = await response.json(content_type=None)
    assert body["type"] == "urn:records-gateway:problem:config-refused"
    assert body["title"] == "The new configuration was refused"
    assert body["detail"].startswith("the running configuration stays: cache.ttl_s.users: ")
    assert body["requestId"] == "reload-1"
    assert body["instance"] == "/admin/reload"
    assert live(client).settings.cache.ttl_s.users == 300


async def test_admin_config_hides_a_password_in_the_redis_url(
    start: Start, config: ConfigFile
) -> None:
    password = "redis-password-0123456789"
    config.set("cache", "redis_url", f"redis://:{password}@127.0.0.1:6379/0")
    client = await start(config)
    response = await client.get("/admin/config", headers=ADMIN_AUTH)
    assert response.status == 200
    assert password not in await response.text()


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-admin-token-000000", f"Basic {ADMIN}", "Bearer "]
)
async def test_admin_routes_need_the_admin_token(
    start: Start, config: ConfigFile, authorization: str | None
) -> None:
    client = await start(config)
    config.set("cache", "ttl_s.users", 10)
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in (("GET", "/admin/config"), ("POST", "/admin/reload")):
        response = await client.request(method, path, headers=headers)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        body = await response.json(content_type=None)
        assert body["title"] == "Authentication required"
        assert SECRET not in json.dumps(body)
    assert live(client).settings.cache.ttl_s.users == 300  # no reload happened
    # the callers' token is not the admin token either
    assert (await client.post("/admin/reload", headers=AUTH)).status == 401


def test_another_worker_adopting_the_live_values_ends_on_the_same_configuration() -> None:
    """docs/operations.md, "Workers": a reload taken by one worker sends the others the live keys it
    applied; each ends with the same live configuration (no key lost, none masked as a
    secret would be), and keeps what is not live."""
    from gateway.config.live import live_fingerprint

    from ..conftest import make_settings

    reloaded = make_settings(
        "http://upstream.test",
        cache={"ttl_s": {"account": 7}, "stale_while_revalidate_s": 11},
        log={"level": "debug"},
        limits={"max_limit": 42},
        upstream={"shadow": {"base_url": "http://candidate.test", "sample_ratio": 0.5}},
        server={"port": 9999},
    )
    sibling = LiveConfig(make_settings("http://upstream.test"), ConfigSource(None, {}))
    assert live_fingerprint(sibling.settings) != live_fingerprint(reloaded)
    result = sibling.adopt(LiveConfig(reloaded, ConfigSource(None, {})).live_values())
    assert result.ok, result.error
    assert live_fingerprint(sibling.settings) == live_fingerprint(reloaded)
    assert sibling.settings.cache.ttl_s.account == 7
    assert sibling.settings.upstream.shadow.base_url == "http://candidate.test"
    assert sibling.settings.server.port != 9999  # not live: stays


def test_adopting_a_key_that_is_not_live_is_refused() -> None:
    from ..conftest import make_settings

    sibling = LiveConfig(make_settings("http://upstream.test"), ConfigSource(None, {}))
    result = sibling.adopt({"server.port": 1234})
    assert not result.ok
    assert sibling.settings.server.port != 1234
