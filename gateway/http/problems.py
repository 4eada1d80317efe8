"""RFC 9457 problem details: the one shape of every error response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from gateway.errors import (
    AuthenticationRequired,
    GatewayError,
    InvalidParameters,
    UpstreamCircuitOpen,
    UpstreamContractError,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.records.cache_status import circuit_open_label

PROBLEM_JSON = "application/problem+json"
PROBLEM_TYPE_BASE = "urn:records-gateway:problem:"
_MAX_INSTANCE = 1024
_MAX_NAME = 100  # characters of a caller's parameter name quoted in a problem


def problem_response(
    request: web.BaseRequest,
    *,
    status: int,
    slug: str,
    title: str,
    detail: str,
    request_id: str,
    extra: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """A problem+json response; ``slug`` names the problem type."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": request.raw_path[:_MAX_INSTANCE],
        "requestId": request_id,
    }
    if extra:
        body.update(extra)
    return web.Response(
        status=status,
        body=orjson.dumps(body),
        content_type=PROBLEM_JSON,
        headers=headers,
    )


def problem_for_error(request: web.Request, exc: GatewayError, request_id: str) -> web.Response:
    """The problem response for one of the gateway's own errors."""
    if isinstance(exc, InvalidParameters):
        return _invalid_parameters(request, exc, request_id)
    if isinstance(exc, AuthenticationRequired):
        return problem_response(
            request,
            status=401,
            slug="unauthenticated",
            title="Authentication required",
            detail=str(exc),
            request_id=request_id,
            headers={"WWW-Authenticate": 'Bearer realm="records-gateway"'},
        )
    if isinstance(exc, UpstreamError):
        return _upstream_problem(request, exc, request_id)
    return problem_response(
        request,
        status=500,
        slug="internal",
        title="Internal error",
        detail="the gateway failed to handle this request; the request id is in the logs",
        request_id=request_id,
    )


def _invalid_parameters(
    request: web.Request, exc: InvalidParameters, request_id: str
) -> web.Response:
    """The 400 listing the request's bad parameters: at most ``InvalidParameters.LISTED``
    of them, each name cut to ``_MAX_NAME`` characters, and ``omittedErrors`` saying how
    many more there were, so that its size is bounded whatever the caller sent."""
    detail = f"{exc.count} request parameter(s) are invalid; see errors"
    extra: dict[str, Any] = {
        "errors": [
            {"parameter": _cut(p.parameter, _MAX_NAME), "message": p.message} for p in exc.problems
        ]
    }
    if exc.left_out:
        detail += f" (the first {len(exc.problems)}; {exc.left_out} more not listed)"
        extra["omittedErrors"] = exc.left_out
    return problem_response(
        request,
        status=400,
        slug="invalid-parameters",
        title="Invalid request parameters",
        detail=detail,
        request_id=request_id,
        extra=extra,
    )


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _upstream_problem(request: web.Request, exc: UpstreamError, request_id: str) -> web.Response:
    extra = {"upstreamStatus": exc.upstream_status} if exc.upstream_status else None
    if isinstance(exc, UpstreamRejected):
        status = exc.upstream_status or 502
        titles = {
            401: ("upstream-unauthorized", "The upstream did not accept the token"),
            403: ("upstream-forbidden", "The upstream refused access"),
            404: ("not-found", "Record not found"),
            429: ("rate-limited", "Too many requests"),
        }
        slug, title = titles[status]
        headers: dict[str, str] = {}
        if status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="records-gateway"'
        if status == 429 and exc.retry_after:
            headers["Retry-After"] = exc.retry_after
        return problem_response(
            request,
            status=status,
            slug=slug,
            title=title,
            detail=exc.detail,
            request_id=request_id,
            extra=extra,
            headers=headers,
        )
    if isinstance(exc, UpstreamCircuitOpen):
        # not called: the answer a caller can act on is when to come back
        return problem_response(
            request,
            status=503,
            slug="upstream-unavailable",
            title="The upstream is unavailable",
            detail=exc.detail,
            request_id=request_id,
            extra={"retryAfter": exc.retry_after_s},
            headers={
                "Retry-After": str(exc.retry_after_s),
                "Cache-Status": circuit_open_label(),
            },
        )
    if isinstance(exc, UpstreamTimeout):
        status, slug, title = 504, "upstream-timeout", "The upstream did not answer in time"
    elif isinstance(exc, UpstreamUnavailable):
        status, slug, title = 502, "upstream-unavailable", "The upstream cannot be reached"
    elif isinstance(exc, UpstreamContractError):
        status, slug, title = 502, "upstream-contract", "The upstream broke the API contract"
    else:
        status, slug, title = 502, "upstream-failed", "The upstream failed"
    return problem_response(
        request,
        status=status,
        slug=slug,
        title=title,
        detail=exc.detail,
        request_id=request_id,
        extra=extra,
    )


def problem_for_http(request: web.Request, exc: web.HTTPException, request_id: str) -> web.Response:
    """The problem response for aiohttp's own 404, 405 and the like."""
    headers: dict[str, str] = {}
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        headers["Allow"] = allowed
        detail = f"{request.method} is not allowed here; allowed: {allowed}"
    elif isinstance(exc, web.HTTPNotFound):
        detail = (
            "no such route; the routes are /users, /clients, /expenses,"
            " /expenses/{expenseId}, /accounts, /accounts/{accountId}"
        )
    else:
        detail = exc.text or exc.reason
    return problem_response(
        request,
        status=exc.status,
        slug=exc.reason.lower().replace(" ", "-"),
        title=exc.reason,
        detail=detail,
        request_id=request_id,
        headers=headers,
    )


def internal_problem(request: web.BaseRequest, request_id: str) -> web.Response:
    """The 500 of an error the gateway did not expect (logged with ``request_id``)."""
    return problem_response(
        request,
        status=500,
        slug="internal",
        title="Internal error",
        detail="the gateway failed to handle this request; the request id is in its logs",
        request_id=request_id,
    )


def expectation_failed(request: web.BaseRequest, request_id: str) -> web.Response:
    """The 417 of a request whose ``Expect`` asks for more than ``100-continue``; it
    does not quote the field (it may hold any bytes)."""
    return problem_response(
        request,
        status=417,
        slug="expectation-failed",
        title="Expectation Failed",
        detail="the gateway meets no expectation but Expect: 100-continue",
        request_id=request_id,
    )


def version_not_supported(request: web.BaseRequest, request_id: str) -> web.Response:
    """The 505 of a request line whose version is neither HTTP/1.1 nor HTTP/1.0."""
    major, minor = request.version
    return problem_response(
        request,
        status=505,
        slug="http-version-not-supported",
        title="HTTP Version Not Supported",
        detail=f"the gateway speaks HTTP/1.1 and HTTP/1.0, not HTTP/{major}.{minor}",
        request_id=request_id,
    )
