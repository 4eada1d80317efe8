"""The content coding of stored bodies, and the representations a caller is served.

An entry's body is compressed once, when it is stored (:func:`stored_body`): gzip,
unless the body is too short for gzip to pay, which stays identity; the entry records
its coding. A caller that accepts gzip is served a gzip entry's bytes as stored; any
other caller is served the identity body, decompressed on demand.

:class:`IdentityBodies` is the process's bounded memo of those decompressed bodies,
keyed by the identity ETag (a hash of the body: the same page stored for many tokens
is one body here), least recently used evicted past ``max_bytes``. It is a derived
copy of hot identity bodies, nothing more: entries stay compressed wherever they are
held, and a body missing here is decompressed again from its entry. Each such
decompression is reported (``decompressed``), so that the memo can be sized from
evidence.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from gateway.cache.entry import GZIP, IDENTITY, CacheCorrupt, CacheEntry

# On 10-item expense pages, 97 % of the bytes zlib's default (6) saves, in 62 % of its
# time (100-item pages: 0.142 of their size against 0.112, in 43 %); paid on every
# fill, beside normalising and noting the records the answer holds (bench/README.md,
# "Compression").
GZIP_LEVEL = 2
# Shorter bodies stay identity: gzip's 18 bytes of framing eat most of what it saves
# there, and an identity caller would pay a decompression for nothing.
GZIP_MIN_BYTES = 256
# gzip framing (RFC 1952) in zlib's window bits
_GZIP_WBITS = 16 + zlib.MAX_WBITS
# What one memoised body is charged besides its bytes: the bytes object, its key and
# the OrderedDict's node.
MEMO_OVERHEAD_BYTES = 160


def stored_body(body: bytes) -> tuple[bytes, str]:
    """``body`` as an entry stores it, with its coding: gzip at ``GZIP_LEVEL`` (no file
    name, no time: the same bytes for the same body), or identity when it is shorter
    than ``GZIP_MIN_BYTES`` or gzip would not make it shorter."""
    if len(body) < GZIP_MIN_BYTES:
        return body, IDENTITY
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    compressed = compressor.compress(body) + compressor.flush()
    if len(compressed) >= len(body):
        return body, IDENTITY
    return compressed, GZIP


def gzip_etag(etag: str) -> str:
    """The strong ETag of the gzip representation of the body whose identity ETag is
    ``etag``: the same hash, ``-gzip`` inside the quotes."""
    return etag[:-1] + '-gzip"'


def etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison of ``If-None-Match`` against our strong ETag."""
    if not etag:
        return False
    if if_none_match.strip() == "*":
        return True
    opaque = etag.removeprefix("W/")
    return any(
        candidate.strip().removeprefix("W/") == opaque for candidate in if_none_match.split(",")
    )


class Representation(NamedTuple):
    """What one caller is sent of an entry: the bytes, their ETag, and their content
    coding (``GZIP``, or ``IDENTITY`` for none)."""

    body: bytes
    etag: str
    coding: str


class IdentityBodies:
    """The bounded memo of decompressed (identity) bodies of gzip entries, shared by the
    process (see the module's docstring); ``max_bytes`` 0 keeps none. ``decompressed``
    is called once for each body decompressed because the memo did not hold it."""

    def __init__(self, max_bytes: int, decompressed: Callable[[], object] | None = None) -> None:
        self._max_bytes = max_bytes
        self._decompressed = decompressed
        self._bodies: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        """The bytes charged for the bodies held (each body plus MEMO_OVERHEAD_BYTES)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._bodies)

    def represent(self, entry: CacheEntry, gzip: bool) -> Representation:
        """``entry`` for a caller that accepts gzip (``gzip``) or not: a gzip entry's
        bytes as stored, or the identity body. Raises CacheCorrupt when a gzip entry's
        bytes do not decompress."""
        if entry.coding == GZIP:
            if gzip:
                return Representation(entry.body, gzip_etag(entry.etag), GZIP)
            return Representation(self.identity(entry), entry.etag, IDENTITY)
        return Representation(entry.body, entry.etag, IDENTITY)

    def identity(self, entry: CacheEntry) -> bytes:
        """The identity body of ``entry``: its bytes, or for a gzip entry the memoised
        decompressed body (decompressed and memoised now when not held)."""
        if entry.coding != GZIP:
            return entry.body
        etag = entry.etag
        bodies = self._bodies
        body = bodies.get(etag)
        if body is not None:
            bodies.move_to_end(etag)
            return body
        try:
            body = zlib.decompress(entry.body, _GZIP_WBITS)
        except zlib.error as exc:
            raise CacheCorrupt(f"a gzip entry that does not decompress: {exc}") from exc
        if self._decompressed is not None:
            self._decompressed()
        self._keep(etag, body)
        return body

    def _keep(self, etag: str, body: bytes) -> None:
        size = len(body) + len(etag) + MEMO_OVERHEAD_BYTES
        if size > self._max_bytes:
            return
        self._bodies[etag] = body
        self._bytes += size
        while self._bytes > self._max_bytes:
            old_etag, old = self._bodies.popitem(last=False)
            self._bytes -= len(old) + len(old_etag) + MEMO_OVERHEAD_BYTES

    def clear(self) -> None:
        self._bodies.clear()
        self._bytes = 0
