"""One client connection of the fast path: aiohttp's connection handler, which answers a
fresh hit on a plain kept-alive GET from the bytes it receives, and whose own error
answers (a request aiohttp's parser rejects) are problems.

Hits from the bytes: while aiohttp has nothing of this connection's in hand (no
request queued or being handled, no answer waiting for the socket to drain), each
whole request head that arrives is read by ``request_head.HeadReader`` and looked up
through the records' port (``gateway.records.lookup``, the only part of the records
the fast path sees): ``RecordLookup.resolve`` (the query remembered, or validated as
the route's handler would; the key), then ``held`` (what this process holds: the
memory backend, whose one read a miss carries, the near cache) or ``look_up`` (read
from the shared cache: Redis, behind the breaker, in a batch with the other reads of
the same turn of the event loop; meanwhile what the caller sends next waits here).
A hit is written with no request object, router or response object: the same reply a
full read would give, in the representation the head's ``Accept-Encoding`` asks for,
its headers those of ``RecordLookup.hit_fields`` as bytes, counted and logged by
``Edge.record_hit``. A miss (absent, stale, the cache unusable) sends the request
aiohttp's way with the miss kept here, and the server's handler runs the request's
handler within it (``gateway.records.lookup.handing``): the handler serves it without
validating, keying or reading the cache again.

Every other head goes to aiohttp whole, in order; once one has, the whole heads behind
it go to aiohttp too, so answers keep the order of requests. Each goes in a
``data_received`` call of its own: aiohttp's parser drops the messages it made in a call
whose bytes end with a malformed one, so requests pipelined ahead of a malformed head
would get no answer. Once the connection is aiohttp's for good, what arrives is still
cut at empty lines for it, for the same reason (``_feed``). Heads are handed over
only while aiohttp's queue of requests has room; the rest wait here, as they would
in its parser, until it drains. With caching off nothing is a hit, but the heads are
handed over one by one all the same.
A head not complete yet is held in a
:class:`~gateway.fastpath.request_head.PendingHead`, which checks each byte once, under
aiohttp's own limits for this connection. Anything that is not a head of ours to frame
hands the connection to aiohttp for good: heads that may announce a body or an
upgrade, heads of which aiohttp's parser does not make one message each, and an
unfinished head that cannot become one read here.

A connection opens as an :class:`OpeningConnection`, a light protocol that answers
the reads that are each one whole head of a fresh hit held in the process, and
becomes a :class:`GatewayConnection` (the transport's protocol from then on) at the
first read that is anything else; a connection whose every request is such a hit never
makes aiohttp's handler. Within a :class:`GatewayConnection`, aiohttp's own handling
of the connection (its task, which waits for the requests its parser makes) begins
with the first request handed to it: until then the connection
is made, kept alive and closed as aiohttp would (``connection_made``,
``_process_keepalive``, ``close``), and a connection whose every request is a hit (a
script's one request, with ``Connection: close``) never makes a task or waits a turn
of the event loop for aiohttp.

The connection keeps the last head it resolved (up to ``REMEMBERED_HEAD_MAX`` bytes)
with what it resolved to (:class:`HeadMemory`), so a caller repeating the same request
is read once; like the token's fingerprint (``fingerprints``), it lives as long as the
connection, through its change of protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from typing import Any, NamedTuple, cast

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from yarl import URL

from gateway.fastpath.fingerprints import ConnectionFingerprints, ConnectionMemo
from gateway.fastpath.request_head import HeadReader, PendingHead
from gateway.http.edge import Edge
from gateway.http.hits import FieldParts, Fields, Handler, not_modified_fields
from gateway.http.runner import handler
from gateway.records.lookup import (
    CacheEntry,
    Hit,
    Miss,
    RecordLookup,
    Representation,
    Target,
    etag_matches,
    handing,
)

log = logging.getLogger("gateway.http")
# the longest head a connection remembers with what it resolved to (a few usual
# headers and a JWT of a kilobyte or so fit): the most it keeps of its caller's
REMEMBERED_HEAD_MAX = 2048
# what a connection holds of what its caller sends while an answer is read from the
# shared cache, before it stops reading the socket until the answer is out
HELD_MAX = 256 * 1024
# the most a connection holds behind a head whose entry it reads from the shared cache
# (past it the head goes aiohttp's way): what is held is copied once per such read
LOOKUP_REST_MAX = 16 * 1024
# at the start of a header line (a query or another field's value may hold the words)
_BODY_FIELDS = (b"\r\ncontent-length:", b"\r\ntransfer-encoding:", b"\r\nupgrade:")
_OK = b"HTTP/1.1 200 OK\r\n"
# how the head of an answer that closes its connection ends (the last field is ours:
# no caller's value holds a CR)
_CLOSING = b"\r\nConnection: close\r\n\r\n"
_NOT_MODIFIED_LINE = b"HTTP/1.1 304 Not Modified\r\n"
# "Content-Length: " and the line's end, around the digits
_LENGTH_FIELD_SIZE = len(b"Content-Length: \r\n")
_SERVER = f"Server: {SERVER_SOFTWARE}\r\n".encode("latin-1")
_SERVER_SIZE = len(_SERVER)
_NO_TARGET = URL.build(path="", encoded=True)


class HitTarget(NamedTuple):
    """A plain GET's head resolved to what its lookup reads (``target``), with what its
    answer and log line take of the head."""

    target: Target
    request_id: str | None  # the caller's X-Request-ID
    traceparent: str | None  # the caller's, read only when the hit is logged or traced
    authorization: str  # the header a miss handed on is matched by
    if_none_match: str | None  # the caller's: a hit whose ETag it names is a 304
    close: bool  # Connection: close: the connection closes after the answer


class WireHeads(FieldParts[bytes]):
    """The status line and header fields of hit replies as bytes, up to ``Date``: those
    of ``RecordLookup.hit_fields(hit, now)``, made once and kept in the three parts of
    ``gateway.http.hits.FieldParts`` (the status line with the first, ``Content-Length``
    and ``Server`` with the last), so that a head is three lookups and a join
    however many entries are hit and however rarely. The 304's (variant ``False``) is
    the same less the fields of the body it does not have (``Content-Type``,
    ``Content-Encoding``, ``Content-Length``), as the handler's 304 has them: its own
    first part, and the last with ``Content-Length`` cut out."""

    def __call__(
        self, entry: CacheEntry, now: float, representation: Representation, modified: bool = True
    ) -> bytes:
        before, timed, after = self.parts(entry, now, representation, modified)
        if not modified:  # its Content-Length cut out, ahead of Server
            cut = len(after) - _SERVER_SIZE - _length_field_size(representation.body)
            return b"".join((before, timed, after[:cut], _SERVER))
        return b"".join((before, timed, after))

    def made(
        self, parts: tuple[Fields, Fields, Fields], representation: Representation, variant: Any
    ) -> tuple[bytes, bytes, bytes]:
        before_fields, timed_fields, after_fields = parts
        status = _OK
        if not variant:
            status, before_fields = _NOT_MODIFIED_LINE, not_modified_fields(parts)
        before, timed, after = (
            "".join(f"{name}: {value}\r\n" for name, value in part)
            for part in (before_fields, timed_fields, after_fields)
        )
        length = f"Content-Length: {len(representation.body)}\r\n"
        return (
            status + before.encode("latin-1"),
            timed.encode("latin-1"),
            (after + length).encode("latin-1") + _SERVER,
        )


def _length_field_size(body: bytes) -> int:
    """The bytes of the ``Content-Length`` field of ``body``, line end included."""
    return _LENGTH_FIELD_SIZE + len(str(len(body)))


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


class Hits:
    """What the connections of one server share to answer hits: the edge and the
    records' lookup port, the token fingerprints per connection, and the ready-made
    heads."""

    def __init__(self, edge: Edge, lookup: RecordLookup) -> None:
        self.edge = edge
        self.lookup = lookup
        self.fingerprints = ConnectionFingerprints()
        self.heads = WireHeads(lookup.hit_fields)
        self.date = DateField()

    def resolve(self, head: bytes, memo: ConnectionMemo, reader: HeadReader) -> HitTarget | None:
        """What a hit on ``head`` (read by the connection's ``reader``, whose tokens'
        fingerprints are in ``memo``) looks up, when it is a plain GET of a record
        route with a valid query and a bearer token; None otherwise."""
        read = reader.read(head)
        if read is None or read.authorization is None:
            return None
        target = self.lookup.resolve(
            read.path, read.query, read.authorization, read.accept_encoding, memo
        )
        if target is None:
            return None
        return HitTarget(
            target,
            read.request_id,
            read.traceparent,
            read.authorization,
            read.if_none_match,
            read.close,
        )

    def hit_answer(self, target: HitTarget, hit: Hit, started: float) -> tuple[bytes, bytes]:
        """The answer (head and body) to the request ``target`` came from, a fresh hit
        (``hit``, looked up since ``started``), counted and logged: its 200, or a 304
        when the request's ``If-None-Match`` names the representation's ETag."""
        edge = self.edge
        request_id = edge.request_id(target.request_id)
        representation = hit.representation
        status, body = 200, representation.body
        if target.if_none_match is not None and etag_matches(
            target.if_none_match, representation.etag
        ):
            status, body = 304, b""
        fields = self.heads(
            hit.entry, target.target.pipeline.clock(), representation, status == 200
        )
        end = _CLOSING if target.close else b"\r\n\r\n"
        head = b"".join((fields, self.date(), b"X-Request-ID: ", request_id.encode(), end))
        route = target.target.query.route
        edge.record_hit(
            route.name,
            route.template,
            started,
            request_id,
            target.target.fingerprint,
            target.traceparent,
            status,
        )
        return head, body

    def probe(
        self, head: bytes, memory: HeadMemory
    ) -> tuple[HitTarget, Hit | Miss | None, float] | None:
        """What ``head`` (one whole head, read by a connection that remembers
        ``memory``) looks up, what the process holds for it
        (``RecordLookup.held``: its one read of the process's entries) and when the
        look began; None when it is no plain GET of a record route with a valid query
        and a bearer token, or caching is off."""
        started = time.perf_counter()
        if self.lookup.caching_pipeline() is None:
            return None
        target = memory.target(self, head)
        if target is None:
            return None
        return target, self.lookup.held(target.target), started


class HeadMemory:
    """What one connection remembers of its heads, as long as it lives: its tokens'
    fingerprints (``memo``), its reader (which remembers the last header block), and
    the last head it resolved (up to ``REMEMBERED_HEAD_MAX`` bytes) with its target,
    so that a caller repeating the same request is read once."""

    __slots__ = ("last_head", "last_target", "memo", "reader")

    def __init__(self, hits: Hits, reader: HeadReader) -> None:
        self.memo = ConnectionMemo(hits.fingerprints)
        self.reader = reader
        self.last_head = b""
        self.last_target: HitTarget | None = None

    def target(self, hits: Hits, head: bytes) -> HitTarget | None:
        """What a hit on ``head`` looks up (see :meth:`Hits.resolve`)."""
        if head == self.last_head:
            return self.last_target
        target = hits.resolve(head, self.memo, self.reader)
        # a head not resolved now may be later; a long one is not kept
        if target is not None and len(head) <= REMEMBERED_HEAD_MAX:
            self.last_head, self.last_target = head, target
        return target

    def forget_last(self) -> None:
        """The last head is read again when it comes again."""
        self.last_head, self.last_target = b"", None


class GatewayConnection(RequestHandler):
    """aiohttp's handler of one connection, with hits from the bytes and problems for
    what aiohttp's parser rejects (see the module's docstring)."""

    __slots__ = (
        "_awaiting",
        "_backlog",
        "_gateway_edge",
        "_hits",
        "_hold_fields",
        "_hold_line",
        "_holding",
        "_looked_up_paused",
        "_memory",
        "_miss",
        "_pending",
        "_read_meanwhile",
        "_reading",
        "_started",
    )

    def __init__(self, manager: web.Server, hits: Hits, memory: HeadMemory, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._hits: Hits | None = hits
        self._gateway_edge = hits.edge
        self._pending: PendingHead | None = None
        # whole heads (and what follows them) not handed to aiohttp yet: its queue of
        # requests was full, and it stopped reading the socket until it drains
        self._backlog = b""
        # a head is held under the limits aiohttp's parser applies to this connection,
        # and read only within half of them (the reader of FastPathServer.head_memory),
        # so that nothing read here is what the parser would refuse
        self._hold_line = min(self.max_line_size, self.max_field_size)
        self._hold_fields = self.max_headers
        # what the connection remembers of its heads (its opening's)
        self._memory = memory
        # while holding, what arrives is kept (the connection's next requests, read
        # after): while the entry of the head awaiting is read from the shared cache,
        # or while aiohttp comes back from answering the request before
        self._holding = False
        self._awaiting = b""
        self._read_meanwhile = b""
        self._looked_up_paused = False
        self._reading: asyncio.Task[Hit | Miss] | None = None
        # the miss of the request last handed to aiohttp after its lookup, with the
        # target and Authorization it is matched by (see take_miss)
        self._miss: tuple[str, str, Miss] | None = None
        # whether aiohttp's own handling of the connection has begun (_start_aiohttp)
        self._started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """What aiohttp does when a connection is made, but its task and TCP keep-alive:
        the connection is its server's (shut down with it) and kept alive as long as
        aiohttp would; aiohttp's handling of requests begins with the first it is
        handed (:meth:`_start_aiohttp`), so a connection whose every request is a hit
        never makes a task, a waiter or a turn of the event loop for aiohttp.

        Nor does such a connection set ``SO_KEEPALIVE`` (aiohttp does, from its first
        request): it is idle only between requests, and closed once idle for the
        keep-alive timeout (at most an hour, ``server.keepalive_timeout_s``), before
        the kernel would send its first probe (``tcp_keepalive_time``, two hours by
        default). The option cost a fifth of the requests per second of callers that
        open a connection per request (bench/README.md)."""
        stream = cast(asyncio.Transport, transport)
        self.transport = stream
        assert self._manager is not None
        self._manager.connection_made(self, stream)
        self._keep_alive()

    def _start_aiohttp(self) -> None:
        """aiohttp's handling of this connection, begun before it is handed anything."""
        if self._started:
            return
        self._started = True
        transport = self.transport
        if transport is None:
            return  # closed meanwhile: nothing to hand on
        if self._keepalive_handle is not None:  # aiohttp schedules its own
            self._keepalive_handle.cancel()
            self._keepalive_handle = None
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._memory.memo.forget()  # what it remembered of the connection's tokens
        super().connection_lost(exc)

    def close(self) -> None:
        """aiohttp's (the server stops: what is in hand is answered, then the connection
        closes); a connection aiohttp was never handed a request of is closed now when
        no read of the shared cache is under way, as aiohttp closes its idle ones."""
        super().close()
        if not self._started and not self._holding:
            self.force_close()

    def data_received(self, data: bytes) -> None:
        hits = self._hits
        if hits is None:
            self._feed(data)
            return
        if self._holding:
            if not data:
                super().data_received(data)
                return
            self._read_meanwhile += data
            if len(self._read_meanwhile) > HELD_MAX and self.transport is not None:
                # a caller sending on and on while its answer is read: stop reading
                self.transport.pause_reading()
                self._looked_up_paused = True
            return
        if not data:
            # aiohttp's queue drained: it re-reads what its parser held back, and the
            # heads held here go on to it before it reads the socket again
            super().data_received(data)
            data, self._backlog = self._backlog, b""
            if not data:
                return
        elif self._backlog:  # read before aiohttp stopped reading the socket
            self._backlog += data
            return
        pending = self._pending
        if pending is not None:
            complete = pending.feed(data)
            if complete == 0:
                return
            self._pending = None
            data = bytes(pending.data)
            if complete < 0:
                self._hand_over_for_good(data)
                return
        self._heads(hits, data)

    def _heads(self, hits: Hits, data: bytes, start: int = 0, waited: bool = False) -> None:
        """Answer or hand over, one by one, the whole heads in ``data[start:]`` (which
        starts a request), and hold what is left of it. ``waited``: aiohttp was waited
        for once already (see :meth:`_wait_for_aiohttp`)."""
        # with caching off (fixed for the process's life) nothing here is a hit
        caching = hits.lookup.caching_pipeline() is not None
        while True:
            end = data.find(b"\r\n\r\n", start) + 4
            if end == 3:  # no whole head (left)
                break
            answer: tuple[bytes, bytes] | HitTarget | None = None
            if caching and not waited and self._aiohttp_coming_back():
                self._wait_for_aiohttp(hits, data[start:])
                return
            waited = False
            # while aiohttp has this connection's earlier requests in hand, every head
            # that follows is for it too
            if caching and self._aiohttp_idle():
                head = data[start:end] if start or end != len(data) else data
                try:
                    answer = self._answer_held(hits, head)
                except Exception:
                    # a fault here must not cost the caller its answer: aiohttp's way
                    # answers the request (with its own problem if the fault is there too)
                    log.exception("fast path: a hit failed; aiohttp answers the request")
                    self._memory.forget_last()
            if isinstance(answer, HitTarget):
                if len(data) - end <= LOOKUP_REST_MAX:
                    # not held here: its entry is read from the shared cache, and the
                    # rest waits for its answer
                    self._look_up(hits, answer, data[start:end], data[end:])
                    return
                # a caller with much pipelined behind it: aiohttp's way, whose queue
                # and reading have their own bounds, rather than holding it all here
                answer = None
            if answer is not None:
                self._send_answer(answer)
                if self.transport is None:
                    return  # closed after it, as its caller asked
            elif self._buffer_paused and len(self._messages) >= self._max_msg_queue_size:
                # aiohttp holds as many requests as it queues, and stopped reading the
                # socket: the rest waits here until it drains (data_received(b""))
                self._backlog = data[start:]
                return
            elif not self._handed_over(data, start, end):
                return
            start = end
        if start == len(data):
            return
        pending = PendingHead(self._hold_line, self._hold_fields)
        if pending.feed(data[start:] if start else data) == 0:
            self._pending = pending
        else:  # aiohttp refuses (or reads) it now, with its own rules and limits
            self._hand_over_for_good(data[start:])

    def _aiohttp_coming_back(self) -> bool:
        """aiohttp has answered this connection's last request, and holds no other,
        but has not come back to wait for the next one yet (its task resumes once the
        handler's task has ended, a turn of the event loop later; the caller's next
        request may arrive in between). Taken for busy, that request and every one
        after it on the connection would go aiohttp's way, each answered in the same
        window as the one before it."""
        return (
            self._started
            and self._waiter is None
            and not self._messages
            and not self._request_in_progress
            and not self._force_close
            and not self._close
            and self.transport is not None
        )

    def _wait_for_aiohttp(self, hits: Hits, data: bytes) -> None:
        """Read ``data`` (and what follows it) once aiohttp is back: after everything
        already due to run in the event loop, which includes aiohttp's resuming task
        (it then waits for the next request, or closes the connection)."""
        self._holding = True
        self._read_meanwhile = data
        self._loop.call_soon(self._aiohttp_back, hits)

    def _aiohttp_back(self, hits: Hits) -> None:
        self._holding = False
        data, self._read_meanwhile = self._read_meanwhile, b""
        if self.transport is None:
            return  # the caller is gone
        self._heads(hits, data, waited=True)
        self._resume_if_held_little()

    def _look_up(self, hits: Hits, target: HitTarget, head: bytes, rest: bytes) -> None:
        """Read ``target``'s entry from the shared cache, then answer ``head`` (with it
        when it is a fresh hit, else by aiohttp's way) and go on with ``rest``."""
        started = time.perf_counter()
        self._holding = True
        self._awaiting = head
        self._read_meanwhile = rest
        self._keep_alive()  # the caller is not idle: its request is being answered
        read = self._loop.create_task(hits.lookup.look_up(target.target))
        self._reading = read
        read.add_done_callback(functools.partial(self._looked_up, hits, target, started))

    def _looked_up(
        self,
        hits: Hits,
        target: HitTarget,
        started: float,
        read: asyncio.Task[Hit | Miss],
    ) -> None:
        head, data = self._awaiting, self._awaiting + self._read_meanwhile
        self._awaiting = self._read_meanwhile = b""
        self._holding = False
        self._reading = None
        found = _outcome(read)
        if self.transport is None:
            return  # the caller is gone
        answer = None
        if isinstance(found, Hit) and self._hits is hits and self._aiohttp_idle():
            try:
                answer = hits.hit_answer(target, found, started)
            except Exception:
                log.exception("fast path: a hit failed; aiohttp answers the request")
        if answer is not None:
            self._send_answer(answer)
            if self.transport is None:
                return  # closed after it, as its caller asked
        else:
            if isinstance(found, Miss):  # the handler serves it with this read
                self._miss = (_target_of(head), target.authorization, found)
            if not self._handed_over(data, 0, len(head)):
                self._resume_if_held_little()
                return
        if len(data) > len(head):
            self._heads(hits, data, len(head))
        self._resume_if_held_little()

    def _resume_if_held_little(self) -> None:
        """Read the socket again, once what is held here is back under HELD_MAX,
        unless aiohttp stopped reading it (it resumes by itself)."""
        if (
            self._looked_up_paused
            and len(self._read_meanwhile) <= HELD_MAX
            and not self._buffer_paused
            and self.transport is not None
        ):
            self._looked_up_paused = False
            self.transport.resume_reading()

    def take_miss(self, request: web.BaseRequest) -> Miss | None:
        """The miss of the request this connection handed aiohttp last after looking
        it up, for that request's handler: taken once, by the first request that asks,
        and given only to one of the same target and Authorization (None otherwise)."""
        handed, self._miss = self._miss, None
        if handed is None:
            return None
        target, authorization, miss = handed
        if request.raw_path != target or request.headers.get("Authorization") != authorization:
            return None
        return miss

    async def shutdown(self, timeout: float | None = 15.0) -> None:  # noqa: ASYNC109
        """aiohttp's, once a request whose entry is being read from the shared cache
        is answered or handed on (within ``timeout``): aiohttp takes the connection for
        idle meanwhile, and would close it with the request unanswered."""
        reading = self._reading
        if reading is not None and not reading.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await asyncio.shield(reading)
            await asyncio.sleep(0)  # its done callback answers or hands the request on
        await super().shutdown(timeout)

    def _process_keepalive(self) -> None:
        if self._holding:
            # a request of the caller's is being answered: the connection is not idle
            self._keepalive_handle = None
            self._keep_alive()
            return
        if not self._started:  # idle since its last answer, as aiohttp would judge it
            self._keepalive_handle = None
            close_time = self._next_keepalive_close_time
            if self._loop.time() < close_time:
                self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)
            elif not self._force_close:
                self.force_close()
            return
        super()._process_keepalive()

    def hand_on(self, head: bytes) -> None:
        """``head`` (one whole head, the connection's first read) to aiohttp, as any
        head that is not a hit here."""
        self._handed_over(head, 0, len(head))

    def _hand_over_for_good(self, data: bytes) -> None:
        self._hits = None
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """``data`` to aiohttp's parser in pieces that each end where a head may (at an
        empty line), until one is refused: its parser drops the messages it made in a
        call whose bytes end with a malformed one, which would leave the requests
        ahead of it unanswered. Any cut of the stream reads the same to the parser;
        past a refusal nothing more is read (the connection closes after the 400)."""
        self._start_aiohttp()
        start = 0
        end = data.find(b"\r\n\r\n") + 4
        while 3 < end < len(data):
            queued = len(self._messages)
            super().data_received(data[start:end])
            if len(self._messages) > queued and isinstance(self._messages[-1][0], _ErrInfo):
                return
            start = end
            end = data.find(b"\r\n\r\n", start) + 4
        super().data_received(data[start:] if start else data)

    def _handed_over(self, data: bytes, start: int, end: int) -> bool:
        """The whole head ``data[start:end]`` handed to aiohttp; whether the connection
        stays ours to read (else everything after it went to aiohttp, and the
        connection is aiohttp's alone from now on).

        It does not when the head may announce a body (what follows is not a head of
        ours to find), or when aiohttp's parser did not make one message of it (empty
        lines, an HTTP/2 preface whose rest it waits for, a queue of requests full
        enough that it holds some back): its parser is then mid-way, and only it can
        tell where the next request starts."""
        head = data[start:end]
        if _frames_a_body(head):
            self._hand_over_for_good(data[start:])
            return False
        counted = self._request_count
        self._start_aiohttp()
        super().data_received(head)
        if self._request_count - counted == 1 or self._force_close or self._close:
            return True
        self._hits = None
        if end < len(data):
            self._feed(data[end:])
        return False

    def _answer_held(self, hits: Hits, head: bytes) -> tuple[bytes, bytes] | HitTarget | None:
        """The answer to ``head`` when it is a plain GET's fresh hit held here; its
        target when its entry may be in the shared cache instead; None otherwise."""
        probe = hits.probe(head, self._memory)
        if probe is None:
            return None
        return self._outcome(hits, head, *probe)

    def _outcome(
        self, hits: Hits, head: bytes, target: HitTarget, held: Hit | Miss | None, started: float
    ) -> tuple[bytes, bytes] | HitTarget | None:
        """What :meth:`_answer_held` answers once ``target``'s entry was looked for in
        the process (``held``, since ``started``): the hit's answer; the target, when
        its entry may be in the shared cache; None, the miss kept for the handler."""
        if isinstance(held, Hit):
            return hits.hit_answer(target, held, started)
        lookup = hits.lookup
        memory = self._memory
        if held is None:
            if lookup.shares(target.target):
                return target
            # nothing read, and no shared cache to read: the handler serves the miss
            held = Miss(target.target, None)
        self._miss = (_target_of(head), target.authorization, held)
        if target is memory.last_target:
            # not a fresh hit now, or resolved under settings since reloaded: read again
            memory.forget_last()
        return None

    def continue_with(
        self, head: bytes, target: HitTarget, held: Miss | None, started: float
    ) -> None:
        """Go on with ``head`` (one whole head, the connection's first read), which its
        opening resolved to ``target`` and looked for in the process (``held``, not a
        hit) since ``started``: read from the shared cache, or handed to aiohttp with
        its miss, as :meth:`_heads` goes on with any head."""
        hits = self._hits
        assert hits is not None
        answer = self._outcome(hits, head, target, held, started)
        if isinstance(answer, HitTarget):
            self._look_up(hits, answer, head, b"")
        else:
            self._handed_over(head, 0, len(head))

    def _aiohttp_idle(self) -> bool:
        """aiohttp waits for this connection's next request, with nothing in hand, and
        the socket takes what is written to it (or aiohttp has not begun: it was
        handed nothing yet)."""
        waiter = self._waiter
        return (
            (not self._started or (waiter is not None and not waiter.done()))
            and not self._messages
            and not self._buffer_paused
            and not self._force_close
            and not self._close
            and not self.writing_paused
            and not self._backed_up()
        )

    def _backed_up(self) -> bool:
        """More is waiting to be written than the transport's high-water mark. The
        transport says so itself (``pause_writing``) after ``write``, but asyncio's own
        ``writelines`` does not from Python 3.12: without this, a caller that sends
        requests and never reads would have their answers pile up in the process."""
        transport = self.transport
        return transport is None or _over_high_water(transport)

    def _send_answer(self, answer: tuple[bytes, bytes]) -> None:
        """``answer`` (head and body, sent in one system call without joining them)
        sent; the connection's idle time starts again, as after any answer."""
        assert self.transport is not None
        self.transport.writelines(answer)
        if answer[0].endswith(_CLOSING):
            # the caller asked for it (Connection: close): what it sent after is dropped,
            # as aiohttp drops it
            self.force_close()
            return
        self._keep_alive()

    def _keep_alive(self) -> None:
        """The connection's idle time starts again (as aiohttp starts it after an
        answer): its keep-alive timeout counts from now."""
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None and self._keepalive_timeout > 0:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own: logs the error (gateway.ops.logs keeps the request's text out)
        # and raises ConnectionError when an answer has begun; its text is dropped
        started = time.perf_counter()  # what came before the error is not known here
        plain = super().handle_error(request, status, exc, message)
        return self._gateway_edge.rejected(request, plain.status, exc, started)


class OpeningConnection(asyncio.Protocol):
    """A connection as it opens, before aiohttp has any part in it: while what each read
    brings is one whole head of a plain GET whose fresh hit this process holds, it is
    answered here (as :class:`GatewayConnection` answers it) and the connection stays
    this light protocol, idle between requests, closed by its server once idle for the
    keep-alive timeout or when the server stops (:meth:`FastPathServer.pre_shutdown`).

    Anything else (a head that is not such a hit, a read of more or less than one
    head, the transport asking to pause writing) makes the connection a
    :class:`GatewayConnection` for the rest of its life (the transport's protocol
    from then on, with what this one remembered of its heads), which reads that read
    as its own first. A connection whose every request is a hit (a script's one
    request, a caller repeating what is cached) never makes aiohttp's handler, whose
    making and undoing cost about as much as the hit itself."""

    __slots__ = ("_memory", "_server", "_transport", "idle_since")

    def __init__(self, server: FastPathServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._memory: HeadMemory | None = None
        self.idle_since = 0.0  # the loop's time of its last answer, or of its opening

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport while this is its protocol (None after)."""
        return self._transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self.idle_since = self._server.opened(self)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            return
        if data.find(b"\r\n\r\n") != len(data) - 4 or _over_high_water(transport):
            self._hand_over().data_received(data)
            return
        server = self._server
        hits = server.hits
        memory = self._memory
        if memory is None:
            memory = self._memory = server.head_memory()
        try:
            probe = hits.probe(data, memory)
            if probe is not None and isinstance(probe[1], Hit):
                answer = hits.hit_answer(probe[0], probe[1], probe[2])
            else:
                answer = None
        except Exception:
            # a fault here must not cost the caller its answer (see _heads)
            log.exception("fast path: a hit failed; aiohttp answers the request")
            memory.forget_last()
            self._hand_over().hand_on(data)
            return
        if answer is None:
            connection = self._hand_over()
            if probe is None:
                connection.data_received(data)
            else:  # not a hit: the handover goes on with the one read made
                target, held, started = probe
                connection.continue_with(data, target, cast(Miss | None, held), started)
            return
        transport.writelines(answer)
        if answer[0].endswith(_CLOSING):
            transport.close()  # as its caller asked; what it sent after is dropped
        else:
            self.idle_since = self._server.loop.time()

    def pause_writing(self) -> None:
        self._hand_over().pause_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        self._server.closed(self)
        if self._memory is not None:
            self._memory.memo.forget()

    def close(self) -> None:
        """Closed now (it has nothing in hand: every answer is written as it is read)."""
        if self._transport is not None:
            self._transport.close()

    def _hand_over(self) -> GatewayConnection:
        """The connection's :class:`GatewayConnection`, made its transport's protocol."""
        transport = self._transport
        assert transport is not None
        self._transport = None
        server = self._server
        server.closed(self)
        connection = server.connection(self._memory)
        connection.connection_made(transport)
        transport.set_protocol(connection)
        return connection


def _over_high_water(transport: asyncio.Transport) -> bool:
    """More is waiting to be written than ``transport``'s high-water mark (see
    :meth:`GatewayConnection._backed_up`)."""
    size = transport.get_write_buffer_size()
    return size > 0 and size > transport.get_write_buffer_limits()[1]


class FastPathServer(web.Server):
    """The application's aiohttp server whose connections open as :class:`OpeningConnection`
    (kept here until they close or become a :class:`GatewayConnection`, aiohttp's
    handler); it answers a request whose target has no path (``CONNECT host:443``) with
    the gateway's own resource of unrouted requests: aiohttp's router offers such a
    request to no resource, and runs its own ``Expect`` handler on it (whose answer is
    plain text, or a 500). A message aiohttp's parser made without a target (``CONNECT``
    with none) is given an empty one: aiohttp would fail the connection's task making
    its request, leaving the caller with neither an answer nor a closed connection. A
    request a connection handed on after its lookup missed is handled within
    :func:`gateway.records.lookup.handing` of that miss.

    ``edge`` is the application's, with its lookup port and its answer to a request with no
    path set."""

    def __init__(self, made: web.Server, edge: Edge, options: Mapping[str, Any]) -> None:
        lookup = edge.lookup
        if lookup is None:
            raise RuntimeError("the fast path needs the edge's lookup port")
        # aiohttp's handler of the application, behind the gateway's public server's
        # (hits and targets without a path), with the request factory and the options
        # of aiohttp's server of the application (gateway.http.runner)
        super().__init__(
            _handling(made.request_handler, handler(made.request_handler, edge)),
            request_factory=_with_a_url(made.request_factory),
            **options,
        )
        self.hits = Hits(edge, lookup)
        # what the server's connections take of the options (web.Server keeps its own)
        server_own = inspect.signature(web.Server).parameters
        self.options = {name: value for name, value in options.items() if name not in server_own}
        self.loop = asyncio.get_running_loop()
        # aiohttp's own Server drops an option its connections do not take (and warns);
        # here a wrong option fails the runner's setup, not every connection
        inspect.signature(RequestHandler).bind(self, loop=self.loop, **self.options)

        defaults = inspect.signature(RequestHandler).parameters

        def option(name: str) -> Any:
            return self.options.get(name, defaults[name].default)

        # the limits of the connections' parsers, within half of which a head is read
        # here (see GatewayConnection)
        self._hold_line = min(option("max_line_size"), option("max_field_size"))
        self._hold_fields = option("max_headers")
        self._keepalive_s: float = option("keepalive_timeout")
        self._opening: dict[OpeningConnection, None] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def __call__(self) -> OpeningConnection:  # type: ignore[override]
        return OpeningConnection(self)

    @property
    def opening(self) -> list[OpeningConnection]:
        """The connections open that aiohttp has no part in yet (aiohttp's own are
        ``connections``)."""
        return list(self._opening)

    def connection(self, memory: HeadMemory | None = None) -> GatewayConnection:
        """The :class:`GatewayConnection` of a connection, with what its opening
        remembered of its heads."""
        memory = memory or self.head_memory()
        return GatewayConnection(self, self.hits, memory, loop=self.loop, **self.options)

    def head_memory(self) -> HeadMemory:
        return HeadMemory(self.hits, HeadReader(self._hold_line // 2, self._hold_fields // 2))

    def opened(self, connection: OpeningConnection) -> float:
        """``connection`` opened: kept until it closes, is handed over, or has been idle
        for the keep-alive timeout; now, on the loop's clock."""
        self._opening[connection] = None
        if self._sweep is None:
            self._sweep = self.loop.call_later(self._sweep_every(), self._close_idle)
        return self.loop.time()

    def closed(self, connection: OpeningConnection) -> None:
        self._opening.pop(connection, None)

    def _sweep_every(self) -> float:
        """How often idle opening connections are looked for: an eighth of the
        keep-alive timeout, at most a second (so one closes at most that late)."""
        return min(1.0, self._keepalive_s / 8)

    def _close_idle(self) -> None:
        self._sweep = None
        deadline = self.loop.time() - self._keepalive_s
        for connection in [c for c in self._opening if c.idle_since <= deadline]:
            connection.close()
        if self._opening:
            self._sweep = self.loop.call_later(self._sweep_every(), self._close_idle)

    def pre_shutdown(self) -> None:
        """aiohttp's (its connections close once what they have in hand is answered),
        and the opening connections closed now: they have nothing in hand."""
        for connection in list(self._opening):
            connection.close()
        super().pre_shutdown()


