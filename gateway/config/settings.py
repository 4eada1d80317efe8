"""The gateway's one settings object.

Settings come from, highest priority first: keyword arguments (the CLI's flags and
the tests), environment variables (``GATEWAY_`` prefix, ``__`` between levels, e.g.
``GATEWAY_UPSTREAM__BASE_URL``), the TOML config file, then the defaults below.
``config.example.toml`` documents every key.
"""

from __future__ import annotations

import importlib.util
import re
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)
from yarl import URL

from gateway.config.backends import BACKENDS
from gateway.config.tls import upstream_ssl_context
from gateway.config.tomlfile import read_toml
from gateway.errors import ConfigError
from gateway.routing.routes import MAX_TTL_S, RouteTable
from gateway.routing.standard import ROUTES


class _Section(BaseModel):
    # every key's description is the docstring under it: the configuration reference
    # and config.example.toml are written from them (gateway.config.reference)
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ServerSettings(_Section):
    """Where the gateway listens, and how its processes serve."""

    host: str = "127.0.0.1"
    """The address the gateway listens on."""
    port: int = Field(default=8080, ge=0, le=65535)
    """The port the gateway listens on (0: one the system picks)."""
    workers: int = Field(default=1, ge=1, le=64)
    """Processes sharing the port (SO_REUSEPORT), each with its own event loop: one per
    core."""
    shutdown_timeout_s: float = Field(default=15.0, ge=0, le=600)
    """On SIGTERM or SIGINT: the seconds that requests in flight may take to finish."""
    keepalive_timeout_s: float = Field(default=75.0, gt=0, le=3600)
    """Seconds an idle kept-alive client connection stays open (aiohttp's own default is
    about an hour); what the gateway remembers of the connection goes with it."""
    fast_path: bool = True
    """Answer fresh hits on plain kept-alive GETs straight from the connection's bytes.
    `false`: the gateway uses aiohttp's public API only (hits are still answered ahead
    of the router, and requests aiohttp's parser rejects still get problem responses).
    If an aiohttp internal the fast path needs is missing, the gateway logs one warning
    naming it and serves as with `false`."""
    docs: bool = True
    """Serve the API's documentation for a person at `GET /docs`: the published OpenAPI
    document rendered by Swagger UI, whose files ship in the package (nothing is fetched
    from another origin). `false`: `/docs` is a 404."""


class LogSettings(_Section):
    """The logs: one record a line on standard output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level logged."""
    format: Literal["json", "text"] = "json"
    """`json`: one JSON object a line, for a collector; `text`: for a terminal."""
    access: bool = True
    """One access-log line per request."""


class HealthSettings(_Section):
    """The readiness check (`GET /readyz`)."""

    check_interval_s: float = Field(default=5.0, ge=0, le=3600)
    """The least seconds between two checks of one component when recent traffic says
    nothing of it: `/readyz` never calls the upstream on every probe."""


def _http_url(value: str) -> URL:
    """``value`` as an absolute http:// or https:// URL; ValueError saying why not."""
    try:
        url = URL(value)
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("must be an absolute http:// or https:// URL")
    return url


def _check_upstream_url(value: str) -> str:
    """An upstream's base URL: absolute http(s), no query, fragment or credentials;
    without its trailing slash."""
    url = _http_url(value)
    if url.query_string or url.fragment:
        raise ValueError("must not carry a query or a fragment")
    if url.user is not None or url.password is not None:
        raise ValueError(
            "must not carry credentials: the caller's Authorization header is what goes upstream"
        )
    return value.rstrip("/")


