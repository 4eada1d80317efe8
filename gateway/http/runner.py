"""The runner the gateway is served by: aiohttp's ``AppRunner``, whose connections are
served by a server of the gateway's own handler, made with aiohttp's public API.

aiohttp's ``AppRunner`` runs the application's life (startup, shutdown, cleanup) and
makes a server whose handler is the application's (its router, the edge, the routes'
handlers). :class:`GatewayRunner` keeps that server for the application and serves the
connections through another (:meth:`GatewayRunner.serve`): aiohttp's public low-level
``web.Server``, with the same request factory and options, whose handler
(:func:`handler`) answers in front of the application what does not need it:

- a hit (``gateway.http.hits``), without the router, the edge's wrapping or the
  pipeline; a miss goes on to the application with the read made for it;
- a request whose target has no path at all (``CONNECT host:443``, ``GET x:``), which
  aiohttp's router offers to no resource: the edge's answer for it, the unrouted
  resource's 404 problem (``Edge.pathless``), so that no middleware is needed for it.

The fast path (``gateway.fastpath``) is this runner with a server of its own
connections, which reads hits from the bytes first. On stopping, the serving server's
connections are shut down (their requests in flight given ``shutdown_timeout``) before
the application's shutdown runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.http.edge import EDGE, Edge
from gateway.http.hits import Handler, PlainHits

# aiohttp's own default, which web.AppRunner takes
SHUTDOWN_TIMEOUT_S = 60.0


def handler(application: Handler, edge: Edge) -> Handler:
    """The serving server's handler of ``edge``'s application, whose own handler is
    ``application`` (see the module's docstring)."""
    lookup, pathless = edge.lookup, edge.pathless
    if lookup is None or pathless is None:
        raise RuntimeError("the gateway's server needs the edge's lookup and pathless handler")
    return PlainHits(edge, lookup).handler(routed(application, pathless))


def routed(
    application: Handler, pathless: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> Handler:
    """``application``, with a request that has no path at all answered by
    ``pathless`` as the router would have, had it offered the request there."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if not request.rel_url.path_safe and isinstance(request, web.Request):
            return await pathless(request)
        return await application(request)

    return handle


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` serving through :meth:`serve`'s server (see the module's
    docstring); ``options`` are the connections' (``web.Server``'s)."""

    def __init__(
        self,
        app: web.Application,
        *,
        handle_signals: bool = False,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
        **options: Any,
    ) -> None:
        super().__init__(
            app, handle_signals=handle_signals, shutdown_timeout=shutdown_timeout, **options
        )
        self.options = options
        self.shutdown_timeout = shutdown_timeout
        self.serving: web.Server | None = None

    @property
    def server(self) -> web.Server | None:
        """The server that serves the connections, once set up."""
        if self.serving is not None:
            return self.serving
        return super().server

    async def setup(self) -> None:
        await super().setup()
        made = super().server
        assert made is not None, "set up"
        self.serving = self.serve(made)

    def serve(self, made: web.Server) -> web.Server:
        """The server of the connections, in front of ``made`` (aiohttp's server of
        the application)."""
        return web.Server(
            handler(made.request_handler, self.app[EDGE]),
            request_factory=made.request_factory,
            **self.options,
        )

    async def shutdown(self) -> None:
        """In aiohttp's own order: the serving server's idle connections closed, the
        application's shutdown, then the rest closed once their requests are answered
        (within ``shutdown_timeout``)."""
        serving = self.serving
        if serving is not None:
            serving.pre_shutdown()
        await super().shutdown()
        if serving is not None:
            await serving.shutdown(self.shutdown_timeout)

    async def cleanup(self) -> None:
        await super().cleanup()
        self.serving = None
