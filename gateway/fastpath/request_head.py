"""Reading the head of a plain HTTP/1.1 GET from its bytes, for the hit path.

A cache hit on a kept-alive connection is answered from the connection's
``data_received`` (``gateway.fastpath.connection``) before aiohttp parses it, when
the bytes are one complete head that :func:`read_head` reads. While a head is not
complete yet, :class:`PendingHead` holds it and checks each byte once as it arrives.
It reads only the narrowest, commonest form (the plain form of ``gateway.http.head_form``,
whose grammar it shares) and returns None for anything else, which then goes to
aiohttp's own parser unchanged:

- the request line is exactly ``GET <target> HTTP/1.1``; the target is an origin
  form whose path holds only letters, digits, ``/ _ ~ - .`` and percent escapes other
  than of a dot (no dot segment, no empty segment), and whose query holds only the
  characters RFC 3986 allows there (unreserved, sub-delims, ``: @ / ?`` and percent
  escapes);
- every header line is a token, a colon and printable ASCII (spaces and tabs
  included); no obs-fold, no bare CR or LF, no byte above 0x7F;
- no line longer than ``line_max`` and at most ``fields_max`` header lines, which the
  caller sets well inside the limits of aiohttp's parser (half of each), so that
  nothing the parser would refuse is read here;
- exactly one ``Host`` (aiohttp refuses an HTTP/1.1 request without one), and no
  header name twice (aiohttp refuses some twice: ``Host``, ``User-Agent`` and more);
- no header that changes how a hit is answered or framed: ``Cache-Control``,
  ``Pragma``, ``Expect``, ``Content-Length``,
  ``Transfer-Encoding``, ``Upgrade``, ``TE``, ``Sec-WebSocket-Key1``,
  ``Proxy-Connection`` (aiohttp reads it as ``Connection``), and ``Connection`` other
  than ``keep-alive`` or ``close`` (a caller that opens a connection per request; the
  answer then says ``Connection: close`` and the connection closes after it).

For what it reads, the path and query are what aiohttp's request gives as
``rel_url.raw_path`` and ``rel_url.raw_query_string`` (the path as sent: without an
escape, what aiohttp's router matches), and the five headers (``If-None-Match``
among them, which makes a hit a 304 when it names the ETag) what ``headers.get``
gives (tests/fastpath/test_request_head.py holds the two to agreeing on random heads).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gateway.http.head_form import FIELD_LINE as _FIELD_LINE
from gateway.http.head_form import REQUEST_LINE as _REQUEST_LINE

_HEAD = re.compile(_REQUEST_LINE + rb"((?:" + _FIELD_LINE + rb")*)\r\n")
# the whole lines a head read here can begin with, and what its unfinished line holds
_HEAD_START = re.compile(_REQUEST_LINE + rb"(?:" + _FIELD_LINE + rb")*")
_UNFINISHED_LINE = re.compile(rb"[\t -~]*\r?")
_REQUEST_LINE_ONLY = re.compile(_REQUEST_LINE)
_FIELD_LINE_ONLY = re.compile(_FIELD_LINE)
_LINE_CHARS = re.compile(rb"[\t -~]*")
_METHOD = b"GET /"
# the defaults: half the limits the server gives aiohttp's parser (gateway.process.worker)
LINE_MAX = 16 * 1024
FIELDS_MAX = 64
_OWS = b" \t"
_AUTHORIZATION = b"authorization"
_X_REQUEST_ID = b"x-request-id"
_ACCEPT_ENCODING = b"accept-encoding"
_TRACEPARENT = b"traceparent"
_IF_NONE_MATCH = b"if-none-match"
_CONNECTION = b"connection"
_HOST = b"host"
# headers after which a hit is not simply the entry's 200, or the message not simply
# a bodiless head: the full path (aiohttp's parser, the route's handler) decides
_DECLINED = frozenset(
    (
        b"cache-control",
        b"pragma",
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
    """What a hit needs of a plain GET: the path, the raw query string, and the five
    headers it reads (None when absent)."""

    path: str
    query: str
    authorization: str | None
    request_id: str | None
    accept_encoding: str | None = None
    traceparent: str | None = None
    if_none_match: str | None = None
    close: bool = False  # Connection: close


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
    accept_encoding: bytes | None = None
    traceparent: bytes | None = None
    if_none_match: bytes | None = None
    close = False
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
        elif name == _ACCEPT_ENCODING:
            accept_encoding = value.strip(_OWS)
        elif name == _TRACEPARENT:
            traceparent = value.strip(_OWS)
        elif name == _IF_NONE_MATCH:
            if_none_match = value.strip(_OWS)
        elif name == _CONNECTION:
            option = value.strip(_OWS).lower()
            if option == b"close":
                close = True
            elif option != b"keep-alive":
                return None
    if _HOST not in seen:
        return None
    return RequestHead(
        path.decode("ascii"),
        query.decode("ascii") if query is not None else "",
        authorization.decode("ascii") if authorization is not None else None,
        request_id.decode("ascii") if request_id is not None else None,
        accept_encoding.decode("ascii") if accept_encoding is not None else None,
        traceparent.decode("ascii") if traceparent is not None else None,
        if_none_match.decode("ascii") if if_none_match is not None else None,
        close,
    )


# the longest header block (all of a head but its request line) a connection remembers
REMEMBERED_FIELDS_MAX = 2048


class HeadReader:
    """:func:`read_head` for the heads of one connection, which remembers the header
    block (every line after the request line) of the last head it read.

    A service sends the same headers on every request of a kept-alive connection
    (``Host``, its token, ``Accept-Encoding``...): only the request line changes. A
    head whose header block is the one read last is read by its request line alone,
    which is what :func:`read_head` would read of it (the block was checked whole, and
    the request line is checked as :func:`read_head` checks it)."""

    __slots__ = ("_fields", "_fields_max", "_line_max", "_read")

    def __init__(self, line_max: int = LINE_MAX, fields_max: int = FIELDS_MAX) -> None:
        self._line_max = line_max
        self._fields_max = fields_max
        self._fields = b""
        self._read: tuple[str | None, str | None, str | None, str | None, str | None, bool] = (
            None,
            None,
            None,
            None,
            None,
            False,
        )

    def read(self, head: bytes) -> RequestHead | None:
        """``head`` read as :func:`read_head` reads it."""
        line_end = head.find(b"\r\n") + 2
        fields = self._fields
        if (
            fields
            and len(head) - len(fields) == line_end
            and line_end - 2 <= self._line_max
            and head.endswith(fields)
        ):
            line = _REQUEST_LINE_ONLY.fullmatch(head, 0, line_end)
            if line is None:
                return None
            path, query = line.groups()
            if b"/." in path or b"//" in path:
                return None
            return RequestHead(
                path.decode("ascii"),
                query.decode("ascii") if query is not None else "",
                *self._read,
            )
        read = read_head(head, self._line_max, self._fields_max)
        if read is not None and len(head) - line_end <= REMEMBERED_FIELDS_MAX:
            self._fields = head[line_end:]
            self._read = (
                read.authorization,
                read.request_id,
                read.accept_encoding,
                read.traceparent,
                read.if_none_match,
                read.close,
            )
        return read


class PendingHead:
    """The start of a request head, held while it may still become one that
    :func:`read_head` reads, checked as it arrives.

    Each byte is looked at a bounded number of times however the head is cut into
    pieces: :meth:`feed` checks each whole line once when its end arrives, and of the
    unfinished line only the bytes it has not seen. It holds a head under aiohttp's own
    limits (``line_max`` a line, ``fields_max`` header lines): anything longer, or of
    another form, is for aiohttp's parser to read or refuse. ``examined`` counts the
    bytes looked at, for tests.
    """

    __slots__ = ("_fields_max", "_line_max", "_line_start", "_lines", "_seen", "data", "examined")

    def __init__(self, line_max: int, fields_max: int) -> None:
        self.data = bytearray()
        self._line_max = line_max
        self._fields_max = fields_max
        self._line_start = 0  # where the unfinished line starts
        self._seen = 0  # bytes of the unfinished line checked already
        self._lines = 0  # whole lines, the request line included
        self.examined = 0

    def feed(self, chunk: bytes) -> int:
        """Add ``chunk``. Returns the length of the whole head once its empty line has
        arrived (``data`` may hold more after it), 0 while it is not complete and may
        still become a head read here, -1 when it cannot."""
        data = self.data
        data += chunk
        end = len(data)
        while True:
            # a line ends in CRLF; its CR may have come with the chunk before
            newline = data.find(b"\r\n", max(self._line_start, self._line_start + self._seen - 1))
            if newline < 0:
                break
            line_end = newline + 2
            if newline == self._line_start:  # the empty line: the head is whole
                if self._lines == 0:
                    return -1
                self.examined += 2
                return line_end
            if not self._whole_line(data, self._line_start, line_end):
                return -1
            self._line_start, self._seen = line_end, 0
        return 0 if self._unfinished_line(data, end) else -1

    def _whole_line(self, data: bytearray, start: int, end: int) -> bool:
        self.examined += end - start
        if end - start - 2 > self._line_max:
            return False
        self._lines += 1
        if self._lines == 1:
            return _REQUEST_LINE_ONLY.fullmatch(data, start, end) is not None
        if self._lines > self._fields_max + 1:
            return False
        return _FIELD_LINE_ONLY.fullmatch(data, start, end) is not None

    def _unfinished_line(self, data: bytearray, end: int) -> bool:
        start = self._line_start
        if end - start > self._line_max + 1:
            return False
        checked = start + self._seen
        # a CR ends the line only with the LF after it: here it may only be the last byte
        last = end - 1 if data[end - 1 : end] == b"\r" else end
        self.examined += end - checked
        if _LINE_CHARS.fullmatch(data, min(checked, last), last) is None:
            return False
        if self._lines == 0 and data[start : start + len(_METHOD)] != _METHOD[: end - start]:
            return False
        self._seen = end - start
        return True
