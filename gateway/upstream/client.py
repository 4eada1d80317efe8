"""The client for the upstream Financial Records Read API.

One :class:`UpstreamClient` per process sends over one :class:`UpstreamLink` (the
bounded pool, TLS, the one safe retry). It forwards a validated query (an
:class:`UpstreamQuery`: the records layer's ``RecordQuery`` is one), and turns every
way the upstream can fail into an :class:`UpstreamError`, so that no aiohttp exception
travels further.

Its circuit breaker (:class:`gateway.ops.circuit.CircuitBreaker`) counts the outages
(5xx, timeouts, refused or reset connections; not a 401, 404 or 429, which are answers
about one request): once it opens, calls fail at once with UpstreamCircuitOpen, without
reaching the upstream, until its reset time lets one trial through (a caller's request,
a background refresh or the readiness check). The pipeline serves stale entries
meanwhile; nothing waits for an upstream that is down.
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp import hdrs
from yarl import URL

from gateway.config.settings import UpstreamSettings
from gateway.errors import (
    UpstreamCircuitOpen,
    UpstreamContractError,
    UpstreamError,
    UpstreamFailed,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.ops.circuit import CircuitBreaker, CircuitState
from gateway.ops.metrics import Metrics
from gateway.ops.trace import current_trace, upstream_call
from gateway.ops.tracecontext import TRACEPARENT, TRACESTATE
from gateway.ops.tracing import UpstreamCall
from gateway.upstream.health import UpstreamHealth
from gateway.upstream.link import ConnectionLost, UpstreamLink, reason_of, timeouts
from gateway.upstream.retry_after import retry_after_of

_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_PASSED_THROUGH = {401, 403, 404, 429}
_READ_CHUNK = 64 * 1024
_URLS_KEPT = 64


class UpstreamRoute(Protocol):
    """What the client needs of a route: its name (the metrics label) and its path
    template (for messages)."""

    @property
    def name(self) -> str: ...

    @property
    def template(self) -> str: ...


class UpstreamQuery(Protocol):
    """What the client needs of a validated query."""

    @property
    def route(self) -> UpstreamRoute: ...

    @property
    def canonical_text(self) -> str: ...

    def upstream_path(self) -> str: ...

    def upstream_params(self, names: Mapping[str, str]) -> list[tuple[str, str]]: ...


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """A successful upstream answer: its status and its raw body."""

    status: int
    body: bytes
    elapsed_s: float


class UpstreamClient:
    """Forwards validated record requests to the upstream."""

    def __init__(
        self,
        link: UpstreamLink,
        settings: UpstreamSettings,
        *,
        breaker: CircuitBreaker | None = None,
        metrics: Metrics | None = None,
        health: UpstreamHealth | None = None,
    ) -> None:
        """``breaker``: the upstream's circuit breaker (None: calls are never held
        back, as for the conformance probe)."""
        self._link = link
        self._settings = settings
        self._timeout = timeouts(settings)
        self.breaker = breaker
        self._metrics = metrics
        self.health = health or UpstreamHealth()
        # the URL of each query asked lately (by its canonical text): made once, not
        # on every upstream call
        self._urls: dict[str, URL] = {}
        base = URL(settings.base_url)
        self._server: dict[str, str | int] = {
            "server.address": base.host or "",
            "server.port": base.port or 0,
        }

    @property
    def available(self) -> bool:
        """Whether a call may reach the upstream now: the circuit is closed, or open
        with a trial due (no I/O: what a request asks before waiting on the upstream)."""
        breaker = self.breaker
        return breaker is None or breaker.state is _CLOSED or breaker.trial_due()

    def circuit_open(self, what: str) -> UpstreamCircuitOpen:
        """The error of a call the open circuit holds back (``what``: the call). Its
        detail says nothing of the failures that opened it: those were other callers'
        requests (their details are in the log, and in /readyz's lastError)."""
        breaker = self.breaker
        assert breaker is not None
        # while a trial runs (half-open), it may take up to the upstream timeout
        wait = breaker.retry_after_s() if breaker.state is _OPEN else breaker.reset_s
        retry_after = max(1, math.ceil(wait))
        return UpstreamCircuitOpen(
            f"{what}: the upstream failed repeatedly (timeouts, 5xx or lost connections);"
            f" the gateway does not call it for about {retry_after} s",
            retry_after_s=retry_after,
        )

    def _admit(self, what: str) -> int | None:
        """The breaker's ticket for a call (None without a breaker); raises
        UpstreamCircuitOpen when the circuit holds the call back."""
        breaker = self.breaker
        if breaker is None:
            return None
        ticket = breaker.admit()
        if ticket is None:
            raise self.circuit_open(what)
        return ticket

    @property
    def timeout_s(self) -> float:
        """The bound of one whole upstream exchange (live: a reload changes it)."""
        return self._settings.timeout_s

    def reconfigure(self, settings: UpstreamSettings) -> None:
        """Apply new timeouts, parameter names and TLS files (a reload); the pool stays
        (connections made under other TLS settings are not shared with new ones)."""
        self._settings = settings.model_copy(update={"base_url": self._settings.base_url})
        self._timeout = timeouts(settings)
        self._urls = {}
        self._link.reconfigure(self._settings)

    @property
    def base_url(self) -> str:
        return self._settings.base_url

    async def check(self) -> None:
        """Readiness check: the upstream answers at all (any status below 500).

        It sends no token: a 401 proves the upstream is there. It goes through the
        circuit breaker as any call does: while the circuit is open it fails at once,
        and once a trial is due it may be the trial. Its success proves less than a
        caller's 200 (an authenticating proxy may answer 401 for a backend that is
        down), so it closes the circuit on probation: the next failure reopens it.
        """
        breaker = self.breaker
        ticket = self._admit("readiness check")
        url = URL(self._settings.base_url + "/users", encoded=True)
        timeout = aiohttp.ClientTimeout(
            total=min(self._settings.timeout_s, 5.0), sock_connect=self._timeout.sock_connect
        )
        try:
            response = await self._link.get(url, budget=timeout, retry=self._retrying())
            status = response.status
            response.release()
        except (TimeoutError, aiohttp.ClientError) as exc:
            why = (
                self._not_connected(exc)
                if isinstance(exc, aiohttp.ClientConnectorError)
                else reason_of(exc)
            )
            detail = f"readiness check: {why}"
            if breaker is not None:
                breaker.failed(detail, ticket)
            raise UpstreamUnavailable(detail) from exc
        except BaseException:
            if breaker is not None:
                breaker.abandoned(ticket)  # as in fetch
            raise
        if status >= 500:
            detail = f"readiness check: upstream status {status}"
            if breaker is not None:
                breaker.failed(detail, ticket)
            raise UpstreamFailed(detail, upstream_status=status)
        if breaker is not None:
            breaker.succeeded(ticket, conclusive=False)

    def _not_connected(self, exc: aiohttp.ClientConnectorError) -> str:
        """Why no connection to the upstream was made, for a detail: an untrusted
        certificate and a failed handshake are named as such (the TLS keys fix them)."""
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            error = exc.certificate_error
            why = error.verify_message if isinstance(error, ssl.SSLCertVerificationError) else ""
            return f"the upstream's TLS certificate was not trusted ({why or error})"
        if isinstance(exc, aiohttp.ClientConnectorSSLError):
            return f"the TLS handshake with the upstream failed ({reason_of(exc)})"
        hint = self._tls_hint() if isinstance(exc.os_error, ConnectionResetError) else ""
        return f"cannot connect to the upstream ({reason_of(exc)}){hint}"

    def _tls_hint(self) -> str:
        """What a connection closed before any answer may mean over TLS: an upstream
        that asks for a client certificate closes the connection of a client without
        one (TLS 1.3 says so only after the handshake)."""
        settings = self._settings
        if settings.base_url.startswith("https://") and settings.client_cert_file is None:
            return (
                "; if the upstream asks for a client certificate, set"
                " upstream.client_cert_file and upstream.client_key_file"
            )
        return ""

    def _retrying(self) -> bool:
        """Whether a call may be sent again after the keep-alive race: only while the
        upstream is healthy (never a trial's, never while failures come in a row, so
        that a failing upstream is never asked twice for one call)."""
        return self.breaker is None or self.breaker.quiet

    def url_for(self, query: UpstreamQuery) -> URL:
        """The full upstream URL for ``query``, with the path prefix of ``base_url``."""
        url = self._urls.get(query.canonical_text)
        if url is None:
            text = self._settings.base_url + query.upstream_path()
            params = query.upstream_params(self._settings.param_names)
            if params:
                text += "?" + urlencode(params, quote_via=quote, safe="")
            url = URL(text, encoded=True)
            if len(self._urls) >= _URLS_KEPT:
                self._urls.clear()
            self._urls[query.canonical_text] = url
        return url

    async def fetch(
        self, query: UpstreamQuery, *, authorization: str, request_id: str
    ) -> UpstreamReply:
        """GET ``query`` upstream with the caller's Authorization header, verbatim, and
        the trace context of the request it is made for (``gateway.ops.trace``): a
        ``traceparent`` of the request's trace whose parent id is this call's span,
        and the caller's ``tracestate``.

        Returns the 2xx answer; raises an UpstreamError for anything else.
        """
        breaker = self.breaker
        template = query.route.template
        ticket = self._admit(f"GET {template}")
        started = time.perf_counter()
        outcome = "error"
        call = upstream_call(
            f"GET {template}",
            {"http.request.method": "GET", "url.template": template, **self._server},
        )
        try:
            reply = await self._fetch(query, authorization, request_id, call)
            outcome = str(reply.status)
            self.health.succeeded()
            if breaker is not None:
                breaker.succeeded(ticket)
            return reply
        except UpstreamError as exc:
            outcome = outcome_of(exc)
            if is_outage(exc):
                # /readyz shows it to anyone: the fault, not the request it was for
                self.health.failed(exc.detail.removeprefix(f"GET {template}: "))
                if breaker is not None:
                    breaker.failed(exc.detail, ticket)
            else:
                self.health.succeeded()
                if breaker is not None:
                    # an answer about this request: the upstream is up
                    breaker.succeeded(ticket)
            raise
        except BaseException:
            # cancelled, or a fault nobody expected: the call reports nothing, and in
            # half-open another call may be the trial (the circuit is never stuck)
            if breaker is not None:
                breaker.abandoned(ticket)
            raise
        finally:
            elapsed = time.perf_counter() - started
            call.end(outcome)
            if self._metrics is not None:
                self._metrics.upstream_called(query.route.name, outcome, elapsed)
            trace = current_trace()
            if trace is not None:
                trace.upstream_status = outcome
                trace.upstream_ms = round(elapsed * 1000, 2)

    async def _fetch(
        self, query: UpstreamQuery, authorization: str, request_id: str, call: UpstreamCall
    ) -> UpstreamReply:
        url = self.url_for(query)
        headers = {
            "Authorization": authorization,
            "X-Request-ID": request_id,
            TRACEPARENT: call.traceparent,
        }
        tracestate = call.tracestate
        if tracestate is not None:
            headers[TRACESTATE] = tracestate
        started = time.perf_counter()
        what = f"GET {query.route.template}"
        metrics = self._metrics
        retried = None if metrics is None else metrics.upstream_retries.labels(query.route.name).inc
        try:
            async with await self._link.get(
                url,
                headers=headers,
                budget=self._timeout,
                retry=self._retrying(),
                on_retry=retried,
            ) as response:
                status = response.status
                if not 200 <= status < 300:
                    raise _status_error(what, status, response.headers.getall(hdrs.RETRY_AFTER, []))
                body = await self._read_limited(response, what)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{what}: the upstream did not answer within {self._settings.timeout_s:g} s"
                f" (connect timeout {self._settings.connect_timeout_s:g} s)"
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable(f"{what}: {self._not_connected(exc)}") from exc
        except ConnectionLost as exc:
            raise UpstreamUnavailable(
                f"{what}: the upstream closed the connection before answering"
                f" ({exc.reason}){self._tls_hint()}"
            ) from exc
        except aiohttp.ClientPayloadError as exc:
            raise UpstreamUnavailable(
                f"{what}: the upstream's answer was cut off ({reason_of(exc)})"
            ) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(
                f"{what}: the connection to the upstream failed ({reason_of(exc)})"
            ) from exc
        return UpstreamReply(status=status, body=body, elapsed_s=time.perf_counter() - started)

    async def _read_limited(self, response: aiohttp.ClientResponse, what: str) -> bytes:
        limit = self._settings.max_body_bytes
        length = response.content_length
        if length is not None and length > limit:
            raise _too_large(what, limit, response.status)
        if length is not None and hdrs.CONTENT_ENCODING not in response.headers:
            return await response.read()  # its length is what it says, within the limit
        # counted as decoded: a compressed body's length says nothing of its size
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                chunks.clear()  # not held by this frame for as long as the error lives
                raise _too_large(what, limit, response.status)
            chunks.append(chunk)
        return b"".join(chunks)


def _too_large(what: str, limit: int, status: int) -> UpstreamContractError:
    return UpstreamContractError(
        f"{what}: the upstream's body is larger than upstream.max_body_bytes ({limit})",
        upstream_status=status,
    )


def _status_error(
    what: str, status: int, retry_after: list[str]
) -> UpstreamRejected | UpstreamFailed:
    if status in _PASSED_THROUGH:
        meaning = {
            401: "the upstream did not accept the bearer token",
            403: "the upstream refused access to this record",
            404: "the upstream has no such record",
            429: "the upstream is rate limiting this caller",
        }[status]
        return UpstreamRejected(
            f"{what}: {meaning} (upstream status {status})",
            upstream_status=status,
            retry_after=retry_after_of(retry_after, datetime.now(UTC)) if status == 429 else None,
        )
    if status >= 500:
        return UpstreamFailed(
            f"{what}: the upstream failed with status {status}", upstream_status=status
        )
    return UpstreamFailed(
        f"{what}: the upstream answered {status} to a request the gateway had validated;"
        " the gateway and the upstream disagree on the API",
        upstream_status=status,
    )


def outcome_of(exc: UpstreamError) -> str:
    """The status label of a failed call: the upstream's status, or what went wrong."""
    if exc.upstream_status is not None and not isinstance(exc, UpstreamContractError):
        return str(exc.upstream_status)
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, UpstreamUnavailable):
        return "unreachable"
    return "invalid-body"


def is_outage(exc: UpstreamError) -> bool:
    """Whether the upstream itself is failing (not merely refusing one request)."""
    if isinstance(exc, UpstreamTimeout | UpstreamUnavailable):
        return True
    return isinstance(exc, UpstreamFailed) and (exc.upstream_status or 500) >= 500
