"""TTL advice per route, from how often the upstream's answers really change.

**The evidence.** Whenever the gateway replaces a cached answer with a new one from the
upstream (a background refresh, a miss after expiry, a caller's ``no-cache``), it
compares the two ETags and records the replaced answer's age: "changed within t
seconds" or "unchanged for t seconds" (``gateway_refreshes_total`` and
``gateway_refresh_age_seconds``, see :func:`evidence_of`).

**The change rate.** An answer's changes are taken to be a Poisson process of rate λ:
changes come one at a time, independently, at a steady rate (a record edited now and
then; a page of many records changes when any of them does, at the sum of their
rates). Then an answer unchanged after t seconds has probability e^(-λt), a changed one
1 - e^(-λt), and the maximum-likelihood λ solves

    Σ_changed t_i / (e^(λ t_i) - 1) = Σ_unchanged t_j

whose left side falls from infinity to 0 as λ grows: one root, found by bisection. Only
ages in the histogram's buckets are known for changed answers; each is taken at its
bucket's middle, all scaled so that their sum is the exact sum of the changed ages (so
the estimate is exact when they share a bucket, as refreshes just after expiry do). The
unchanged side needs only the sum of ages, which is exact. With no change seen, the
estimate is 0 and the advice uses the 95% upper bound 3 / Σ t instead (the "rule of
three"); with every answer changed, the rate is beyond what the ages can tell, and the
advice is the minimum TTL. Fewer than :data:`MIN_REFRESHES` refreshes is "not enough
data": a dozen observations can put the rate off by half.

**The advice.** A cached answer served at age a was overtaken by a change with
probability 1 - e^(-λa). Requests for one key are taken to come as a Poisson process
too, at the rate r that the route's hit ratio h at its TTL T implies (h = rT / (1 + rT),
one miss and then rT hits per TTL): hits then fall evenly over the TTL, and the share
of all answers served after the upstream changed is

    S(T) = h(T) · (1 - (1 - e^(-λT)) / (λT)).

The advised TTL is the longest within [``ttl_advice_min_s``, ``ttl_advice_max_s``] whose
S stays at most ``cache.max_stale_share``. The stale windows (answers served past
their TTL) are left out of S: they trade staleness for availability, separately.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

MIN_REFRESHES = 30
# a hit ratio is never taken as 1 (a route whose every answer is a hit says nothing of
# its request rate beyond "high")
_HIGHEST_HIT_RATIO = 0.999
_LOWEST_RATE = 1e-12  # per second: once in 30,000 years
_HIGHEST_RATE = 1e3


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the gateway saw of one route's answers being replaced, and its traffic.

    ``changed_ages`` holds, for each histogram bucket that has any, (its lower bound,
    its upper bound or ``inf``, the changed answers in it)."""

    hits: float = 0.0
    misses: float = 0.0
    unchanged: float = 0.0
    unchanged_age_sum: float = 0.0
    changed: float = 0.0
    changed_age_sum: float = 0.0
    changed_ages: tuple[tuple[float, float, float], ...] = ()

    @property
    def refreshes(self) -> int:
        return round(self.unchanged + self.changed)

    @property
    def hit_ratio(self) -> float | None:
        served = self.hits + self.misses
        return None if served <= 0 else self.hits / served


def change_rate(evidence: Evidence) -> float | None:
    """The maximum-likelihood rate (changes per second) of the route's answers; 0 when
    none changed; None when every one did (no finite estimate)."""
    if evidence.changed <= 0:
        return 0.0
    if evidence.unchanged_age_sum <= 0:
        return None
    ages = _changed_ages(evidence)
    target = evidence.unchanged_age_sum

    def excess(rate: float) -> float:
        # t / (e^(λt) - 1), which is 0 to any precision past λt = 700
        return (
            sum(count * age / math.expm1(rate * age) for age, count in ages if rate * age < 700)
            - target
        )

    low, high = math.log(_LOWEST_RATE), math.log(_HIGHEST_RATE)
    if excess(math.exp(high)) > 0:
        return None
    if excess(math.exp(low)) < 0:
        return _LOWEST_RATE
    for _ in range(100):
        middle = (low + high) / 2
        if excess(math.exp(middle)) > 0:
            low = middle
        else:
            high = middle
    return math.exp((low + high) / 2)


