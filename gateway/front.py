"""The front door: the request handler aiohttp's server calls first, and the runner
that installs it.

aiohttp hands every request to ``Application._handle``, which resolves the route,
builds and freezes its match info and looks for ``Expect`` before the handler runs;
on this machine that costs about a quarter of what a bare handler's request costs
(bench/README.md). A cache hit on a list route needs none of it: the path alone
names the route. :func:`front_door` tries the record routes' shortcuts
(``RecordRoutes.shortcuts``: a fresh hit held in this process, or None) for a GET on
exactly their path, and hands everything else, including every request a shortcut
declines, to the application unchanged.

What the front door answers never passes through the application: an aiohttp
middleware or ``on_response_prepare`` signal would not see it. ``create_app``
registers neither (a test holds it to that); the edge's work (request id, metrics,
access log) is done by the shortcut itself.

:class:`GatewayRunner` is ``web.AppRunner`` with the front door in place; the server
and the test suite both run the gateway through it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

from gateway.connections import ConnectionFingerprints
from gateway.handlers import Shortcut
from gateway.state import RECORDS, SHORTCUT_DECLINED

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def front_door(app_handler: Handler, shortcuts: Mapping[str, Shortcut]) -> Handler:
    """``app_handler`` behind the shortcuts of ``shortcuts`` (exact path -> shortcut)."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.method == hdrs.METH_GET:
            shortcut = shortcuts.get(request.path)
            if shortcut is not None and hdrs.EXPECT not in request.headers:
                # the server's request factory is the application's: a web.Request
                full = cast(web.Request, request)
                response = shortcut(full)
                if response is not None:
                    return response
                full[SHORTCUT_DECLINED] = True  # the route's handler need not try again
        return await app_handler(request)

    return handle


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose server calls the front door first, and tells the record
    routes when a connection closes (they forget what they remembered of it)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        records = self.app[RECORDS]
        server.request_handler = front_door(server.request_handler, records.shortcuts)
        server.connection_lost = _forgetting(  # type: ignore[method-assign,assignment]
            server.connection_lost, records.fingerprints
        )
        return server


ConnectionLost = Callable[[RequestHandler, BaseException | None], None]


def _forgetting(
    connection_lost: ConnectionLost, fingerprints: ConnectionFingerprints
) -> ConnectionLost:
    """The server's ``connection_lost``, which first has ``fingerprints`` forget it."""

    def lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
        fingerprints.forget(handler)
        connection_lost(handler, exc)

    return lost
