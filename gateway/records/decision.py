"""The read as one decision: from what is known about a request to what is done.

:func:`decide` is pure: it reads :class:`Facts` (whether the answer is cached at all,
the caller's directives, the state of the key's entry, the upstream's circuit, a fill
that ended while the cache was read) and returns one :class:`Outcome`. The pipeline
gathers the facts, asks, and acts; ``gateway.records.cache_status`` says how each
outcome is labelled.

The rules, in the order they apply:

1. Not cached (no cache, or the route's TTL is 0): BYPASS. ``no-store``: BYPASS_NO_STORE.
2. ``no-cache`` honoured (``cache.honor_client_no_cache``): REVALIDATE.
3. The entry not read yet: LOOKUP (then decide again with what the read found).
4. A fresh entry: HIT.
5. Within ``stale_while_revalidate_s`` after expiry: served at once with a background
   refresh (STALE_REFRESH); while the circuit is open, labelled so, and refreshed only
   as the circuit's trial when one is due (STALE_CIRCUIT_TRIAL, STALE_CIRCUIT_OPEN).
6. Circuit open, an entry within ``stale_if_error_s``: served the same way.
7. Circuit open with no call allowed and no such entry: FAIL_CIRCUIT_OPEN.
8. A fill of the key that ended while the cache was read: TAKE_ENDED_FILL.
9. An entry within ``stale_if_error_s``: FILL_OR_STALE (the entry answers an outage).
10. Otherwise: FILL.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from gateway.cache.entry import CacheEntry


class EntryState(enum.Enum):
    """What the cache read found for the key."""

    UNREAD = "unread"  # not read (yet)
    UNAVAILABLE = "unavailable"  # the cache could not be used
    ABSENT = "absent"  # no entry (or a purged one)
    FRESH = "fresh"
    STALE_REVALIDATE = "stale-while-revalidate"  # expired, within that window
    STALE_IF_ERROR = "stale-if-error"  # expired beyond it, within stale_if_error_s
    EXPIRED = "expired"  # older than both windows


class Circuit(enum.Enum):
    """The upstream's circuit as a read sees it."""

    CLOSED = "closed"  # no breaker, or calls flow
    TRIAL_DUE = "trial-due"  # open, and the next call is its trial
    HELD = "held"  # open or half-open: no call may go now


class Facts(NamedTuple):
    """What is known about one read (a named tuple: one is made on every read)."""

    caches: bool  # a cache is configured and the route's TTL is above 0
    no_store: bool
    no_cache: bool  # the caller's no-cache, when cache.honor_client_no_cache
    state: EntryState = EntryState.UNREAD
    circuit: Circuit = Circuit.CLOSED
    ended_fill_joins: bool = False  # a fill this read may take ended while it read


class Outcome(enum.Enum):
    """What the pipeline does for a read: exactly one per :class:`Facts`."""

    BYPASS = "bypass"  # upstream only, nothing stored
    BYPASS_NO_STORE = "bypass-no-store"  # the caller's no-store
    REVALIDATE = "revalidate"  # the caller's no-cache: upstream, stored
    LOOKUP = "lookup"  # read the cache, then decide again
    HIT = "hit"
    STALE_REFRESH = "stale-refresh"  # stale at once, one background refresh
    STALE_CIRCUIT_TRIAL = "stale-circuit-trial"  # stale at once; the trial refreshes
    STALE_CIRCUIT_OPEN = "stale-circuit-open"  # stale at once; no upstream call
    FAIL_CIRCUIT_OPEN = "fail-circuit-open"  # 503 at once
    TAKE_ENDED_FILL = "take-ended-fill"
    FILL_OR_STALE = "fill-or-stale"  # fill; the stale entry answers an outage
    FILL = "fill"


# the outcomes that serve the entry as read
SERVES_ENTRY = frozenset(
    {
        Outcome.HIT,
        Outcome.STALE_REFRESH,
        Outcome.STALE_CIRCUIT_TRIAL,
        Outcome.STALE_CIRCUIT_OPEN,
    }
)

_HELD = Circuit.HELD
_CLOSED = Circuit.CLOSED


def entry_state(
    entry: CacheEntry | None, now: float, stale_while_revalidate_s: int, stale_if_error_s: int
) -> EntryState:
    """The state of ``entry`` at ``now`` under the policy's stale windows; freshness
    itself is the entry's (:meth:`CacheEntry.is_fresh`)."""
    if entry is None:
        return EntryState.ABSENT
    if entry.is_fresh(now):
        return EntryState.FRESH
    overdue = -entry.left(now)
    if overdue < stale_while_revalidate_s:
        return EntryState.STALE_REVALIDATE
    if overdue < stale_if_error_s:
        return EntryState.STALE_IF_ERROR
    return EntryState.EXPIRED


def decide(facts: Facts) -> Outcome:
    """The one outcome of ``facts`` (see the module's rules)."""
    if not facts.caches:
        return Outcome.BYPASS
    if facts.no_store:
        return Outcome.BYPASS_NO_STORE
    if facts.no_cache:
        return Outcome.REVALIDATE
    state = facts.state
    if state is EntryState.FRESH:
        return Outcome.HIT
    if state is EntryState.UNREAD:
        return Outcome.LOOKUP
    circuit = facts.circuit
    if state is EntryState.STALE_REVALIDATE and circuit is _CLOSED:
        return Outcome.STALE_REFRESH
    if state is EntryState.STALE_REVALIDATE or (
        state is EntryState.STALE_IF_ERROR and circuit is not _CLOSED
    ):
        return Outcome.STALE_CIRCUIT_OPEN if circuit is _HELD else Outcome.STALE_CIRCUIT_TRIAL
    if circuit is _HELD:
        return Outcome.FAIL_CIRCUIT_OPEN
    if facts.ended_fill_joins:
        return Outcome.TAKE_ENDED_FILL
    if state is EntryState.STALE_IF_ERROR:
        return Outcome.FILL_OR_STALE
    return Outcome.FILL
