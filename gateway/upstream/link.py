"""The connections to the upstream: one bounded pool of kept-alive connections, TLS as
configured, and one safe retry of a request whose pooled connection the upstream had
already closed.

The keep-alive race: the upstream closes a connection it holds idle just as the
gateway sends a request on it, and the request fails before any answer. A GET is
idempotent (RFC 9110 lets a client send it again), so it is retried, once, on a *new*
connection (a second session whose connections are never kept: another pooled one may
be closed as well), with what is left of its time. It is retried when the pooled
connection was closed before any byte of an answer, or reset before the answer's head
was complete (aiohttp does not say how much of a head it had read before a reset);
never after a timeout, after a head cut short by a close, or when the connection was
new (an upstream that accepts and drops connections is failing, and a retry would
only double the load on it). The client asks for no retry while the upstream fails.

aiohttp would retry by itself, on any connection, after any disconnect, and without
telling; so each session's middleware turns those disconnects into
:class:`ConnectionLost`, which aiohttp does not retry, marked retryable or not.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
import weakref
from collections.abc import Callable
from typing import Any

import aiohttp
import aiohttp.http_exceptions
from yarl import URL

from gateway import __version__
from gateway.config.settings import UpstreamSettings

log = logging.getLogger("gateway.upstream")
USER_AGENT = f"records-gateway/{__version__}"


class ConnectionLost(aiohttp.ClientConnectionError):
    """The upstream closed or reset the connection before its answer began;
    ``retryable`` when that connection came from the pool."""

    def __init__(self, reason: str, *, retryable: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


class PoolConnector(aiohttp.TCPConnector):
    """A TCPConnector that knows, for each request it connected, whether the connection
    had carried a request before (it came from the pool)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[object] = weakref.WeakSet()
        self._pooled: dict[int, bool] = {}  # by id of the request, while it is sent

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Any],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        if protocol is not None:
            self._pooled[id(req)] = protocol in self._handed_out
            self._handed_out.add(protocol)
        return connection

    def was_pooled(self, req: aiohttp.ClientRequest) -> bool:
        """Whether ``req`` went out on a pooled connection (asked once, after sending)."""
        return self._pooled.pop(id(req), False)


