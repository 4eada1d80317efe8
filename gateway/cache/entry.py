"""What the cache stores: an entry, its key, and the purge generations it carries.

An entry is the final published bytes of one answer with its ETag, status and the
time it was stored, packed into one value, so that a hit is one backend read and no
JSON work. The bytes are stored in a content coding (gzip, or identity for bodies too
short to gain from it: ``gateway.cache.coding``), which the entry records; its ETag is
always that of the identity body. Keys are made by ``gateway.records.keys.Keyer``; here
a key is only its route and its text.

The value's format: a header (``RGC2``, the time stored, TTL, status, the two
generations, the ETag's length, the coding), the ETag, the body. Values of the format
before it (``RGC1``, no coding: identity) are still read, so that instances of this
version read what older ones stored; an older instance reads an ``RGC2`` value as no
entry at all (a miss), never as an error (docs/deployment.md, "Upgrading").

Purges work with generations rather than by finding keys: an entry records the
generations (of the whole namespace and of its route) current when it was stored, and
an entry whose generations differ from the current ones is a miss. In Redis a
generation is a random 63-bit number that a purge replaces with another; a
generation key that is missing (deleted, evicted) is made anew with a fresh random
number, so that no entry stored before, purged or not, matches it again.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import NamedTuple

_HEADER = struct.Struct("!4sdIHQQBB")
_MAGIC = b"RGC2"
# the format before codings: its header lacks the last byte, its bodies are identity
_HEADER_V1 = struct.Struct("!4sdIHQQB")
_MAGIC_V1 = b"RGC1"

# The content codings of stored bodies (Content-Encoding names), as the header spells them.
IDENTITY = "identity"
GZIP = "gzip"
_CODINGS = (IDENTITY, GZIP)
_GZIP_START = b"\x1f\x8b\x08"  # a gzip member of deflated data (RFC 1952)


class CacheCorrupt(ValueError):
    """A stored value that is not an entry of this format."""


class Generations(NamedTuple):
    """The purge generations an entry was stored under (a named tuple: a hit compares
    two of them, and tuples compare in C)."""

    everything: int = 0
    route: int = 0


NO_GENERATIONS = Generations()  # before any purge


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One stored answer: status 200 with the published body, or a negative 404.
    ``body`` is in ``coding`` (GZIP or IDENTITY); ``etag`` is that of the identity body."""

    body: bytes
    etag: str
    stored_at: float
    ttl_s: int
    status: int = 200
    generations: Generations = NO_GENERATIONS
    coding: str = IDENTITY

    def age(self, now: float) -> float:
        return max(0.0, now - self.stored_at)

    def left(self, now: float) -> float:
        """Seconds of freshness left at ``now`` (at most 0 once its TTL is over)."""
        return self.ttl_s - self.age(now)

    def is_fresh(self, now: float) -> bool:
        """Whether the entry is within its TTL at ``now``: the one rule of freshness,
        which every cache layer and the read's decision ask."""
        return self.ttl_s - self.age(now) > 0

    def encode(self) -> bytes:
        etag = self.etag.encode("ascii")
        header = _HEADER.pack(
            _MAGIC,
            self.stored_at,
            self.ttl_s,
            self.status,
            self.generations.everything,
            self.generations.route,
            len(etag),
            _CODINGS.index(self.coding),
        )
        return header + etag + self.body

    @classmethod
    def decode(cls, raw: bytes) -> CacheEntry:
        """The entry ``raw`` encodes (this format or the one before); raises
        CacheCorrupt for anything else."""
        magic = raw[:4]
        if magic == _MAGIC and len(raw) >= _HEADER.size:
            *fields, etag_len, code = _HEADER.unpack_from(raw)
            start = _HEADER.size
            if code >= len(_CODINGS):
                raise CacheCorrupt(f"an entry of an unknown coding ({code})")
            coding = _CODINGS[code]
        elif magic == _MAGIC_V1 and len(raw) >= _HEADER_V1.size:
            *fields, etag_len = _HEADER_V1.unpack_from(raw)
            start = _HEADER_V1.size
            coding = IDENTITY
        else:
            raise CacheCorrupt("not a records-gateway cache entry")
        _, stored_at, ttl_s, status, everything, route = fields
        body = raw[start + etag_len :]
        if coding == GZIP and body[:3] != _GZIP_START:
            raise CacheCorrupt("a gzip entry whose body is not gzip")
        return cls(
            body=body,
            etag=raw[start : start + etag_len].decode("ascii"),
            stored_at=stored_at,
            ttl_s=ttl_s,
            status=status,
            generations=Generations(everything, route),
            coding=coding,
        )


# Lookup and CacheKey are made on every request: named tuples cost a fraction of a
# frozen dataclass's __init__ and are just as immutable.


class Lookup(NamedTuple):
    """What a read found: the entry (None when absent or purged) and the generations
    current now, which an entry stored after this read must carry."""

    entry: CacheEntry | None
    generations: Generations


class CacheKey(NamedTuple):
    """The key of one answer; ``route`` is kept apart for per-route purges."""

    route: str
    text: str


def etag_of(body: bytes) -> str:
    """A strong ETag of the published bytes: 128 bits of their SHA-256 (collision
    resistant: nobody who can write text into a record can make two versions of a page
    share an ETag)."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
