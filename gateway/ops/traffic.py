"""What each record route's traffic was, from the metrics every worker counted: the
requests and how the cache answered them, and the upstream calls they made. The admin
console's fleet view and ``records-gateway ttl-advice --json`` read it from
``GET /admin/ttl``."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# gateway_cache_results_total's results, as the report names them
RESULTS = {"hit": "hits", "stale": "stale", "miss": "misses", "bypass": "bypasses"}


# the bits of a route's sketch of the keys it fetched: 128 KiB a route and process,
# within a few per cent up to some hundred thousand keys
SKETCH_BITS = 1 << 20


class KeySketch:
    """Which keys were seen, as bits of a bitmap (linear counting): :meth:`add` gives
    how much the estimate of the keys seen grew (0 for a key seen before), so that the
    processes' counters add up to the sum of their own estimates."""

    __slots__ = ("_bits", "_set")

    def __init__(self) -> None:
        self._bits = bytearray(SKETCH_BITS // 8)
        self._set = 0

    def add(self, key: str) -> float:
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        bit = int.from_bytes(digest, "big") % SKETCH_BITS
        byte, mask = bit >> 3, 1 << (bit & 7)
        if self._bits[byte] & mask:
            return 0.0
        self._bits[byte] |= mask
        self._set += 1
        return estimated(self._set) - estimated(self._set - 1)


def estimated(bits_set: int) -> float:
    """The keys behind ``bits_set`` bits of a sketch (linear counting)."""
    share = min(bits_set, SKETCH_BITS - 1) / SKETCH_BITS
    return -SKETCH_BITS * math.log1p(-share)


@dataclass(slots=True)
class Traffic:
    """One route's counts since the gateway started (every worker summed)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS.values(), 0))
    upstream_calls: int = 0
    distinct_keys: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    def as_json(self) -> dict[str, Any]:
        requests = self.requests
        served = self.counts["hits"] + self.counts["stale"]
        return {
            "requests": requests,
            **self.counts,
            "hitRatio": round(served / requests, 4) if requests else None,
            "staleShare": round(self.counts["stale"] / requests, 4) if requests else None,
            "upstreamCalls": self.upstream_calls,
            "distinctKeys": round(self.distinct_keys),
            "bestHitRatio": self.best_hit_ratio,
        }

    @property
    def best_hit_ratio(self) -> float | None:
        """The hit ratio these requests could have had at best, counted as ``hitRatio``
        is: every key's first request a miss, every later one a hit, but for those that
        bypassed the cache."""
        requests = self.requests
        if not requests:
            return None
        cached = requests - self.counts["bypasses"]
        return round(max(cached - round(self.distinct_keys), 0) / requests, 4)


_FAMILIES = ("gateway_cache_results", "gateway_upstream_requests", "gateway_cache_distinct_keys")


def traffic_of(families: Iterable[Any]) -> Mapping[str, Traffic]:
    """Each route's :class:`Traffic` from prometheus-client metric families (those of a
    scrape): ``gateway_cache_results_total`` and ``gateway_upstream_requests_total``."""
    routes: dict[str, Traffic] = {}
    for family in families:
        if family.name not in _FAMILIES:
            continue
        for sample in family.samples:
            route = sample.labels.get("route")
            if route is None or not sample.name.endswith("_total"):
                continue
            traffic = routes.setdefault(route, Traffic())
            if family.name == "gateway_upstream_requests":
                traffic.upstream_calls += int(sample.value)
            elif family.name == "gateway_cache_distinct_keys":
                traffic.distinct_keys += sample.value
            elif sample.labels.get("result") in RESULTS:
                traffic.counts[RESULTS[sample.labels["result"]]] += int(sample.value)
    return routes
