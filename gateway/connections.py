"""What the gateway remembers about each open client connection: the fingerprint of
the token it last sent.

A service sends the same token on every request of a keep-alive connection, and the
token's fingerprint (an HMAC-SHA256, gateway.cache.Keyer) is a fifth of what a cache
hit costs. :class:`ConnectionFingerprints` computes it once per connection and token
instead of once per request. What it holds (the Authorization header and its
fingerprint) lives exactly as long as the connection that sent it: the server forgets
a connection when it closes (gateway.front.GatewayRunner), as aiohttp drops the
request that carried the header. It is process memory only; it never reaches the
cache, the logs or the metrics.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.cache import Keyer

# Held only for open connections; the bound is a safety net for a server that does
# not report closed connections (an application run outside GatewayRunner).
MAX_CONNECTIONS = 16_384


class _Last(NamedTuple):
    keyer: Keyer
    authorization: str
    fingerprint: str


class ConnectionFingerprints:
    """The fingerprint of the last Authorization header each open connection sent."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS) -> None:
        self._max = max_connections
        self._last: dict[object, _Last] = {}

    def __len__(self) -> int:
        return len(self._last)

    def known(self, connection: object, keyer: Keyer, authorization: str) -> str | None:
        """The fingerprint of ``authorization`` if ``connection`` sent it last (under
        the same keyer); None otherwise."""
        last = self._last.get(connection)
        if last is None or last.authorization != authorization or last.keyer is not keyer:
            return None
        return last.fingerprint

    def of(self, connection: object, keyer: Keyer, authorization: str) -> str:
        """The fingerprint of ``authorization``, sent on ``connection``; remembered for it."""
        fingerprint = self.known(connection, keyer, authorization)
        if fingerprint is None:
            fingerprint = keyer.fingerprint(authorization)
            if len(self._last) >= self._max and connection not in self._last:
                self._last.clear()
            self._last[connection] = _Last(keyer, authorization, fingerprint)
        return fingerprint

    def forget(self, connection: object) -> None:
        """``connection`` has closed."""
        self._last.pop(connection, None)
