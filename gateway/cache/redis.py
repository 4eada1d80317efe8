"""The Redis cache backend: every call bounded in time, on any of the three topologies.

A read is the entry and the two purge generations it is checked against. Reads made
in the same turn of the event loop go to Redis together (:class:`ReadBatch`): one MGET
of every entry and generation they need on a standalone server or a Sentinel-managed
primary; on a cluster, where the entries and the generations live in different slots,
the entries by slot and one MGET of the generations, sent at once (one round trip of
latency). Under load, a read thus costs a share of one command instead of a command
of its own. A store is one SET with an expiry; a purge is one SET of a new random
generation; a fill lease is one SET NX PX; removing one entry (a caller the upstream
refused) is one DEL. Every Redis failure or timeout becomes CacheUnavailable, which the
pipeline treats as a miss. Made with its topology's pub/sub (``gateway.cache.pubsub``),
it publishes invalidations, and the registry puts the near cache in front of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
import struct
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisError

from gateway.cache.backend import (
    EVERY_CALLER,
    PUBLISHING_INDEXED,
    RECORD_PURGE_MARK_S,
    SHARED,
    BeforeStore,
    IndexSize,
    InvalidationChannel,
    Noted,
    Purged,
    QuietBackend,
    RecordsPurged,
)
from gateway.cache.clock import Clock, system_clock
from gateway.cache.entry import (
    CacheCorrupt,
    CacheEntry,
    CacheKey,
    Generations,
    Lookup,
)
from gateway.cache.fleet import Fleet
from gateway.cache.keyspace import (
    VERSIONS_SUFFIX,
    claim_key,
    generation_key,
    index_size_key,
    lease_key,
    probe_key,
    record_key,
    record_sequence_key,
    record_slot,
)
from gateway.cache.topology import REDIS_ERRORS, Commands
from gateway.errors import CacheUnavailable

log = logging.getLogger("gateway.cache")

T = TypeVar("T")

# Deletes a lease only if it is still the one taken (compare and delete, atomically).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# The counter of purges by record, made when missing (never made, evicted) from the
# server's time in microseconds: beyond every number it gave before, since no two
# purges are a microsecond apart. Numbers are written with %d: a Lua number as Redis
# writes it by itself keeps 14 digits.
_COUNTER = """
local function counter(key)
  if redis.call('EXISTS', key) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', key, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  return key
end
"""

# The server's time in microseconds, as a number.
_NOW = """
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
"""

# A fill's stamp: the server's time in microseconds, or the latest purge's number when
# that is later (the server's clock went back). KEYS: the counter.
_SEQUENCE = (
    _COUNTER
    + _NOW
    + """
return math.max(tonumber(redis.call('GET', counter(KEYS[1]))), now())
"""
)

# Notes that an entry holds records, unless one of them was purged after the fill's
# number: then nothing is written (the sets keep naming the entry that is there). A
# set's member ``!`` is scored by the number of the record's last purge; the others
# (``<route>|<key>``, one per key) by when their entry was stored. Members stored
# longer ago than any entry lives are let go; a set lives as long as its longest-lived
# entry. Answers the latest purge number of the records (0: none); when it is not later
# than the fill's and the entry's key is given, stores the entry too, in the same step.
# KEYS: each record's set, then the entry's key (when it shares the slot); ARGV: how
# many sets, member, stored at (s), the entry's life (ms), the oldest score kept (s),
# the fill's number, and with the entry's key, its value.
_NOTE = """
local sets = tonumber(ARGV[1])
local latest = 0
for i = 1, sets do
  local marked = tonumber(redis.call('ZSCORE', KEYS[i], '!') or '0')
  if marked > latest then latest = marked end
end
if latest > tonumber(ARGV[6]) then return latest end
for i = 1, sets do
  local set = KEYS[i]
  redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. ARGV[5])
  redis.call('ZADD', set, ARGV[3], ARGV[2])
  if redis.call('PTTL', set) < tonumber(ARGV[4]) then redis.call('PEXPIRE', set, ARGV[4]) end
