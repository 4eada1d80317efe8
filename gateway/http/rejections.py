"""The problem responses to what aiohttp would answer by itself: a request its HTTP
parser rejects, or an error outside every handler. Both ways in answer them so: the
fast path's connections from aiohttp's ``handle_error``, plain aiohttp through
``gateway.process.listener``, which checks each head it cuts and has a refused one
answered by the edge (:meth:`gateway.http.edge.Edge.rejected`)."""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong

from gateway.http.problems import internal_problem, problem_response


def problem_for_rejected(
    request: web.BaseRequest, status: int, exc: BaseException | None, request_id: str
) -> web.Response:
    """The problem response to a request aiohttp answers itself: one its HTTP parser
    rejects (``exc`` a BadHttpMessage), or a 500 outside every handler. The detail
    never quotes the request: the offending line may be an Authorization header."""
    if status == 500:
        return internal_problem(request, request_id)
    if status > 500:
        title = HTTPStatus(status).phrase
        slug = title.lower().replace(" ", "-")
        detail = f"{title.lower()}; the request id is in the gateway's logs"
    else:
        slug, title = "malformed-request", "Malformed HTTP request"
        if isinstance(exc, LineTooLong):
            detail = "the request line or a header is longer than the gateway accepts"
        elif isinstance(exc, BadHttpMethod):
            detail = "not an HTTP/1.1 request (TLS to a plain-HTTP port, or an unknown method)"
        elif isinstance(exc, BadHttpMessage):
            detail = "the request is not valid HTTP/1.1: a malformed request line or header"
        else:
            detail = "the request could not be read as HTTP/1.1"
    return problem_response(
        request, status=status, slug=slug, title=title, detail=detail, request_id=request_id
    )
