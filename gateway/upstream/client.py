"""The client for the upstream Financial Records Read API.

One :class:`UpstreamClient` per process wraps one shared ``aiohttp.ClientSession``
with a bounded connection pool. It forwards a validated query (an :class:`UpstreamQuery`:
the records layer's ``RecordQuery`` is one), and
turns every way the upstream can fail into an :class:`UpstreamError`, so that no
aiohttp exception travels further.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlencode

import aiohttp
from aiohttp import hdrs
from yarl import URL

from gateway import __version__
from gateway.config.settings import UpstreamSettings
from gateway.errors import (
    UpstreamContractError,
    UpstreamError,
    UpstreamFailed,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.ops.metrics import Metrics
from gateway.ops.trace import current_trace
from gateway.upstream.health import UpstreamHealth

USER_AGENT = f"records-gateway/{__version__}"
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

    def upstream_params(self, bank_code_param: str) -> list[tuple[str, str]]: ...


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """A successful upstream answer: its status and its raw body."""

    status: int
    body: bytes
    elapsed_s: float


def create_session(settings: UpstreamSettings) -> aiohttp.ClientSession:
    """The one shared session: a bounded pool, explicit timeouts, no cookies."""
    connector = aiohttp.TCPConnector(
        limit=settings.max_connections,
        limit_per_host=settings.max_connections,
        ttl_dns_cache=60,
        enable_cleanup_closed=True,
    )
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
    )


def timeouts(settings: UpstreamSettings) -> aiohttp.ClientTimeout:
    """The whole exchange within ``timeout_s``; the TCP connect within ``connect_timeout_s``."""
    return aiohttp.ClientTimeout(
        total=settings.timeout_s,
        sock_connect=settings.connect_timeout_s,
    )


class UpstreamClient:
    """Forwards validated record requests to the upstream."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: UpstreamSettings,
        *,
        metrics: Metrics | None = None,
        health: UpstreamHealth | None = None,
    ) -> None:
        self._session = session
        self._settings = settings
        self._timeout = timeouts(settings)
        self._metrics = metrics
        self.health = health or UpstreamHealth()
        # the URL of each query asked lately (by its canonical text): made once, not
        # on every upstream call
        self._urls: dict[str, URL] = {}

    @property
    def timeout_s(self) -> float:
        """The bound of one whole upstream exchange (live: a reload changes it)."""
        return self._settings.timeout_s

    def reconfigure(self, settings: UpstreamSettings) -> None:
        """Apply new timeouts and parameter names (a reload); the session and its pool
        stay."""
        self._settings = settings.model_copy(update={"base_url": self._settings.base_url})
        self._timeout = timeouts(settings)
        self._urls = {}

    @property
    def base_url(self) -> str:
        return self._settings.base_url

    async def check(self) -> None:
        """Readiness check: the upstream answers at all (any status below 500).

        It sends no token: a 401 proves the upstream is there.
        """
        url = URL(self._settings.base_url + "/users", encoded=True)
        timeout = aiohttp.ClientTimeout(total=min(self._settings.timeout_s, 5.0))
        try:
            async with self._session.get(url, timeout=timeout, allow_redirects=False) as response:
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamUnavailable(f"readiness check: {_reason(exc)}") from exc
        if status >= 500:
            raise UpstreamFailed(
                f"readiness check: upstream status {status}", upstream_status=status
            )

    def url_for(self, query: UpstreamQuery) -> URL:
        """The full upstream URL for ``query``, with the path prefix of ``base_url``."""
        url = self._urls.get(query.canonical_text)
        if url is None:
            text = self._settings.base_url + query.upstream_path()
            params = query.upstream_params(self._settings.bank_code_param)
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
        """GET ``query`` upstream with the caller's Authorization header, verbatim.

        Returns the 2xx answer; raises an UpstreamError for anything else.
        """
        started = time.perf_counter()
        outcome = "error"
        try:
            reply = await self._fetch(query, authorization, request_id)
            outcome = str(reply.status)
            self.health.succeeded()
            return reply
        except UpstreamError as exc:
            outcome = _outcome(exc)
            if _is_outage(exc):
                self.health.failed(exc.detail)
            else:
                self.health.succeeded()
            raise
        finally:
            elapsed = time.perf_counter() - started
            if self._metrics is not None:
                self._metrics.upstream_called(query.route.name, outcome, elapsed)
            trace = current_trace()
            if trace is not None:
                trace.upstream_status = outcome
                trace.upstream_ms = round(elapsed * 1000, 2)

    async def _fetch(
        self, query: UpstreamQuery, authorization: str, request_id: str
    ) -> UpstreamReply:
        url = self.url_for(query)
        headers = {"Authorization": authorization, "X-Request-ID": request_id}
        started = time.perf_counter()
        what = f"GET {query.route.template}"
        try:
            async with self._session.get(
                url, headers=headers, timeout=self._timeout, allow_redirects=False
            ) as response:
                status = response.status
                if not 200 <= status < 300:
                    raise _status_error(what, status, response.headers.get("Retry-After"))
                body = await self._read_limited(response, what)
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{what}: the upstream did not answer within {self._settings.timeout_s:g} s"
                f" (connect timeout {self._settings.connect_timeout_s:g} s)"
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable(
                f"{what}: cannot connect to the upstream ({_reason(exc)})"
            ) from exc
        except aiohttp.ClientPayloadError as exc:
            raise UpstreamUnavailable(
                f"{what}: the upstream's answer was cut off ({_reason(exc)})"
            ) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailable(
                f"{what}: the connection to the upstream failed ({_reason(exc)})"
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
                raise _too_large(what, limit, response.status)
            chunks.append(chunk)
        return b"".join(chunks)


def _too_large(what: str, limit: int, status: int) -> UpstreamContractError:
    return UpstreamContractError(
        f"{what}: the upstream's body is larger than upstream.max_body_bytes ({limit})",
        upstream_status=status,
    )


def _status_error(
    what: str, status: int, retry_after: str | None
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
            retry_after=retry_after,
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


def _outcome(exc: UpstreamError) -> str:
    """The status label of a failed call: the upstream's status, or what went wrong."""
    if exc.upstream_status is not None and not isinstance(exc, UpstreamContractError):
        return str(exc.upstream_status)
    if isinstance(exc, UpstreamTimeout):
        return "timeout"
    if isinstance(exc, UpstreamUnavailable):
        return "unreachable"
    return "invalid-body"


def _is_outage(exc: UpstreamError) -> bool:
    """Whether the upstream itself is failing (not merely refusing one request)."""
    if isinstance(exc, UpstreamTimeout | UpstreamUnavailable):
        return True
    return isinstance(exc, UpstreamFailed) and (exc.upstream_status or 500) >= 500


def _reason(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return exc.os_error.strerror or type(exc.os_error).__name__
    return str(exc) or type(exc).__name__
