"""The gateway's one settings object.

Settings come from, highest priority first: keyword arguments (the CLI's flags and
the tests), environment variables (``GATEWAY_`` prefix, ``__`` between levels, e.g.
``GATEWAY_UPSTREAM__BASE_URL``), the TOML config file, then the defaults below.
``config.example.toml`` documents every key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from yarl import URL

from gateway.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class UpstreamSettings(_Section):
    base_url: str = "http://127.0.0.1:9090"
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    connect_timeout_s: float = Field(default=2.0, gt=0, le=600)
    max_connections: int = Field(default=100, ge=1, le=10_000)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    bank_code_param: str = Field(default="bankCode", min_length=1, max_length=100)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        try:
            url = URL(value)
        except ValueError as exc:
            raise ValueError(f"not a URL: {exc}") from exc
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("must be an absolute http:// or https:// URL")
        if url.query_string or url.fragment:
            raise ValueError("must not carry a query or a fragment")
        return value.rstrip("/")

    @field_validator("bank_code_param")
    @classmethod
    def _check_param_name(cls, value: str) -> str:
        if not all(ch.isalnum() or ch in "_-." for ch in value):
            raise ValueError("must be letters, digits, '_', '-' or '.'")
        return value


class LimitsSettings(_Section):
    max_limit: int = Field(default=100, ge=1, le=10_000)


class Settings(BaseSettings):
    """Every setting of the gateway, validated once at start."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    limits: LimitsSettings = LimitsSettings()


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path}: not found") from exc
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from exc


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming the first bad key (dotted) and what is wrong with it."""
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(root)"
    message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    return f"{key}: {message}"


def load_settings(
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Build the settings from the file, the environment and ``overrides`` (CLI flags).

    Raises ConfigError with one line naming the key and the problem.
    """
    file_data = _read_toml(config_path) if config_path is not None else {}

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (
                init_settings,
                env_settings,
                InitSettingsSource(settings_cls, init_kwargs=file_data),
            )

    try:
        return _Loaded(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from exc


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, every secret replaced by "**********"."""
    return settings.model_dump(mode="json")


__all__ = [
    "LimitsSettings",
    "ServerSettings",
    "Settings",
    "UpstreamSettings",
    "describe_validation_error",
    "load_settings",
    "redacted",
]