end
if #KEYS > sets then redis.call('SET', KEYS[#KEYS], ARGV[7], 'PX', ARGV[4]) end
return latest
"""

_NOTE_BYTES = _NOTE.encode()

# past this many scopes in a record's hash of versions, a fill's note lets go of those
# noted longer ago than VERSIONS_KEPT_S
VERSIONS_PRUNED_PAST = 256
# a changed record's set of more members than this is read in pages by the fill
CHANGED_READ_IN_SCRIPT = 500

# _NOTE, keeping one version of each record within a scope (``*``, or a caller's
# fingerprint). Each record's hash of versions (``<set>:v``) holds, by scope,
# ``<stamp>:<settled>:<version>``: the version noted last; the latest time (a stamp,
# as _SEQUENCE makes them) at which a fill that brought it had its answer; and 1 once
# the entries holding another version are gone everywhere, 0 until then. The fill is
# refused (nothing written, answers {0}) when one of its records was purged after its
# stamp (taken before it asked the upstream), or has another version noted by a fill
# whose answer came after this fill asked: the two calls overlapped, and which answer
# is the newer cannot be known. Otherwise it is noted, and for each record whose
# version changed in the scope (or was never noted there, or whose change is not
# settled yet), the set's other members in the scope are answered, with their scores:
# {1, member, score, ...}: the entries the fill removes before it stores its own
# (_STORE_IF_CURRENT, which settles the change). KEYS: the counter, the sets, their
# hashes; ARGV: how many sets, member, stored at (s), the entry's life (ms), the
# oldest score kept (s), the fill's stamp, the scope, how long a hash lives at least
# (ms), each set's version.
_NOTE_VERSIONS = (
    _COUNTER
    + _NOW
    + f"local VERSIONS_PRUNED_PAST = {VERSIONS_PRUNED_PAST}\n"
    + f"local CHANGED_READ_IN_SCRIPT = {CHANGED_READ_IN_SCRIPT}\n"
    + """
local n = tonumber(ARGV[1])
local since = tonumber(ARGV[6])
local scope = ARGV[7]
local answered = math.max(tonumber(redis.call('GET', counter(KEYS[1]))), now())
-- the counter follows the stamps noted, so that a fill's stamp is never below one
-- noted before it, even when the server's clock goes back (a failover)
redis.call('SET', KEYS[1], string.format('%d', answered))
for i = 2, n + 1 do
  if tonumber(redis.call('ZSCORE', KEYS[i], '!') or '0') > since then return {0} end
