"""The running configuration, and reloading it without a restart (SIGHUP, POST
/admin/reload).

A reload re-reads the config file (and the environment and flags, as at start),
reading at most 1 MiB of it and parsing it off the event loop within a time and a
memory bound (gateway.config.tomlfile), validates it whole, and applies what can
change while serving: the cache TTLs and stale windows, the log level and access log,
the upstream's URL, timeouts and TLS files (read again on every reload, so that a
certificate renewed in place is taken), the readiness check interval,
``limits.max_limit`` and the shadow traffic (``upstream.shadow``). A file over a bound
or that fails validation, or settings a running part cannot take, are refused with a
log line and the running configuration is kept. Other changes
(addresses, the cache backend, secrets) need a restart and are reported so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gateway.config.settings import (
    Settings,
    describe_validation_error,
    load_settings,
    redacted,
    settings_from,
)
from gateway.config.tomlfile import ParseBounds, read_toml_bounded
from gateway.errors import ConfigError

log = logging.getLogger("gateway.config")

# Dotted keys a reload applies; every other change waits for a restart.
LIVE_KEYS = (
    "cache.ttl_s",
    "cache.stale_while_revalidate_s",
    "cache.stale_if_error_s",
    "cache.negative_ttl_s",
    "cache.honor_client_no_cache",
    "cache.record_consistency",
    "cache.max_stale_share",
    "cache.ttl_advice_min_s",
    "cache.ttl_advice_max_s",
    "log.level",
    "log.access",
    "upstream.base_url",
    "upstream.timeout_s",
    "upstream.connect_timeout_s",
    "upstream.ca_file",
    "upstream.client_cert_file",
    "upstream.client_key_file",
    "upstream.tls_verify",
    "upstream.shadow.base_url",
    "upstream.shadow.sample_ratio",
    "upstream.shadow.max_in_flight",
    "upstream.shadow.recheck_ratio",
    "upstream.shadow.ca_file",
    "upstream.shadow.client_cert_file",
    "upstream.shadow.client_key_file",
    "upstream.shadow.tls_verify",
    "limits.max_limit",
    "health.check_interval_s",
)


# what a reload takes whole from the new settings (``LiveConfig._live_part``), besides
# the LIVE_KEYS
_WHOLE_SECTIONS = ("upstream.shadow.", "limits.", "health.")


def _taken_live(key: str) -> bool:
    return key in LIVE_KEYS or key.startswith(_WHOLE_SECTIONS)


def applied_by_reload(key: str) -> bool:
    """Whether a reload applies a change of the dotted ``key`` (``cache.ttl_s.users``:
    the TTLs are applied as one); every other change needs a restart."""
    return any(key == live or key.startswith(f"{live}.") for live in LIVE_KEYS)


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where the settings come from: the file and the command line's overrides."""

    path: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    bounds: ParseBounds = field(default_factory=ParseBounds)

    def load(self) -> Settings:
        """The settings, the file parsed in this process (at start)."""
        return load_settings(self.path, self.overrides)

    async def load_while_serving(self) -> Settings:
        """The settings, the file parsed off the event loop within ``bounds``."""
        file_data = await read_toml_bounded(self.path, self.bounds) if self.path is not None else {}
        return settings_from(file_data, self.overrides)