def _changed_ages(evidence: Evidence) -> list[tuple[float, float]]:
    """(age, count) of the changed answers: each bucket's middle, scaled so that their
    total is the exact sum of the changed ages."""
    middles = []
    for low, high, count in evidence.changed_ages:
        if count <= 0:
            continue
        middle = low * 1.5 if math.isinf(high) else (low + high) / 2
        middles.append((max(middle, 1e-3), count))
    weighted = sum(age * count for age, count in middles)
    if weighted <= 0:
        return middles
    scale = evidence.changed_age_sum / weighted if evidence.changed_age_sum > 0 else 1.0
    return [(max(age * scale, 1e-3), count) for age, count in middles]


def stale_share(rate: float, ttl_s: float, hit_ratio: float) -> float:
    """S(T) of the module's docstring: the share of answers served after the upstream
    changed, at ``ttl_s`` with ``hit_ratio``, for answers changing at ``rate``."""
    if ttl_s <= 0 or rate <= 0:
        return 0.0
    x = rate * ttl_s
    return hit_ratio * (1 - -math.expm1(-x) / x)


def hit_ratio_at(ttl_s: float, hit_ratio: float, now_ttl_s: float) -> float:
    """The hit ratio at ``ttl_s`` of a route whose hit ratio is ``hit_ratio`` at
    ``now_ttl_s`` (one miss, then rT hits, per TTL)."""
    if ttl_s <= 0 or now_ttl_s <= 0:
        return 0.0
    h = min(hit_ratio, _HIGHEST_HIT_RATIO)
    per_second = h / ((1 - h) * now_ttl_s)
    return per_second * ttl_s / (1 + per_second * ttl_s)


@dataclass(frozen=True, slots=True)
class Policy:
    """What the advice aims at: the largest share of stale answers, and the bounds."""

    max_stale_share: float
    min_ttl_s: int
    max_ttl_s: int


@dataclass(frozen=True, slots=True)
class Advice:
    """The advice for one route (see :func:`advise`)."""

    route: str
    ttl_s: int
    hit_ratio: float | None
    refreshes: int
    changed_share: float | None
    changes_per_hour: float | None
    advised_ttl_s: int | None
    stale_share_now: float | None
    hit_ratio_now: float | None
    stale_share_advised: float | None
    hit_ratio_advised: float | None
    reason: str
    # (TTL, stale share, hit ratio) across the policy's bounds: the curve the advice
    # is read from; empty while the change rate is unknown
    curve: tuple[tuple[int, float, float], ...] = ()

    def as_json(self) -> dict[str, Any]:
        def rounded(value: float | None, places: int = 4) -> float | None:
            return None if value is None else round(value, places)

        return {
            "route": self.route,
            "ttl": self.ttl_s,
            "hitRatio": rounded(self.hit_ratio),
            "refreshes": self.refreshes,
            "changedShare": rounded(self.changed_share),
            "changesPerHour": rounded(self.changes_per_hour, 3),
            "advisedTtl": self.advised_ttl_s,
            "current": {
                "staleShare": rounded(self.stale_share_now),
                "hitRatio": rounded(self.hit_ratio_now),
            },
            "advised": {
                "staleShare": rounded(self.stale_share_advised),
                "hitRatio": rounded(self.hit_ratio_advised),
            },
            "reason": self.reason,
            "curve": [
                {"ttl": ttl, "staleShare": rounded(share), "hitRatio": rounded(hit)}
                for ttl, share, hit in self.curve
            ],
        }


CURVE_POINTS = 25


def advise(route: str, ttl_s: int, evidence: Evidence, policy: Policy) -> Advice:
    """The advised TTL of ``route`` (TTL now ``ttl_s``) from ``evidence``: the longest
    within the policy's bounds whose expected stale share stays at most its maximum;
    with the curve of the stale share against the TTL it was read from."""
    advice = _advise(route, ttl_s, evidence, policy)
    hit_ratio = evidence.hit_ratio
    if advice.changes_per_hour is None or hit_ratio is None:
        return advice
    return replace(advice, curve=curve(advice.changes_per_hour / 3600, ttl_s, hit_ratio, policy))


