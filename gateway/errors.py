"""The gateway's exceptions. Third-party errors are translated into these at the
boundary where they happen (``raise UpstreamTimeout(...) from exc``), so that no
aiohttp or redis exception reaches a handler. Only the HTTP edge turns them into
problem responses.

    GatewayError
    ├── ConfigError                  a setting, a flag or a file they name is wrong
    │                                (exit 2)
    ├── StartError                   the server cannot start: its address, its
    │                                metrics folder (exit 1)
    ├── CacheUnavailable             the cache backend failed or timed out (never
    │                                reaches a caller: the request goes upstream)
    ├── RequestError                 the caller's request is at fault (4xx)
    │   ├── InvalidParameters        400, lists the bad parameters (at most 20)
    │   └── AuthenticationRequired   401, no usable bearer token
    └── UpstreamError                the upstream did not give a usable answer
        ├── UpstreamUnavailable      refused, reset, DNS failure, TLS (502)
        │   └── UpstreamCircuitOpen  not called: its circuit breaker is open (503)
        ├── UpstreamTimeout          connect or read timeout (504)
        ├── UpstreamRejected         the upstream answered 401/403/404/429 (same status)
        ├── UpstreamFailed           the upstream answered 5xx or an unexpected 4xx (502)
        └── UpstreamContractError    2xx whose body breaks the contract (502)
"""

from __future__ import annotations

from dataclasses import dataclass


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """The configuration is invalid; the message names the key (or the file).

    ``where`` holds what the message names as fields of a log line: ``key`` (dotted,
    ``upstream.timeout_s``), ``path`` (a file).
    """

    def __init__(self, message: str, **where: str) -> None:
        super().__init__(message)
        self.where = where


class StartError(GatewayError):
    """The server cannot start where it is told (an address in use or not on this
    machine, a port it may not bind, a folder it cannot write); the message names what
    and where, and ``where`` holds them as fields of a log line (``address``,
    ``path``)."""

    def __init__(self, message: str, **where: str) -> None:
        super().__init__(message)
        self.where = where


class CacheUnavailable(GatewayError):
    """The cache backend failed or did not answer in time."""


@dataclass(frozen=True, slots=True)
class ParameterProblem:
    """One bad request parameter and what is wrong with it."""

    parameter: str
    message: str


class RequestError(GatewayError):
    """The request itself is at fault."""


class InvalidParameters(RequestError):
    """One or more request parameters are invalid: the first ``LISTED`` problems in
    ``problems`` and how many more there were in ``left_out``.

    A caller may send thousands of bad parameters in one request; what it gets back
    (and what the gateway holds of them) stays the same small size whatever it sends.
    """

    LISTED = 20

    def __init__(self, problems: list[ParameterProblem], *, left_out: int = 0) -> None:
        self.problems = problems[: self.LISTED]
        self.left_out = left_out + len(problems) - len(self.problems)
        super().__init__("; ".join(f"{p.parameter}: {p.message}" for p in self.problems))

    @property
    def count(self) -> int:
        """How many problems the request has, listed or not."""
        return len(self.problems) + self.left_out


class AuthenticationRequired(RequestError):
    """No usable ``Authorization: Bearer`` header."""


class UpstreamError(GatewayError):
    """The upstream did not give a usable answer."""

    def __init__(self, detail: str, *, upstream_status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.upstream_status = upstream_status


class UpstreamUnavailable(UpstreamError):
    """The upstream could not be reached (refused, reset, DNS failure)."""


class UpstreamCircuitOpen(UpstreamUnavailable):
    """The upstream was not called: it failed repeatedly and its circuit breaker is
    open; a trial is due in ``retry_after_s`` seconds."""

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer within the configured timeout."""


class UpstreamRejected(UpstreamError):
    """The upstream refused the request with 401, 403, 404 or 429; ``retry_after`` is
    the Retry-After of a 429 fit to pass on (gateway.upstream.retry_after), if any."""

    def __init__(
        self, detail: str, *, upstream_status: int, retry_after: str | None = None
    ) -> None:
        super().__init__(detail, upstream_status=upstream_status)
        self.retry_after = retry_after


class UpstreamFailed(UpstreamError):
    """The upstream answered with a server error or an unexpected client error."""


class UpstreamContractError(UpstreamError):
    """The upstream answered 2xx with a body that breaks the API contract."""
