"""Settings: the file, the environment, the overrides, and one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config.settings import Settings, load_settings, redacted
from gateway.errors import ConfigError

EXAMPLE = Path(__file__).parent.parent.parent / "config.example.toml"
REDIS_EXAMPLE = Path(__file__).parent.parent.parent / "deploy" / "config.redis.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_example_file_is_the_defaults() -> None:
    """config.example.toml says "the value shown is the default": it loads as shipped,
    with no environment, to exactly the defaults."""
    assert load_settings(EXAMPLE).model_dump() == Settings().model_dump()


def test_the_redis_example_needs_only_the_secret_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match=r"^cache\.key_secret: required when backend is redis"):
        load_settings(REDIS_EXAMPLE)
    monkeypatch.setenv("GATEWAY_CACHE__KEY_SECRET", "an-example-secret-of-32-characters")
    monkeypatch.setenv("GATEWAY_CACHE__REDIS_URL", "redis://redis.internal:6379/0")
    loaded = load_settings(REDIS_EXAMPLE)
    assert loaded.cache.backend == "redis"
    assert loaded.cache.redis_url == "redis://redis.internal:6379/0"
    assert loaded.log.format == "json"


def test_redis_backend_needs_a_key_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(REDIS_EXAMPLE)
    assert str(caught.value) == (
        "cache.key_secret: required when backend is redis"
        " (set cache.key_secret or GATEWAY_CACHE__KEY_SECRET)"
    )


def test_file_then_environment_then_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        '[server]\nport = 9000\nhost = "0.0.0.0"\n[upstream]\nbase_url = "https://a.example/v2/"\n',
    )
    monkeypatch.setenv("GATEWAY_SERVER__PORT", "9100")
    monkeypatch.setenv("GATEWAY_UPSTREAM__TIMEOUT_S", "3.5")
    settings = load_settings(path, {"server": {"port": 9200}})
    assert settings.server.port == 9200
    assert settings.server.host == "0.0.0.0"
    assert settings.upstream.timeout_s == 3.5
    assert settings.upstream.base_url == "https://a.example/v2"
    assert settings.limits.max_limit == 100


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[upstream]\ntimeout_s = 0\n", "upstream.timeout_s: Input should be greater than 0"),
        ('[upstream]\nbase_url = "ftp://x"\n', "upstream.base_url: must be an absolute http"),
        ("[server]\nport = 70000\n", "server.port: Input should be less than or equal to 65535"),
        ("[limits]\nmax_limit = 'many'\n", "limits.max_limit: Input should be a valid integer"),
        (
            "[limits]\nmax_limit = 1001\n",
            "limits.max_limit: Input should be less than or equal to 1000",
        ),
        ("[upstream]\nbase_ur = 'x'\n", "upstream.base_ur: unknown key"),
        ("[caches]\n", "caches: unknown key"),
        ("[server\n", "not valid TOML"),
        ("[cache.ttl_s]\nexpenses = -1\n", "cache.ttl_s.expenses: Input should be greater than"),
        ("[cache]\nbackend = 'disk'\n", "cache.backend: Input should be 'redis', 'memory' or"),
        ("[cache]\nredis_url = 'http://x'\n", "cache.redis_url: must start with redis://"),
        ("[cache]\nkey_secret = 'short'\n", "cache.key_secret: must be at least 16 characters"),
        (
            "[admin]\nchange_feed_secret = '" + "s" * 31 + "'\n",
            "admin.change_feed_secret: must be at least 32 characters",
        ),
        (
            "[admin]\ntoken = '" + "t" * 32 + "'\nchange_feed_secret = '" + "t" * 32 + "'\n",
            "admin.change_feed_secret must differ from admin.token",
        ),
        (
            "[cache]\nidentity_memo_max_bytes = -1\n",
            "cache.identity_memo_max_bytes: Input should be greater than or equal to 0",
        ),
        ('[upstream]\nbase_url = "http://u:p@x.example"\n', "upstream.base_url: must not carry"),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
        (
            "[upstream.shadow]\nsample_ratio = 0.5\n",
            "upstream.shadow.base_url: needed when sample_ratio is above 0",
        ),
        (
            "[upstream.shadow]\nsample_ratio = 1.5\nbase_url = 'http://c'\n",
            "upstream.shadow.sample_ratio: Input should be less than or equal to 1",
        ),
        (
            "[upstream.shadow]\nbase_url = 'http://c'\ntls_verify = false\n",
            "upstream.shadow.tls_verify: used only with an https:// base_url",
        ),
        (
            "[upstream.shadow]\nbase_url = 'https://u:p@c'\n",
            "upstream.shadow.base_url: must not carry credentials",
        ),
        (
            "[upstream.shadow]\nmax_in_flight = 0\n",
            "upstream.shadow.max_in_flight: Input should be greater than or equal to 1",
        ),
        (
            "[tracing]\notlp_endpoint = 'collector:4318'\n",
            "tracing.otlp_endpoint: must be an absolute http:// or https:// URL",
        ),
        (
            "[tracing]\notlp_endpoint = 'http://c:4318/?a=1'\n",
            "tracing.otlp_endpoint: must not carry a query, a fragment or credentials",
        ),
        (
            "[tracing]\notlp_endpoint = 'http://u:p@c:4318'\n",
            "tracing.otlp_endpoint: must not carry a query, a fragment or credentials",
        ),
        (
            "[tracing]\nsample_ratio = 1.5\n",
            "tracing.sample_ratio: Input should be less than or equal to 1",
        ),
        ("[tracing]\nservice_name = ''\n", "tracing.service_name: String should have at least"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_environment_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_UPSTREAM__MAX_CONNECTIONS", "lots")
    with pytest.raises(ConfigError, match=r"^upstream\.max_connections: Input should be"):
        load_settings()


def test_a_file_over_the_size_bound_is_refused_unparsed(tmp_path: Path) -> None:
    path = write(tmp_path, "[server\n" + "#" * (1024 * 1024) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value) == (
        f"config file {path}: larger than 1 MiB (1048576 bytes), the bound on a config file"
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml")


def test_redacted_hides_secrets() -> None:
    settings = Settings(cache={"key_secret": "super-secret-value-123"})
    data = redacted(settings)
    assert data["upstream"]["base_url"] == "http://127.0.0.1:9090"
    assert data["limits"] == {"max_limit": 100}
    assert data["cache"]["key_secret"] == "**********"
    assert "super-secret-value-123" not in repr(data)


def test_an_environment_section_that_is_not_json_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_CACHE__TTL_S", "abc")
    with pytest.raises(ConfigError, match='field "cache"'):
        load_settings()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw-secret@h:6379/0", "redis://:**********@h:6379/0"),
        ("redis://h:6379/0?password=pw-secret&db=1", "redis://h:6379/0?password=**********&db=1"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
    ],
)
def test_a_redis_password_is_redacted(url: str, shown: str) -> None:
    assert redacted(Settings(cache={"redis_url": url}))["cache"]["redis_url"] == shown


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({"redis_url": "redis://h:notaport/0"}, "cache.redis_url: the port must be a number"),
        ({"redis_url": "redis://h:99999/0"}, "cache.redis_url: the port must be a number"),
        ({"redis_url": "redis://h:0/0"}, "cache.redis_url: the port must be a number"),
        ({"redis_url": "redis://h1:6379,h2:6379/0"}, "cache.redis_url: one URL only"),
        ({"redis_url": "redis:///0"}, "cache.redis_url: must name a host"),
        ({"redis_url": "redis://h:6379/zero"}, "cache.redis_url: the path must be a database"),
        ({"redis_url": "unix://"}, "cache.redis_url: unix:// needs the socket's path"),
        ({"redis_nodes": ["h:6379"]}, "cache.redis_nodes: used only with redis_mode sentinel"),
        ({"redis_sentinel_master": "m"}, "cache.redis_sentinel_master: used only with"),
        ({"redis_mode": "sentinel"}, "cache.redis_nodes: redis_mode sentinel needs the sentinels"),
        ({"redis_mode": "cluster"}, "cache.redis_nodes: redis_mode cluster needs the seed nodes"),
        (
            {"redis_mode": "sentinel", "redis_nodes": ["h:26379"]},
            "cache.redis_sentinel_master: redis_mode sentinel needs the master's name",
        ),
        (
            {"redis_mode": "cluster", "redis_nodes": ["h:7000"], "redis_sentinel_master": "m"},
            "cache.redis_sentinel_master: used only with redis_mode sentinel",
        ),
        (
            {"redis_mode": "cluster", "redis_nodes": ["h:7000"], "redis_url": "redis://h:1/0"},
            "cache.redis_url: used only with redis_mode standalone",
        ),
        ({"redis_mode": "cluster", "redis_nodes": ["h"]}, "cache.redis_nodes: 'h' is not host"),
        ({"redis_mode": "cluster", "redis_nodes": ["h:70000"]}, "cache.redis_nodes: 'h:70000'"),
        ({"redis_mode": "cluster", "redis_nodes": ["a/b:1"]}, "cache.redis_nodes: 'a/b:1' is not"),
        ({"redis_mode": "ring"}, "cache.redis_mode: Input should be 'standalone', 'sentinel' or"),
        (
            {"redis_url": "redis://:pw@h:6379/0", "redis_password": "other"},
            "cache.redis_password: redis_url carries a password already",
        ),
        ({"redis_tls_ca_file": "/etc/hostname"}, "cache.redis_tls_ca_file: needs redis_tls"),
        (
            {"redis_tls": True, "redis_tls_ca_file": "/no/such/ca.pem"},
            "cache.redis_tls_ca_file: /no/such/ca.pem is not a file",
        ),
        ({"breaker_failure_share": 0}, "cache.breaker_failure_share: Input should be greater"),
        ({"breaker_window_s": 1e-308}, "cache.breaker_window_s: Input should be greater"),
        (
            {"redis_url": "redis://h:6379/0?socket_timeout=abc"},
            "cache.redis_url: unknown query parameter 'socket_timeout'; allowed: db,",
        ),
        ({"redis_url": "unix:///tmp/x.sock?db=x"}, "cache.redis_url: query parameter 'db':"),
        (
            {"redis_url": "rediss://h:6379/0?ssl_cert_reqs=bogus"},
            "cache.redis_url: query parameter 'ssl_cert_reqs': 'bogus' is not a valid value",
        ),
    ],
)
def test_bad_cache_keys_are_one_line_naming_the_key(cache: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"cache": cache})
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "cache",
    [
        {"redis_mode": "sentinel", "redis_nodes": ["10.0.0.1:26379"], "redis_sentinel_master": "m"},
        {"redis_mode": "cluster", "redis_nodes": ["10.0.0.1:7000", "[::1]:7001"]},
        {"redis_url": "rediss://h.example:6380/2", "redis_password": "pw", "redis_username": "gw"},
        {"redis_url": "unix:///run/redis.sock"},
    ],
)
def test_good_redis_topologies_load(cache: dict[str, Any]) -> None:
    settings = load_settings(None, {"cache": cache})
    assert settings.cache.redis_mode == cache.get("redis_mode", "standalone")


def test_redis_nodes_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_CACHE__REDIS_MODE", "cluster")
    monkeypatch.setenv("GATEWAY_CACHE__REDIS_NODES", '["a:7000", "b:7001"]')
    assert load_settings().cache.redis_nodes == ("a:7000", "b:7001")


def test_redis_passwords_are_redacted() -> None:
    settings = Settings(
        cache={
            "redis_mode": "sentinel",
            "redis_nodes": ["h:26379"],
            "redis_sentinel_master": "m",
            "redis_password": "data-secret-1",
            "redis_sentinel_password": "sentinel-secret-2",
        }
    )
    data = redacted(settings)
    assert data["cache"]["redis_password"] == "**********"
    assert data["cache"]["redis_sentinel_password"] == "**********"
    assert "secret-1" not in repr(data)
    assert "secret-2" not in repr(data)


def test_the_shadows_candidate_takes_the_upstreams_timeouts_and_its_own_tls(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        write(
            tmp_path,
            "[upstream]\ntimeout_s = 3\n"
            "[upstream.shadow]\nbase_url = 'https://candidate.example/v2/'\n"
            "sample_ratio = 0.25\nmax_in_flight = 4\ntls_verify = false\n",
        )
    )
    assert settings.upstream.shadow.enabled
    candidate = settings.upstream.candidate()
    assert candidate.base_url == "https://candidate.example/v2"
    assert (candidate.timeout_s, candidate.tls_verify) == (3.0, False)
    assert candidate.max_connections == 5
    assert not candidate.shadow.enabled


@pytest.mark.parametrize(
    ("endpoint", "traces_url"),
    [
        (None, None),
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otel.example/otlp", "https://otel.example/otlp/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ],
)
def test_spans_go_to_the_otlp_endpoint_s_traces_path(
    endpoint: str | None, traces_url: str | None
) -> None:
    tracing = Settings(tracing={"otlp_endpoint": endpoint}).tracing
    assert tracing.otlp_traces_url == traces_url
    assert (tracing.service_name, tracing.sample_ratio) == ("records-gateway", 1.0)
