"""The front door: the request handler aiohttp's server calls first, and the runner
that installs it.

aiohttp hands every request to ``Application._handle``, which resolves the route,
builds and freezes its match info and looks for ``Expect`` before the handler runs;
on this machine that costs about a quarter of what a bare handler's request costs
(bench/README.md). A cache hit needs none of it: the path alone names the route.
:func:`front_door` tries the record routes' shortcuts (``RecordRoutes.shortcuts``: a
fresh hit held in this process, or None) for a GET whose path is exactly what the
router would match to a record route, and hands everything else, including every
request a shortcut declines, to the application unchanged.

"Exactly what the router would match": aiohttp's router matches the URL's
``path_safe`` (the path decoded except ``%2F`` and ``%25``) against each route's
pattern (``/accounts/{accountId:[^/]+}``) and decodes those two in the id it matched.
The front door reads the same string the same way, so ``/accounts%2FACC-002``, which
the router gives to no route (404), is not taken for ``/accounts/ACC-002``, and
``/accounts/a%2Fb`` is the id ``a/b`` for both. tests/test_front.py holds the two to
agreeing, on random paths and on a served gateway.

What the front door answers never passes through the application: an aiohttp
middleware or ``on_response_prepare`` signal would not see it. ``create_app``
registers neither (a test holds it to that); the edge's work (request id, metrics,
access log) is done by the shortcut itself.

:class:`GatewayRunner` is ``web.AppRunner`` with the front door in place; the server
and the test suite both run the gateway through it. Its server
(:class:`GatewayServer`) also answers what aiohttp answers by itself, a request its
HTTP parser rejects, as an RFC 9457 problem instead of aiohttp's plain text, which
quotes the offending line back (an Authorization header, say).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

from gateway.edge import UNMATCHED, X_REQUEST_ID
from gateway.handlers import HitTarget, RecordRoutes, Shortcut
from gateway.problems import problem_for_rejected
from gateway.request_head import may_become_head, read_head
from gateway.state import RECORDS, SHORTCUT_DECLINED

log = logging.getLogger("gateway.http")
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# the most of an unfinished request head a connection holds before handing it to
# aiohttp (whose limits then apply: 32 KiB a line, 128 header lines); a line longer
# than read_head reads is handed over at once
HELD_MAX = 64 * 1024
# the longest head a connection remembers with what it resolved to (a few usual
# headers and a JWT of a kilobyte or so fit): the most it keeps of its caller's
REMEMBERED_HEAD_MAX = 2048
_BODY_FIELDS = (b"content-length:", b"transfer-encoding:", b"upgrade:")


def front_door(
    app_handler: Handler,
    shortcuts: Mapping[str, Shortcut],
    id_shortcuts: Mapping[str, Shortcut],
) -> Handler:
    """``app_handler`` behind ``shortcuts`` (a list route's path -> its shortcut) and
    ``id_shortcuts`` (an id route's parent path -> its shortcut, given the id)."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.method == hdrs.METH_GET and hdrs.EXPECT not in request.headers:
            path = request.rel_url.path_safe  # what the router matches
            value: str | None = None
            shortcut = shortcuts.get(path)
            if shortcut is None:
                parent, _, segment = path.rpartition("/")
                shortcut = id_shortcuts.get(parent) if segment else None
                value = routed_id(segment)
            if shortcut is not None:
                # the server's request factory is the application's: a web.Request
                full = cast(web.Request, request)
                response = shortcut(full, value)
                if response is not None:
                    return response
                full[SHORTCUT_DECLINED] = True  # the route's handler need not try again
        return await app_handler(request)

    return handle


def routed_id(segment: str) -> str:
    """The id the router gives for ``segment`` of ``path_safe``: its ``%2F`` and ``%25``
    decoded, the only escapes ``path_safe`` keeps (aiohttp's ``_unquote_path_safe``)."""
    if "%" not in segment:
        return segment
    return segment.replace("%2F", "/").replace("%25", "%")


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` serving the application through a :class:`GatewayServer`."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the application started and frozen
        records = self.app[RECORDS]
        return GatewayServer(
            made,
            front_door(made.request_handler, records.shortcuts, records.id_shortcuts),
            records=records,
        )


class GatewayServer(web.Server):
    """The application's aiohttp server with the front door as its handler; its
    connections answer the errors aiohttp answers itself (a request its parser
    rejects) as RFC 9457 problems, and it tells the record routes when a connection
    closes (they forget what they remembered of it)."""

    def __init__(self, made: web.Server, handler: Handler, *, records: RecordRoutes) -> None:
        # the request factory and options of the server aiohttp made for the app
        super().__init__(
            handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **made._kwargs,
        )
        self._records = records
        # aiohttp's Server drops options its RequestHandler does not take (and warns);
        # here a wrong option fails the runner's setup, not every connection
        inspect.signature(RequestHandler).bind(self, loop=self._loop, **self._kwargs)

    def __call__(self) -> RequestHandler:
        return GatewayConnection(self, self._records, loop=self._loop, **self._kwargs)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._records.fingerprints.forget(handler)
        super().connection_lost(handler, exc)


class GatewayConnection(RequestHandler):
    """aiohttp's handler of one connection, which answers a fresh hit on a plain
    kept-alive GET from the bytes it receives, and whose own error answers are
    problems, with a request id, counted and logged as the edge does for every other
    answer.

    Hits from the bytes: while aiohttp has nothing of this connection's in hand (no
    request queued or being handled, no answer waiting for the socket to drain),
    each whole request head that arrives is read by ``gateway.request_head`` and
    resolved by ``RecordRoutes.resolve_head``; a fresh hit's ready-made answer is
    written at once, with no request object, task switch, router or response object.
    Every other head goes to aiohttp whole, in order; once one has, the whole heads
    behind it go to aiohttp too, in one piece (its parser then keeps its own bound on
    the requests it queues), so answers keep the order of requests. A head not
    complete yet is held here while it may still become one ``read_head`` reads
    (``may_become_head``, at most ``HELD_MAX`` bytes). Anything that is not a head of
    ours to frame hands the connection to aiohttp for good, which then applies its own
    rules and limits as it always did: heads that may announce a body or an upgrade,
    heads of which aiohttp's parser does not make one message each (empty lines, an
    HTTP/2 preface it waits to see the rest of, a queue full enough that it holds
    requests back), and an unfinished head that cannot become one read here.

    The connection keeps the last head it resolved (up to ``REMEMBERED_HEAD_MAX``
    bytes) with what it resolved to, so a caller repeating the same request is read
    once: like the token's fingerprint (gateway.connections), it lives exactly as
    long as the connection.
    """

    __slots__ = (
        "_edge",
        "_fields_max",
        "_held",
        "_last_head",
        "_last_target",
        "_line_max",
        "_records",
    )

    def __init__(self, manager: web.Server, records: RecordRoutes, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._records: RecordRoutes | None = records
        self._edge = records.edge
        self._held = b""
        # read_head's limits, half of those aiohttp's parser applies to this connection,
        # so that nothing read here is what the parser would refuse
        self._line_max = min(self.max_line_size, self.max_field_size) // 2
        self._fields_max = self.max_headers // 2
        # the last head offered and what it resolved to: a client repeats the same
        # head (path, query, token) on a kept-alive connection, read once here
        self._last_head = b""
        self._last_target: HitTarget | None = None

    def data_received(self, data: bytes) -> None:
        records = self._records
        # no bytes: aiohttp re-reading what its parser held back while its queue was full;
        # with caching off (the backend is fixed for the process's life), no head read
        # here could be a hit
        if records is None or not data or (records.caching_pipeline() is None and not self._held):
            super().data_received(data)
            return
        if self._held:
            data = self._held + data
            self._held = b""
        start = 0
        while True:
            end = data.find(b"\r\n\r\n", start) + 4
            if end == 3:  # no whole head (left)
                break
            if not self._aiohttp_idle():
                # aiohttp has this connection's earlier requests in hand: every whole
                # head that follows is for it too, handed over in one piece, so that
                # its parser keeps its own bound on the requests it queues
                end = data.rfind(b"\r\n\r\n") + 4
                if not self._handed_over(data, start, end):
                    return
                start = end
                break
            head = data[start:end] if start or end != len(data) else data
            answer = self._answer(records, head)
            if answer is not None:
                self._answered(answer)
            elif not self._handed_over(data, start, end):
                return
            start = end
        rest = data[start:] if start else data
        if not rest:
            return
        if len(rest) <= HELD_MAX and may_become_head(rest, self._line_max, self._fields_max):
            self._held = rest
        else:  # aiohttp refuses (or reads) it now, with its own rules and limits
            self._records = None
            super().data_received(rest)

    def _handed_over(self, data: bytes, start: int, end: int) -> bool:
        """The whole heads ``data[start:end]`` handed to aiohttp; whether the
        connection stays ours to read (else everything after them went to aiohttp, and
        the connection is aiohttp's alone from now on).

        It does not when the heads may announce a body (what follows is not a head
        of ours to find), or when aiohttp's parser did not make one message of each
        head (empty lines, an HTTP/2 preface whose rest it waits for, a queue of
        requests full enough that it holds some back): its parser is then mid-way,
        and only it can tell where the next request starts."""
        heads = data[start:end]
        if _frames_a_body(heads):
            self._records = None
            super().data_received(data[start:])
            return False
        counted = self._request_count
        super().data_received(heads)
        made = self._request_count - counted
        if made == heads.count(b"\r\n\r\n") or self._force_close or self._close:
            return True
        self._records = None
        if end < len(data):
            super().data_received(data[end:])
        return False

    def _answer(self, records: RecordRoutes, head: bytes) -> tuple[bytes, bytes] | None:
        """The answer to ``head`` when it is a plain GET's fresh hit; None otherwise."""
        if head == self._last_head:
            target = self._last_target
        else:  # (caching off, data_received hands every byte to aiohttp before this)
            read = read_head(head, self._line_max, self._fields_max)
            target = None if read is None else records.resolve_head(read, self)
            # a head not resolved now may be later; a long one is not kept
            if target is not None and len(head) <= REMEMBERED_HEAD_MAX:
                self._last_head, self._last_target = head, target
        answer = None if target is None else records.answer_target(target)
        if answer is None and target is self._last_target:
            # not a fresh hit now, or resolved under settings since reloaded: read again
            self._last_head, self._last_target = b"", None
        return answer

    def _aiohttp_idle(self) -> bool:
        """aiohttp waits for this connection's next request, with nothing in hand."""
        waiter = self._waiter
        return (
            waiter is not None
            and not waiter.done()
            and not self._messages
            and not self._buffer_paused
            and not self._force_close
            and not self._close
            and not self.writing_paused
        )

    def _answered(self, answer: tuple[bytes, bytes]) -> None:
        """``answer`` (head and body, sent in one system call without joining them)
        sent; the connection's idle time starts again, as after any answer."""
        assert self.transport is not None
        self.transport.writelines(answer)
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
        # aiohttp's own: logs the error (gateway.logs keeps the request's text out)
        # and raises ConnectionError when an answer has begun; its text is dropped
        started = time.perf_counter()  # what came before the error is not known here
        plain = super().handle_error(request, status, exc, message)
        edge = self._edge
        request_id = edge.request_id(request.headers.get(X_REQUEST_ID))
        problem = problem_for_rejected(request, plain.status, exc, request_id)
        problem.headers[X_REQUEST_ID] = request_id
        problem.force_close()
        if problem.status >= 500:  # aiohttp logged the traceback, without the id
            log.error(
                "unhandled error outside the handlers",
                extra={"request_id": request_id, "status": problem.status},
            )
        # the server's request factory is the application's: a web.Request
        edge.answered(request.method, UNMATCHED, problem.status, "none", started, request_id)
        return problem


def _frames_a_body(head: bytes) -> bool:
    """Whether ``head`` may announce a body or a protocol switch: what follows it is
    then not a head of ours to find (matched loosely: a false yes only costs speed)."""
    lowered = head.lower()
    return any(field in lowered for field in _BODY_FIELDS)
