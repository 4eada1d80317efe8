"""The runner the gateway is served by: with the fast path when ``server.fast_path`` is
on and aiohttp has every internal it relies on, plain ``web.AppRunner`` otherwise."""

from __future__ import annotations

import functools
import logging
from typing import Any

import aiohttp
from aiohttp import web

from gateway.fastpath import internals
from gateway.fastpath.connection import FastPathServer
from gateway.http.edge import EDGE

log = logging.getLogger("gateway.fastpath")


class FastPathRunner(web.AppRunner):
    """``web.AppRunner`` serving the application through a :class:`FastPathServer`."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the application started and frozen
        absent = internals.server_missing(made)
        if absent:
            _step_aside(absent)
            return made
        return FastPathServer(made, self.app[EDGE])


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


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner of the gateway's ``app`` (``kwargs`` are ``web.AppRunner``'s)."""
    if not app[EDGE].live.settings.server.fast_path:
        return web.AppRunner(app, **kwargs)
    absent = _missing()
    if absent:
        _step_aside(absent)
        return web.AppRunner(app, **kwargs)
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