@dataclass(frozen=True, slots=True)
class ReloadResult:
    ok: bool
    applied: list[str]
    needs_restart: list[str]
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "applied": self.applied,
            "needsRestart": self.needs_restart,
            "error": self.error,
        }


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name != "cache.ttl_s":
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def cache_fingerprint(settings: Settings) -> str:
    """A short digest of what decides how long entries live and which entries are
    shared: the TTLs, the stale windows, the negative TTL and the namespace. Instances
    that share a Redis announce it (gateway.cache.fleet) to find disagreements."""
    cache = settings.cache
    relevant = {
        "namespace": cache.namespace,
        "ttl_s": cache.ttl_s.model_dump(),
        "stale_while_revalidate_s": cache.stale_while_revalidate_s,
        "stale_if_error_s": cache.stale_if_error_s,
        "negative_ttl_s": cache.negative_ttl_s,
    }
    text = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def live_fingerprint(settings: Settings) -> str:
    """A short digest of every live key's value: the workers of one instance that run
    the same configuration have the same."""
    flat = _flatten(settings.model_dump(mode="json"))
    relevant = {key: value for key, value in flat.items() if _taken_live(key)}
    text = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class LiveConfig:
    """Holds the effective settings and applies reloads to the running parts."""

    def __init__(self, settings: Settings, source: ConfigSource) -> None:
        self.settings = settings
        self._source = source
        self._appliers: list[Callable[[Settings], None]] = []
        # one reload at a time, so that an older file never lands after a newer one
        self._reloading = asyncio.Lock()

    def on_change(self, apply: Callable[[Settings], None]) -> None:
        """Register a part that takes new settings (called with every applied reload,
        in the order registered). A part that cannot take them raises ConfigError
        before it changes anything: the reload is then refused, and the parts called
        before it are called again with the running settings."""
        self._appliers.append(apply)

    def effective(self) -> dict[str, Any]:
        return redacted(self.settings)

    async def reload(self) -> ReloadResult:
        """Read the configuration again and apply its live part; refused (``ok`` false,
        the running settings kept) when the file or the settings are refused. Reloads
        run one at a time, in the order called."""
        async with self._reloading:
            return await self._reload()

    async def _reload(self) -> ReloadResult:
        try:
            new = await self._source.load_while_serving()
        except ConfigError as exc:
            return self._refused(exc)
        return self.take(new)

    def live_values(self) -> dict[str, Any]:
        """The live part of the running settings as JSON data (dotted keys): what
        :meth:`adopt` takes, in another worker of the same instance."""
        flat = _flatten(self.settings.model_dump(mode="json"))
        return {key: value for key, value in flat.items() if _taken_live(key)}

    def adopt(self, values: dict[str, Any]) -> ReloadResult:
        """Apply the live keys another worker applied (its :meth:`live_values`), as a
        reload of them would; what is not live stays as it is here."""
        data = self.settings.model_dump()
        try:
            for key, value in values.items():
                if not _taken_live(key):
                    raise ConfigError(f"{key}: not a live key")
                *sections, name = key.split(".")
                part = data
                for section in sections:
                    part = part[section]
                part[name] = value
            new = Settings.model_validate(data)
        except ValidationError as exc:
            return self._refused(ConfigError(describe_validation_error(exc)))
        except (ConfigError, KeyError, TypeError) as exc:
            return self._refused(ConfigError(str(exc)))
        return self.take(new)

    def _refused(self, exc: ConfigError) -> ReloadResult:
        log.error(
            "config reload refused; the running configuration stays",
            extra={"event": "config_reload", "ok": False, "error": str(exc)},
        )
        return ReloadResult(ok=False, applied=[], needs_restart=[], error=str(exc))

    def take(self, new: Settings) -> ReloadResult:
        """Apply the live keys of ``new`` (validated settings), name the others."""
        try:
            merged = self._live_part(new)
            self._apply(merged)
        except ConfigError as exc:
            return self._refused(exc)
        # compared unredacted (SecretStr compares by value); only key names are reported
        before = _flatten(self.settings.model_dump())
        after = _flatten(new.model_dump())
        changed = sorted(key for key in after if before.get(key) != after[key])
        applied = [key for key in changed if key in LIVE_KEYS]
        needs_restart = [key for key in changed if key not in LIVE_KEYS]
        if needs_restart:
            log.warning(
                "config reload: these changes need a restart and were not applied",
                extra={"event": "config_reload", "keys": needs_restart},
            )
        self.settings = merged
        log.info(
            "config reloaded",
            extra={"event": "config_reload", "ok": True, "applied": applied},
        )
        return ReloadResult(ok=True, applied=applied, needs_restart=needs_restart)

    def _apply(self, merged: Settings) -> None:
        """Hand ``merged`` to every part; when one refuses it (ConfigError), the parts
        before it take the running settings again and the error is raised."""
        done: list[Callable[[Settings], None]] = []
        try:
            for apply in self._appliers:
                apply(merged)
                done.append(apply)
        except ConfigError:
            for apply in reversed(done):
                apply(self.settings)
            raise

    def _live_part(self, new: Settings) -> Settings:
        """The running settings with only the live keys taken from ``new``."""
        current = self.settings
        upstream = new.upstream
        return current.model_copy(
            update={
                "cache": current.cache.model_copy(
                    update={
                        "ttl_s": new.cache.ttl_s,
                        "stale_while_revalidate_s": new.cache.stale_while_revalidate_s,
                        "stale_if_error_s": new.cache.stale_if_error_s,
                        "negative_ttl_s": new.cache.negative_ttl_s,
                        "honor_client_no_cache": new.cache.honor_client_no_cache,
                        "record_consistency": new.cache.record_consistency,
                        "max_stale_share": new.cache.max_stale_share,
                        "ttl_advice_min_s": new.cache.ttl_advice_min_s,
                        "ttl_advice_max_s": new.cache.ttl_advice_max_s,
                    }
                ),
                "log": current.log.model_copy(
                    update={"level": new.log.level, "access": new.log.access}
                ),
                "upstream": current.upstream.model_copy(
                    update={
                        "base_url": upstream.base_url,
                        "timeout_s": upstream.timeout_s,
                        "connect_timeout_s": upstream.connect_timeout_s,
                        "ca_file": upstream.ca_file,
                        "client_cert_file": upstream.client_cert_file,
                        "client_key_file": upstream.client_key_file,
                        "tls_verify": upstream.tls_verify,
                        "shadow": new.upstream.shadow,
                    }
                ),
                "limits": new.limits,
                "health": new.health,
            }
        )
