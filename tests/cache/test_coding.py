"""Stored bodies compressed once, the representations callers are sent, and the bounded
memo of identity bodies (gateway/cache/coding.py)."""

from __future__ import annotations

import gzip
import os

import pytest

from gateway.cache.coding import (
    GZIP_MIN_BYTES,
    MEMO_OVERHEAD_BYTES,
    IdentityBodies,
    Representation,
    gzip_etag,
    stored_body,
)
from gateway.cache.entry import GZIP, IDENTITY, CacheCorrupt, CacheEntry, etag_of


def page(n: int, items: int = 40) -> bytes:
    """A page of ``items`` records, different for each ``n``."""
    record = b'{"id":"%03d-%03d","amount":"1694.8300","status":"PAID","concept":"Office"}'
    return b'{"data":[' + b",".join(record % (n, i) for i in range(items)) + b"]}"


def stored(body: bytes) -> CacheEntry:
    coded, coding = stored_body(body)
    return CacheEntry(coded, etag_of(body), 1000.0, 30, coding=coding)


def test_a_body_is_stored_gzip_once_deterministically() -> None:
    body = page(1)
    coded, coding = stored_body(body)
    assert coding == GZIP
    assert gzip.decompress(coded) == body
    assert len(coded) < len(body) // 4
    assert stored_body(body) == (coded, GZIP)  # no time or name in it: the same bytes
    assert coded[3] == 0  # no flags: no file name, no comment
    assert coded[4:8] == b"\0\0\0\0"  # no modification time


@pytest.mark.parametrize(
    "body",
    [b"", b'{"data":[],"total":0}', b"x" * (GZIP_MIN_BYTES - 1), os.urandom(4096)],
    ids=["empty", "empty-page", "just-short", "incompressible"],
)
def test_bodies_gzip_would_not_shorten_stay_identity(body: bytes) -> None:
    assert stored_body(body) == (body, IDENTITY)


def test_a_body_of_the_threshold_is_compressed() -> None:
    assert stored_body(b"x" * GZIP_MIN_BYTES)[1] == GZIP


def test_the_gzip_etag_is_the_identity_hash_with_a_suffix_inside_the_quotes() -> None:
    etag = etag_of(b"abc")
    assert gzip_etag(etag) == '"ba7816bf8f01cfea414140de5dae2223-gzip"'


def test_each_caller_gets_its_representation() -> None:
    body = page(2)
    entry = stored(body)
    bodies = IdentityBodies(1024 * 1024)
    assert bodies.represent(entry, gzip=True) == Representation(
        entry.body, gzip_etag(entry.etag), GZIP
    )
    assert bodies.represent(entry, gzip=False) == Representation(body, entry.etag, IDENTITY)
    short = stored(b'{"data":[]}')
    for accepts in (True, False):  # an identity entry is identity to everyone
        assert bodies.represent(short, gzip=accepts) == Representation(
            short.body, short.etag, IDENTITY
        )
    assert len(bodies) == 1  # the one decompressed body


def test_one_body_stored_for_many_tokens_is_one_memoised_body() -> None:
    """Keyed by the identity ETag (a hash of the body): the same page stored under many
    keys is decompressed once and held once."""
    body = page(3)
    bodies = IdentityBodies(1024 * 1024)
    first = bodies.identity(stored(body))
    for _ in range(5):
        assert bodies.identity(stored(body)) is first
    assert len(bodies) == 1
    assert bodies.size_bytes == len(body) + len(etag_of(body)) + MEMO_OVERHEAD_BYTES


def test_the_memo_never_holds_more_than_its_bytes_and_keeps_the_recently_used() -> None:
    one = len(page(0)) + len(etag_of(page(0))) + MEMO_OVERHEAD_BYTES
    limit = 10 * one + one // 2
    bodies = IdentityBodies(limit)
    hot = stored(page(0))
    for n in range(1, 200):
        assert bodies.identity(hot) == page(0)
        assert bodies.identity(stored(page(n))) == page(n)
        assert bodies.size_bytes <= limit
    assert len(bodies) == 10
    assert bodies.size_bytes == 10 * one
    hot_held = bodies.identity(hot)
    assert bodies.identity(hot) is hot_held  # still held: not decompressed again
    bodies.clear()
    assert (len(bodies), bodies.size_bytes) == (0, 0)


@pytest.mark.parametrize("limit", [0, 100])
def test_a_memo_too_small_for_a_body_keeps_none_and_still_serves_it(limit: int) -> None:
    bodies = IdentityBodies(limit)
    entry = stored(page(4))
    assert bodies.represent(entry, gzip=False).body == page(4)
    assert (len(bodies), bodies.size_bytes) == (0, 0)


def test_a_gzip_body_that_does_not_decompress_is_corrupt() -> None:
    entry = stored(page(5))
    broken = CacheEntry(entry.body[:10] + b"\xff" * 40, entry.etag, 1000.0, 30, coding=GZIP)
    bodies = IdentityBodies(1024 * 1024)
    with pytest.raises(CacheCorrupt):
        bodies.represent(broken, gzip=False)
    assert len(bodies) == 0


def test_each_decompression_the_memo_did_not_spare_is_reported() -> None:
    decompressed: list[None] = []
    one = len(page(0)) + len(etag_of(page(0))) + MEMO_OVERHEAD_BYTES
    bodies = IdentityBodies(one, lambda: decompressed.append(None))
    for n in (0, 0, 1, 1, 0):  # held, held; 1 pushes 0 out, held; 0 again
        assert bodies.identity(stored(page(n))) == page(n)
    assert len(decompressed) == 3
    plain = b"short"  # an identity entry is never decompressed
    assert bodies.identity(stored(plain)) == plain
    assert len(decompressed) == 3
