"""The middleware at the HTTP edge: request ids and the translation of errors."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.errors import GatewayError
from gateway.problems import problem_for_error, problem_for_http, problem_response
from gateway.state import REQUEST_ID

log = logging.getLogger("gateway.http")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def choose_request_id(given: str | None) -> str:
    """The caller's X-Request-ID when it is safe to echo, otherwise a new one."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request an id and turn every error into a problem response."""
    request_id = choose_request_id(request.headers.get("X-Request-ID"))
    request[REQUEST_ID] = request_id
    response: web.StreamResponse
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = problem_for_http(request, exc, request_id)
    except GatewayError as exc:
        response = problem_for_error(request, exc, request_id)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception(
            "unhandled error", extra={"request_id": request_id, "route": _route_of(request)}
        )
        response = problem_response(
            request,
            status=500,
            slug="internal",
            title="Internal error",
            detail="the gateway failed to handle this request; the request id is in its logs",
            request_id=request_id,
        )
    response.headers["X-Request-ID"] = request_id
    return response


def _route_of(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"
