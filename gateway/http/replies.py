"""What a record reply carries besides its body: its headers, and the 304 of a request
whose ``If-None-Match`` names its ETag.

Every record reply has the same headers (:func:`reply_headers`, docs/caching.md's header
table), made from the pipeline's :class:`~gateway.records.pipeline.Reply`; the fast
path (``gateway.fastpath``) writes the same headers as bytes. A reply is one
representation of its answer (gzip or identity, ``gateway.http.negotiation`` says
which): its ETag is that representation's, it says ``Content-Encoding: gzip`` when it
is gzip, and every record reply, whichever it is, says ``Vary: Accept-Encoding``.
The gateway sets Content-Encoding itself and never asks aiohttp to compress.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from multidict import CIMultiDict

from gateway.cache.coding import etag_matches
from gateway.cache.entry import IDENTITY
from gateway.records.pipeline import Reply

JSON = "application/json"


def reply_headers(reply: Reply) -> CIMultiDict[str]:
    """The headers of a record reply: its type and coding, and the cache headers."""
    headers = CIMultiDict((("Content-Type", JSON),))
    if reply.coding != IDENTITY:
        headers["Content-Encoding"] = reply.coding
    headers.extend(
        (
            ("X-Cache", reply.x_cache),
            ("Cache-Status", reply.cache_status),
            ("Age", str(reply.age_s)),
            ("Cache-Control", f"private, max-age={reply.max_age_s}"),
            ("Vary", "Accept-Encoding"),
        )
    )
    if reply.etag:
        headers["ETag"] = reply.etag
    return headers


def reply_response(request: web.Request, reply: Reply) -> web.Response:
    """The response to ``request`` of ``reply``: a 304 Not Modified when the request's
    ``If-None-Match`` names the ETag of the reply's representation (the 200's headers,
    less ``Content-Type`` and ``Content-Encoding``: metadata of a body it does not
    have), else the 200 with its body (a HEAD's: its headers, Content-Length that of
    the body, which aiohttp does not send)."""
    headers = reply_headers(reply)
    if_none_match = request.headers.get(hdrs.IF_NONE_MATCH)
    if if_none_match is not None and etag_matches(if_none_match, reply.etag):
        response = web.Response(status=304, headers=headers)
        del response.headers["Content-Type"]
        response.headers.popall("Content-Encoding", None)
        return response
    return web.Response(body=reply.body, headers=headers)