class _UpstreamEndpoint(_Section):
    """Where an upstream is (the one in use, or the shadow's candidate) and the TLS keys
    to reach it over https://: ca_file replaces the system's trust store; a client
    certificate (and its key, unless the certificate's file holds it) for mutual TLS.
    Each message of its validation starts with the key it is about."""

    base_url: str | None = Field(default=None, examples=["https://candidate.example.com"])
    """The candidate upstream's base URL: absolute `http://` or `https://`, with no query,
    fragment or credentials."""
    ca_file: Path | None = Field(default=None, examples=["/etc/records-gateway/upstream-ca.pem"])
    """A PEM bundle that replaces the system's trust store for this upstream (only its
    CAs are trusted). Read again on every reload, so that a file renewed in place is
    taken; a file that does not load is a configuration error naming its key."""
    client_cert_file: Path | None = Field(
        default=None, examples=["/etc/records-gateway/client.pem"]
    )
    """A client certificate for an upstream that asks for one (mutual TLS), in PEM; its
    key may be in the same file."""
    client_key_file: Path | None = Field(default=None, examples=["/etc/records-gateway/client.key"])
    """The key of `client_cert_file`, when that file does not hold it."""
    tls_verify: bool = True
    """Check the upstream's certificate and name. `false` skips both (a warning is logged
    at start): never in production."""

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_upstream_url(value)

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        defaults = _UpstreamEndpoint.model_fields
        given = [key for key, value in self.tls_keys().items() if value != defaults[key].default]
        if given and not (self.base_url or "").startswith("https://"):
            raise ValueError(f"{given[0]}: used only with an https:// base_url")
        if self.client_key_file is not None and self.client_cert_file is None:
            raise ValueError("client_key_file: needs client_cert_file (the certificate it signs)")
        self.ssl_context()  # every file loads, or the key that does not is named
        return self

    def tls_keys(self) -> dict[str, Any]:
        """The TLS keys by name, as they are set."""
        return {
            "ca_file": self.ca_file,
            "client_cert_file": self.client_cert_file,
            "client_key_file": self.client_key_file,
            "tls_verify": self.tls_verify,
        }

    def ssl_context(self) -> ssl.SSLContext | None:
        """A new TLS context for the upstream from the files as they are now (None:
        the defaults); raises ValueError naming the key of a file that does not load."""
        return upstream_ssl_context(
            ca_file=self.ca_file,
            client_cert_file=self.client_cert_file,
            client_key_file=self.client_key_file,
            verify=self.tls_verify,
        )


class ShadowSettings(_UpstreamEndpoint):
    """Shadow traffic: a sampled share of the requests that reach the upstream is sent
    again, after its caller is answered, to a candidate upstream, and the two answers
    are compared (gateway.comparison). The candidate gets the callers' own tokens."""

    sample_ratio: float = Field(default=0.0, ge=0, le=1)
    """The share of upstream calls (misses and refreshes, never hits) sent again to the
    candidate at `base_url` once the caller has its answer, the two answers compared
    field by field (`GET /admin/shadow`, `records-gateway shadow-report`, the
    `gateway_shadow_*` metrics); 0 turns shadowing off. The candidate gets the callers'
    own tokens: point it only at an upstream you trust with them. Nothing of its answers
    is served or cached."""
    max_in_flight: int = Field(default=8, ge=1, le=1000)
    """Candidate calls (and second primary calls) under way at once, per process; beyond
    it a sampled request is skipped, and counted. Each call is bounded by
    `upstream.timeout_s`."""
    recheck_ratio: float = Field(default=0.2, ge=0, le=1)
    """The share of differing requests whose primary is asked a second time, to tell
    noise (timestamps, generated values) from regressions; a field's first difference on
    a route is always rechecked."""

    @model_validator(mode="after")
    def _check_shadow(self) -> ShadowSettings:
        if self.sample_ratio > 0 and self.base_url is None:
            raise ValueError("base_url: needed when sample_ratio is above 0 (the candidate)")
        return self

    @property
    def enabled(self) -> bool:
        return self.base_url is not None and self.sample_ratio > 0


