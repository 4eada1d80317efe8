"""The HTTP edge around every handler: request ids, errors as problems, the access log
and the request metrics.

It wraps each handler (``Edge.wrap``) instead of being an aiohttp middleware, because
aiohttp calls a handler directly when an application has no middleware (served as
plain aiohttp, one does stand in front: ``gateway.http.unrouted``). Unknown paths
and other methods reach handlers of their own (``not_found``, ``method_not_allowed``,
and ``gateway.http.unrouted`` for what no route takes), so they get the same problem
responses. What aiohttp runs before any handler, the ``Expect`` field's handler, is
the edge's too (``Edge.expectation``), on every route. A request line that is not
HTTP/1.1 or HTTP/1.0 is answered 505 before any handler runs, with an HTTP/1.1 status
line, and its connection closed. A request that asks to switch protocols, and a
``CONNECT``, are answered as HTTP/1.1 and their connection closed (the gateway takes no
upgrade and tunnels nothing, and aiohttp's parser drops what is pipelined behind such
a request).

:meth:`Edge.record_answer` is the one place where an answered request is counted and
logged: the wrapped handlers call it, and so does the fast path (``gateway.fastpath``)
for what it answers without aiohttp (:meth:`Edge.record_hit`). :meth:`Edge.rejected`
is the answer to a request aiohttp's parser refuses, whichever way in it came.

The fast path reaches the rest of the application through the edge alone
(``EDGE``): its bookkeeping, the records' lookup port (``Edge.lookup``) and the handler
of a request with no path (``Edge.pathless``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.http import RawRequestMessage
from multidict import istr

from gateway.config.live import LiveConfig
from gateway.errors import GatewayError, UpstreamContractError
from gateway.http.problems import (
    expectation_failed,
    internal_problem,
    problem_for_error,
    problem_for_http,
    version_not_supported,
)
from gateway.http.rejections import Refusals, problem_for_rejected, refusal_kind
from gateway.ops.metrics import Metrics
from gateway.ops.trace import CACHE_LOOKUP, CACHE_READ, CURRENT_TRACE, RequestTrace
from gateway.ops.tracecontext import (
    TRACEPARENT,
    TRACESTATE,
    caller_context,
    new_trace_id,
    parse_traceparent,
)
from gateway.ops.tracing import NO_TRACER, Tracer, Untraced
from gateway.records.lookup import RecordLookup

log = logging.getLogger("gateway.http")
access_log = logging.getLogger("gateway.access")
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
X_REQUEST_ID = istr("X-Request-ID")  # an istr: looked up without case folding
_TRACEPARENT = istr(TRACEPARENT)
_TRACESTATE = istr(TRACESTATE)
EXPECT = istr("Expect")
_UPGRADE = istr("Upgrade")
_CONNECTION = istr("Connection")
SPOKEN_VERSIONS = (HttpVersion11, HttpVersion10)
_CONTINUE = "100-continue"
_INTERIM_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
UNMATCHED = "other"  # the metrics label of paths the gateway does not have
REQUEST_ID = web.RequestKey("request_id", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


class RequestIds:
    """New request ids: a random prefix per process and a counter; unique and cheap."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._next = itertools.count(1).__next__

    def new(self) -> str:
        return f"{self._prefix}{self._next():016x}"


def choose_request_id(given: str | None, ids: RequestIds) -> str:
    """The caller's X-Request-ID when it is safe to echo, otherwise a new one."""
    if given is not None and REQUEST_ID_PATTERN.fullmatch(given):
        return given
    return ids.new()