def curve(
    rate: float, ttl_s: int, hit_ratio: float, policy: Policy, points: int = CURVE_POINTS
) -> tuple[tuple[int, float, float], ...]:
    """The expected stale share and hit ratio at ``points`` TTLs spread evenly on a log
    scale over the policy's bounds, and at the TTL now: what a chart of the advice
    draws."""
    low, high = policy.min_ttl_s, policy.max_ttl_s
    ratio = (high / low) ** (1 / (points - 1)) if high > low else 1.0
    ttls = sorted({round(low * ratio**step) for step in range(points)} | {ttl_s} - {0})
    rows = []
    for ttl in ttls:
        hit = hit_ratio_at(ttl, hit_ratio, ttl_s)
        rows.append((ttl, stale_share(rate, ttl, hit), hit))
    return tuple(rows)


def _advise(route: str, ttl_s: int, evidence: Evidence, policy: Policy) -> Advice:
    refreshes = evidence.refreshes
    hit_ratio = evidence.hit_ratio
    changed_share = evidence.changed / refreshes if refreshes else None

    def advice(advised: int | None, rate: float | None, reason: str) -> Advice:
        h = hit_ratio if hit_ratio is not None else 0.0
        now_stale = None if rate is None else stale_share(rate, ttl_s, h)
        if advised is None or rate is None or hit_ratio is None:
            return Advice(
                route, ttl_s, hit_ratio, refreshes, changed_share,
                None if rate is None else rate * 3600,
                advised, now_stale, hit_ratio, None, None, reason,
            )  # fmt: skip
        h_advised = hit_ratio_at(advised, h, ttl_s)
        return Advice(
            route, ttl_s, hit_ratio, refreshes, changed_share, rate * 3600, advised,
            now_stale, hit_ratio, stale_share(rate, advised, h_advised), h_advised, reason,
        )  # fmt: skip

    if ttl_s <= 0:
        return advice(None, None, "caching is off for this route (its TTL is 0)")
    if refreshes < MIN_REFRESHES:
        return advice(
            None,
            None,
            f"not enough data: {refreshes} refreshes seen, {MIN_REFRESHES} needed",
        )
    if hit_ratio is None:
        return advice(None, None, "no traffic counted yet: the hit ratio is unknown")
    rate = change_rate(evidence)
    share = policy.max_stale_share
    if rate is None:
        return advice(
            policy.min_ttl_s,
            None,
            f"every one of {refreshes} replaced answers had changed: the answers change"
            f" faster than the ages seen tell; the minimum TTL ({policy.min_ttl_s} s)",
        )
    seen = f"{refreshes} refreshes, {changed_share or 0:.1%} changed"
    if rate == 0:
        total_age = evidence.unchanged_age_sum
        bound = 3 / total_age if total_age > 0 else _LOWEST_RATE
        advised = _longest(bound, ttl_s, hit_ratio, policy)
        return advice(
            advised,
            bound,
            f"no change seen ({seen}); at most {bound * 3600:.3g} changes an hour (95%),"
            f" so {advised} s keeps stale answers under {share:.1%}",
        )
    advised = _longest(rate, ttl_s, hit_ratio, policy)
    now = stale_share(rate, ttl_s, hit_ratio)
    at_advised = stale_share(rate, advised, hit_ratio_at(advised, hit_ratio, ttl_s))
    if at_advised > share:
        why = (
            f"changes {rate * 3600:.3g} times an hour ({seen}): even the minimum TTL"
            f" ({advised} s) serves {at_advised:.1%} stale"
        )
    else:
        why = (
            f"changes {rate * 3600:.3g} times an hour ({seen}): {advised} s keeps stale"
            f" answers under {share:.1%}; now {ttl_s} s serves {now:.1%}"
        )
    return advice(advised, rate, why)