def _handling(application: Handler, gateway: Handler) -> Handler:
    """The handler of a request aiohttp made of a head its connection handed on: within
    the miss the connection looked up for it, ``application`` (aiohttp's handler of
    the application: the lookup is made); otherwise ``gateway`` (the gateway's public
    server's handler, ``gateway.http.runner``: hits the fast path did not read, and
    targets without a path)."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if request.method != "GET" or not isinstance(connection, GatewayConnection):
            return await gateway(request)
        miss = connection.take_miss(request)
        if miss is None:
            return await gateway(request)
        with handing(miss):
            return await application(request)

    return handle


def _with_a_url(factory: Callable[..., web.BaseRequest]) -> Callable[..., web.BaseRequest]:
    """aiohttp's request ``factory``, with an empty target and URL (no path) for a
    message its parser left without them."""

    def make(message: Any, payload: Any, protocol: Any, *args: Any) -> web.BaseRequest:
        if message.url is None:
            message = message._replace(path="", url=_NO_TARGET)
        return factory(message, payload, protocol, *args)

    return make


def _outcome(read: asyncio.Task[Hit | Miss]) -> Hit | Miss | None:
    """What a lookup ended with (None: cancelled, or failed, which is logged)."""
    if read.cancelled():
        return None
    if read.exception() is not None:
        log.error(
            "fast path: a shared-cache read failed; aiohttp answers the request",
            exc_info=read.exception(),
        )
        return None
    return read.result()


def _target_of(head: bytes) -> str:
    """The request target of a head read here (``GET <target> HTTP/1.1``)."""
    return head[4 : head.index(b" HTTP/1.1\r\n")].decode("ascii")


def _frames_a_body(head: bytes) -> bool:
    """Whether ``head`` may announce a body or a protocol switch: what follows it is
    then not a head of ours to find (a field named so, whatever its value: a false yes
    only costs speed and the connection's later heads going to aiohttp as they come)."""
    lowered = head.lower()
    return any(field in lowered for field in _BODY_FIELDS)
