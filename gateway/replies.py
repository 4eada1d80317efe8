"""What a record reply carries besides its body, and fresh hits made ready to send.

Every record reply has the same headers (:func:`cache_headers`, the README's header
table). A fresh hit's depend only on its entry's ETag, its age and its freshness left
in whole seconds, so :class:`HitHeads` makes each such set once, both as headers and
as the bytes they are on the wire.

A fresh hit on a GET over a kept-alive HTTP/1.1 connection, the usual case by far, is
then sent as one ready-made block of bytes (:class:`WireResponse`): status line,
those headers, ``Content-Length``, ``Server``, ``Date``, ``X-Request-ID`` and the
body. aiohttp's own way (copy the headers, fill in its own, serialise them, buffer
and write) cost more than the rest of a hit together (bench/README.md). The bytes are
exactly the fields aiohttp would send for the same reply (tests/test_replies.py
compares the two, field for field); anything else (HEAD, HTTP/1.0, ``Connection:
close``, a 304) is answered by ``web.Response`` from the same headers.

A 200 that took the pipeline's full way (a miss, say) to such a GET is a
:class:`ReadyReply`: its headers and body go straight to aiohttp's writer, without
``web.Response``'s preparation.
"""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import NamedTuple

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.cache import CacheEntry
from gateway.pipeline import CACHE_NAME, HIT, hit_status

JSON = "application/json"

_OK_LINE = "HTTP/1.1 200 OK"
_OK = (_OK_LINE + "\r\n").encode("latin-1")
_SERVER = f"Server: {SERVER_SOFTWARE}\r\n".encode("latin-1")


def cache_headers(
    x_cache: str, cache_status: str, age_s: int, max_age_s: int, etag: str
) -> CIMultiDict[str]:
    """The headers of a reply: its type and the cache headers (README's header table)."""
    headers = CIMultiDict(
        (
            ("Content-Type", JSON),
            ("X-Cache", x_cache),
            ("Cache-Status", cache_status),
            ("Age", str(age_s)),
            ("Cache-Control", f"private, max-age={max_age_s}"),
        )
    )
    if etag:
        headers["ETag"] = etag
    return headers


class HitHead(NamedTuple):
    """A fresh hit's headers (read-only: ``web.Response`` copies what it is given) and
    its 200's status line and header fields as bytes, ``Content-Length`` and
    ``Server`` included; ``Date`` and ``X-Request-ID`` are the request's own."""

    headers: CIMultiDictProxy[str]
    wire: bytes


class HitHeads:
    """The heads of fresh hits, the same as the pipeline's hit reply, each made once
    per (ETag, age, freshness left, body length). At most ``size`` are kept (a fixed
    amount of memory, whatever the cache holds)."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._made: dict[tuple[str, int, int, int], HitHead] = {}

    def __call__(self, entry: CacheEntry, now: float) -> HitHead:
        age = entry.age(now)
        age_s, left = int(age), int(entry.ttl_s - age)  # entry.left(now), age computed once
        key = (entry.etag, age_s, left, len(entry.body))
        made = self._made.get(key)
        if made is None:
            headers = cache_headers(
                HIT, f"{CACHE_NAME}; {hit_status(left)}", age_s, left, entry.etag
            )
            fields = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            length = f"Content-Length: {len(entry.body)}\r\n"
            wire = _OK + (fields + length).encode("latin-1") + _SERVER
            made = HitHead(CIMultiDictProxy(headers), wire)
            if len(self._made) >= self._size:
                self._made.clear()
            self._made[key] = made
        return made


class DateField:
    """The ``Date`` header field of now, made once a second (RFC 9110 IMF-fixdate)."""

    def __init__(self) -> None:
        self._second = -1
        self._field = b""

    def __call__(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._field = f"Date: {formatdate(second, usegmt=True)}\r\n".encode("latin-1")
            self._second = second
        return self._field


def sendable(request: web.BaseRequest) -> bool:
    """Whether a ready-made 200 fits ``request``: a GET over HTTP/1.1 the client keeps
    alive (what the bytes say: a body, no ``Connection`` field)."""
    return request.method == "GET" and request.version == HttpVersion11 and request.keep_alive


def ready_head(head: HitHead, date: bytes, request_id: str) -> bytes:
    """A fresh hit's 200 up to its body: status line, header fields, the empty line."""
    return b"".join((head.wire, date, b"X-Request-ID: ", request_id.encode("ascii"), b"\r\n\r\n"))


def ready_made(head: HitHead, date: bytes, request_id: str, body: bytes) -> bytes:
    """A fresh hit's 200 as one block of bytes, from status line to body: one write,
    the body copied once into it (what aiohttp's own writer does with headers and body
    on Python before 3.12.9, where writelines is not used)."""
    return ready_head(head, date, request_id) + body


class ReadyReply(web.StreamResponse):
    """A record reply's 200 that took the full way (a miss, a bypass, a stale answer,
    a hit not answered from ready-made bytes) for a :func:`sendable` request: its
    headers as the handler and the edge left them, then ``Content-Length``, ``Date``
    and ``Server``, handed to the connection's writer with the body in one go.

    aiohttp's ``web.Response`` would work out the same fields (body type, length,
    keep-alive, chunking, compression) on every answer: 11 µs against 7 for a 10 KB
    page, headers made and sent (bench/README.md). The fields are aiohttp's own,
    serialised by aiohttp's writer; tests/test_replies.py compares them with
    ``web.Response``'s, field for field. Past ``prepare`` it is what aiohttp's own
    response is once sent, as :class:`WireResponse` is. Like it, it sends no
    ``on_response_prepare`` signal: ``create_app`` registers none (tests/test_front.py
    holds it to that)."""

    def __init__(self, body: bytes, headers: CIMultiDict[str]) -> None:
        super().__init__(status=200, headers=headers)
        self._keep_alive = True  # what sendable() checked; no Connection field
        self._ready_body = body

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        self._eof_sent = True
        headers = self.headers
        headers[hdrs.CONTENT_LENGTH] = str(len(self._ready_body))
        headers[hdrs.DATE] = rfc822_formatted_time()
        headers[hdrs.SERVER] = SERVER_SOFTWARE
        writer = request.writer
        await writer.write_headers(_OK_LINE, headers)
        await writer.write_eof(self._ready_body)
        self._body_length = writer.output_size
        return writer


class WireResponse(web.StreamResponse):
    """A 200 whose bytes, from status line to body, are made already: ``prepare``
    writes them all and ends the message. Only for a :func:`sendable` request.

    Past ``prepare`` it is what aiohttp's own response is once sent: prepared, ended
    (``write_eof`` does nothing), ``body_length`` the bytes written, kept alive unless
    ``force_close`` was called; tests/test_replies.py holds it to that."""

    def __init__(self, head: HitHead, date: bytes, request_id: str, body: bytes) -> None:
        super().__init__(status=200)
        self._keep_alive = True  # what the bytes say: no Connection field
        self._wire = ready_made(head, date, request_id, body)

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        self._eof_sent = True
        writer = request.writer
        await writer.write_eof(self._wire)
        self._body_length = len(self._wire)
        return writer
