"""Cache keys of record reads: namespace, upstream, route, canonical query and a keyed
fingerprint of the caller's token.

One token's entries are never served to another, switching upstreams never serves the
old one's data (the upstream's identity is part of every key), and no raw token is
ever written into a key or a value: only its HMAC under ``cache.key_secret``.
"""

from __future__ import annotations

import hashlib
import hmac

from gateway.cache.entry import CacheKey
from gateway.cache.keyspace import entry_prefix
from gateway.records.credentials import Credentials
from gateway.records.routes import RecordQuery


def upstream_identity(base_url: str) -> str:
    """A short hash of the upstream's base URL, part of every key."""
    return hashlib.sha256(base_url.encode()).hexdigest()[:12]


class Keyer:
    """Builds cache keys; holds the secret of the token fingerprints."""

    def __init__(self, *, namespace: str, base_url: str, secret: bytes) -> None:
        self._prefix = f"{namespace}:{upstream_identity(base_url)}"
        self._entries = entry_prefix(self._prefix)
        # keyed once: each fingerprint copies the keyed state instead of re-keying
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)

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


def caller_of(key: CacheKey) -> str:
    """The fingerprint of the caller whose entry ``key`` names: what follows its last
    ``|`` (a fingerprint has none); the cache keeps one version of a record per caller
    by it (``cache.record_consistency = "caller"``)."""
    return key.text.rpartition("|")[2]
