"""How a read is labelled: the ``X-Cache`` value and the ``Cache-Status`` field
(RFC 9211) of each outcome of ``gateway.records.decision``, in one place.

Every answer a read gives is labelled by :func:`label`, or for a fresh hit, which
every path (aiohttp's or the fast path) answers alike, by :func:`hit_label`.
"""

from __future__ import annotations

from gateway.records.decision import Outcome

CACHE_NAME = "records-gateway"

# the Cache-Status detail of an answer given without calling the upstream because
# its circuit is open
CIRCUIT_OPEN = "upstream-circuit-open"

HIT = "HIT"
MISS = "MISS"
STALE = "STALE"
BYPASS = "BYPASS"

_PREFIX = CACHE_NAME + "; "
_CIRCUIT_OPEN_DETAIL = "; detail=" + CIRCUIT_OPEN


def hit_status(left_s: int) -> str:
    """The Cache-Status detail of a hit with ``left_s`` seconds of freshness left
    (negative once stale)."""
    return f"hit; ttl={left_s}"


def hit_label(left_s: int) -> str:
    """The Cache-Status field of a fresh hit with ``left_s`` seconds left."""
    return f"{_PREFIX}hit; ttl={left_s}"


def label(
    outcome: Outcome,
    *,
    left: float = 0.0,
    stored: bool = False,
    collapsed: bool = False,
    stale: bool = False,
    cache_available: bool = True,
    failed_status: int | None = None,
) -> tuple[str, str]:
    """``(X-Cache, Cache-Status)`` of a read decided as ``outcome``.

    ``left``: the seconds of freshness left of the entry served (negative once
    stale). For the fills: ``stored``, whether the answer was stored; ``collapsed``,
    whether it is the entry another instance filled; ``stale``, whether a stale entry
    answered instead (while another instance fills, or, with ``failed_status`` set, 0
    for none, instead of an upstream failure); ``cache_available``, whether the cache
    could be read."""
    if outcome is Outcome.HIT:
        return HIT, hit_label(int(left))
    if outcome is Outcome.STALE_REFRESH:
        return STALE, _PREFIX + hit_status(int(left) or -1)
    if outcome is Outcome.STALE_CIRCUIT_OPEN or outcome is Outcome.STALE_CIRCUIT_TRIAL:
        return STALE, _PREFIX + hit_status(int(left) or -1) + _CIRCUIT_OPEN_DETAIL
    if outcome is Outcome.BYPASS:
        return BYPASS, _PREFIX + "fwd=bypass"
    if outcome is Outcome.BYPASS_NO_STORE:
        return BYPASS, _PREFIX + "fwd=request"
    if outcome is Outcome.REVALIDATE:
        return BYPASS, _PREFIX + ("fwd=request; stored" if stored else "fwd=request")
    if outcome is Outcome.LOOKUP or outcome is Outcome.FAIL_CIRCUIT_OPEN:
        raise ValueError(f"{outcome} answers nothing from the cache")
    return _fill_label(stored, collapsed, stale, cache_available, failed_status)


def _fill_label(
    stored: bool, collapsed: bool, stale: bool, cache_available: bool, failed_status: int | None
) -> tuple[str, str]:
    if stale and failed_status is not None:
        status = f"; fwd-status={failed_status}" if failed_status else ""
        return STALE, f"{_PREFIX}fwd=stale{status}"
    if stale:
        return STALE, _PREFIX + "fwd=stale; collapsed"
    if not cache_available:
        return MISS, _PREFIX + "fwd=miss; detail=cache-unavailable"
    if collapsed:
        return MISS, _PREFIX + "fwd=miss; collapsed"
    return MISS, _PREFIX + ("fwd=miss; stored" if stored else "fwd=miss")


def circuit_open_label() -> str:
    """The Cache-Status field of a 503 given because the upstream's circuit is open."""
    return f"{_PREFIX}detail={CIRCUIT_OPEN}"
