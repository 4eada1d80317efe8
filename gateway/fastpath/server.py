"""The runner the gateway is served by: with the fast path when ``server.fast_path`` is
on and aiohttp has every internal it relies on, the gateway's public runner
(``gateway.http.runner``) otherwise."""

from __future__ import annotations

import functools
import logging
from typing import Any

import aiohttp
from aiohttp import web

from gateway.fastpath import internals
from gateway.fastpath.connection import FastPathServer
from gateway.http.edge import EDGE
from gateway.http.runner import GatewayRunner

log = logging.getLogger("gateway.fastpath")


class FastPathRunner(GatewayRunner):
    """The gateway's runner serving through a :class:`FastPathServer`."""

    def serve(self, made: web.Server) -> web.Server:
        absent = internals.server_missing(made)
        if absent:
            _step_aside(absent)
            return super().serve(made)
        return FastPathServer(made, self.app[EDGE], self.options)


@functools.cache
def _missing() -> tuple[str, ...]:
    return tuple(internals.missing())


def _step_aside(absent: tuple[str, ...] | list[str]) -> None:
    log.warning(
        "fast path off: aiohttp %s lacks %s; serving as plain aiohttp",
        aiohttp.__version__,
        ", ".join(absent),
        extra={"event": "fast_path", "on": False, "missing": list(absent)},
    )


def make_runner(app: web.Application, **kwargs: Any) -> GatewayRunner:
    """The runner of the gateway's ``app`` (``kwargs`` are ``web.AppRunner``'s)."""
    if not app[EDGE].live.settings.server.fast_path:
        return GatewayRunner(app, **kwargs)
    absent = _missing()
    if absent:
        _step_aside(absent)
        return GatewayRunner(app, **kwargs)
    if not internals.verified(aiohttp.__version__):
        _unverified()
    return FastPathRunner(app, **kwargs)


@functools.cache
def _unverified() -> None:
    """Say once per process that the fast path runs on a release it was not verified on."""
    log.warning(
        "fast path on: aiohttp %s has every internal it relies on, but it was verified on %s only",
        aiohttp.__version__,
        ", ".join(internals.VERIFIED_ON),
        extra={
            "event": "fast_path",
            "on": True,
            "verified": False,
            "aiohttp": aiohttp.__version__,
        },
    )
