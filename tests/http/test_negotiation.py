"""Accept-Encoding read as RFC 9110 §12.5.3 says, for gzip and identity
(gateway/http/negotiation.py); what callers get on the wire is in test_compression.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http import negotiation
from gateway.http.negotiation import MEMO_LONGEST, MEMO_SIZE, MOST_MEMBERS, gzip_preferred

from ..profiles import examples


@pytest.mark.parametrize(
    ("accept_encoding", "gzip"),
    [
        (None, False),  # no field: identity
        ("", False),  # an empty field: identity only
        ("  ", False),
        ("gzip", True),
        ("GZip", True),  # codings are case-insensitive
        ("x-gzip", True),
        ("X-GZIP;Q=1", True),
        ("gzip, deflate", True),  # aiohttp's client
        ("gzip, deflate, br, zstd", True),
        ("br", False),  # only codings the gateway does not serve: identity
        ("deflate, br;q=1", False),
        ("*", True),  # every coding, gzip included, equally: gzip
        ("*;q=0.5", True),
        ("gzip;q=0", False),
        ("x-gzip;q=0, *", False),  # gzip refused by name: "*" does not bring it back
        ("*;q=0", False),  # neither acceptable: identity all the same (not a 406)
        ("identity;q=0", False),  # gzip not named, no "*": identity all the same
        ("gzip;q=0, identity;q=0", False),
        ("identity;q=0, *", True),
        ("gzip;q=0.5", True),  # identity, not named, is preferred to nothing named
        ("gzip;q=0.001", True),
        ("gzip;q=0.5, identity", False),  # identity preferred
        ("gzip;q=0.5, identity;q=0.5", True),  # as preferred: gzip
        ("gzip;q=0.501, identity;q=0.5", True),
        ("gzip;q=0.4, identity;q=0.5", False),
        ("identity;q=0.2, gzip;q=0.3", True),  # order means nothing, weights do
        ("gzip;q=0.9, *;q=0.5", True),  # identity takes "*"'s weight, gzip its own
        ("gzip;q=0.5, *;q=0.9", False),
        ("gzip;q=1.000", True),
        ("gzip ; q=0.8 , identity ; q=0.7", True),  # whitespace around the parts
        (",, gzip ,,", True),  # empty list members
        ("gzip;q=1.5", False),  # a weight out of range: the member is ignored
        ("gzip;q=0.1234", False),  # more than three decimals
        ("gzip;q=abc", False),
        ("gzip;q=", False),
        ("gzip;level=9", False),  # a parameter other than the weight
        ("gzip;q=1;x=2", False),
        ("gzip;q=0.9, gzip;q=0", True),  # named twice: the higher weight
        ("identity;q=0.5, gzip;q=abc", False),
        ("gzip\x00", False),
        ("\u00e9, gzip", True),
    ],
)
def test_gzip_is_served_when_acceptable_and_not_less_preferred_than_identity(
    accept_encoding: str | None, gzip: bool
) -> None:
    assert gzip_preferred(accept_encoding) is gzip


def test_only_the_first_members_of_a_field_are_read() -> None:
    """A field of thousands of codings is read up to MOST_MEMBERS members: what comes
    after them is not looked at (the work is bounded whatever the caller sends)."""
    filler = ", ".join(["br"] * (MOST_MEMBERS - 1))
    assert gzip_preferred(f"{filler}, gzip") is True
    assert gzip_preferred(f"{filler}, br, gzip") is False
    assert gzip_preferred(f"gzip, {filler}, identity;q=0, *;q=0, gzip;q=0") is True
    assert gzip_preferred("gzip, " + "br, " * 20_000) is True
    assert gzip_preferred("br, " * 20_000 + "gzip") is False
    assert gzip_preferred("," * 50_000 + "gzip") is False


def test_short_values_are_memoised_in_a_bounded_memo_and_long_ones_are_not() -> None:
    memo = negotiation._memoised
    memo.cache_clear()
    for n in range(MEMO_SIZE * 2):
        assert gzip_preferred(f"gzip;q=0.{n % 10}, x-custom-{n}") is (n % 10 > 0)
    assert memo.cache_info().currsize == MEMO_SIZE
    memo.cache_clear()
    long = "gzip, " + "x" * MEMO_LONGEST
    assert gzip_preferred(long) is True
    assert memo.cache_info().currsize == 0
    assert gzip_preferred("gzip") is gzip_preferred("gzip") is True
    assert memo.cache_info().hits == 1


@settings(max_examples=examples(300))
@given(st.text(alphabet=st.sampled_from(list("gzipxidentty*-;q=0.15, \t\u00e9GZ")), max_size=80))
def test_any_field_is_read_without_an_error(accept_encoding: str) -> None:
    assert gzip_preferred(accept_encoding) in (True, False)
