"""What each record route's traffic was, from the metrics every worker counted: the
requests and how the cache answered them, and the upstream calls they made. The admin
console's fleet view and ``records-gateway ttl-advice --json`` read it from
``GET /admin/ttl``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# gateway_cache_results_total's results, as the report names them
RESULTS = {"hit": "hits", "stale": "stale", "miss": "misses", "bypass": "bypasses"}


@dataclass(slots=True)
class Traffic:
    """One route's counts since the gateway started (every worker summed)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS.values(), 0))
    upstream_calls: int = 0

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
        }


def traffic_of(families: Iterable[Any]) -> Mapping[str, Traffic]:
    """Each route's :class:`Traffic` from prometheus-client metric families (those of a
    scrape): ``gateway_cache_results_total`` and ``gateway_upstream_requests_total``."""
    routes: dict[str, Traffic] = {}
    for family in families:
        if family.name not in ("gateway_cache_results", "gateway_upstream_requests"):
            continue
        for sample in family.samples:
            route = sample.labels.get("route")
            if route is None or not sample.name.endswith("_total"):
                continue
            traffic = routes.setdefault(route, Traffic())
            if family.name == "gateway_upstream_requests":
                traffic.upstream_calls += int(sample.value)
            elif sample.labels.get("result") in RESULTS:
                traffic.counts[RESULTS[sample.labels["result"]]] += int(sample.value)
    return routes
