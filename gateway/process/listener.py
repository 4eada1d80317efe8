"""The listening socket of one gateway process, and what serves each connection on it.

With the fast path, a connection is served by its own handler
(``gateway.fastpath.connection``). Without it (``server.fast_path = false``, or the
fast path stepped aside at start), it is served by aiohttp's handler behind
:class:`HeadCuts`, which hands it what the socket reads in pieces, each ending where a
request head can end (an empty line): aiohttp's parser drops the requests it read in a
call whose bytes end with a malformed head, so that those pipelined ahead of it in the
same read would get no answer. Fed piece by piece, each request ahead of a malformed
one is answered, in order, then the 400, then the connection closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from gateway.fastpath.connection import FastPathServer

# the most pieces one read is cut into; the rest of the read goes whole. aiohttp's
# parser refuses every piece fed after a malformed head again (one 400 queued each, not
# answered), which this bounds; no caller pipelines as many requests in one read
PIECES_MAX = 256
# connections the kernel queues before the server accepts them (aiohttp's default)
BACKLOG = 128


class HeadCuts(asyncio.Protocol):
    """The protocol of one connection: ``handler``'s (aiohttp's, made by its public
    ``web.Server``), fed what arrives cut after each empty line, at most
    ``PIECES_MAX`` pieces a read. A read holding one head end at most (the usual case)
    goes whole, after one search. Any cut of the stream reads the same to the parser."""

    __slots__ = ("_feed", "_handler")

    def __init__(self, handler: asyncio.Protocol) -> None:
        self._handler = handler
        self._feed = handler.data_received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._handler.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def data_received(self, data: bytes) -> None:
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


def connection_factory(server: web.Server) -> Callable[[], asyncio.Protocol]:
    """What makes the protocol of each connection ``server`` (a runner's, set up)
    serves: its own connections with the fast path, aiohttp's behind
    :class:`HeadCuts` otherwise."""
    if isinstance(server, FastPathServer):
        return server
    return lambda: HeadCuts(server())


async def listen(
    runner: web.AppRunner, host: str, port: int, *, reuse_port: bool = False
) -> asyncio.Server:
    """Listen on ``host``:``port`` for ``runner`` (set up). To stop: close the server
    this returns (no new connections), then ``runner.cleanup()``, which lets the
    requests in flight finish and closes the connections."""
    server = runner.server
    if server is None:
        raise RuntimeError("listen: the runner is not set up")
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        connection_factory(server),
        host,
        port,
        backlog=BACKLOG,
        reuse_port=reuse_port or None,
    )