def _longest(rate: float, ttl_s: int, hit_ratio: float, policy: Policy) -> int:
    """The longest whole TTL within the policy's bounds whose stale share stays at
    most its maximum (the minimum when none does)."""

    def share_at(candidate: int) -> float:
        return stale_share(rate, candidate, hit_ratio_at(candidate, hit_ratio, ttl_s))

    low, high = policy.min_ttl_s, policy.max_ttl_s
    if share_at(high) <= policy.max_stale_share:
        return high
    if share_at(low) > policy.max_stale_share:
        return low
    while high - low > 1:  # share_at(low) <= max < share_at(high); it rises with T
        middle = (low + high) // 2
        if share_at(middle) <= policy.max_stale_share:
            low = middle
        else:
            high = middle
    return low


def evidence_of(families: Iterable[Any]) -> Mapping[str, Evidence]:
    """Each route's :class:`Evidence` from prometheus-client metric families (those
    of a scrape, every worker summed): ``gateway_cache_results_total``,
    ``gateway_refreshes_total`` and ``gateway_refresh_age_seconds``."""
    routes: dict[str, dict[str, Any]] = {}

    def of(route: str) -> dict[str, Any]:
        return routes.setdefault(
            route,
            {
                "hits": 0.0,
                "misses": 0.0,
                "unchanged": 0.0,
                "unchanged_age_sum": 0.0,
                "changed": 0.0,
                "changed_age_sum": 0.0,
                "buckets": [],
            },
        )

    for family in families:
        if family.name == "gateway_cache_results":
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                result = sample.labels.get("result")
                if result in ("hit", "stale"):
                    of(sample.labels["route"])["hits"] += sample.value
                elif result == "miss":
                    of(sample.labels["route"])["misses"] += sample.value
        elif family.name == "gateway_refresh_age_seconds":
            for sample in family.samples:
                route, changed = sample.labels.get("route"), sample.labels.get("changed")
                if route is None or changed not in ("true", "false"):
                    continue
                side = "changed" if changed == "true" else "unchanged"
                if sample.name.endswith("_count"):
                    of(route)[side] += sample.value
                elif sample.name.endswith("_sum"):
                    of(route)[f"{side}_age_sum"] += sample.value
                elif sample.name.endswith("_bucket") and side == "changed":
                    of(route)["buckets"].append((float(sample.labels["le"]), sample.value))
    evidence: dict[str, Evidence] = {}
    for route, seen in routes.items():
        cumulative = sorted(seen.pop("buckets"))
        buckets, below, previous = [], 0.0, 0.0
        for bound, running in cumulative:
            count = running - below
            if count > 0:
                buckets.append((previous, bound, count))
            below, previous = running, bound
        evidence[route] = Evidence(**seen, changed_ages=tuple(buckets))
    return evidence


def to_table(report: Mapping[str, Any]) -> str:
    """``GET /admin/ttl``'s answer as a table for a terminal, a route a line, and each
    route's reason under it."""
    lines = [
        f"aim: at most {report['maxStaleShare']:.1%} of answers served after the upstream"
        f" changed; advice within {report['minTtl']}..{report['maxTtl']} s",
        "",
        f"{'route':<9} {'ttl':>6} {'hit':>6} {'refr.':>6} {'changed':>7} {'ch/hour':>9}"
        f" {'advised':>8} {'stale now':>9} {'stale adv.':>10} {'hit adv.':>8}",
    ]

    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    for item in report["routes"]:
        rate = item["changesPerHour"]
        advised = item["advisedTtl"]
        lines.append(
            f"{item['route']:<9} {item['ttl']:>6} {share(item['hitRatio']):>6}"
            f" {item['refreshes']:>6} {share(item['changedShare']):>7}"
            f" {'-' if rate is None else f'{rate:.3g}':>9}"
            f" {'-' if advised is None else advised:>8}"
            f" {share(item['current']['staleShare']):>9}"
            f" {share(item['advised']['staleShare']):>10}"
            f" {share(item['advised']['hitRatio']):>8}"
        )
        lines.append(f"          {item['reason']}")
    return "\n".join(lines)
