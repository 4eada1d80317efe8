"""The configuration reference (docs/configuration.md, written when the site is built)
and config.example.toml, both from the settings model: every key described, the
example file the model as it is today."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from gateway.config.live import ConfigSource, LiveConfig
from gateway.config.reference import Key, example_toml, reference_markdown, sections
from gateway.config.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
KEYS = [key for section in sections() for key in section.keys]


def _leaves(data: dict[str, object], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, value in data.items():
        if isinstance(value, dict):
            keys |= _leaves(value, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_the_reference_holds_every_key_of_the_model() -> None:
    assert {key.dotted for key in KEYS} == _leaves(Settings().model_dump())
    assert len(KEYS) > 70


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.dotted)
def test_every_key_has_a_description(key: Key) -> None:
    """A key added without a docstring under it fails here."""
    description = key.description
    assert len(description.split()) >= 3, f"{key.dotted} has no description"


def test_every_section_says_what_it_is_for() -> None:
    for section in sections():
        assert section.summary, f"[{section.dotted}] has no docstring"


def test_the_page_states_type_default_bounds_reload_and_variable() -> None:
    page = reference_markdown()
    port = page.split("### `server.port`", 1)[1].split("###", 1)[0]
    assert "**Type** int" in port
    assert "**Default** `8080`" in port
    assert "**Bounds** at least 0, at most 65,535" in port
    assert "**Applied by** a restart" in port
    assert "`GATEWAY_SERVER__PORT`" in port
    assert "The port the gateway listens on" in port
    users = page.split("### `cache.ttl_s.users`", 1)[1].split("###", 1)[0]
    assert "**Applied by** a reload" in users
    assert "`GET /users`" in users
    namespace = page.split("### `cache.namespace`", 1)[1].split("###", 1)[0]
    assert "matches `^[A-Za-z0-9_.-]+$`" in namespace
    level = page.split("### `log.level`", 1)[1].split("###", 1)[0]
    assert '**Type** "debug" | "info" | "warning" | "error"' in level


def _changed(key: Key) -> list[Any]:
    """Values to try for ``key`` other than its default."""
    default = key.default
    if key.dotted.endswith("base_url"):
        return ["http://127.0.0.1:9999"]
    if isinstance(default, bool):
        return [not default]
    if key.type.startswith('"'):
        return [
            choice.strip('"') for choice in key.type.split(" | ") if choice.strip('"') != default
        ]
    if isinstance(default, int | float):
        return [default * 2, default + 1, default / 2, default - 1, 1, 0.5]
    if key.secret:
        return ["s" * 40]
    if isinstance(default, str):
        return [default + "x", "other"]
    return []


def _with(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *sections, name = dotted.split(".")
    place = data
    for section in sections:
        place = place.setdefault(section, {})
    place[name] = value
    return data


def _value(settings: Settings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def test_a_key_marked_applied_by_a_reload_is_applied_and_no_other() -> None:
    """Each key changed alone (to the first value the model takes), and the settings
    reloaded: the running settings take the new value exactly when the reference says a
    reload applies it. Keys no value of which validates alone (a file, the backend, the
    nodes of another mode) are left to their own tests."""
    base = Settings()
    checked = 0
    for key in KEYS:
        for value in _changed(key):
            if value == key.default:
                continue
            try:
                new = Settings(**_with({}, key.dotted, value))
            except ValidationError:
                continue
            live = LiveConfig(base, ConfigSource(None, {}))
            result = live.take(new)
            assert result.ok, (key.dotted, result.error)
            taken = _value(live.settings, key.dotted) == _value(new, key.dotted)
            assert taken is key.live, (
                f"{key.dotted}: a reload {'did' if taken else 'did not'} apply it"
            )
            checked += 1
            break
    assert checked >= 55


def test_config_example_toml_is_the_model_as_it_is() -> None:
    """`make config-example` writes it again after a change to the model."""
    shipped = (ROOT / "config.example.toml").read_text(encoding="utf-8")
    assert shipped == example_toml(), "config.example.toml is stale: run `make config-example`"
    assert load_settings(ROOT / "config.example.toml").model_dump() == Settings().model_dump()


def test_a_secret_is_never_written_into_the_example() -> None:
    text = example_toml()
    for name in ("token", "change_feed_secret", "key_secret", "redis_password"):
        assert f"\n# {name} = " in text
        assert f"\n{name} = " not in text
