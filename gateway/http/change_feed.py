"""Change notices: ``POST /admin/records/changed``, how an upstream's change feed (or a
CDC pipeline) tells the gateway which records changed, so that the entries holding them
are purged as ``DELETE /admin/cache?record=...`` purges them.

The body is a JSON object::

    {"records": ["expense:3f6c...", "account:ACC-1"], "soft": false, "id": "feed-81723"}

``records`` names 1 to :data:`CHANGES_MAX` records (``gateway.normalise.holdings``);
``soft`` (false when absent) marks their entries stale instead of removing them; ``id``
(optional, up to :data:`ID_MAX` characters) tells apart two notices of the same records
signed in the same second, which would otherwise be one notice, taken once. Nothing
is purged unless every reference is valid; the problem names each bad one by its index.

A notice carries the admin token, or, for a feed that should not hold it, a signature
with ``admin.change_feed_secret``:

- ``X-Gateway-Timestamp``: the time of signing, in whole seconds since the Unix epoch;
- ``X-Gateway-Signature``: ``v1=`` and the lowercase hex HMAC-SHA256, under the secret,
  of ``v1``, a newline, the timestamp as sent, a newline and the body's bytes.

A signed notice is taken within :data:`WINDOW_S` of this machine's clock, either way,
and once: the signature is remembered for twice that and a minute (the instances'
clocks may differ) (for every instance sharing the
cache backend; with a backend of one process, by that process), and a notice sent
again with it is refused. A retry is signed again, with its own timestamp.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Any, NamedTuple

import orjson
from aiohttp import web
from multidict import istr

from gateway.errors import InvalidParameters, ParameterProblem
from gateway.normalise.holdings import BadReference, parse_ref

TIMESTAMP_HEADER = istr("X-Gateway-Timestamp")
SIGNATURE_HEADER = istr("X-Gateway-Signature")
SCHEME = "v1"
# how far a signed notice's timestamp may be from this machine's clock, either way
WINDOW_S = 300
# the most records one notice names, and the most bytes its body may have (enough for
# that many references of the longest id)
CHANGES_MAX = 1000
BODY_MAX_BYTES = 256 * 1024
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v1=([0-9a-f]{64})")
_FIELDS = ("records", "soft", "id")
# the longest id a notice may carry
ID_MAX = 200


class Notice(NamedTuple):
    """A valid change notice: its records, as canonical references, and its mode."""

    records: list[str]
    soft: bool


class Unsigned(Exception):
    """A notice whose signature is missing, malformed, wrong or out of its window; the
    message says which, never what the right signature would be."""


class TooLarge(Exception):
    """A body of more than :data:`BODY_MAX_BYTES`."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Gateway-Signature`` of ``body`` signed at ``timestamp``."""
    message = SCHEME.encode() + b"\n" + timestamp.encode() + b"\n" + body
    return f"{SCHEME}=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def is_signed(request: web.Request) -> bool:
    """Whether the request carries a signature at all (then it is judged by it)."""
    return SIGNATURE_HEADER in request.headers or TIMESTAMP_HEADER in request.headers


class Signed(NamedTuple):
    """A notice's signature fields, well formed and within their window."""

    stamp: str
    given: str


