"""The tunable part of caching, reloadable without a restart: the TTL of each route,
the stale windows, the negative TTL, and whether a caller's ``no-cache`` is honoured."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.settings import CacheSettings
from gateway.routing.routes import RouteTable
from gateway.routing.standard import ROUTES


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """The tunable part of caching (reloadable without a restart)."""

    ttl_s: dict[str, int]
    stale_while_revalidate_s: int
    stale_if_error_s: int
    negative_ttl_s: int
    honor_client_no_cache: bool
    # cache.record_consistency: "off", "caller" or "all"
    record_consistency: str = "off"

    @classmethod
    def from_settings(cls, settings: CacheSettings, routes: RouteTable = ROUTES) -> CachePolicy:
        """The policy of ``settings``; a route of ``routes`` that the settings hold no
        TTL for has the TTL it declares."""
        return cls(
            ttl_s=routes.ttls(settings.ttl_s.model_dump()),
            stale_while_revalidate_s=settings.stale_while_revalidate_s,
            stale_if_error_s=settings.stale_if_error_s,
            negative_ttl_s=settings.negative_ttl_s,
            honor_client_no_cache=settings.honor_client_no_cache,
            record_consistency=settings.record_consistency,
        )

    def lifetime_s(self, ttl_s: int) -> int:
        """How long an entry lives in the backend: its TTL plus the larger window."""
        return ttl_s + max(self.stale_while_revalidate_s, self.stale_if_error_s)
