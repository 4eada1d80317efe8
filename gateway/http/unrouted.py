"""What no route of the gateway takes: every other path, and targets without a path.

aiohttp's router offers a request only to the resources registered under its path and
the path's parents; when none takes it, aiohttp answers 404 itself, in plain text,
after running its own ``Expect`` handler (plain text again, and a 500 for a field
that is not UTF-8). So the gateway registers :class:`Unrouted` last, under ``/``, the
parent of every path: a resource that takes whatever the routes left, whatever its
path (a line feed in it, ``*``, an absolute-form target without a slash), with the
edge's expect handler and 404 problem.

A target with no path at all (``CONNECT host:443``, ``GET x:``) is offered to no
resource. The gateway's server answers such a request (:meth:`Unrouted.respond`) before
aiohttp's application sees it (``gateway.http.runner``), with or without the fast
path.
"""

from __future__ import annotations

import time

from aiohttp import hdrs, web

from gateway.http.edge import EXPECT, Edge, not_found
from gateway.http.rejections import REFUSED_METHOD


class Unrouted(web.PlainResource):
    """The resource of every request the gateway's routes do not take (register it
    last): the edge's 404 problem, with the edge's expect handler."""

    def __init__(self, edge: Edge) -> None:
        # registered under "/", so the router offers it every path once the path's
        # own resources and its parents' have refused it
        super().__init__("/")
        self.handler = edge.wrap(not_found)
        self.expect = edge.expectation()
        self._edge = edge
        self._route = self.add_route(hdrs.METH_ANY, self._take, expect_handler=self.expect)

    async def _take(self, request: web.Request) -> web.StreamResponse:
        """The edge's 404 problem; for a stand-in of a head the parser refused
        (``gateway.http.rejections``), the problem of that refusal."""
        kind = self._edge.refusals.kind_of(request)
        if kind is None:
            return await self.handler(request)
        return self._edge.refused(request, 400, kind, time.perf_counter(), REFUSED_METHOD)

    async def resolve(self, request: web.Request) -> tuple[web.UrlMappingMatchInfo, set[str]]:
        """Every request offered here is taken."""
        return web.UrlMappingMatchInfo({}, self._route), set()

    async def respond(self, request: web.Request) -> web.StreamResponse:
        """The answer to ``request`` had aiohttp's router offered it here: for a target
        without a path, which it offers nowhere."""
        if request.headers.get(EXPECT):
            expected = await self.expect(request)
            if expected is not None:
                return expected
        return await self.handler(request)


UNROUTED = web.AppKey("unrouted", Unrouted)
