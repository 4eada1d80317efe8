"""Which content coding a caller gets: its ``Accept-Encoding`` read as RFC 9110
§12.5.3 says, for the two codings the gateway serves (gzip and identity).

- No field: identity. An empty field: identity only.
- Codings are case-insensitive; ``x-gzip`` is gzip; ``*`` stands for every coding the
  field does not name (identity included); each may carry a weight ``;q=`` (0 to 1,
  at most three decimals; 1 without one); a coding named twice has the higher of its
  weights. A coding the field does not name, with no ``*``, is not acceptable, but
  identity, which is acceptable unless the field excludes it (``identity;q=0``, or
  ``*;q=0`` without an ``identity`` of its own), and then preferred to nothing the
  field names (it has no weight of its own).
- gzip is served when it is acceptable (a weight above 0) and not less preferred than
  identity (``gzip;q=0.5`` alone: gzip; ``gzip;q=0.5, identity``: identity); identity
  otherwise. When the field accepts neither (``identity;q=0``
  alone, ``gzip;q=0, identity;q=0``), identity is served all the same rather than a
  406: RFC 9110 §12.1 allows either, identity needs no decoding by anyone, and a 406
  would turn a mistaken header into a failed read.
- A member that is not ``coding [;q=weight]`` (another parameter, a weight out of
  range or spelt otherwise) is ignored, as if it were not there; nothing in the field
  is an error.

The work is bounded whatever the field holds: only its first ``MOST_MEMBERS`` members
are read (a field of thousands of codings is cut there), and results are memoised by
the field's value for values up to ``MEMO_LONGEST`` characters (every request reads
the field; callers send the same few values).
"""

from __future__ import annotations

import functools
import re

from aiohttp import hdrs
from multidict import CIMultiDictProxy

# list members read, at most; the rest of a longer field is ignored
MOST_MEMBERS = 32
# the longest field value whose result is memoised, and how many are
MEMO_LONGEST = 128
MEMO_SIZE = 256
_WEIGHT = re.compile(r"[ \t]*[qQ][ \t]*=[ \t]*(0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)[ \t]*")
_OWS = " \t"
_GZIP = frozenset(("gzip", "x-gzip"))


def gzip_preferred(accept_encoding: str | None) -> bool:
    """Whether a caller whose ``Accept-Encoding`` is ``accept_encoding`` (None: it sent
    none) is served gzip rather than identity (see the module's docstring)."""
    if accept_encoding is None:
        return False
    if len(accept_encoding) <= MEMO_LONGEST:
        return _memoised(accept_encoding)
    return _gzip_preferred(accept_encoding)


def _gzip_preferred(accept_encoding: str) -> bool:
    gzip: float | None = None
    star: float | None = None
    identity: float | None = None
    for member in accept_encoding.split(",", MOST_MEMBERS)[:MOST_MEMBERS]:
        coding, semicolon, parameters = member.partition(";")
        coding = coding.strip(_OWS).lower()
        if not coding:
            continue  # an empty member (", ,"), which a list may hold
        weight = 1.0
        if semicolon:
            match = _WEIGHT.fullmatch(parameters)
            if match is None:
                continue
            weight = float(match.group(1))
        if coding in _GZIP:
            gzip = weight if gzip is None else max(gzip, weight)
        elif coding == "identity":
            identity = weight if identity is None else max(identity, weight)
        elif coding == "*":
            star = weight if star is None else max(star, weight)
    if gzip is None:
        gzip = 0.0 if star is None else star
    if identity is None:
        identity = 0.0 if star is None else star
    return gzip > 0 and gzip >= identity


_memoised = functools.lru_cache(maxsize=MEMO_SIZE)(_gzip_preferred)


def accept_encoding(headers: CIMultiDictProxy[str]) -> str | None:
    """The request's ``Accept-Encoding``, its fields joined as one list (None: none; of
    more fields than a list's members are read, the first)."""
    values = headers.getall(hdrs.ACCEPT_ENCODING, None)
    if values is None:
        return None
    return values[0] if len(values) == 1 else ", ".join(values[:MOST_MEMBERS])