def signature_fields(request: web.Request, secret: str | None) -> Signed:
    """The signature fields, checked before the body is read: a secret to check them
    with, one of each, well formed, and a timestamp within :data:`WINDOW_S` of this
    machine's clock; raises Unsigned otherwise."""
    if secret is None:
        raise Unsigned("signed change notices are not taken: admin.change_feed_secret is unset")
    stamps = request.headers.getall(TIMESTAMP_HEADER, [])
    signatures = request.headers.getall(SIGNATURE_HEADER, [])
    if len(stamps) != 1 or len(signatures) != 1:
        raise Unsigned(
            f"a signed notice has one {TIMESTAMP_HEADER} and one {SIGNATURE_HEADER} field"
        )
    stamp, given = stamps[0].strip(), signatures[0].strip()
    if not _TIMESTAMP.fullmatch(stamp):
        raise Unsigned(f"{TIMESTAMP_HEADER} must be whole seconds since the Unix epoch")
    if _SIGNATURE.fullmatch(given) is None:
        raise Unsigned(f"{SIGNATURE_HEADER} must be v1= and 64 lowercase hex digits")
    skew = int(stamp) - time.time()
    if abs(skew) > WINDOW_S:
        raise Unsigned(
            f"{TIMESTAMP_HEADER} is {abs(skew):.0f} s in the "
            + ("future" if skew > 0 else "past")
            + f"; a signed notice is taken within {WINDOW_S} s of the gateway's clock"
        )
    return Signed(stamp, given)


def check_signature(signed: Signed, secret: str, body: bytes) -> str:
    """The signature's digest, when it is ``body``'s under ``secret``; raises Unsigned
    otherwise."""
    if not hmac.compare_digest(signed.given, sign(secret, signed.stamp, body)):
        raise Unsigned(f"{SIGNATURE_HEADER} is not the body's signature at {TIMESTAMP_HEADER}")
    return signed.given.removeprefix(f"{SCHEME}=")


async def read_body(request: web.Request) -> bytes:
    """The request's body, read no further than :data:`BODY_MAX_BYTES`; raises
    TooLarge beyond it (at once when its ``Content-Length`` says so)."""
    length = request.content_length
    if length is not None and length > BODY_MAX_BYTES:
        raise TooLarge
    parts: list[bytes] = []
    size = 0
    while True:
        part = await request.content.read(BODY_MAX_BYTES + 1 - size)
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > BODY_MAX_BYTES:
            raise TooLarge


def parse_notice(body: bytes) -> Notice:
    """The notice in ``body``; raises InvalidParameters naming every bad part (each bad
    reference by its index in ``records``) before anything is purged."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidParameters(
            [ParameterProblem("body", "must be a JSON object with a list of references")]
        ) from None
    if not isinstance(data, dict):
        raise InvalidParameters([ParameterProblem("body", "must be a JSON object")])
    problems = [
        ParameterProblem(name[:80], "unknown field; allowed: " + ", ".join(_FIELDS))
        for name in data
        if name not in _FIELDS
    ]
    soft = data.get("soft", False)
    if not isinstance(soft, bool):
        problems.append(ParameterProblem("soft", "must be true or false"))
    notice_id = data.get("id", "")
    if not isinstance(notice_id, str) or len(notice_id) > ID_MAX:
        problems.append(ParameterProblem("id", f"must be text of at most {ID_MAX} characters"))
    refs = _references(data.get("records"), problems)
    if problems:
        raise InvalidParameters(problems)
    return Notice(refs, soft is True)


def _references(texts: object, problems: list[ParameterProblem]) -> list[str]:
    """The canonical references of ``texts``, once each; a problem for each bad one."""
    if not isinstance(texts, list) or not texts:
        problems.append(ParameterProblem("records", "must be a non-empty list of references"))
        return []
    if len(texts) > CHANGES_MAX:
        problems.append(
            ParameterProblem("records", f"names {len(texts)} records; at most {CHANGES_MAX}")
        )
        return []
    refs: dict[str, None] = {}
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            problems.append(ParameterProblem(f"records[{index}]", "must be a string"))
            continue
        try:
            refs[str(parse_ref(text))] = None
        except BadReference as exc:
            problems.append(ParameterProblem(f"records[{index}]", f"{shown(text)}: {exc}"))
    return list(refs)


def shown(text: str) -> str:
    """A reference as a problem quotes it: bounded, and as JSON text would show it."""
    return repr(text if len(text) <= 80 else text[:80] + "...")


def replay_name(digest: str) -> str:
    """What the backend remembers of a signed notice (``CacheBackend.claim``)."""
    return "notice:" + digest[:32]