def _disconnects(connector: PoolConnector | None) -> aiohttp.ClientMiddlewareType:
    """The middleware that turns a connection lost before the answer into
    :class:`ConnectionLost` (retryable when ``connector`` says the connection was a
    pooled one)."""

    async def middleware(
        req: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        try:
            return await handler(req)
        except aiohttp.ClientConnectorError:
            raise  # no connection at all (refused, DNS, TLS handshake): not the race
        except (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError,
            aiohttp.ClientConnectionResetError,
        ) as exc:
            # a disconnect that cut a head short carries what was read of it
            began = isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(
                exc.message, str
            )
            pooled = connector is not None and connector.was_pooled(req)
            # (what was read of a head cut short is not quoted: it may hold the
            # upstream's cookies, and the detail reaches callers and /readyz)
            reason = "after part of its answer's head" if began else reason_of(exc)
            raise ConnectionLost(reason, retryable=pooled and not began) from exc
        finally:
            if connector is not None:
                connector.was_pooled(req)

    return middleware


class UpstreamLink:
    """The gateway's connections to one upstream (see the module's docstring)."""

    def __init__(self, settings: UpstreamSettings) -> None:
        self._settings = settings
        self._tls_files = _tls_files(settings)
        self._ssl: ssl.SSLContext | bool = settings.ssl_context() or True
        self._warn_unverified(settings)
        # upstream.max_connections bounds both: a tenth of it (at least one) is kept
        # for retries, whose connections are never pooled
        retries, pooled = retry_connections(settings.max_connections)
        self.pool = PoolConnector(
            limit=pooled,
            limit_per_host=pooled,
            ttl_dns_cache=60,
            enable_cleanup_closed=True,
        )
        self._session = _session(self.pool, _disconnects(self.pool), settings)
        fresh = aiohttp.TCPConnector(
            force_close=True,
            limit=retries,
            limit_per_host=retries,
            ttl_dns_cache=60,
            enable_cleanup_closed=True,
        )
        self._fresh = _session(fresh, _disconnects(None), settings)

    def reconfigure(self, settings: UpstreamSettings) -> None:
        """Take new TLS files (read again now: a certificate renewed in place) and
        timeouts. A new context only when a TLS setting or a file's bytes changed: the
        pool's connections belong to their context, and a reload that changes nothing
        must not make the pool connect again. A file that no longer loads keeps the
        context in use, with an error logged (the reload validated it a moment ago)."""
        files = _tls_files(settings)
        if files == self._tls_files:
            self._settings = settings
            return  # the same settings and bytes: the context, and its pool, stay
        try:
            self._ssl = settings.ssl_context() or True
            self._tls_files = files
        except ValueError as exc:
            log.error(
                "upstream TLS: the files do not load; the current ones stay",
                extra={"event": "upstream_tls", "error": str(exc)},
            )
        else:
            if settings.tls_verify != self._settings.tls_verify:
                self._warn_unverified(settings)
        self._settings = settings

    @staticmethod
    def _warn_unverified(settings: UpstreamSettings) -> None:
        if not settings.tls_verify:
            log.warning(
                "upstream TLS: upstream.tls_verify is false; the upstream's certificate"
                " and name are not checked, so anyone on the path can read the callers'"
                " tokens and answer in the upstream's place",
                extra={"event": "upstream_tls", "verify": False},
            )

    async def get(
        self,
        url: URL,
        *,
        headers: dict[str, str] | None = None,
        budget: aiohttp.ClientTimeout,
        retry: bool = True,
        on_retry: Callable[[], None] | None = None,
    ) -> aiohttp.ClientResponse:
        """GET ``url`` within ``budget``: the response once its head is in (to be released by the
        caller: ``async with``), after at most one retry on a new connection of a
        pooled connection lost before its answer, when ``retry`` allows (``on_retry``
        is told).

        Raises aiohttp's errors, and ConnectionLost when the connection was lost
        before the answer (and not retried, or the retry's was lost too)."""
        started = time.monotonic()
        try:
            return await self._session.get(
                url, headers=headers, timeout=budget, allow_redirects=False, ssl=self._ssl
            )
        except ConnectionLost as exc:
            if not (retry and exc.retryable):
                raise
            if on_retry is not None:
                on_retry()
            log.debug("upstream: a pooled connection was closed; retrying on a new one")
            left = budget  # what is left of it: the whole exchange stays within its total
            if budget.total is not None:
                total = max(budget.total - (time.monotonic() - started), 0.001)
                left = aiohttp.ClientTimeout(total=total, sock_connect=budget.sock_connect)
            return await self._fresh.get(
                url, headers=headers, timeout=left, allow_redirects=False, ssl=self._ssl
            )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has closed the pool (no request can go out on it)."""
        return self._session.closed and self._fresh.closed

    async def close(self) -> None:
        await self._session.close()
        await self._fresh.close()

    async def __aenter__(self) -> UpstreamLink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def retry_connections(max_connections: int) -> tuple[int, int]:
    """How ``upstream.max_connections`` is shared: (retries, pooled), one of each at
    least, and together no more than it from 2 on."""
    retries = max(1, max_connections // 10)
    return retries, max(1, max_connections - retries)


def _tls_files(settings: UpstreamSettings) -> tuple[object, ...]:
    """The TLS settings with the bytes of their files now (a file that cannot be read
    counts as changed: the new context's load says why)."""
    contents: list[object] = [settings.tls_verify]
    for path in (settings.ca_file, settings.client_cert_file, settings.client_key_file):
        if path is None:
            contents.append(None)
            continue
        try:
            contents.append((path, hashlib.sha256(path.read_bytes()).digest()))
        except OSError:
            contents.append((path, object()))
    return tuple(contents)


def _session(
    connector: aiohttp.BaseConnector,
    middleware: aiohttp.ClientMiddlewareType,
    settings: UpstreamSettings,
) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        # shared by every caller: a cookie one caller's answer sets upstream must never
        # go out with another caller's request, so no cookie is kept at all
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=timeouts(settings),
        headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
        trust_env=False,
        raise_for_status=False,
        auto_decompress=True,
        middlewares=(middleware,),
    )


def timeouts(settings: UpstreamSettings) -> aiohttp.ClientTimeout:
    """The whole exchange within ``timeout_s``; the TCP connect within ``connect_timeout_s``."""
    return aiohttp.ClientTimeout(
        total=settings.timeout_s,
        sock_connect=settings.connect_timeout_s,
    )


# What a parse error of an answer's head is, by how aiohttp's message begins: each a
# fixed name, never the message itself (it quotes the line it refused)
_HEAD_FAULTS = (
    ("Got more than", "a line of the answer's head too long"),
    ("Bad status line", "status line malformed"),
    ("Too many headers", "too many header fields"),
    ("Invalid character in chunk", "chunked body malformed"),
    ("Invalid character in Content-Length", "Content-Length malformed"),
    ("Content-Length", "Content-Length malformed"),
    ("Invalid header", "header field malformed"),
    ("Duplicate", "header field repeated"),
)


def reason_of(exc: BaseException) -> str:
    """What went wrong, in words a detail, a log line and /readyz can carry: a fixed
    name of the fault, or the system's words for a socket error. Never the request's
    URL (aiohttp's response errors quote it) nor any byte the upstream sent: aiohttp's
    parse errors quote the line they refused (a header echoing the caller's token, a
    cookie), and a disconnect's error holds the head read so far."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error.strerror or type(exc.os_error).__name__
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "Server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return _payload_fault(exc.__cause__)
    if isinstance(exc, aiohttp.ClientResponseError):
        message = exc.message if isinstance(exc.message, str) else ""
        for start, fault in _HEAD_FAULTS:
            if message.startswith(start):
                return fault
        return "the answer's head could not be parsed"
    if isinstance(exc, aiohttp.ClientOSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, ConnectionLost):
        return exc.reason
    return type(exc).__name__


def _payload_fault(cause: BaseException | None) -> str:
    if isinstance(cause, aiohttp.http_exceptions.ContentEncodingError):
        return "its Content-Encoding could not be decoded"
    if isinstance(cause, aiohttp.http_exceptions.ContentLengthError):
        return "shorter than its Content-Length"
    if isinstance(cause, aiohttp.http_exceptions.TransferEncodingError):
        return "chunked body malformed"
    return "its body could not be read"
