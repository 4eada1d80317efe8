"""What the fast path remembers about each open client connection: the fingerprint of
the token it last sent.

A service sends the same token on every request of a keep-alive connection, and the
token's fingerprint (an HMAC-SHA256, ``gateway.records.keys.Keyer``) is a large share
of what a hit from the bytes costs. :class:`ConnectionFingerprints` computes it once
per connection and token instead of once per request. What it holds (the
Authorization header and its fingerprint) lives at most as long as the connection
that sent it: a connection of the fast path forgets it when it closes
(``gateway.fastpath.connection.GatewayConnection``). It is process memory only; it never
reaches the cache, the logs or the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.records.lookup import Keyer

# What the table may hold, counted as the headers' lengths plus a fixed cost per
# entry: a few thousand connections' worth of usual tokens. Anyone can send a token
# (it is remembered before the upstream has seen it), so the bound is in bytes, and a
# header longer than REMEMBERED_HEADER_MAX is never remembered: it pays its HMAC on
# every request instead. Past the bound the table starts again, empty.
MAX_BYTES = 4 * 1024 * 1024
REMEMBERED_HEADER_MAX = 4096
ENTRY_COST_BYTES = 256


@dataclass(frozen=True, slots=True)
class _Last:
    keyer: Keyer
    authorization: str = field(repr=False)
    fingerprint: str


class ConnectionFingerprints:
    """The fingerprint of the last Authorization header each open connection sent."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._last: dict[object, _Last] = {}

    def __len__(self) -> int:
        return len(self._last)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def known(self, connection: object, keyer: Keyer, authorization: str) -> str | None:
        """The fingerprint of ``authorization`` if ``connection`` sent it last (under
        the same keyer); None otherwise."""
        last = self._last.get(connection)
        if last is None or last.authorization != authorization or last.keyer is not keyer:
            return None
        return last.fingerprint

    def remember(self, connection: object, keyer: Keyer, authorization: str) -> str:
        """The fingerprint of ``authorization``, computed; remembered for ``connection``
        unless the header is too long to keep."""
        fingerprint = keyer.fingerprint(authorization)
        self.forget(connection)
        if len(authorization) <= REMEMBERED_HEADER_MAX:
            cost = len(authorization) + ENTRY_COST_BYTES
            if self._bytes + cost > self._max_bytes:
                self._last.clear()
                self._bytes = 0
            self._last[connection] = _Last(keyer, authorization, fingerprint)
            self._bytes += cost
        return fingerprint

    def of(self, connection: object, keyer: Keyer, authorization: str) -> str:
        """The fingerprint of ``authorization``, sent on ``connection``."""
        known = self.known(connection, keyer, authorization)
        return known if known is not None else self.remember(connection, keyer, authorization)

    def forget(self, connection: object) -> None:
        """``connection`` has closed (or sends another header)."""
        last = self._last.pop(connection, None)
        if last is not None:
            self._bytes -= len(last.authorization) + ENTRY_COST_BYTES


class ConnectionMemo:
    """The fingerprints one connection's tokens have (a view of the server's
    :class:`ConnectionFingerprints`, in which the view stands for its connection), for
    ``gateway.records.lookup.RecordLookup``. It holds nothing of the connection, so
    that a closed connection is freed as soon as it is dropped, with no reference
    cycle for the garbage collector to find."""

    __slots__ = ("_fingerprints",)

    def __init__(self, fingerprints: ConnectionFingerprints) -> None:
        self._fingerprints = fingerprints

    def known(self, keyer: Keyer, authorization: str) -> str | None:
        return self._fingerprints.known(self, keyer, authorization)

    def remember(self, keyer: Keyer, authorization: str) -> str:
        return self._fingerprints.remember(self, keyer, authorization)

    def forget(self) -> None:
        """Its connection has closed."""
        self._fingerprints.forget(self)
