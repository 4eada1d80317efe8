"""Reading the head of a plain HTTP/1.1 GET from its bytes, for the hit path.

A cache hit on a kept-alive connection is answered from the connection's
``data_received`` (gateway.front.GatewayConnection) before aiohttp parses it, when
the bytes are one complete head that :func:`read_head` reads. It reads only the
narrowest, commonest form and returns None for anything else, which then goes to
aiohttp's own parser unchanged, as before:

- the request line is exactly ``GET <target> HTTP/1.1``; the target is an origin
  form whose path holds only letters, digits and ``/ _ ~ - .`` (no percent escape, no
  dot segment, no empty segment), and whose query holds only the characters RFC 3986
  allows there (unreserved, sub-delims, ``: @ / ?`` and percent escapes);
- every header line is a token, a colon and printable ASCII (spaces and tabs
  included); no obs-fold, no bare CR or LF, no byte above 0x7F;
- no line longer than ``line_max`` and at most ``fields_max`` header lines, which the
  caller sets well inside the limits it gives aiohttp's parser (the server: 32 KiB a
  line, 128 lines; half of each here), so that nothing the parser would refuse is
  read here;
- exactly one ``Host`` (aiohttp refuses an HTTP/1.1 request without one), and no
  header name twice (aiohttp refuses some twice: ``Host``, ``User-Agent`` and more);
- no header that changes how a hit is answered or framed: ``Cache-Control``,
  ``Pragma``, ``If-None-Match``, ``Expect``, ``Content-Length``,
  ``Transfer-Encoding``, ``Upgrade``, ``TE``, ``Sec-WebSocket-Key1``,
  ``Proxy-Connection`` (aiohttp reads it as ``Connection``), and ``Connection`` other
  than ``keep-alive``.

For what it reads, the path and query are what aiohttp's request gives as
``rel_url.path_safe`` and ``rel_url.raw_query_string``, and the two headers what
``headers.get`` gives (tests/test_request_head.py holds the two to agreeing on
random heads).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_REQUEST_LINE = rb"GET (/[A-Za-z0-9/_~.-]*)(?:\?([A-Za-z0-9._~!$&'()*+,;=:@/?%-]*))? HTTP/1\.1\r\n"
_FIELD_LINE = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t -~]*\r\n"
_HEAD = re.compile(_REQUEST_LINE + rb"((?:" + _FIELD_LINE + rb")*)\r\n")
# the whole lines a head read here can begin with, and what its unfinished line holds
_HEAD_START = re.compile(_REQUEST_LINE + rb"(?:" + _FIELD_LINE + rb")*")
_UNFINISHED_LINE = re.compile(rb"[\t -~]*\r?")
_METHOD = b"GET /"
# the defaults: half the limits the server gives aiohttp's parser (gateway.server)
LINE_MAX = 16 * 1024
FIELDS_MAX = 64
_OWS = b" \t"
_AUTHORIZATION = b"authorization"
_X_REQUEST_ID = b"x-request-id"
_CONNECTION = b"connection"
_HOST = b"host"
# headers after which a hit is not simply the entry's 200, or the message not simply
# a bodiless head: the full path (aiohttp's parser, the route's handler) decides
_DECLINED = frozenset(
    (
        b"cache-control",
        b"pragma",
        b"if-none-match",
        b"expect",
        b"content-length",
        b"transfer-encoding",
        b"upgrade",
        b"te",
        b"sec-websocket-key1",
        b"proxy-connection",
    )
)


class RequestHead(NamedTuple):
    """What a hit needs of a plain GET: the path, the raw query string, and the two
    headers it reads (None when absent)."""

    path: str
    query: str
    authorization: str | None
    request_id: str | None


def may_become_head(start: bytes, line_max: int = LINE_MAX, fields_max: int = FIELDS_MAX) -> bool:
    """Whether ``start`` (the start of a request head, its end not received yet) may
    still become a head :func:`read_head` reads: its whole lines are of that form and
    within the limits, and its unfinished line can still be. Anything else is for
    aiohttp's parser to refuse (or read) at once."""
    if len(start) > line_max * (fields_max + 2):
        return False
    unfinished_from = start.rfind(b"\r\n") + 2
    if unfinished_from == 1:  # still on the request line
        if start[: len(_METHOD)] != _METHOD[: len(start)]:
            return False
        unfinished_from = 0
    else:
        whole = _HEAD_START.match(start)
        if whole is None or whole.end() != unfinished_from:
            return False
        if start.count(b"\r\n", 0, unfinished_from) > fields_max + 1:
            return False
    return (
        len(start) - unfinished_from <= line_max
        and _UNFINISHED_LINE.fullmatch(start, unfinished_from) is not None
    )


def read_head(
    head: bytes, line_max: int = LINE_MAX, fields_max: int = FIELDS_MAX
) -> RequestHead | None:
    """``head`` (one whole request head, its final CRLF CRLF included) read, or None
    when it is not the plain form described above."""
    match = _HEAD.fullmatch(head)
    if match is None:
        return None
    path, query, fields = match.groups()
    if b"/." in path or b"//" in path:
        return None
    if len(head) > line_max and max(len(line) for line in head.split(b"\r\n")) > line_max:
        return None
    lines = fields.split(b"\r\n")
    if len(lines) > fields_max + 1:
        return None
    authorization: bytes | None = None
    request_id: bytes | None = None
    seen: set[bytes] = set()
    for line in lines[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        if name in seen or name in _DECLINED:
            return None
        seen.add(name)
        if name == _AUTHORIZATION:
            authorization = value.strip(_OWS)
        elif name == _X_REQUEST_ID:
            request_id = value.strip(_OWS)
        elif name == _CONNECTION and value.strip(_OWS).lower() != b"keep-alive":
            return None
    if _HOST not in seen:
        return None
    return RequestHead(
        path.decode("ascii"),
        query.decode("ascii") if query is not None else "",
        authorization.decode("ascii") if authorization is not None else None,
        request_id.decode("ascii") if request_id is not None else None,
    )
