"""The listening socket of one gateway process, and what serves each connection on it.

With the fast path, a connection is served by its own handler
(``gateway.fastpath.connection``). Without it (``server.fast_path = false``, or the
fast path stepped aside at start), it is served by aiohttp's handler behind
:class:`HeadCuts`, which hands it what the socket reads in pieces, each ending where a
request head can end (an empty line): aiohttp's parser drops the requests it read in a
call whose bytes end with a malformed head, so that those pipelined ahead of it in the
same read would get no answer. Fed piece by piece, each request ahead of a malformed
one is answered, in order, then the 400, then the connection closes.

That 400 is the edge's problem, as with the fast path (``gateway.http.rejections``):
:class:`HeadCuts` reads each read first with aiohttp's public request parser, under
the limits of aiohttp's handler, and feeds aiohttp only whole heads (the start of one
waits for its end). In place of a head that parser refuses it feeds the edge's
stand-in request, and nothing after it. Bodies are read by that parser too (and
dropped as they come, never decompressed): a body with a length is fed to its end
and no further, a chunked one up to each empty line (where it may end), so the head
after a body starts a piece of its own and a refused one is the edge's problem too,
in the read where the body ends or a later one. The usual read, one whole head of a
plain GET (``gateway.http.head_form.one_plain_get``: a form the parser reads as one
bodiless GET and refuses nothing of), goes to aiohttp with no second parse; its check
costs about half of the parser's. What stays aiohttp's own: the bytes
of a body's framing the parser refuses (both ways in, aiohttp answers the request and
fails its body's reader), any head after a request that switches protocols, and
what follows a chunked body's ``PIECES_MAX`` pieces in one read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.http import HttpProcessingError, HttpRequestParser, RawRequestMessage
from multidict import istr

from gateway.fastpath.connection import FastPathServer
from gateway.http.edge import EDGE
from gateway.http.head_form import one_plain_get
from gateway.http.rejections import Refusals

# the most pieces one read is cut into; the rest of the read goes whole. aiohttp's
# parser refuses every piece fed after a malformed head again (one 400 queued each, not
# answered), which this bounds; no caller pipelines as many requests in one read
PIECES_MAX = 256
# what the head checker's parser buffers of a body before it would pause its protocol
# (it has none): far more than one read of the socket (the C parser takes an int)
CHECKED_BODY_LIMIT = 1 << 30
# what is left of a chunked body: up to an empty line, where it may end
CHUNKED = -1
# the most a connection holds of blank lines (and an HTTP/2 preface) that make no
# request yet, before aiohttp is fed them; a head's start is held within the parser's
# own limits
HELD_BLANK_MAX = 8 * 1024
_CONTENT_LENGTH = istr("Content-Length")  # looked up without case folding
# connections the kernel queues before the server accepts them (aiohttp's default)
BACKLOG = 128


class HeadCuts(asyncio.Protocol):
    """The protocol of one connection: ``handler``'s (aiohttp's, made by its public
    ``web.Server``), fed what arrives cut after each empty line, at most
    ``PIECES_MAX`` pieces a read, once aiohttp's public parser has read it (see the
    module's docstring; ``refusals``: the application's stand-ins). A read holding
    one head end at most (the usual case) goes whole, after one search. Any cut of
    the stream reads the same to the parser."""

    __slots__ = (
        "_body",
        "_body_left",
        "_check",
        "_feed",
        "_handler",
        "_held",
        "_plain_lines",
        "_plain_max",
        "_refusals",
        "_refused",
    )

    def __init__(self, handler: asyncio.Protocol, refusals: Refusals | None = None) -> None:
        self._handler = handler
        self._feed = handler.data_received
        self._refusals = refusals
        self._check: HttpRequestParser | None = None
        self._held = b""  # the start of a head whose end has not arrived
        self._refused = False  # a head was refused: nothing more is read
        # the body the checker is reading (dropped as it comes), and what is left of
        # it: its bytes to come (Content-Length), or CHUNKED
        self._body: StreamReader | None = None
        self._body_left = 0
        # the bounds within which a read that is one plain GET goes to aiohttp unread
        # by the checker: half the parser's limits (see connection_made)
        self._plain_max = 0
        self._plain_lines = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler.connection_made(transport)
        if self._refusals is not None:
            self._check = _checker(self._handler)
            line_max, fields_max, field_max = _limits(self._handler)
            self._plain_max = min(line_max, field_max) // 2
            self._plain_lines = fields_max // 2

    def connection_lost(self, exc: Exception | None) -> None:
        self._check = None
        self._handler.connection_lost(exc)

    def eof_received(self) -> bool | None:
        if self._held:
            self._feed(self._held)
            self._held = b""
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def data_received(self, data: bytes) -> None:
        check = self._check
        if check is None:
            if not self._refused:
                self._cut(data)
            return
        if (
            not self._held
            and self._body is None
            and one_plain_get(data, self._plain_max, self._plain_lines)
        ):
            self._feed(data)  # the usual read: one plain GET, which the checker reads whole
            return
        checked = len(self._held)  # the checker has read what is held already
        if checked:
            data, self._held = self._held + data, b""
        if self._body is not None:
            data = self._through_body(check, data)
            if not data or self._check is None:
                return
        try:
            messages, upgraded, _ = check.feed_data(data[checked:])
        except HttpProcessingError:
            self._refuse(data)
            return
        framed = False  # a message whose head is followed by a body
        for message, _ in messages:
            if message.upgrade:
                upgraded = True
            elif message.chunked or _CONTENT_LENGTH in message.headers:
                framed = True
        if upgraded:
            self._check = None  # aiohttp's alone from here on
            self._cut(data)
            return
        if framed:
            self._follow(messages[-1])
            self._cut(data)  # where its heads end is the bodies' framing
            return
        end = data.rfind(b"\r\n\r\n") + 4
        if end < 4 or (not messages and len(data) <= HELD_BLANK_MAX):
            # no request whole yet (the start of a head, blank lines ahead of one,
            # an HTTP/2 preface): held, within the bounds of a head
            self._held = data
        elif end < len(data):
            self._held = data[end:]
            self._cut(data[:end])
        elif len(messages) == 1:
            self._feed(data)  # one head, whole: the usual read
        else:
            self._cut(data)

    def _follow(self, last: tuple[RawRequestMessage, StreamReader]) -> None:
        """Note the body of the checker's ``last`` message, when it is still coming
        (the messages before it have theirs whole), and drop what came of it."""
        message, body = last
        if not body.is_eof():
            self._body = body
            self._body_left = CHUNKED if message.chunked else _content_length(message)
        self._drop_body()

    def _drop_body(self) -> None:
        """What the checker read of the body, dropped (aiohttp's handler reads it)."""
        body = self._body
        if body is None:
            return
        read = len(body.read_nowait())
        if self._body_left != CHUNKED:
            self._body_left -= read
        if body.is_eof():
            self._body = None

    def _through_body(self, check: HttpRequestParser, data: bytes) -> bytes:
        """Feed the checker and aiohttp the rest of the body ``data`` starts in; what
        is after its end (which starts a head), or nothing. A body with a length ends
        where it says; a chunked one at an empty line, so it is fed piece by piece
        (at most ``PIECES_MAX`` pieces, the rest whole)."""
        start, pieces, size = 0, PIECES_MAX, len(data)
        while self._body is not None and start < size:
            if self._body_left != CHUNKED:
                end = _piece_end(data, start, self._body_left)
            elif pieces:
                end = _piece_end(data, start, None)
                pieces -= 1
            else:
                # past the bound: the connection is aiohttp's alone from here on
                self._check = self._body = None
                self._cut(data[start:])
                return b""
            try:
                check.feed_data(data[start:end])
            except HttpProcessingError:
                # in the body's own framing: aiohttp's to answer (its parser refuses
                # the same bytes)
                self._check = self._body = None
                self._cut(data[start:])
                return b""
            self._feed(data[start:end])
            self._drop_body()
            start = end
        return data[start:]

    def _refuse(self, data: bytes) -> None:
        """Feed aiohttp the requests of ``data`` (which starts one) ahead of the head
        the parser refuses, then the stand-in of that refusal; nothing after it. A
        fresh parser reads ``data`` again, piece by piece: a head at a time, a body
        with a length whole, a chunked one to each empty line (where it may end)."""
        assert self._refusals is not None
        self._check = None
        self._refused = True
        check = _checker(self._handler)
        body: tuple[StreamReader, int] | None = None  # a body being read, its length
        start = 0
        pending = b""  # pieces the parser took that make no request yet
        while start < len(data):
            in_body = body is not None
            end = _piece_end(data, start, body[1] if body is not None else None)
            piece = data[start:end]
            try:
                messages, _, _ = check.feed_data(piece)
            except HttpProcessingError as exc:
                if in_body:
                    # in a body's framing: aiohttp's own answer, as the parser's
                    self._refused = False
                    self._cut(pending + data[start:])
                else:
                    self._feed(self._refusals.stand_in(exc))
                return
            if body is not None and body[0].is_eof():
                body = None
            for message, payload in messages:
                if not payload.is_eof():
                    body = (payload, CHUNKED if message.chunked else _content_length(message))
            if messages or in_body or body is not None:
                self._feed(pending + piece)
                pending = b""
            else:
                pending += piece
            start = end
        self._feed(self._refusals.stand_in(None))

    def _cut(self, data: bytes) -> None:
        end = data.find(b"\r\n\r\n") + 4
        size = len(data)
        if not 3 < end < size:
            self._feed(data)
            return
        feed = self._feed
        start = 0
        pieces = PIECES_MAX
        while pieces and 3 < end < size:
            feed(data[start:end])
            start = end
            end = data.find(b"\r\n\r\n", start) + 4
            pieces -= 1
        feed(data[start:])


def _checker(handler: asyncio.Protocol) -> HttpRequestParser:
    """aiohttp's public request parser under the limits of its ``handler``. Its
    protocol is :class:`_Unpaused`: what it reads of a body is dropped after every
    read of the socket, far below what it buffers before it would pause
    (``CHECKED_BODY_LIMIT``)."""
    loop = asyncio.get_running_loop()
    protocol: Any = _Unpaused()
    line_max, fields_max, field_max = _limits(handler)
    return HttpRequestParser(
        protocol,
        loop,
        CHECKED_BODY_LIMIT,
        auto_decompress=False,
        max_line_size=line_max,
        max_headers=fields_max,
        max_field_size=field_max,
    )


def _limits(handler: asyncio.Protocol) -> tuple[int, int, int]:
    """The limits of aiohttp's ``handler``'s parser: the longest request line, the
    most header lines, the longest header line (aiohttp's defaults if it has none)."""
    return (
        getattr(handler, "max_line_size", 8190),
        getattr(handler, "max_headers", 128),
        getattr(handler, "max_field_size", 8190),
    )


class _Unpaused:
    """The flow control of the head checker's bodies: none (nothing reads them)."""

    connected = True

    def pause_reading(self) -> None:
        """Nothing to pause: the socket is read for aiohttp's own handler."""

    def resume_reading(self, resume_parser: bool = True) -> None:
        """Nothing to resume."""


def _piece_end(data: bytes, start: int, length: int | None) -> int:
    """Where the piece of ``data`` from ``start`` ends: after ``length`` bytes (the rest
    of a body with a length), or after the next empty line (a head, or a chunked body's
    part: ``length`` None or ``CHUNKED``); the end of ``data`` when that is past it."""
    if length is not None and length != CHUNKED:
        return min(start + length, len(data))
    end = data.find(b"\r\n\r\n", start) + 4
    return end if end > 3 else len(data)


def _content_length(message: RawRequestMessage) -> int:
    """The length of ``message``'s body, as its head gives it (the parser checked it)."""
    return int(message.headers["Content-Length"])


def connection_factory(
    server: web.Server, refusals: Refusals | None = None
) -> Callable[[], asyncio.Protocol]:
    """What makes the protocol of each connection ``server`` (a runner's, set up)
    serves: its own connections with the fast path, aiohttp's behind
    :class:`HeadCuts` otherwise (``refusals``: the application's stand-ins for heads
    the parser refuses; None: aiohttp answers those itself)."""
    if isinstance(server, FastPathServer):
        return server
    return lambda: HeadCuts(server(), refusals)


async def listen(
    runner: web.AppRunner, host: str, port: int, *, reuse_port: bool = False
) -> asyncio.Server:
    """Listen on ``host``:``port`` for ``runner`` (set up). To stop: close the server
    this returns (no new connections), then ``runner.cleanup()``, which lets the
    requests in flight finish and closes the connections."""
    server = runner.server
    if server is None:
        raise RuntimeError("listen: the runner is not set up")
    refusals = runner.app[EDGE].refusals if EDGE in runner.app else None
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        connection_factory(server, refusals),
        host,
        port,
        backlog=BACKLOG,
        reuse_port=reuse_port or None,
    )
