"""The problem responses to what aiohttp would answer by itself: a request its HTTP
parser refuses, or an error outside every handler. Both ways in answer them alike.

- The fast path's connections answer them from aiohttp's ``handle_error``
  (:meth:`gateway.http.edge.Edge.rejected`).
- Plain aiohttp (``gateway.process.listener``) checks each head with aiohttp's public
  parser before its own handler reads it; in place of a head the parser refuses, it
  feeds aiohttp a stand-in request (:meth:`Refusals.stand_in`), which the unrouted
  resource answers with the same problem (:meth:`Refusals.kind_of`,
  :meth:`gateway.http.edge.Edge.refused`). A stand-in carries a secret made per
  application, so no caller can send one.

Either way the answer is an HTTP/1.0 400 (the request's own version is not known),
its instance ``/``, and the connection closes after it.
"""

from __future__ import annotations

import hmac
import secrets
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong

from gateway.http.problems import internal_problem, problem_response

# the detail of each kind of refusal; it never quotes the request (the offending line
# may be an Authorization header)
DETAILS = {
    "line-too-long": "the request line or a header is longer than the gateway accepts",
    "bad-method": "not an HTTP/1.1 request (TLS to a plain-HTTP port, or an unknown method)",
    "bad-message": "the request is not valid HTTP/1.1: a malformed request line or header",
    "unreadable": "the request could not be read as HTTP/1.1",
}
STAND_IN_FIELD = "X-Records-Gateway-Refused"
# the method logged for a refused head (its own is not known), as aiohttp names it
REFUSED_METHOD = "UNKNOWN"


# the parser's errors by kind of refusal, the most specific first (LineTooLong and
# BadHttpMethod are BadHttpMessages)
_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (LineTooLong, "line-too-long"),
    (BadHttpMethod, "bad-method"),
    (BadHttpMessage, "bad-message"),
)


def refusal_kind(exc: BaseException | None) -> str:
    """The kind of refusal (a key of ``DETAILS``) of the parser's error ``exc``."""
    return next((kind for error, kind in _KINDS if isinstance(exc, error)), "unreadable")


def problem_for_rejected(
    request: web.BaseRequest, status: int, kind: str, request_id: str
) -> web.Response:
    """The problem response to a request aiohttp would answer itself: one its HTTP
    parser refuses (``kind``, see ``DETAILS``), or a 500 outside every handler."""
    if status == 500:
        return internal_problem(request, request_id)
    if status > 500:
        title = HTTPStatus(status).phrase
        slug = title.lower().replace(" ", "-")
        detail = f"{title.lower()}; the request id is in the gateway's logs"
    else:
        slug, title = "malformed-request", "Malformed HTTP request"
        detail = DETAILS.get(kind, DETAILS["unreadable"])
    return problem_response(
        request, status=status, slug=slug, title=title, detail=detail, request_id=request_id
    )


class Refusals:
    """The stand-in requests of one application for heads the parser refuses."""

    def __init__(self) -> None:
        self._secret = secrets.token_hex(16)

    def stand_in(self, exc: BaseException | None) -> bytes:
        """The request fed to aiohttp in place of a head refused with ``exc``: an
        HTTP/1.0 GET of ``/`` (closed after its answer) naming the refusal's kind."""
        field = f"{STAND_IN_FIELD}: {self._secret} {refusal_kind(exc)}\r\n"
        return b"GET / HTTP/1.0\r\n" + field.encode("ascii") + b"\r\n"

    def kind_of(self, request: web.BaseRequest) -> str | None:
        """The kind of refusal ``request`` stands in for; None when it is no stand-in
        of this application's (a caller's request, whatever it sends)."""
        value = request.headers.get(STAND_IN_FIELD)
        if value is None:
            return None
        secret, _, kind = value.partition(" ")
        if not hmac.compare_digest(secret.encode(), self._secret.encode()):
            return None
        return kind if kind in DETAILS else None
