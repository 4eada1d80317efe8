"""What the cache stores and under which key, and the seam every backend fits.

An entry is the final published bytes of one answer with its ETag, status and the
time it was stored, packed into one value, so that a hit is one backend read and no
JSON work. A key is made of the namespace, the upstream's identity, the route, the
canonical query and a keyed fingerprint of the caller's token: one token's entries
are never served to another, switching upstreams never serves the old one's data,
and no raw token is ever written into a key or a value.

Purges work with generation counters rather than by finding keys: an entry records
the generations (of the whole namespace and of its route) current when it was
stored, and an entry whose generations are older than the current ones is a miss.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from gateway.auth import Credentials
from gateway.params import RecordQuery

_HEADER = struct.Struct("!4sdIHQQB")
_MAGIC = b"RGC1"

# The parts of every key, after "namespace:upstream": entries, purge generations.
ENTRY_PART = "e"
GENERATION_PART = "gen"
# Generation counters outlive every entry stored under them.
GENERATION_LIFETIME_S = 30 * 24 * 3600


def generation_key(prefix: str, route: str | None) -> str:
    """The counter whose increment purges everything (route None) or one route."""
    return f"{prefix}:{GENERATION_PART}" + ("" if route is None else f":{route}")


class CacheCorrupt(ValueError):
    """A stored value that is not an entry of this format."""


class Generations(NamedTuple):
    """The purge generations an entry was stored under (a named tuple: a hit compares
    two of them, and tuples compare in C)."""

    everything: int = 0
    route: int = 0


NO_GENERATIONS = Generations()  # before any purge


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One stored answer: status 200 with the published body, or a negative 404."""

    body: bytes
    etag: str
    stored_at: float
    ttl_s: int
    status: int = 200
    generations: Generations = NO_GENERATIONS

    def age(self, now: float) -> float:
        return max(0.0, now - self.stored_at)

    def left(self, now: float) -> float:
        """Seconds of freshness left at ``now`` (at most 0 once its TTL is over)."""
        return self.ttl_s - self.age(now)

    def encode(self) -> bytes:
        etag = self.etag.encode("ascii")
        header = _HEADER.pack(
            _MAGIC,
            self.stored_at,
            self.ttl_s,
            self.status,
            self.generations.everything,
            self.generations.route,
            len(etag),
        )
        return header + etag + self.body

    @classmethod
    def decode(cls, raw: bytes) -> CacheEntry:
        if len(raw) < _HEADER.size or raw[:4] != _MAGIC:
            raise CacheCorrupt("not a records-gateway cache entry")
        _, stored_at, ttl_s, status, everything, route, etag_len = _HEADER.unpack_from(raw)
        start = _HEADER.size
        etag = raw[start : start + etag_len].decode("ascii")
        return cls(
            body=raw[start + etag_len :],
            etag=etag,
            stored_at=stored_at,
            ttl_s=ttl_s,
            status=status,
            generations=Generations(everything, route),
        )


# Lookup and CacheKey are made on every request: named tuples cost a fraction of a
# frozen dataclass's __init__ and are just as immutable.


class Lookup(NamedTuple):
    """What a read found: the entry (None when absent or purged) and the generations
    current now, which an entry stored after this read must carry."""

    entry: CacheEntry | None
    generations: Generations


class CacheKey(NamedTuple):
    """The key of one answer; ``route`` is kept apart for per-route purges."""

    route: str
    text: str


def etag_of(body: bytes) -> str:
    """A strong ETag of the published bytes: 128 bits of their SHA-256 (OpenSSL's, which
    uses the CPU's SHA instructions: half the time of BLAKE2b on a 10 KB page)."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def upstream_identity(base_url: str) -> str:
    """A short hash of the upstream's base URL, part of every key."""
    return hashlib.sha256(base_url.encode()).hexdigest()[:12]


def _builtin_sha256() -> Callable[[], Any]:
    """CPython's own SHA-256 (not OpenSSL's), for the per-request HMAC.

    The HMAC is the same either way (RFC 2104 over SHA-256, the same bytes: tested),
    but copying a keyed OpenSSL 3 HMAC context costs several microseconds per request
    under load (provider look-ups, reference counts), a tenth of a cache hit; the
    built-in state copies with a memcpy. The module is ``_sha2`` from Python 3.12,
    ``_sha256`` before; OpenSSL's is the fallback.
    """
    for module in ("_sha2", "_sha256"):
        try:
            constructor: Callable[[], Any] = importlib.import_module(module).sha256
        except (ImportError, AttributeError):
            continue
        return constructor
    return hashlib.sha256


class Keyer:
    """Builds cache keys; holds the secret of the token fingerprints."""

    def __init__(self, *, namespace: str, base_url: str, secret: bytes) -> None:
        self._prefix = f"{namespace}:{upstream_identity(base_url)}"
        self._entries = f"{self._prefix}:{ENTRY_PART}:"
        # keyed once: each fingerprint copies the keyed state instead of re-keying
        self._keyed = hmac.new(secret, digestmod=_builtin_sha256())

    @property
    def prefix(self) -> str:
        """``namespace:upstream``: what every key and generation counter starts with."""
        return self._prefix

    def fingerprint(self, authorization: str) -> str:
        """HMAC-SHA256 of the Authorization header exactly as sent (the token and its
        spelling, since that is what goes upstream), shortened; safe for keys and logs."""
        mac = self._keyed.copy()
        mac.update(authorization.encode("utf-8", "surrogateescape"))
        return mac.hexdigest()[:32]

    def key(self, query: RecordQuery, credentials: Credentials) -> CacheKey:
        return self.key_for(query, self.fingerprint(credentials.authorization))

    def key_for(self, query: RecordQuery, fingerprint: str) -> CacheKey:
        """The key of ``query`` for the caller whose token has ``fingerprint``."""
        text = f"{self._entries}{query.canonical_text}|{fingerprint}"
        return CacheKey(query.route.name, text)


class QuietBackend:
    """Defaults for backends with nothing in the background, no one to tell and
    nothing held in the process."""

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return None

    async def ping(self) -> None:
        return None

    def start(self) -> None:
        return None

    async def announce(self, route: str | None) -> None:
        return None


class CacheBackend(Protocol):
    """Where entries live. Implementations raise only CacheUnavailable."""

    name: str

    async def get(self, key: CacheKey) -> Lookup:
        """The entry (None when absent, expired from the store, or purged)."""
        ...

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        """Store ``entry`` for ``lifetime_s`` seconds (its TTL plus the stale windows)."""
        ...

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        """The entry under ``key`` if this process holds it, it is within its TTL and
        no purge came after it; no I/O, no waiting. None says nothing: ``get`` decides."""
        ...

    async def purge(self, route: str | None) -> None:
        """Make every entry (of one route, or all) a miss, for every instance."""
        ...

    async def ping(self) -> None:
        """Raise CacheUnavailable when the backend cannot be used."""
        ...

    def start(self) -> None:
        """Begin background work, if the backend has any (in the running event loop)."""
        ...

    async def announce(self, route: str | None) -> None:
        """Tell every instance that entries of ``route`` (None: all) changed, so that
        copies kept in process are dropped; a no-op for backends without any."""
        ...

    async def close(self) -> None: ...