end
local changed = {}
local noted = {}
for i = 1, n do
  local seen = redis.call('HGET', KEYS[1 + n + i], scope)
  local at, settled, version
  if seen then at, settled, version = string.match(seen, '^(%d+):(%d):(.*)$') end
  if not version then
    changed[#changed + 1] = i
    noted[i] = string.format('%d', answered) .. ':0:'
  elseif version ~= ARGV[8 + i] then
    if tonumber(at) >= since then return {0} end
    changed[#changed + 1] = i
    noted[i] = string.format('%d', answered) .. ':0:'
  else
    if settled ~= '1' then changed[#changed + 1] = i end
    noted[i] = string.format('%d', math.max(tonumber(at), answered)) .. ':' .. settled .. ':'
  end
end
local member = ARGV[2]
for i = 1, n do
  local set, versions = KEYS[1 + i], KEYS[1 + n + i]
  redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. ARGV[5])
  redis.call('ZADD', set, ARGV[3], member)
  if redis.call('PTTL', set) < tonumber(ARGV[4]) then redis.call('PEXPIRE', set, ARGV[4]) end
  redis.call('HSET', versions, scope, noted[i] .. ARGV[8 + i])
  local keep = math.max(tonumber(ARGV[4]), tonumber(ARGV[8]))
  if redis.call('PTTL', versions) < keep then redis.call('PEXPIRE', versions, keep) end
  -- many callers' versions of one record: let go of those noted longer ago than a
  -- hash is kept (their callers' entries are gone; a fill of theirs starts afresh)
  if redis.call('HLEN', versions) > VERSIONS_PRUNED_PAST then
    local fields = redis.call('HGETALL', versions)
    local oldest = answered - tonumber(ARGV[8]) * 1000
    for j = 1, #fields, 2 do
      local at = tonumber(string.match(fields[j + 1], '^(%d+):') or '0')
      if at < oldest then redis.call('HDEL', versions, fields[j]) end
    end
  end
end
local found, large = {}, {}
local suffix = '|' .. scope
for _, i in ipairs(changed) do
  local set = KEYS[1 + i]
  if redis.call('ZCARD', set) > CHANGED_READ_IN_SCRIPT then
    large[#large + 1] = i
  else
    local members = redis.call('ZRANGE', set, 0, -1, 'WITHSCORES')
    for j = 1, #members, 2 do
      local other = members[j]
      if other ~= '!' and other ~= member
          and (scope == '*' or string.sub(other, -#suffix) == suffix) then
        found[#found + 1] = other
        found[#found + 1] = members[j + 1]
      end
    end
  end
end
return {1, found, large}
"""
)

# Whether a fill noted by _NOTE_VERSIONS still holds: none of its records purged after
# its stamp, and each still at its version in the scope (else a later fill noted
# another); if so, and ARGV says so (its removals confirmed everywhere), each record's
# change is settled; and, where the entry's key is given, the entry is stored in the
# same step. KEYS: the sets, their hashes, and the entry's key (where it shares the
# slot); ARGV: the stamp, the scope, 1 to settle (or 0), each set's version, and with
# the key, the entry's value and life (ms). Answers 1 or 0.
_STORE_IF_CURRENT = """
local n = math.floor(#KEYS / 2)
local seen = {}
for i = 1, n do
  if tonumber(redis.call('ZSCORE', KEYS[i], '!') or '0') > tonumber(ARGV[1]) then return 0 end
  seen[i] = redis.call('HGET', KEYS[n + i], ARGV[2])
  if not seen[i] or string.match(seen[i], '^%d+:%d:(.*)$') ~= ARGV[3 + i] then return 0 end
end
if ARGV[3] == '1' then
  for i = 1, n do
    local at = string.match(seen[i], '^(%d+):')
    redis.call('HSET', KEYS[n + i], ARGV[2], at .. ':1:' .. ARGV[3 + i])
  end
end
if #KEYS > 2 * n then redis.call('SET', KEYS[#KEYS], ARGV[4 + n], 'PX', ARGV[5 + n]) end
return 1
"""

# How long a record's hash of versions lives at least after a fill noted it: longer
# than any fill takes (the upstream's timeouts are at most 600 s each).
VERSIONS_KEPT_S = RECORD_PURGE_MARK_S


@functools.lru_cache(maxsize=16_384)
def _record_key_bytes(prefix: str, ref: str) -> bytes:
    """:func:`record_key`, encoded (a store names up to 40 records, most of them often)."""
    return record_key(prefix, ref).encode()


# The number of the latest purge of records. KEYS: their sets.
_MARKS = """
local latest = 0
for _, set in ipairs(KEYS) do
  local marked = tonumber(redis.call('ZSCORE', set, '!') or '0')
  if marked > latest then latest = marked end
end
return latest
"""

# A purge by record: the next number (beyond the latest, and beyond the server's time
# in microseconds, so beyond every fill's stamp before it), and each record's set
# marked with it (unless a later purge marked it), kept at least the marks' life.
# KEYS: the counter, then each record's set; ARGV: the marks' life (ms). Answers the
# number.
_PURGE_MARK = (
    _COUNTER
    + _NOW
    + """
local key = counter(KEYS[1])
local number = math.max(tonumber(redis.call('GET', key)), now()) + 1
redis.call('SET', key, string.format('%d', number))
for i = 2, #KEYS do
  local set = KEYS[i]
  redis.call('ZADD', set, 'GT', string.format('%d', number), '!')
  if redis.call('PTTL', set) < tonumber(ARGV[1]) then redis.call('PEXPIRE', set, ARGV[1]) end
end
return number
"""
)

# After a hard purge removed their entries: the members taken from each set, unless
# noted again since (their score changed). KEYS: the sets; ARGV: for each set, how many
# values follow, then its members and scores.
_FORGET_HOLDERS = """
local at = 1
for _, set in ipairs(KEYS) do
  local count = tonumber(ARGV[at])
  for j = at + 1, at + count, 2 do
    local score = redis.call('ZSCORE', set, ARGV[j])
    if ARGV[j] ~= '!' and score and tonumber(score) == tonumber(ARGV[j + 1]) then
      redis.call('ZREM', set, ARGV[j])
    end
  end
  at = at + count + 1
end
return 1
"""

# Removes an entry (ARGV[2] empty) or gives it a new TTL (ARGV[2], 4 bytes), only if it
# is still the one stored at ARGV[1] (8 bytes, as its header has it).
_ENTRY_IF_STORED_AT = """
if redis.call('GETRANGE', KEYS[1], 4, 11) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', KEYS[1]) end
redis.call('SETRANGE', KEYS[1], 12, ARGV[2])
return 1
"""

# How often one instance of the fleet measures the records' index, and how many of
# its keys it asks the MEMORY USAGE of.
INDEX_MEASURED_S = 300.0
INDEX_SAMPLE = 50
# at most this many pages of 1,000 keys read of a standalone keyspace; past them, the
# index's keys are estimated from the share found
INDEX_SCAN_PAGES = 100

# A purge by record works in steps (reading a set's page, removing a batch of entries)
# of at most this many members or scripts, each step given at least PURGE_STEP_S.
PURGE_BATCH = 500
PURGE_STEP_S = 2.0

# a generation fits the entry's unsigned 64-bit fields; one outside (written by hand) is
# a cache fault, never a crash of the store
_GENERATION_BOUND = 2**64


# the most keys one batched read asks for; reads past it go in the next batch
BATCH_MAX_KEYS = 256


class ReadBatch:
    """The reads of one turn of the event loop, sent to Redis as one command.

    :meth:`read` returns a future of ``[entry, everything generation, route
    generation]`` as stored; the first read of a turn schedules the batch's send for
    the end of that turn, so that every read the turn's requests make goes with it.
    A read that stops waiting (its caller's timeout) leaves the others' batch alone:
    the batch runs on its own, bounded by ``timeout_s``, and fails as a whole when
    Redis fails (each waiting read then gets that error)."""

    def __init__(
        self,
        client: Commands,
        *,
        everything_key: str,
        timeout_s: float,
        pipelines: asyncio.Lock | None = None,
    ) -> None:
        """``pipelines``: held while a read spread over a cluster's nodes is sent (see
        :class:`RedisBackend`)."""
        self._client = client
        self._cluster = isinstance(client, RedisCluster)
        self._pipelines = pipelines or asyncio.Lock()
        self._everything_key = everything_key
        self._timeout_s = timeout_s
        self._waiting: list[tuple[str, str, asyncio.Future[list[Any]]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def read(self, entry_key: str, route_key: str) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send)
        self._waiting.append((entry_key, route_key, future))
        return future

    def _send(self) -> None:
        waiting, self._waiting = self._waiting, []
        for start in range(0, len(waiting), BATCH_MAX_KEYS):
            task = asyncio.ensure_future(
                self._read_together(waiting[start : start + BATCH_MAX_KEYS])
            )
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _read_together(self, reads: list[tuple[str, str, asyncio.Future[list[Any]]]]) -> None:
        entries = [entry_key for entry_key, _, _ in reads]
        generation_keys = list(dict.fromkeys((self._everything_key, *(r for _, r, _ in reads))))
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._cluster:
                    # the generations share one slot; the entries are spread over many
                    stored, generations = await asyncio.gather(
                        self._spread_read(entries), self._client.mget(generation_keys)
                    )
                else:
                    values = await self._client.mget([*entries, *generation_keys])
                    stored, generations = values[: len(entries)], values[len(entries) :]
        except BaseException as exc:
            for _, _, future in reads:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RedisError(exc))
            if not isinstance(exc, Exception):
                raise
            return
        current = dict(zip(generation_keys, generations, strict=True))
        everything = current[self._everything_key]
        for (_, route_key, future), raw in zip(reads, stored, strict=True):
            if not future.done():
                future.set_result([raw, everything, current[route_key]])

    async def _spread_read(self, keys: list[str]) -> list[Any]:
        async with self._pipelines:
            return await self._client.mget_nonatomic(keys)  # type: ignore[union-attr]

    async def close(self) -> None:
        """Let the batches sent finish (within the timeout: their reads are answered
        as usual at a graceful stop), then cancel what is left."""
        if self._sending:
            await asyncio.wait(list(self._sending), timeout=self._timeout_s)
        for task in list(self._sending):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# the fields of an entry's header that a purge by record reads and writes in Redis:
# when it was stored (bytes 4 to 11) and its TTL (12 to 15), as CacheEntry packs them
_STORED_AT = struct.Struct("!d")
_TTL = struct.Struct("!I")


# members stored longer ago than this are let go: no entry lives longer
# (cache.ttl_s is at most a day, cache.stale_if_error_s at most a week)
LONGEST_LIFETIME_S = 8 * 86_400


def holder_member(key: CacheKey) -> str:
    """A record set's member for the entry under ``key``: ``<route>|<key>``."""
    return f"{key.route}|{key.text}"


def parse_holder_member(member: bytes | str) -> CacheKey | None:
    """The key a :func:`holder_member` names; None for anything else."""
    text = member.decode("utf-8", "replace") if isinstance(member, bytes) else member
    route, _, key = text.partition("|")
    if not route or not key:
        return None
    return CacheKey(route, key)


def _touching(
    batch: list[CacheKey], holders: dict[CacheKey, float], now: float, *, soft: bool
) -> Callable[[Any], None]:
    """What adds to a pipeline the scripts that remove (or, ``soft``, make stale) the
    entries of ``batch``, each only if it is still the one stored at ``holders[key]``."""

    def touch(pipeline: Any) -> None:
        for holder in batch:
            stored_at = holders[holder]
            ttl = _TTL.pack(max(0, math.floor(now - stored_at))) if soft else b""
            pipeline.eval(_ENTRY_IF_STORED_AT, 1, holder.text, _STORED_AT.pack(stored_at), ttl)

    return touch


def new_generation() -> int:
    """A random generation, never 0 (0 is what an entry stored without a cache has)."""
    return secrets.randbits(63) | 1


class RedisBackend(QuietBackend):
    """Entries in a Redis shared by every gateway instance of one namespace and upstream."""

    name = "redis"

    def __init__(
        self,
        client: Commands,
        *,
        prefix: str,
        timeout_s: float,
        invalidations: InvalidationChannel | None = None,
        clock: Clock = system_clock,
    ) -> None:
        """``invalidations``: the topology's pub/sub (``gateway.cache.pubsub``); without
        it, the backend does not publish invalidations. ``clock``: the wall time that
        purges by record are marked with and that entries are stored at."""
        self._client = client
        self._invalidations = invalidations
        self._clock = clock
        self.capabilities = (
            replace(SHARED, purges_records=True) if invalidations is None else PUBLISHING_INDEXED
        )
        self._cluster = isinstance(client, RedisCluster)
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._everything_key = generation_key(prefix, None)
        # redis-py's cluster pipelines (8.1) race when several run at once: two of them
        # can share a connection, and one fails with an AttributeError. On a cluster,
        # the backend's commands spread over nodes are sent one batch at a time.
        self._pipelines = asyncio.Lock()
        # sent by its digest (EVALSHA; loaded again where a server does not know it):
        # it goes with every store
        self._note = client.register_script(_NOTE_BYTES)
        self._batch = ReadBatch(
            client,
            everything_key=self._everything_key,
            timeout_s=timeout_s,
            pipelines=self._pipelines,
        )

    @property
    def invalidations(self) -> InvalidationChannel:
        if self._invalidations is None:
            raise AttributeError("invalidations: this Redis backend was made without pub/sub")
        return self._invalidations

    def fleet(self, fingerprint: Callable[[], str], on_read: Callable[[int], None]) -> Fleet:
        """The fleet announcements in a hash of this prefix (``gateway.cache.fleet``)."""
        return Fleet(self._client, prefix=self._prefix, fingerprint=fingerprint, on_read=on_read)

    @contextlib.contextmanager
    def _faults(self, what: str, timeout_s: float | None = None) -> Iterator[None]:
        """A timeout or a Redis error inside becomes CacheUnavailable."""
        try:
            yield
        except TimeoutError as exc:
            waited = self._timeout_s if timeout_s is None else timeout_s
            raise CacheUnavailable(f"redis {what}: no answer within {waited * 1000:g} ms") from exc
        except REDIS_ERRORS as exc:
            raise CacheUnavailable(f"redis {what}: {type(exc).__name__}: {exc}") from exc

    async def _pipelined(self, commands: Callable[[Any], None]) -> list[Any]:
        """The answers of the commands ``commands`` adds to a pipeline (not a
        transaction), sent together; on a cluster, one such batch at a time."""
        pipeline = self._client.pipeline(transaction=False)
        commands(pipeline)
        if not self._cluster:
            return await pipeline.execute()
        async with self._pipelines:
            return await pipeline.execute()

    async def _call(
        self, what: str, call: Callable[[], Awaitable[T]], timeout_s: float | None = None
    ) -> T:
        """``call()`` within ``timeout_s`` (default ``cache.redis_timeout_ms``), its
        faults as CacheUnavailable."""
        waited = self._timeout_s if timeout_s is None else timeout_s
        with self._faults(what, waited):
            async with asyncio.timeout(waited):
                return await call()

    async def get(self, key: CacheKey) -> Lookup:
        route_key = generation_key(self._prefix, key.route)
        with self._faults("GET"):
            # bounded by the batch's own timeout, which starts within this turn
            raw, everything, route = await self._batch.read(key.text, route_key)
        if everything is None or route is None:
            # a generation is missing (never made, deleted, evicted): make it anew; no
            # entry stored before can match a fresh random generation
            everything, route = await self._call("GET", lambda: self._new_generations(route_key))
        try:
            current = Generations(int(everything), int(route))
        except ValueError as exc:
            raise CacheUnavailable(f"redis GET: a purge generation is not a number: {exc}") from exc
        if not (
            0 <= current.everything < _GENERATION_BOUND and 0 <= current.route < _GENERATION_BOUND
        ):
            raise CacheUnavailable(f"redis GET: a purge generation is out of range: {current}")
        if not isinstance(raw, bytes):
            return Lookup(None, current)
        try:
            entry = CacheEntry.decode(raw)
        except (CacheCorrupt, UnicodeDecodeError, ValueError):
            return Lookup(None, current)
        if entry.generations != current:
            return Lookup(None, current)
        return Lookup(entry, current)

    async def _new_generations(self, route_key: str) -> list[Any]:
        for key in (self._everything_key, route_key):
            await self._client.set(key, new_generation(), nx=True)
        values: list[Any] = await self._client.mget(self._everything_key, route_key)
        if None in values:
            raise RedisError("a purge generation vanished as it was made")
        return values

    async def set(self, key: CacheKey, entry: CacheEntry, lifetime_s: float) -> None:
        milliseconds = max(1, int(lifetime_s * 1000))
        await self._call("SET", lambda: self._client.set(key.text, entry.encode(), px=milliseconds))

    async def set_holding(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        held: Mapping[str, str],
        since: int,
    ) -> bool:
        """One script notes every record the entry holds and reads when each was last
        purged (the records' index has one slot; a record's set holds its last purge's
        number); unless one was purged after ``since``, the entry is stored, in the
        same script where it shares the slot (standalone, Sentinel). On a cluster the
        entry is stored next, and the marks are read again: a purge that came in
        between took its holders before the entry was there, so the entry is removed
        again (a purge after it finds the entry)."""
        if not held:
            await self.set(key, entry, lifetime_s)
            return True
        prefix = self._prefix
        keys: list[bytes] = [_record_key_bytes(prefix, ref) for ref in held]
        sets = list(keys)
        life_ms = max(1, int(lifetime_s * 1000))
        args: list[Any] = [
            len(sets),
            holder_member(key),
            repr(entry.stored_at),
            life_ms,
            repr(self._clock() - LONGEST_LIFETIME_S),
            since,
        ]
        if not self._cluster:
            keys.append(key.text.encode())
            args.append(entry.encode())
        latest = await self._call(
            "EVAL",
            lambda: self._note(keys, args),
        )
        if int(latest) > since:
            return False
        if not self._cluster:
            return True
        await self.set(key, entry, lifetime_s)
        try:
            latest = await self._call("EVAL", lambda: self._client.eval(_MARKS, len(sets), *sets))
        except CacheUnavailable:
            latest = since + 1  # unknown: as if purged
        if int(latest) <= since:
            return True
        await self._remove_if_stored_at(key, entry)
        return False

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
        """``_NOTE_VERSIONS`` decides and notes; the entries it names are removed (as
        a hard purge removes them); ``before_store`` is awaited; ``_STORE_IF_CURRENT``
        checks the decision still holds and stores the entry, in the same step where
        it shares the slot (on a cluster, stored first and removed again if not: it
        can be read for about one round trip); the members removed are let go."""
        if not held:
            await self.set(key, entry, lifetime_s)
            return Noted(True)
        prefix = self._prefix
        sets = [_record_key_bytes(prefix, ref) for ref in held]
        hashes = [set_key + VERSIONS_SUFFIX for set_key in sets]
        versions = list(held.values())
        life_ms = max(1, int(lifetime_s * 1000))
        note = functools.partial(
            self._client.eval,
            _NOTE_VERSIONS,
            1 + 2 * len(sets),
            record_sequence_key(prefix).encode(),
            *sets,
            *hashes,
            len(sets),
            holder_member(key),
            repr(entry.stored_at),
            life_ms,
            repr(self._clock() - LONGEST_LIFETIME_S),
            since,
            scope,
            int(VERSIONS_KEPT_S * 1000),
            *versions,
        )
        answer = await self._call("EVAL", note)
        if not answer or int(answer[0]) != 1:
            return Noted(False)
        invalidated, removed = await self._invalidate(
            await self._in_scope(answer, sets, key, scope), sets
        )
        confirmed = True
        if invalidated and before_store is not None:
            confirmed = await before_store(invalidated)
        # settled (the 1) once removed from Redis: a process that did not confirm is
        # told again in the background (before_store), not by every later fill
        stored = await self._store_if_current(
            key, entry, lifetime_s, [*sets, *hashes], [since, scope, 1, *versions]
        )
        if stored and removed:
            with contextlib.suppress(CacheUnavailable):  # else they go with their age
                await self._forget(removed, max(self._timeout_s, PURGE_STEP_S))
        return Noted(stored, invalidated, confirmed)

    async def _in_scope(
        self, answer: list[Any], sets: list[bytes], key: CacheKey, scope: str
    ) -> list[Any]:
        """The other members in ``scope`` of the changed records' sets, with their
        scores: those ``_NOTE_VERSIONS`` read, and those of the large sets it named,
        read here in pages."""
        member = holder_member(key).encode()
        suffix = b"" if scope == EVERY_CALLER else b"|" + scope.encode()
        found: list[Any] = list(answer[1])
        step_s = max(self._timeout_s, PURGE_STEP_S)
        for place in answer[2]:
            for other, score in await self._holders_of(sets[int(place) - 1].decode(), step_s):
                if other != member and other.endswith(suffix):
                    found += [other, score]
        return found

    async def _store_if_current(
        self,
        key: CacheKey,
        entry: CacheEntry,
        lifetime_s: float,
        current: list[bytes],
        checked: list[Any],
    ) -> bool:
        """Store the entry if ``_STORE_IF_CURRENT`` says the fill's note still holds:
        in one script where the entry shares the slot; on a cluster, stored first and
        removed again when it does not."""
        if not self._cluster:
            store = functools.partial(
                self._client.eval,
                _STORE_IF_CURRENT,
                len(current) + 1,
                *current,
                key.text.encode(),
                *checked,
                entry.encode(),
                max(1, int(lifetime_s * 1000)),
            )
            return bool(int(await self._call("EVAL", store)))
        await self.set(key, entry, lifetime_s)
        check = functools.partial(
            self._client.eval, _STORE_IF_CURRENT, len(current), *current, *checked
        )
        try:
            still = int(await self._call("EVAL", check))
        except CacheUnavailable:
            still = 0  # unknown: as if a later fill came
        if not still:
            await self._remove_if_stored_at(key, entry)
        return bool(still)

    async def _remove_if_stored_at(self, key: CacheKey, entry: CacheEntry) -> None:
        """Remove the entry under ``key`` if it is still ``entry`` (stored at its time)."""
        stored_at = _STORED_AT.pack(entry.stored_at)
        await self._call(
            "EVAL", lambda: self._client.eval(_ENTRY_IF_STORED_AT, 1, key.text, stored_at, b"")
        )

    async def _invalidate(
        self, found: list[Any], sets: list[bytes]
    ) -> tuple[tuple[CacheKey, ...], dict[str, list[tuple[bytes, float]]]]:
        """Remove the entries ``found`` names (members and scores, as _NOTE_VERSIONS
        answers them), each only if it is still the one noted. The keys named, removed
        or not (copies may be held), and the members of the entries removed, to let go
        of ``sets`` once the change is settled (until then, a fill of the same version
        finds them again). A member whose entry was not there stays: its fill may be
        about to store it, and a later change must find it then."""
        holders: dict[CacheKey, float] = {}
        members: dict[CacheKey, list[tuple[bytes, float]]] = {}
        for member, score in zip(found[::2], found[1::2], strict=True):
            holder = parse_holder_member(member)
            if holder is not None:
                holders[holder] = max(float(score), holders.get(holder, -math.inf))
                members.setdefault(holder, []).append((member, float(score)))
        if not holders:
            return (), {}
        step_s = max(self._timeout_s, PURGE_STEP_S)
        entries = list(holders)
        done: list[Any] = []
        for start in range(0, len(entries), PURGE_BATCH):
            touch = _touching(entries[start : start + PURGE_BATCH], holders, 0.0, soft=False)
            done += await self._call("EVAL", functools.partial(self._pipelined, touch), step_s)
        removed = [
            pair
            for holder, result in zip(entries, done, strict=True)
            if result
            for pair in members[holder]
        ]
        return tuple(entries), {set_key.decode(): removed for set_key in sets}

    async def index_size(self) -> IndexSize | None:
        """The index's size as one instance of the fleet last measured it (at most
        every INDEX_MEASURED_S, by whichever instance claims it first: a cluster's
        exact count of the index's slot, or a SCAN of the keyspace for it elsewhere;
        bytes from the MEMORY USAGE of up to INDEX_SAMPLE keys); None before any did."""
        figure_key = index_size_key(self._prefix)
        if await self.claim("index-size", INDEX_MEASURED_S):
            size = await self._measure_index()
            value = f"{size.keys} {size.bytes}".encode()
            await self._call("SET", lambda: self._client.set(figure_key, value))
            return size
        raw: Any = await self._call("GET", lambda: self._client.get(figure_key))
        keys, _, size_bytes = (raw or b"").partition(b" ")
        if not keys.isdigit() or not size_bytes.isdigit():
            return None
        return IndexSize(int(keys), int(size_bytes))

    async def _measure_index(self) -> IndexSize:
        slot = record_slot(self._prefix)
        step_s = max(self._timeout_s, PURGE_STEP_S)
        sample: list[Any] = []
        client: Any = self._client  # typed loosely: MEMORY USAGE may answer nothing
        if self._cluster:
            number = key_slot(slot.encode())
            count = int(await self._call("CLUSTER", lambda: client.cluster_countkeysinslot(number)))
            sample = await self._call(
                "CLUSTER", lambda: client.cluster_get_keys_in_slot(number, INDEX_SAMPLE), step_s
            )
        else:
            count, cursor, pattern = 0, 0, slot.replace("{", "\\{").replace("}", "\\}") + "*"
            for _ in range(INDEX_SCAN_PAGES):
                scan = functools.partial(self._client.scan, cursor, match=pattern, count=1000)
                cursor, keys = await self._call("SCAN", scan, step_s)
                count += len(keys)
                sample += keys[: INDEX_SAMPLE - len(sample)]
                if not cursor:
                    break
            else:
                # a keyspace larger than the pages read: the share found, of all its keys
                total = int(await self._call("DBSIZE", lambda: client.dbsize(), step_s))
                count = round(count * total / (INDEX_SCAN_PAGES * 1000))
        sizes = []
        for key in sample:
            usage = functools.partial(client.memory_usage, key)
            sizes.append(int(await self._call("MEMORY", usage) or 0))
        average = sum(sizes) / len(sizes) if sizes else 0
        return IndexSize(count, int(average * count))

    async def purge_sequence(self) -> int:
        key = record_sequence_key(self._prefix)
        value = await self._call("EVAL", lambda: self._client.eval(_SEQUENCE, 1, key))
        try:
            return int(value)
        except (TypeError, ValueError) as exc:
            raise CacheUnavailable(f"redis EVAL: the purge number is not a number: {exc}") from exc

    async def purge_records(self, refs: Sequence[str], *, soft: bool) -> RecordsPurged:
        """One script numbers the purge and marks each record's set with it (the
        records' index has one slot: a fill that notes after this sees the mark); the
        sets are then read page by page (ZSCAN), each entry removed or, soft, made
        stale, only if it is still the entry that was noted, in pipelines of
        PURGE_BATCH scripts; then, hard, the members of the entries removed are let
        go. Until the entries are gone the members stay, so that a purge whose outcome
        is unknown finds them again when it is retried. Each step has its own time
        (PURGE_STEP_S at least), so that a record held by many entries is purged in
        steps that each hold Redis briefly."""
        now = self._clock()
        step_s = max(self._timeout_s, PURGE_STEP_S)
        sets = [record_key(self._prefix, ref) for ref in refs]
        keys = [record_sequence_key(self._prefix), *sets]
        mark_ms = int(RECORD_PURGE_MARK_S * 1000)
        await self._call(
            "EVAL", lambda: self._client.eval(_PURGE_MARK, len(keys), *keys, mark_ms), step_s
        )
        # each entry as it was last noted (a key noted in several sets at different
        # times holds now what it was last noted with), and each set's members
        holders: dict[CacheKey, float] = {}
        members: dict[str, list[tuple[bytes, float]]] = {}
        for set_key in sets:
            found = members[set_key] = await self._holders_of(set_key, step_s)
            for member, score in found:
                holder = parse_holder_member(member)
                if holder is not None:
                    holders[holder] = max(score, holders.get(holder, -math.inf))
        entries = list(holders)
        done: list[Any] = []
        for start in range(0, len(entries), PURGE_BATCH):
            touch = _touching(entries[start : start + PURGE_BATCH], holders, now, soft=soft)
            done += await self._call("EVAL", functools.partial(self._pipelined, touch), step_s)
        if not soft:
            with contextlib.suppress(CacheUnavailable):  # else they go with their age
                await self._forget(members, step_s)
        removed = tuple(holder for holder, result in zip(entries, done, strict=True) if result)
        return RecordsPurged(removed, reached=tuple(entries))

    async def _holders_of(self, set_key: str, step_s: float) -> list[tuple[bytes, float]]:
        """Every member of a record's set but its purge mark, with its score."""
        found: list[tuple[bytes, float]] = []
        cursor = 0
        while True:
            scan = functools.partial(self._client.zscan, set_key, cursor, count=PURGE_BATCH)
            cursor, page = await self._call("ZSCAN", scan, step_s)
            for member, score in page:
                if isinstance(member, bytes) and member != b"!":
                    found.append((member, float(score)))
            if not cursor:
                return found

    async def _forget(self, members: dict[str, list[tuple[bytes, float]]], step_s: float) -> None:
        """Let go of the members a hard purge read (unless noted again since)."""
        for set_key, found in members.items():
            for start in range(0, len(found), PURGE_BATCH):
                args: list[Any] = [2 * len(found[start : start + PURGE_BATCH])]
                for member, score in found[start : start + PURGE_BATCH]:
                    args += [member, repr(score)]
                forget = functools.partial(self._client.eval, _FORGET_HOLDERS, 1, set_key, *args)
                await self._call("EVAL", forget, step_s)

    async def purge(self, route: str | None) -> Purged:
        """A new random generation: every entry stored before is a miss from now on.
        Generations have no expiry (a handful of small keys per namespace and
        upstream), so that no eviction policy that spares persistent keys takes them."""
        await self._call(
            "SET", lambda: self._client.set(generation_key(self._prefix, route), new_generation())
        )
        return Purged()

    async def remove(self, key: CacheKey) -> bool:
        """One DEL of the entry: no instance reads it from Redis after this."""
        return bool(await self._call("DEL", lambda: self._client.delete(key.text)))

    async def take_lease(self, key: CacheKey, milliseconds: int) -> bytes | None:
        token = secrets.token_hex(8).encode()
        taken = await self._call(
            "SET", lambda: self._client.set(lease_key(key), token, nx=True, px=milliseconds)
        )
        return token if taken else None

    async def leased(self, key: CacheKey) -> bool:
        return bool(await self._call("GET", lambda: self._client.exists(lease_key(key))))

    async def drop_lease(self, key: CacheKey, token: bytes) -> None:
        await self._call("EVAL", lambda: self._client.eval(_RELEASE, 1, lease_key(key), token))

    async def claim(self, name: str, lifetime_s: float) -> bool:
        """One SET NX of the name's key: the instance whose SET wrote it claimed it."""
        key = claim_key(self._prefix, name)
        ttl_ms = max(1, math.ceil(lifetime_s * 1000))
        return bool(
            await self._call("SET", lambda: self._client.set(key, b"1", nx=True, px=ttl_ms))
        )

    async def probe(self) -> None:
        """A write and a read as traffic makes them, on a probe key of this prefix."""
        probe = CacheKey("probe", probe_key(self._prefix))
        await self._call("SET", lambda: self._client.set(probe.text, b"1", px=10_000))
        await self.get(probe)

    async def close(self) -> None:
        """Close the batch and the client; a Redis that fails to close (a timeout, a
        reset) is logged, not raised: what closes after the backend still closes."""
        await self._batch.close()
        try:
            await self._client.aclose()
        except REDIS_ERRORS as exc:
            log.warning(
                "redis: the client did not close cleanly",
                extra={"event": "redis_close_failed", "error": type(exc).__name__},
            )
