"""The in-process cache backend: bounded by bytes, least-recently-used eviction."""

from __future__ import annotations

import math
import secrets
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gateway.cache.backend import (
    EVERY_CALLER,
    IN_PROCESS,
    NOTHING,
    RECORD_PURGE_MARK_S,
    BeforeStore,
    IndexSize,
    Noted,
    ProcessClaims,
    Purged,
    QuietBackend,
    RecordsPurged,
)
from gateway.cache.clock import Clock
from gateway.cache.entry import CacheEntry, CacheKey, Generations, Lookup

# What one entry is charged against the bound besides its key and body: the entry, its
# slot and OrderedDict node, the ETag, what such small long-lived objects cost in
# allocator pages they keep from being returned, and a share of the heap that bodies of
# 10-100 KB leave fragmented; so that the process stays within memory_max_bytes + its
# base (bench/README.md, "Memory", has how the figure was chosen).
ENTRY_OVERHEAD_BYTES = 2048


# What one record an entry holds is charged against the bound besides its reference:
# its place in the entry's list and in the record's set of holders.
HOLDING_OVERHEAD_BYTES = 160

# How many records no entry holds any more a memory backend remembers the latest
# version stamp of (set_consistent); beyond them, one floor for all.
FORGOTTEN_MAX = 65_536
# past this many scopes (callers) for one record, the older half is let go
VERSIONS_PRUNED_PAST = 256


@dataclass(slots=True)
class _Slot:
    entry: CacheEntry
    expires_at: float
    size: int
    route: str
    held: tuple[str, ...] = ()