class Edge:
    """The edge of one application: what every request passes through on its way in
    and out, whichever handler answers it."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        live: LiveConfig,
        ids: RequestIds | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        """``tracer``: makes the spans of the record routes (``gateway.ops.tracing``;
        the application sets its own once it starts)."""
        self.metrics = metrics
        self.ids = ids or RequestIds()
        self.live = live
        self.tracer = tracer
        # set by the application: the records' lookup port, and the answer to a request
        # with no path at all (what the router would give it, had it offered it one)
        self.lookup: RecordLookup | None = None
        self.pathless: Handler | None = None
        self.refusals = Refusals()

    def request_id(self, given: str | None) -> str:
        """The id of a request that came with ``given`` as its X-Request-ID."""
        return choose_request_id(given, self.ids)

    def wrap(
        self, handler: Handler, route: str = UNMATCHED, template: str | None = None
    ) -> Handler:
        """``handler`` with a request id, its trace (the caller's ``traceparent``
        continued, or a new trace), problem responses for every error, the access log
        line and the request metrics; ``route`` is its metrics label, ``template`` the
        route template of its span (None: the tracer records none, as for the health,
        metrics and admin routes)."""
        metrics = self.metrics

        async def handle(request: web.Request) -> web.StreamResponse:
            started = time.perf_counter()
            headers = request.headers
            request_id = self.request_id(headers.get(X_REQUEST_ID))
            request[REQUEST_ID] = request_id
            traceparents = headers.getall(_TRACEPARENT, None)
            caller = None
            if traceparents is not None:
                caller = caller_context(traceparents, headers.getall(_TRACESTATE, ()))
            span = (
                Untraced.of(caller)
                if template is None
                else self.tracer.request(request.method, template, caller, request_id, started)
            )
            # the layers below fill what the request did for its access log line, and
            # make their spans inside the request's
            trace = RequestTrace(span)
            token = CURRENT_TRACE.set(trace)
            metrics.busy += 1
            response: web.StreamResponse
            status: int | None = None  # None: the caller went away before its answer
            cache = "none"
            try:
                if request.version in SPOKEN_VERSIONS:
                    response = await _run_handler(handler, request, request_id, route)
                    if request.method == "CONNECT" or (
                        _UPGRADE in headers and asks_to_switch(request)
                    ):
                        response.force_close()
                    response.headers[X_REQUEST_ID] = request_id
                else:
                    response = version_not_supported(request, request_id)
                    response.force_close()
                    response.headers[X_REQUEST_ID] = request_id
                    await _prepare_as_http_11(request, response)
                status = response.status
                cache = response.headers.get("X-Cache", "NONE").lower()
            finally:
                metrics.busy -= 1
                CURRENT_TRACE.reset(token)
                span.end(status, cache)
            self.record_answer(
                request.method, route, response.status, cache, started, request_id, trace
            )
            return response

        handle.__name__ = getattr(handler, "__name__", "handle")
        return handle

    def expectation(self, route: str = UNMATCHED) -> ExpectHandler:
        """The expect handler of ``route``'s resource. aiohttp runs it before the route's
        handler (and before any middleware) when a request has an ``Expect`` field.

        ``100-continue`` is met: an HTTP/1.1 request gets the interim ``100 Continue``,
        as from aiohttp's own handler (HTTP/1.0 has none, RFC 9110 10.1.1). Any other
        expectation is answered 417 here, as a problem counted and logged like every
        answer (aiohttp's own answer is plain text, and a 500 when the field is not
        UTF-8). A request line of another version is left to the handler's 505."""

        async def expect(request: web.Request) -> web.StreamResponse | None:
            version = request.version
            if version not in SPOKEN_VERSIONS:
                return None
            if _only_continue(request.headers.getall(EXPECT, ())):
                if version == HttpVersion11:
                    writer = request.writer
                    try:
                        await writer.write(_INTERIM_CONTINUE)
                    except ConnectionError:
                        # the caller is gone: nobody to answer, and nothing to log at
                        # error level (aiohttp's own handler lets this escape)
                        gone = web.Response(status=400)
                        gone.force_close()
                        return gone
                    # the answer itself has not begun (aiohttp's own handler does the same)
                    writer.output_size = 0
                return None
            started = time.perf_counter()
            request_id = self.request_id(request.headers.get(X_REQUEST_ID))
            response = expectation_failed(request, request_id)
            response.headers[X_REQUEST_ID] = request_id
            if request.body_exists or request.method == "CONNECT" or asks_to_switch(request):
                # whether its body follows is the caller's guess: no next request can be
                # told apart from it (nor after an upgrade request, see asks_to_switch)
                response.force_close()
            self.record_answer(
                request.method,
                route,
                417,
                "none",
                started,
                request_id,
                traceparent=request.headers.get(_TRACEPARENT),
            )
            return response

        return expect

    def record_answer(
        self,
        method: str,
        route: str,
        status: int,
        cache: str,
        started: float,
        request_id: str,
        trace: RequestTrace | None = None,
        token_fingerprint: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        """Count one answered request and write its access log line (what the request
        did upstream, and its trace, are in ``trace``; a hit has none, only the token's
        fingerprint and the caller's ``traceparent``, read only for the line)."""
        elapsed = time.perf_counter() - started
        self.metrics.count_answer(route, status, cache, elapsed)
        if self.live.settings.log.access:
            upstream_status = upstream_ms = None
            if trace is None:
                caller = None if traceparent is None else parse_traceparent(traceparent)
                trace_id = new_trace_id() if caller is None else caller.trace_id
            else:
                trace_id = trace.trace_id
                upstream_status, upstream_ms = trace.upstream_status, trace.upstream_ms
                token_fingerprint = trace.token_fingerprint
            access_log.info(
                "request",
                extra={
                    "request_id": request_id,
                    "trace_id": trace_id,
                    "method": method,
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                    "cache": cache,
                    "upstream_status": upstream_status,
                    "upstream_ms": upstream_ms,
                    "token_fingerprint": token_fingerprint,
                },
            )

    def record_hit(
        self,
        route: str,
        template: str,
        started: float,
        request_id: str,
        token_fingerprint: str,
        traceparent: str | None,
        status: int = 200,
    ) -> None:
        """Count and log a hit answered without aiohttp (the fast path; ``status``: 200,
        or 304 for a conditional request), with the spans the route's handler would
        have made: the request's and its cache read's, both begun at ``started`` and
        ended now."""
        trace = None
        if self.tracer.recording:
            caller = None if traceparent is None else parse_traceparent(traceparent)
            span = self.tracer.request("GET", template, caller, request_id, started)
            with span.child(CACHE_READ, started) as cache_read:
                cache_read.set(CACHE_LOOKUP, "found")
            span.end(status, "hit")
            trace = RequestTrace(span, token_fingerprint=token_fingerprint)
        self.record_answer(
            "GET",
            route,
            status,
            "hit",
            started,
            request_id,
            trace,
            token_fingerprint=token_fingerprint,
            traceparent=traceparent,
        )

    def rejected(
        self,
        request: web.BaseRequest,
        status: int,
        exc: BaseException | None,
        started: float,
    ) -> web.Response:
        """The problem answer (``gateway.http.rejections``) to a request aiohttp would
        answer by itself: one its parser refuses (``exc``), or an error outside every
        handler; counted and logged, and its connection closed after it."""
        return self.refused(request, status, refusal_kind(exc), started)

    def refused(
        self,
        request: web.BaseRequest,
        status: int,
        kind: str,
        started: float,
        method: str | None = None,
    ) -> web.Response:
        """:meth:`rejected`, for a refusal of ``kind`` (``gateway.http.rejections``);
        ``method``, the one logged when not the request's."""
        request_id = self.request_id(request.headers.get(X_REQUEST_ID))
        problem = problem_for_rejected(request, status, kind, request_id)
        problem.headers[X_REQUEST_ID] = request_id
        problem.force_close()
        if problem.status >= 500:  # aiohttp logged the traceback, without the id
            log.error(
                "unhandled error outside the handlers",
                extra={"request_id": request_id, "status": problem.status},
            )
        self.record_answer(
            method or request.method,
            UNMATCHED,
            problem.status,
            "none",
            started,
            request_id,
            traceparent=request.headers.get(TRACEPARENT),
        )
        return problem


EDGE = web.AppKey("edge", Edge)


async def _run_handler(
    handler: Handler, request: web.Request, request_id: str, route: str
) -> web.StreamResponse:
    """The handler's response, or the problem response of what it raised."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        return problem_for_http(request, exc, request_id)
    except GatewayError as exc:
        if isinstance(exc, UpstreamContractError):
            log.warning(
                "upstream contract violation",
                extra={
                    "event": "upstream_contract",
                    "request_id": request_id,
                    "route": route,
                    "detail": exc.detail,
                },
            )
        return problem_for_error(request, exc, request_id)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unhandled error", extra={"request_id": request_id, "route": route})
        return internal_problem(request, request_id)


def asks_to_switch(request: web.BaseRequest) -> bool:
    """Whether ``request`` asks to switch protocols: an ``Upgrade`` field, with
    ``upgrade`` among the ``Connection`` options (RFC 9110 7.8), as aiohttp's parser
    reads it. The gateway takes no upgrade, and aiohttp's parser does not read what
    follows such a request in the same read as requests: its connection must close
    once it is answered, or the requests behind it would wait for the keep-alive
    timeout unanswered."""
    headers = request.headers
    if not headers.get(_UPGRADE):
        return False
    return any(
        option.strip(" \t").lower() == "upgrade"
        for field in headers.getall(_CONNECTION, ())
        for option in field.split(",")
    )


async def _prepare_as_http_11(request: web.Request, response: web.StreamResponse) -> None:
    """``response``'s status line and fields written as HTTP/1.1, the version the
    gateway speaks, for a request line of another (aiohttp writes the request's own,
    ``HTTP/2.0 505``, which no caller of that version reads); aiohttp then writes its
    body. The request is read as HTTP/1.1 for that alone, through aiohttp's public
    request type."""
    message = RawRequestMessage(
        request.method,
        request.path,
        HttpVersion11,
        request.headers,
        request.raw_headers,
        True,  # should_close
        None,  # compression
        False,  # upgrade
        False,  # chunked
        request.rel_url,
    )
    as_http_11 = web.BaseRequest(
        message,
        request.content,
        request.protocol,
        request.writer,
        request.task,
        asyncio.get_running_loop(),
    )
    await response.prepare(as_http_11)


def _only_continue(fields: Iterable[str]) -> bool:
    """Whether the ``Expect`` fields ask for nothing but ``100-continue`` (empty list
    members are no expectation, RFC 9110 5.6.1)."""
    return all(
        member.strip(" \t").lower() in ("", _CONTINUE)
        for field in fields
        for member in field.split(",")
    )


async def not_found(request: web.Request) -> web.StreamResponse:
    """Every path the gateway does not have."""
    raise web.HTTPNotFound()


def method_not_allowed(
    allowed: Iterable[str], guard: Callable[[web.Request], None] | None = None
) -> Handler:
    """The handler of the other methods of a path: 405 with ``Allow``, once ``guard``
    (which raises to refuse the request, as the admin token check does) let it through:
    a path that needs a credential shows its methods to no one without it."""
    methods = set(allowed)

    async def handle(request: web.Request) -> web.StreamResponse:
        if guard is not None:
            guard(request)
        raise web.HTTPMethodNotAllowed(request.method, methods)

    return handle
