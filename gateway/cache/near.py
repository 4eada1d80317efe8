"""A bounded in-process near cache in front of a shared backend, and the messages of
the channel every instance of a prefix listens on (``gateway.cache.tiered`` puts the
two together).

A hit served from a shared store costs a network round trip and the client's CPU on
every request; a hit served from this process costs a dictionary lookup. The near
cache keeps a copy of fresh entries only, for the rest of their freshness, so stale
serving and expiry still follow the shared store.

Consistency it promises (docs/near-cache.md):

- a purge on any instance empties the matching near entries of every instance before
  the purge is answered 200: every process subscribed to the channel confirms that it
  dropped them (up to 1 s is waited for the confirmations);
- a purge whose outcome is unknown (the store did not answer in time) still drops this
  process's copies at once and is retried, with its invalidation, in the background;
- while the invalidation channel is down (the store unreachable, the subscription
  dropped, nothing heard for 0.75 s) the near cache is not used at all and is
  emptied, so that an instance that cannot be told stops serving copies within 1 s;
  it is used again once the subscription is back;
- a near entry is never served past the freshness of the shared entry it copies;
- an entry removed for a caller the upstream refused (``TieredBackend.remove``) is
  dropped by every process when its one-key message arrives (not waited for).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.cache.clock import Clock
from gateway.cache.entry import CacheEntry, CacheKey, Generations
from gateway.cache.memory import MemoryBackend

_EVERYTHING = b"*"
_ONE_KEY = b"="  # what begins the target of a message that names one key


def invalidation_message(route: str | None, purge_id: str = "") -> bytes:
    """``<purge id> <route or *>``; the id names the confirmations to send back."""
    return f"{purge_id or '-'} ".encode() + (_EVERYTHING if route is None else route.encode())


def removal_message(key: CacheKey) -> bytes:
    """``- =<route> <key>``: drop the copies of one key (no confirmation asked). A
    gateway that does not know this form reads it as a route that matches nothing."""
    return b"- " + _ONE_KEY + key.route.encode() + b" " + key.text.encode()


def parse_removal(data: bytes) -> CacheKey | None:
    """The key a :func:`removal_message` names; None for any other message."""
    _, _, target = data.partition(b" ")
    if not target.startswith(_ONE_KEY):
        return None
    route, _, text = target[len(_ONE_KEY) :].partition(b" ")
    if not route or not text:
        return None
    return CacheKey(route.decode("utf-8", "replace"), text.decode("utf-8", "replace"))


_MANY_KEYS = b"=="  # what begins the target of a message that names several keys
# the most bytes of keys one message carries; more go in the messages before it
REMOVALS_MAX_BYTES = 64 * 1024


def removals_messages(keys: Sequence[CacheKey], purge_id: str) -> list[bytes]:
    """``<id> ==<route> <key>\n<route> <key>...``: drop the copies of ``keys``, in as
    many messages as their size needs; the last (and only the last) asks for the
    confirmations of ``purge_id``, so that one confirmation says every message before
    it was heard (a channel delivers in order). An older gateway reads each as a
    one-key message for a key that does not exist, and confirms none."""
    messages: list[bytes] = []
    lines: list[bytes] = []
    size = 0
    for key in keys:
        line = key.route.encode() + b" " + key.text.encode()
        if lines and size + len(line) > REMOVALS_MAX_BYTES:
            messages.append(b"- " + _MANY_KEYS + b"\n".join(lines))
            lines, size = [], 0
        lines.append(line)
        size += len(line) + 1
    messages.append(f"{purge_id or '-'} ".encode() + _MANY_KEYS + b"\n".join(lines))
    return messages


def parse_removals(data: bytes) -> tuple[str, list[CacheKey]] | None:
    """(purge id, the keys) of a :func:`removals_messages` message; None for any other."""
    purge_id, _, target = data.partition(b" ")
    if not target.startswith(_MANY_KEYS):
        return None
    keys = []
    for line in target[len(_MANY_KEYS) :].split(b"\n"):
        route, _, text = line.partition(b" ")
        if route and text:
            keys.append(CacheKey(route.decode("utf-8", "replace"), text.decode("utf-8", "replace")))
    return purge_id.decode("ascii", "replace"), keys


def parse_invalidation(data: bytes) -> tuple[str, str | None]:
    """(purge id, route or None for all); ids "-" ask for no confirmation."""
    purge_id, _, target = data.partition(b" ")
    if not target:  # the message of an older gateway: the route alone
        purge_id, target = b"-", purge_id
    route = None if target == _EVERYTHING else target.decode("utf-8", "replace")
    return purge_id.decode("ascii", "replace"), route


class NearCache:
    """Fresh copies of a shared backend's entries in this process, used only while
    the invalidation channel is live."""

    def __init__(self, *, max_bytes: int, clock: Clock, enabled: bool = True) -> None:
        self._store = MemoryBackend(max_bytes=max_bytes, clock=clock)
        self._clock = clock
        # disabled (cache.near_cache = false): nothing kept, the channel still listened
        # to, so that purges of other instances are confirmed
        self.enabled = enabled
        self.live = False
        # The purge generations the store last reported per route; dropped by every
        # invalidation, so that an answer fetched before a purge is never kept here.
        self._known: dict[str, Generations] = {}
        # Bumped by every invalidation: what a read of the store that overlapped one
        # reported is not learnt.
        self.epoch = 0

    def learn(self, route: str, generations: Generations, epoch: int) -> None:
        """The store reported these as the current generations of ``route``, in a read
        that began at ``epoch``."""
        if epoch == self.epoch:
            self._known[route] = generations

    def get(self, key: CacheKey) -> CacheEntry | None:
        if not self.live:
            return None
        # kept only while fresh (put's lifetime is the freshness left): fresh or gone
        return self._store.fresh_text(key.text, None)

    def put(self, key: CacheKey, entry: CacheEntry) -> None:
        """Keep a copy of ``entry`` if it was stored under the generations the store last
        reported for its route (not if a purge came in between)."""
        if not self.live or not self.enabled or self._known.get(key.route) != entry.generations:
            return
        now = self._clock()
        if entry.is_fresh(now):
            self._store.put(key.text, entry, entry.left(now), route=key.route)

    def invalidate(self, route: str | None) -> None:
        self.epoch += 1
        if route is None:
            self._store.clear()
            self._known.clear()
        else:
            self._store.drop_route(route)
            self._known.pop(route, None)

    def remove(self, key: CacheKey) -> None:
        """Drop the copy of ``key``. Until the store is read again for its route, no copy
        of that route is kept: a read that overlapped the removal may carry the
        removed entry."""
        self.epoch += 1
        self._known.pop(key.route, None)
        self._store.drop(key.text)

    def set_live(self, live: bool) -> None:
        if live != self.live:
            self.epoch += 1
            self._store.clear()
            self._known.clear()
            self.live = live

    def __len__(self) -> int:
        return len(self._store)