class MemoryBackend(QuietBackend):
    """Entries in this process only, at most ``max_bytes`` of them (keys, bodies, overhead)."""

    name = "memory"
    capabilities = IN_PROCESS

    def __init__(self, *, max_bytes: int, clock: Clock) -> None:
        self._max_bytes = max_bytes
        self._clock = clock
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._bytes = 0
        self._holding_bytes = 0  # of _bytes, what the records' index is charged
        self._everything = 0
        self._routes: dict[str, int] = {}
        self._generations: dict[str, Generations] = {}
        # the entries (their keys' texts) that hold each record; the number and time
        # of each record's last purge (forgotten after RECORD_PURGE_MARK_S), and of the
        # latest of them all
        self._holders: dict[str, set[str]] = {}
        self._record_purges: dict[str, tuple[int, float]] = {}
        # one number for every purge by record and every fill's purge_sequence
        self._stamps = 0
        # each record's version in each scope of set_consistent, with the stamp of when
        # the latest fill that brought it was noted, while some entry holds the record;
        # then, for at most FORGOTTEN_MAX records, the latest such stamp (beyond them,
        # the floor)
        self._versions: dict[str, dict[str, tuple[int, str]]] = {}
        self._forgotten: OrderedDict[str, int] = OrderedDict()
        self._forgotten_floor = 0
        self._claims = ProcessClaims(clock)

    @staticmethod
    def new_secret() -> bytes:
        """A random per-process secret for token fingerprints: memory never leaves it."""
        return secrets.token_bytes(32)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._slots)

    def _current(self, route: str) -> Generations:
        current = self._generations.get(route)
        if current is None:
            current = Generations(self._everything, self._routes.get(route, 0))
            self._generations[route] = current
        return current

    async def get(self, key: CacheKey) -> Lookup:
        current = self._current(key.route)
        return Lookup(self._unpurged(key.text, current), current)

    def read_held(self, key: CacheKey) -> CacheEntry | Lookup:
        """The entry under ``key`` while within its TTL, as :meth:`fresh` gives it;
        otherwise what :meth:`get` returns. Marked recently used (see :meth:`_held`
        for what is dropped)."""
        current = self._current(key.route)
        text = key.text
        now = self._clock()
        slot = self._held(text, current, now)
        if slot is None:
            return Lookup(None, current)
        self._slots.move_to_end(text)
        entry = slot.entry
        return entry if entry.is_fresh(now) else Lookup(entry, current)

    def fresh(self, key: CacheKey) -> CacheEntry | None:
        return self.fresh_text(key.text, self._current(key.route))

    def fresh_text(self, text: str, current: Generations | None) -> CacheEntry | None:
        """The entry under ``text`` while within its TTL, marked recently used (see
        :meth:`_held` for what is dropped)."""
        now = self._clock()
        slot = self._held(text, current, now)
        if slot is None or not slot.entry.is_fresh(now):
            return None
        self._slots.move_to_end(text)
        return slot.entry

    def _unpurged(self, text: str, current: Generations | None) -> CacheEntry | None:
        """The entry under ``text``, fresh or stale, marked recently used (see
        :meth:`_held` for what is dropped)."""
        slot = self._held(text, current, self._clock())
        if slot is None:
            return None
        self._slots.move_to_end(text)
        return slot.entry

    def _held(self, text: str, current: Generations | None, now: float) -> _Slot | None:
        """The slot under ``text``, unless expired from the store at ``now`` or stored
        before the ``current`` generations (None: no purge check); those are dropped."""
        slot = self._slots.get(text)
        if slot is not None and (
            slot.expires_at <= now or (current is not None and slot.entry.generations != current)
        ):
            self.drop(text)
            return None
        return slot

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        self.put(key.text, entry, lifetime_s, route=key.route)

    def peek(self, text: str) -> CacheEntry | None:
        """The entry under ``text`` unless expired from the store; marks it recently used."""
        return self._unpurged(text, None)

    def put(self, text: str, entry: CacheEntry, lifetime_s: float, *, route: str = "") -> None:
        """Store ``entry`` for ``lifetime_s``, evicting the least recently used beyond the bound."""
        size = len(text) + len(entry.body) + ENTRY_OVERHEAD_BYTES
        self.drop(text)  # the entry it replaces goes, whether this one is kept or not
        if size > self._max_bytes:
            return
        self._slots[text] = _Slot(entry, self._clock() + lifetime_s, size, route)
        self._bytes += size
        while self._bytes > self._max_bytes:
            self.drop(next(iter(self._slots)))

    async def remove(self, key: CacheKey) -> bool:
        return self.drop(key.text)

    def drop(self, text: str) -> bool:
        """Drop the entry under ``text``; True when there was one."""
        slot = self._slots.pop(text, None)
        if slot is None:
            return False
        self._bytes -= slot.size
        self._holding_bytes -= sum(len(ref) + HOLDING_OVERHEAD_BYTES for ref in slot.held)
        for ref in slot.held:
            holders = self._holders.get(ref)
            if holders is not None:
                holders.discard(text)
                if not holders:
                    del self._holders[ref]
                    self._forget_versions(ref)
        return True

    def _prune_scopes(self, ref: str, scopes: dict[str, tuple[int, str]]) -> None:
        """Let go of the older half of a record's scopes (callers), keeping the stamp
        of the latest let go, as for a record forgotten."""
        ordered = sorted(scopes.items(), key=lambda item: item[1][0])
        dropped = ordered[: len(ordered) // 2]
        for scope, _ in dropped:
            del scopes[scope]
        latest = max(stamp for _, (stamp, _) in dropped)
        self._remember_forgotten(ref, latest)

    def _remember_forgotten(self, ref: str, stamp: int) -> None:
        forgotten = self._forgotten
        forgotten[ref] = max(forgotten.get(ref, 0), stamp)
        forgotten.move_to_end(ref)
        while len(forgotten) > FORGOTTEN_MAX:
            _, oldest = forgotten.popitem(last=False)
            self._forgotten_floor = max(self._forgotten_floor, oldest)

    def _forget_versions(self, ref: str) -> None:
        """Forget the versions of a record no entry holds, keeping the stamp of the
        latest fill that noted one (a fill that began before it must still not store
        another version)."""
        scopes = self._versions.pop(ref, None)
        if scopes:
            self._remember_forgotten(ref, max(stamp for stamp, _ in scopes.values()))

    async def set_holding(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
    ) -> bool:
        purges = self._record_purges
        if any(purges.get(ref, (0, 0.0))[0] > since for ref in held):
            self.drop(key.text)
            return False
        self.put(key.text, entry, lifetime_s, route=key.route)
        slot = self._slots.get(key.text)
        if slot is None or slot.entry is not entry or not held:
            return True  # larger than the whole bound: not kept
        slot.held = tuple(held)
        added = sum(len(ref) + HOLDING_OVERHEAD_BYTES for ref in slot.held)
        slot.size += added
        self._bytes += added
        self._holding_bytes += added
        for ref in slot.held:
            self._holders.setdefault(ref, set()).add(key.text)
        while self._bytes > self._max_bytes:
            self.drop(next(iter(self._slots)))
        return True

    async def set_consistent(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
        scope: str,
        before_store: BeforeStore | None = None,
    ) -> Noted:
        """Decided, noted and stored in one step (nothing else runs in between): no
        process holds copies of these entries, so ``before_store`` is not needed."""
        versions = self._versions
        changed: list[str] = []
        for ref, version in held.items():
            scopes = versions.get(ref)
            noted = None if scopes is None else scopes.get(scope)
            if noted is None:
                if since <= max(self._forgotten.get(ref, 0), self._forgotten_floor):
                    self.drop(key.text)
                    return Noted(False)
                changed.append(ref)
            elif noted[1] != version:
                if noted[0] >= since:
                    self.drop(key.text)
                    return Noted(False)
                changed.append(ref)
        if not await self.set_holding(key, entry, lifetime_s, held, since):
            return Noted(False)
        if key.text not in self._slots:
            return Noted(True)  # larger than the whole bound: nothing noted
        self._stamps += 1  # the answer came before this: what a later fill must follow
        for ref, version in held.items():
            scopes = versions.setdefault(ref, {})
            scopes[scope] = (self._stamps, version)
            if len(scopes) > VERSIONS_PRUNED_PAST:
                self._prune_scopes(ref, scopes)
        suffix = "|" + scope
        invalidated: dict[str, CacheKey] = {}
        for ref in changed:
            for text in self._holders.get(ref, ()):
                if text != key.text and (scope == EVERY_CALLER or text.endswith(suffix)):
                    invalidated[text] = CacheKey(self._slots[text].route, text)
        for text in invalidated:
            self.drop(text)
        return Noted(True, tuple(invalidated.values()))

    async def purge_records(self, refs: Sequence[str], *, soft: bool) -> RecordsPurged:
        now = self._clock()
        purges = self._record_purges
        for ref, (_, when) in list(purges.items()):
            if when < now - RECORD_PURGE_MARK_S:
                del purges[ref]
        self._stamps += 1
        texts: dict[str, None] = {}
        for ref in refs:
            purges[ref] = (self._stamps, now)
            texts.update(dict.fromkeys(self._holders.get(ref, ())))
        keys = []
        for text in texts:
            slot = self._slots[text]
            keys.append(CacheKey(slot.route, text))
            if not soft:
                self.drop(text)
            elif slot.entry.is_fresh(now):
                # stale from now on: its stale windows begin now, and its slot's end
                # (when the store forgets it) stays
                slot.entry = replace(slot.entry, ttl_s=math.floor(slot.entry.age(now)))
        return RecordsPurged(tuple(keys), reached=tuple(keys))

    def drop_route(self, route: str) -> None:
        """Drop every entry of ``route`` (a scan: for purges, never on the request path)."""
        for text in [text for text, slot in self._slots.items() if slot.route == route]:
            self.drop(text)

    def clear(self) -> None:
        self._slots.clear()
        self._holders.clear()
        self._bytes = 0
        self._holding_bytes = 0
        for ref in list(self._versions):
            self._forget_versions(ref)

    async def purge(self, route: str | None) -> Purged:
        if route is None:
            self._everything += 1
            self.clear()
        else:
            self._routes[route] = self._routes.get(route, 0) + 1
        self._generations.clear()
        return Purged()

    async def purge_sequence(self) -> int:
        self._stamps += 1
        return self._stamps

    async def claim(self, name: str, lifetime_s: float) -> bool:
        return self._claims.claim(name, lifetime_s)

    async def index_size(self) -> IndexSize:
        return IndexSize(len(self._holders), self._holding_bytes)

    async def close(self) -> None:
        self.clear()


class NullBackend(QuietBackend):
    """``cache.backend = "none"``: nothing is stored."""

    name = "none"
    capabilities = NOTHING

    def __init__(self) -> None:
        self._claims = ProcessClaims()

    async def claim(self, name: str, lifetime_s: float) -> bool:
        return self._claims.claim(name, lifetime_s)

    async def get(self, key: CacheKey) -> Lookup:
        return Lookup(None, Generations())

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        return None

    async def set_holding(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
    ) -> bool:
        return True

    async def set_consistent(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
        scope: str,
        before_store: BeforeStore | None = None,
    ) -> Noted:
        return Noted(True)

    async def purge_sequence(self) -> int:
        return 0

    async def purge(self, route: str | None) -> Purged:
        return Purged()

    async def remove(self, key: CacheKey) -> bool:
        return False

    async def close(self) -> None:
        return None
