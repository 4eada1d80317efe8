"""Settings: the file, the environment, the overrides, and one-line errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.settings import Settings, load_settings, redacted
from gateway.errors import ConfigError

EXAMPLE = Path(__file__).parent.parent.parent / "config.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_example_file_is_the_defaults_but_for_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_CACHE__KEY_SECRET", "an-example-secret-of-32-characters")
    loaded = load_settings(EXAMPLE).model_dump()
    defaults = Settings().model_dump()
    assert loaded["cache"].pop("backend") == "redis"
    assert loaded["cache"].pop("key_secret").get_secret_value().startswith("an-example")
    defaults["cache"].pop("backend")
    defaults["cache"].pop("key_secret")
    assert loaded == defaults


def test_redis_backend_needs_a_key_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(EXAMPLE)
    assert str(caught.value) == (
        "cache: key_secret is required when backend is redis"
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
        ("[upstream]\nbase_ur = 'x'\n", "upstream.base_ur: unknown key"),
        ("[caches]\n", "caches: unknown key"),
        ("[server\n", "not valid TOML"),
        ("[cache.ttl_s]\nexpenses = -1\n", "cache.ttl_s.expenses: Input should be greater than"),
        ("[cache]\nbackend = 'disk'\n", "cache.backend: Input should be 'redis', 'memory' or"),
        ("[cache]\nredis_url = 'http://x'\n", "cache.redis_url: must start with redis://"),
        ("[cache]\nkey_secret = 'short'\n", "cache.key_secret: must be at least 16 characters"),
        ('[upstream]\nbase_url = "http://u:p@x.example"\n', "upstream.base_url: must not carry"),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
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
