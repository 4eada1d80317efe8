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
dropped as they come, so that it holds no more than one read of them): a head refused
after a request with a body is the edge's problem as well, when it comes in a later
read than that body's end. Only a head refused in the same read as a body before it,
or any head after a request that switches protocols, is aiohttp's own plain-text 400
(the bytes ahead of it cannot be cut into whole requests without reading the body's
framing twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.http import HttpProcessingError, HttpRequestParser, RawRequestMessage

from gateway.fastpath.connection import FastPathServer
from gateway.http.edge import EDGE
from gateway.http.rejections import Refusals

# the most pieces one read is cut into; the rest of the read goes whole. aiohttp's
# parser refuses every piece fed after a malformed head again (one 400 queued each, not
# answered), which this bounds; no caller pipelines as many requests in one read
PIECES_MAX = 256
# what the head checker's parser buffers of a body before it would pause its protocol
# (it has none): far more than one read of the socket (the C parser takes an int)
CHECKED_BODY_LIMIT = 1 << 30
# connections the kernel queues before the server accepts them (aiohttp's default)
BACKLOG = 128


class HeadCuts(asyncio.Protocol):
    """The protocol of one connection: ``handler``'s (aiohttp's, made by its public
    ``web.Server``), fed what arrives cut after each empty line, at most
    ``PIECES_MAX`` pieces a read, once aiohttp's public parser has read it (see the
    module's docstring; ``refusals``: the application's stand-ins). A read holding
    one head end at most (the usual case) goes whole, after one search. Any cut of
    the stream reads the same to the parser."""

    __slots__ = ("_bodies", "_check", "_feed", "_handler", "_held", "_refusals", "_refused")

    def __init__(self, handler: asyncio.Protocol, refusals: Refusals | None = None) -> None:
        self._handler = handler
        self._feed = handler.data_received
        self._refusals = refusals
        self._check: HttpRequestParser | None = None
        self._held = b""  # the start of a head whose end has not arrived
        self._refused = False  # a head was refused: nothing more is read
        # the bodies the checker is reading (dropped as they come)
        self._bodies: list[StreamReader] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler.connection_made(transport)
        if self._refusals is not None:
            self._check = _checker(self._handler)

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
        in_body = bool(self._bodies)
        try:
            # the checker has read what is held already: it is fed what is new only
            messages, upgraded, _ = check.feed_data(data)
        except HttpProcessingError:
            self._refused_in(data, in_body)
            return
        if self._held:
            data, self._held = self._held + data, b""
        if upgraded or any(message.upgrade for message, _ in messages):
            self._check = None  # aiohttp's alone from here on
            self._cut(data)
            return
        self._bodies += (payload for _, payload in messages if not payload.is_eof())
        if self._bodies:
            self._drop_bodies()
        if in_body or any(_may_have_a_body(message) for message, _ in messages):
            # where its heads end is the bodies' framing: nothing is held back
            self._cut(data)
            return
        end = data.rfind(b"\r\n\r\n") + 4
        if not messages or end < 4:
            # no request whole yet (the start of a head, or of an HTTP/2 preface)
            self._held = data
        elif end < len(data):
            self._held = data[end:]
            self._cut(data[:end])
        else:
            self._cut(data)

    def _drop_bodies(self) -> None:
        """What the checker read of bodies, dropped (aiohttp's handler reads them)."""
        for body in self._bodies:
            body.read_nowait()
        self._bodies = [body for body in self._bodies if not body.is_eof()]

    def _refused_in(self, data: bytes, in_body: bool) -> None:
        """The checker refused a head in ``data``: the edge's stand-in in its place
        when ``data`` (after what is held) starts at a head, with no body ahead of
        it; aiohttp's own answer otherwise (see the module's docstring)."""
        if in_body:
            self._check = None
            self._bodies = []
            self._cut(data)
            return
        self._refuse(self._held + data)

    def _refuse(self, data: bytes) -> None:
        """Feed aiohttp the requests of ``data`` (which starts one) ahead of the head
        the parser refuses, then the stand-in of that refusal; nothing after it."""
        assert self._refusals is not None
        self._check = None
        self._refused = True
        check = _checker(self._handler)
        start = 0
        pending = b""  # pieces the parser took that make no request yet
        while start < len(data):
            end = data.find(b"\r\n\r\n", start) + 4
            piece = data[start:end] if end > 3 else data[start:]
            try:
                messages, _, _ = check.feed_data(piece)
            except HttpProcessingError as exc:
                self._feed(self._refusals.stand_in(exc))
                return
            if any(_may_have_a_body(message) for message, _ in messages):
                # a body ahead of the refused head: its framing is aiohttp's to read
                self._cut(pending + data[start:])
                return
            if end < 4:
                break
            if messages:
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
    return HttpRequestParser(
        protocol,
        loop,
        CHECKED_BODY_LIMIT,
        max_line_size=getattr(handler, "max_line_size", 8190),
        max_headers=getattr(handler, "max_headers", 128),
        max_field_size=getattr(handler, "max_field_size", 8190),
    )


class _Unpaused:
    """The flow control of the head checker's bodies: none (nothing reads them)."""

    connected = True

    def pause_reading(self) -> None:
        """Nothing to pause: the socket is read for aiohttp's own handler."""

    def resume_reading(self, resume_parser: bool = True) -> None:
        """Nothing to resume."""


def _may_have_a_body(message: RawRequestMessage) -> bool:
    """Whether what follows ``message``'s head may be its body or another protocol."""
    return message.chunked or message.upgrade or "Content-Length" in message.headers


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