class UpstreamSettings(_UpstreamEndpoint):
    """The upstream: the Financial Records Read API the gateway stands in front of, and
    how it is called. The TLS keys apply to an `https://` base URL."""

    base_url: str = "http://127.0.0.1:9090"
    """The upstream's base URL. It may carry a path prefix
    (`https://api.example.com/v2`); no query, fragment or credentials, and no trailing
    slash needed. A reload switches to a new one (with the TLS keys, taken together):
    requests in flight finish on the old upstream, and the cache starts cold for the new
    one."""
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    """Seconds for a whole upstream exchange (connect, send, wait, read the body); past
    it the caller gets a 504."""
    connect_timeout_s: float = Field(default=2.0, gt=0, le=600)
    """Seconds to open a TCP connection to the upstream."""
    max_connections: int = Field(default=100, ge=1, le=10_000)
    """Connections to the upstream at most: nine tenths in the one shared pool, a tenth
    (at least one) for the retries on a new connection."""
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """The largest upstream body accepted, in bytes; a larger one is a 502."""
    bank_code_param: str = Field(default="bankCode", min_length=1, max_length=100)
    """The name under which the upstream takes the bank-code filter of `/accounts`
    (letters, digits, `_`, `-` or `.`). The gateway always takes it as `bankCode`; the
    reference API does not name it."""
    breaker_failures: int = Field(default=5, ge=1, le=1000)
    """The upstream's circuit breaker opens after this many failures in a row (5xx,
    timeout, refused or reset connection), each within `breaker_window_s` of the one
    before. While it is open the upstream is not called for `breaker_reset_s`: stale
    entries (within `cache.stale_if_error_s`) are served at once, other requests get 503
    `upstream-unavailable` with `Retry-After`. Then one trial call (a request's, a
    background refresh or the readiness check)."""
    breaker_reset_s: float = Field(default=5.0, gt=0, le=3600)
    """Seconds the upstream's breaker stays open before its one trial call."""
    breaker_window_s: float = Field(default=10.0, ge=0.1, le=3600)
    """The upstream breaker's window, in seconds: the most between two failures counted
    in a row, and the span over which the share of failures is measured."""
    breaker_failure_share: float = Field(default=0.5, gt=0, le=1)
    """The upstream's breaker also opens when, over the last `breaker_window_s`, at
    least `breaker_min_calls` calls were made and this share of them failed."""
    breaker_min_calls: int = Field(default=20, ge=1, le=100_000)
    """The fewest calls over the window for `breaker_failure_share` to be judged."""

    shadow: ShadowSettings = ShadowSettings()
    """Shadow traffic to a candidate upstream (switching upstreams)."""

    @field_validator("bank_code_param")
    @classmethod
    def _check_param_name(cls, value: str) -> str:
        if not all(ch.isalnum() or ch in "_-." for ch in value):
            raise ValueError("must be letters, digits, '_', '-' or '.'")
        return value

    @property
    def param_names(self) -> dict[str, str]:
        """The upstream's names of the query parameters it names otherwise than the
        gateway: the gateway's name to the upstream's."""
        return {"bankCode": self.bank_code_param}

    def candidate(self) -> UpstreamSettings:
        """These settings pointed at the shadow's candidate: its URL and TLS keys, the
        upstream's timeouts, body limit and parameter names; a pool of
        ``shadow.max_in_flight`` connections. Only while the shadow has a base_url."""
        shadow = self.shadow
        assert shadow.base_url is not None
        return self.model_copy(
            update={
                "base_url": shadow.base_url,
                **shadow.tls_keys(),
                "max_connections": shadow.max_in_flight + 1,
                "shadow": ShadowSettings(),
            }
        )


class LimitsSettings(_Section):
    """What a caller may ask for."""

    max_limit: int = Field(default=100, ge=1, le=1000)
    """The largest `limit` a caller may ask for on a list route. At most 1000: the
    reference upstream serves at most 1000 items a page, and a larger limit would be its
    400, the caller's 502."""


class RouteTTLs(_Section):
    """Seconds an answer of each route stays fresh; 0 turns caching off for the route.

    One field per route of :data:`gateway.routing.standard.ROUTES`, named for the
    route, defaulting to its declared TTL, from 0 to ``MAX_TTL_S``: the model is made
    from the route table (:func:`route_ttls`), never written beside it.
    """

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> int: ...


def route_ttls(routes: RouteTable) -> type[RouteTTLs]:
    """The settings model of the TTLs of ``routes``."""
    fields: dict[str, Any] = {
        route.name: (
            int,
            Field(
                default=route.ttl_s,
                ge=0,
                le=MAX_TTL_S,
                description=f"Seconds an answer of `GET {route.template}` stays fresh.",
            ),
        )
        for route in routes
    }
    model: type[RouteTTLs] = create_model(
        "CacheTTLs", __base__=RouteTTLs, __module__=__name__, **fields
    )
    model.__doc__ = RouteTTLs.__doc__
    return model


if TYPE_CHECKING:
    CacheTTLs = RouteTTLs
else:
    CacheTTLs = route_ttls(ROUTES)


RedisMode = Literal["standalone", "sentinel", "cluster"]
Consistency = Literal["off", "caller", "all"]


class CacheSettings(_Section):
    """Where answers are cached, for how long, and what the gateway does when the cache
    fails. The keys that name Redis are read only with `backend = "redis"`."""

    backend: str = Field(default="memory", min_length=1, max_length=100)
    """Where answers are cached: `redis` (shared by every gateway instance), `memory`
    (this process only, bounded by `memory_max_bytes`) or `none`."""
    redis_mode: RedisMode = "standalone"
    """How to reach Redis: `standalone` (one server at `redis_url`), `sentinel` (the
    primary that the sentinels in `redis_nodes` name for `redis_sentinel_master`) or
    `cluster` (a Redis Cluster, its seed nodes in `redis_nodes`)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Standalone only: `redis://host:port/db`, `rediss://` (TLS) or
    `unix:///path/to/redis.sock`. Its query may set only `db`, `username`, `password`,
    `ssl_cert_reqs` and `ssl_check_hostname`."""
    redis_nodes: tuple[str, ...] = Field(
        default=(), examples=[["10.0.0.21:26379", "10.0.0.22:26379", "10.0.0.23:26379"]]
    )
    """Sentinel and cluster (remove `redis_url` then): the sentinels, or any nodes of the
    cluster, as `host:port` (at most 64)."""
    redis_sentinel_master: str | None = Field(
        default=None, min_length=1, max_length=200, examples=["records"]
    )
    """Sentinel only: the name under which the sentinels know the primary."""
    redis_username: str | None = Field(
        default=None, min_length=1, max_length=200, examples=["gateway"]
    )
    """The ACL user of the data nodes, in every mode."""
    redis_password: SecretStr | None = None
    """The password of the data nodes, in every mode. Keep it out of the file: set
    `GATEWAY_CACHE__REDIS_PASSWORD`."""
    redis_sentinel_password: SecretStr | None = None
    """Sentinel only: the sentinels' own password, where they have one. Keep it out of
    the file: set `GATEWAY_CACHE__REDIS_SENTINEL_PASSWORD`."""
    redis_tls: bool = False
    """TLS to every node and sentinel, in every mode (a `rediss://` URL does the same in
    standalone mode)."""
    redis_tls_ca_file: Path | None = Field(default=None, examples=["/etc/ssl/certs/redis-ca.pem"])
    """The CA that signed the Redis servers' certificates, if it is a private one."""
    redis_timeout_ms: int = Field(default=50, ge=1, le=10_000)
    """Milliseconds for any one Redis call; past it the request goes upstream as a
    miss."""
    key_secret: SecretStr | None = None
    """The secret of the token fingerprints in cache keys (HMAC-SHA256), at least 16
    characters. Required with the `redis` backend, and the same on every instance that
    shares a Redis; with `memory`, a random secret per process. Keep it out of the file:
    set `GATEWAY_CACHE__KEY_SECRET`."""
    namespace: str = Field(default="rg", min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")
    """The prefix of every Redis key: a Redis ACL user confined to `~<namespace>:*`
    reaches all the gateway's keys."""
    memory_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    """The bound of the `memory` backend (keys, bodies and overhead), in bytes."""
    negative_ttl_s: int = Field(default=0, ge=0, le=86_400)
    """Seconds to cache an upstream 404 of `/expenses/{id}` and `/accounts/{id}`; 0: not
    cached."""
    stale_while_revalidate_s: int = Field(default=30, ge=0, le=86_400)
    """After an entry expires: serve it at once for this many seconds while one
    background refresh runs."""
    stale_if_error_s: int = Field(default=600, ge=0, le=7 * 86_400)
    """After an entry expires: serve it for this many seconds when the upstream fails
    (5xx, timeout, unreachable, circuit open) instead of the error."""
    honor_client_no_cache: bool = True
    """Honour a caller's `Cache-Control: no-cache` (fetch upstream, store, `Cache-Status`
    says so). `no-store` is always honoured."""
    record_consistency: Consistency = "off"
    """One version of a record across views: `off` keeps each entry as it was fetched;
    `caller`: a caller once served a record's version is never afterwards served an
    older one (its entries holding the older are removed when a fetch brings the newer);
    `all`: the same for every caller at once. Costs upstream calls, measured by
    `make bench-consistency`."""
    near_cache: bool = True
    """With `redis`: keep fresh copies of entries in this process too, invalidated on
    every instance through Redis pub/sub, bounded by `near_max_bytes`."""
    near_max_bytes: int = Field(default=32 * 1024 * 1024, ge=1024 * 1024)
    """The bound of the near cache, in bytes."""
    identity_memo_max_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    """Entries are stored gzip-compressed (those under 256 bytes stay as they are);
    callers that do not accept gzip get the body decompressed. This bounds the process's
    memo of those decompressed bodies (a hot page is decompressed once, not on every
    hit), in bytes; 0 keeps none. A copy of bodies, never of entries."""
    breaker_failures: int = Field(default=5, ge=1, le=1000)
    """The cache's circuit breaker opens after this many cache failures in a row: the
    cache is skipped (requests go upstream) for `breaker_reset_s`, then one call is
    tried."""
    breaker_reset_s: float = Field(default=5.0, gt=0, le=3600)
    """Seconds the cache's breaker stays open before one call is tried."""
    breaker_window_s: float = Field(default=10.0, ge=0.1, le=3600)
    """The cache breaker's window, in seconds, over which the share of failures is
    measured."""
    breaker_failure_share: float = Field(default=0.5, gt=0, le=1)
    """The cache's breaker also opens when, over the last `breaker_window_s`, at least
    `breaker_min_calls` cache calls were made and this share of them failed."""
    breaker_min_calls: int = Field(default=20, ge=1, le=100_000)
    """The fewest cache calls over the window for `breaker_failure_share` to be
    judged."""
    ttl_s: CacheTTLs = CacheTTLs()
    """Seconds an answer stays fresh, per route; 0 turns caching off for that route."""
    max_stale_share: float = Field(default=0.05, gt=0, lt=1)
    """TTL advice (`GET /admin/ttl`, `records-gateway ttl-advice`): the advised TTL of a
    route is the longest within `ttl_advice_min_s`..`ttl_advice_max_s` whose expected
    share of answers served after the upstream changed stays at most this. The gateway
    never changes a TTL by itself."""
    ttl_advice_min_s: int = Field(default=5, ge=1, le=86_400)
    """The shortest TTL advised, in seconds."""
    ttl_advice_max_s: int = Field(default=3600, ge=1, le=86_400)
    """The longest TTL advised, in seconds (not below `ttl_advice_min_s`)."""

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        check_redis_url(value)
        return value

    @field_validator("redis_nodes")
    @classmethod
    def _check_nodes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > 64:
            raise ValueError("at most 64 nodes")
        for node in value:
            parse_node(node)
        return value

    @field_validator("key_secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return value

    @model_validator(mode="after")
    def _check_redis_mode(self) -> CacheSettings:
        # each message starts with the key it is about (see describe_validation_error)
        mode = self.redis_mode
        if mode == "standalone":
            if self.redis_nodes:
                raise ValueError(
                    "redis_nodes: used only with redis_mode sentinel or cluster"
                    " (standalone mode reads redis_url)"
                )
            if self.redis_sentinel_master is not None:
                raise ValueError("redis_sentinel_master: used only with redis_mode sentinel")
            url = urlsplit(self.redis_url)
            if self.redis_password is not None and url.password:
                raise ValueError("redis_password: redis_url carries a password already")
            if self.redis_username is not None and url.username:
                raise ValueError("redis_username: redis_url carries a user name already")
            return self
        if not self.redis_nodes:
            what = "sentinels" if mode == "sentinel" else "seed nodes"
            raise ValueError(f"redis_nodes: redis_mode {mode} needs the {what} as host:port")
        if "redis_url" in self.model_fields_set:
            raise ValueError(
                f"redis_url: used only with redis_mode standalone ({mode} mode connects to"
                " redis_nodes; TLS and passwords come from redis_tls and redis_password)"
            )
        if mode == "sentinel" and self.redis_sentinel_master is None:
            raise ValueError("redis_sentinel_master: redis_mode sentinel needs the master's name")
        if mode == "cluster" and self.redis_sentinel_master is not None:
            raise ValueError("redis_sentinel_master: used only with redis_mode sentinel")
        if mode == "cluster" and self.redis_sentinel_password is not None:
            raise ValueError("redis_sentinel_password: used only with redis_mode sentinel")
        return self

    @model_validator(mode="after")
    def _check_tls(self) -> CacheSettings:
        tls = self.redis_tls or (
            self.redis_mode == "standalone" and self.redis_url.startswith("rediss://")
        )
        if self.redis_tls_ca_file is not None:
            if not tls:
                raise ValueError("redis_tls_ca_file: needs redis_tls = true (or a rediss:// URL)")
            if not self.redis_tls_ca_file.is_file():
                raise ValueError(f"redis_tls_ca_file: {self.redis_tls_ca_file} is not a file")
        if self.redis_tls and self.redis_url.startswith("unix://"):
            raise ValueError("redis_tls: a unix:// socket does not use TLS")
        return self

    @model_validator(mode="after")
    def _check_advice_bounds(self) -> CacheSettings:
        if self.ttl_advice_min_s > self.ttl_advice_max_s:
            raise ValueError("ttl_advice_min_s: must not be above ttl_advice_max_s")
        return self

    @field_validator("backend")
    @classmethod
    def _registered_backend(cls, value: str) -> str:
        refusal = BACKENDS.refusal(value)
        if refusal is not None:
            raise ValueError(refusal)
        return value

    @model_validator(mode="after")
    def _secret_for_shared(self) -> CacheSettings:
        kind = BACKENDS.kind(self.backend)
        if kind is not None and kind.shared and self.key_secret is None:
            raise ValueError(
                f"key_secret: required when backend is {self.backend}"
                " (set cache.key_secret or GATEWAY_CACHE__KEY_SECRET)"
            )
        return self


def check_redis_url(value: str) -> None:
    """Raise ValueError unless ``value`` is one usable Redis URL."""
    if "," in value:
        raise ValueError(
            "one URL only; for several nodes set redis_mode (sentinel or cluster) and redis_nodes"
        )
    url = urlsplit(value)
    _check_redis_query(url.query)
    if url.scheme == "unix":
        if not url.path:
            raise ValueError("unix:// needs the socket's path, e.g. unix:///run/redis.sock")
        return
    if url.scheme not in ("redis", "rediss"):
        raise ValueError("must start with redis://, rediss:// or unix://")
    if not url.hostname:
        raise ValueError("must name a host, e.g. redis://127.0.0.1:6379/0")
    try:
        port = url.port
    except ValueError as exc:
        raise ValueError("the port must be a number from 1 to 65535") from exc
    if port == 0:
        raise ValueError("the port must be a number from 1 to 65535")
    database = url.path.strip("/")
    if database and not (database.isdigit() and int(database) <= 10_000):
        raise ValueError("the path must be a database number, e.g. /0")


# What a redis_url's query may set; every other setting of the client is the gateway's.
_REDIS_QUERY: dict[str, Callable[[str], bool]] = {
    "db": str.isdigit,
    "username": bool,
    "password": bool,
    "ssl_cert_reqs": lambda value: value in ("none", "optional", "required"),
    "ssl_check_hostname": lambda value: value.lower() in ("true", "false", "1", "0"),
}


def _check_redis_query(query: str) -> None:
    for name, value in parse_qsl(query, keep_blank_values=True):
        check = _REDIS_QUERY.get(name)
        if check is None:
            raise ValueError(
                f"unknown query parameter {name!r}; allowed: " + ", ".join(_REDIS_QUERY)
            )
        if not check(value):
            raise ValueError(f"query parameter {name!r}: {value!r} is not a valid value")


def parse_node(node: str) -> tuple[str, int]:
    """``host:port`` (``[v6 address]:port``) as a host and a port; ValueError if it is not."""
    host, colon, port_text = node.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or any(ch in host for ch in "/@?#, "):
        raise ValueError(f"{node!r} is not host:port")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{node!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


class AdminSettings(_Section):
    """The admin routes (`/admin/...`): purges, reloads, the config in force, TTL advice,
    the shadow report."""

    token: SecretStr | None = None
    """The bearer token of the admin routes, at least 16 characters. Unset (and no
    `change_feed_secret`): the admin routes do not exist. Keep it out of the file: set
    `GATEWAY_ADMIN__TOKEN`."""
    change_feed_secret: SecretStr | None = None
    """The key a change feed signs its notices with (`POST /admin/records/changed`), so
    that it need not hold the token: at least 32 characters, and not the token. Set
    alone, that route is the only admin route. Keep it out of the file: set
    `GATEWAY_ADMIN__CHANGE_FEED_SECRET`."""

    @field_validator("token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return value

    @field_validator("change_feed_secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters")
        return value

    @model_validator(mode="after")
    def _apart(self) -> AdminSettings:
        token, secret = self.token, self.change_feed_secret
        if (
            token is not None
            and secret is not None
            and token.get_secret_value() == secret.get_secret_value()
        ):
            raise ValueError(
                "admin.change_feed_secret must differ from admin.token: the feed"
                " that holds it must not be able to do what the token does"
            )
        return self

    @property
    def routes_exist(self) -> bool:
        """Whether there are admin routes at all: with the token, or the feed's key."""
        return self.token is not None or self.change_feed_secret is not None


class TracingSettings(_Section):
    """W3C trace context is always forwarded upstream; with ``otlp_endpoint`` set, spans
    are exported too, through OpenTelemetry (the ``otel`` extra)."""

    otlp_endpoint: str | None = Field(default=None, examples=["http://127.0.0.1:4318"])
    """The OTLP/HTTP collector that spans of each record request, its cache read and its
    upstream call are exported to: its base URL (`/v1/traces` is added) or its full
    traces URL. Needs the `otel` extra (`pip install 'records-gateway[otel]'`). Unset: no
    spans, and OpenTelemetry is never imported. The W3C trace context of every caller is
    forwarded to the upstream either way."""
    service_name: str = Field(default="records-gateway", min_length=1, max_length=200)
    """The `service.name` of the spans."""
    sample_ratio: float = Field(default=1.0, ge=0, le=1)
    """The share (0 to 1) of the traces the gateway starts that are recorded; a caller's
    `traceparent` decides for its own trace (its sampled flag)."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = _http_url(value)
        if url.query_string or url.fragment or url.user is not None:
            raise ValueError("must not carry a query, a fragment or credentials")
        missing = _missing_otel()
        if missing is not None:
            raise ValueError(
                f"exporting spans needs OpenTelemetry, and {missing} is not installed:"
                " pip install 'records-gateway[otel]'"
            )
        return value

    @property
    def otlp_traces_url(self) -> str | None:
        """The URL spans are posted to: ``otlp_endpoint``, with ``/v1/traces`` added
        unless it ends so already."""
        endpoint = self.otlp_endpoint
        if endpoint is None or endpoint.rstrip("/").endswith(_OTLP_TRACES_PATH):
            return endpoint
        return endpoint.rstrip("/") + _OTLP_TRACES_PATH


_OTLP_TRACES_PATH = "/v1/traces"
# what tracing.otlp_endpoint needs: the SDK and the OTLP/HTTP exporter (the otel extra)
_OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http")


def _missing_otel() -> str | None:
    """The first module of OpenTelemetry's that ``tracing.otlp_endpoint`` needs and
    that is not installed (found, not imported: only the packages above it are)."""
    for name in _OTEL_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return name
    return None


class Settings(BaseSettings):
    """Every setting of the gateway, validated once at start."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    limits: LimitsSettings = LimitsSettings()
    cache: CacheSettings = Field(default_factory=CacheSettings)
    admin: AdminSettings = AdminSettings()
    log: LogSettings = LogSettings()
    health: HealthSettings = HealthSettings()
    tracing: TracingSettings = TracingSettings()


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming the first bad key (dotted) and what is wrong with it."""
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "(root)"
    message = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
    message = message.removeprefix("Value error, ")
    # a check of a whole section names its key first: "redis_nodes: ..."
    named = re.match(r"([a-z_]+): ", message)
    if first["type"] == "value_error" and named and first["loc"]:
        key, message = f"{key}.{named.group(1)}", message[named.end() :]
    return f"{key}: {message}"


def load_settings(
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Settings:
    """Build the settings from the file, the environment and ``overrides`` (CLI flags).

    Raises ConfigError with one line naming the key and the problem.
    """
    return settings_from(read_toml(config_path) if config_path is not None else {}, overrides)


def settings_from(file_data: dict[str, Any], overrides: dict[str, Any] | None = None) -> Settings:
    """Build the settings from a config file's parsed ``file_data``, the environment and
    ``overrides`` (CLI flags); raises ConfigError as :func:`load_settings` does."""
    try:
        return _layered(Settings, file_data)(**(overrides or {}))
    except ValidationError as exc:
        described = describe_validation_error(exc)
        raise ConfigError(described, key=described.partition(": ")[0]) from exc
    except SettingsError as exc:
        # an environment variable that should hold JSON (a whole section) does not
        raise ConfigError(str(exc).splitlines()[0]) from exc


_S = TypeVar("_S", bound=BaseSettings)


def _layered(base: type[_S], file_data: dict[str, Any]) -> type[_S]:
    """``base`` read in the gateway's order: the flags (the keyword arguments), then
    the environment, then the file's ``file_data``."""

    class Layered(base):  # type: ignore[valid-type,misc]
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

    return Layered


class _LogFormatOnly(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: Literal["json", "text"] = LogSettings().format


class _LogOnly(BaseSettings):
    """The settings' ``log.format`` alone, every other key ignored."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_nested_delimiter="__", extra="ignore"
    )

    log: _LogFormatOnly = _LogFormatOnly()


def log_format_of(
    config_path: Path | None = None, overrides: dict[str, Any] | None = None
) -> Literal["json", "text"]:
    """``log.format`` as :func:`load_settings` reads it (flags, environment, file), read
    alone: for saying why the settings do not load in the format of the logs they
    would have made. The default where it cannot be read."""
    try:
        file_data = read_toml(config_path) if config_path is not None else {}
    except ConfigError:
        file_data = {}

    overrides = overrides or {}
    try:
        read = _layered(_LogOnly, file_data)
        return read(**({"log": overrides["log"]} if "log" in overrides else {})).log.format
    except (ValidationError, SettingsError):
        return _LogFormatOnly().format


REDACTED = "**********"


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, every secret replaced by "**********",
    the password of ``cache.redis_url`` too."""
    data = settings.model_dump(mode="json")
    url = URL(data["cache"]["redis_url"])
    if url.password or "password" in url.query:
        if url.password:
            url = url.with_password(REDACTED)
        if "password" in url.query:
            url = url.update_query(password=REDACTED)
        data["cache"]["redis_url"] = str(url)
    return data


__all__ = [
    "AdminSettings",
    "CacheSettings",
    "CacheTTLs",
    "HealthSettings",
    "LimitsSettings",
    "LogSettings",
    "RouteTTLs",
    "ServerSettings",
    "Settings",
    "ShadowSettings",
    "TracingSettings",
    "UpstreamSettings",
    "describe_validation_error",
    "load_settings",
    "log_format_of",
    "redacted",
    "settings_from",
]
