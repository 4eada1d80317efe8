"""The aiohttp internals the fast path relies on, and the check that they are there.

aiohttp promises nothing about them: a release may rename or drop any. So the fast
path names each one here, :func:`missing` looks for every one of them with the shape
it expects at start, and ``server.make_runner`` serves as plain aiohttp when one is
missing. The package takes a range of aiohttp releases (pyproject.toml); those the
fast path was verified on, its whole suite passing with it on, are ``VERIFIED_ON``.
On another release whose internals all pass the check, the fast path runs and says
once that the release is not among them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from types import ModuleType

from aiohttp import web, web_protocol
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler

# the aiohttp releases the fast path was verified on: `make test` (the locked release)
# or `make test-aiohttp-latest` passed with these internals checked and in use
VERIFIED_ON = ("3.14.5",)


def verified(version: str) -> bool:
    """Whether the fast path was verified on aiohttp ``version``."""
    return version in VERIFIED_ON


# attributes every connection handler has (in its __slots__, set by its __init__)
CONNECTION_SLOTS = (
    "_waiter",
    "_messages",
    "_request_in_progress",
    "_max_msg_queue_size",
    "_buffer_paused",
    "_force_close",
    "_close",
    "_request_count",
    "_keepalive_timeout",
    "_keepalive_handle",
    "_next_keepalive_close_time",
    "_loop",
    "_manager",
    "max_line_size",
    "max_field_size",
    "max_headers",
    "transport",
)
# methods of the connection handler the fast path calls or overrides, with the
# parameters it passes them
CONNECTION_METHODS = {
    "data_received": ("self", "data"),
    # what it does on a connection is done here (its task aside), and itself once the
    # connection is handed its first request (connection.GatewayConnection._start_aiohttp)
    "connection_made": ("self", "transport"),
    # the server stopping: a connection it was never handed a request of is closed here
    "close": ("self",),
    # where a connection forgets what the fast path remembered of it
    "connection_lost": ("self", "exc"),
    "handle_error": ("self", "request", "status", "exc", "message"),
    "_process_keepalive": ("self",),
    # when its queue of requests drains, it calls data_received(b"") from here: what
    # hands the connection's held heads on (connection.GatewayConnection._backlog)
    "_resume_reading_if_drained": ("self",),
    # closes the connection after an answer its caller asked to be the last
    "force_close": ("self",),
}
# what the server the fast path makes relies on of aiohttp's server of the application
SERVER_ATTRIBUTES = ("request_handler", "request_factory")
# what the fast path reads and replaces of a message of aiohttp's HTTP parser
MESSAGE_ATTRIBUTES = ("path", "url", "_replace")
# the server's constructor options the fast path passes, and the method it overrides
SERVER_OPTIONS = ("handler", "request_factory", "handler_cancellation")
SERVER_METHODS = {
    # a connection is its server's before aiohttp's own handling of it begins
    "connection_made": ("self", "handler", "transport"),
}


# what the connection handler queues for a request its parser refused
PROTOCOL_MODULE_ATTRIBUTES = ("_ErrInfo",)


def _slots(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    return names


def missing(
    connection: type = RequestHandler,
    server: type = web.Server,
    message: type = RawRequestMessage,
    protocol: ModuleType = web_protocol,
) -> list[str]:
    """What of the internals above ``connection``, ``server``, ``message``
    and the module of connection handlers, ``protocol``, lack, by name (empty when
    everything is there with the expected shape)."""
    absent: list[str] = [
        f"{message.__name__}.{name}" for name in MESSAGE_ATTRIBUTES if not hasattr(message, name)
    ]
    absent += [
        f"{protocol.__name__}.{name}"
        for name in PROTOCOL_MODULE_ATTRIBUTES
        if not isinstance(getattr(protocol, name, None), type)
    ]
    slots = _slots(connection)
    absent += [f"{connection.__name__}.{name}" for name in CONNECTION_SLOTS if name not in slots]
    for name, parameters in CONNECTION_METHODS.items():
        method = getattr(connection, name, None)
        if not callable(method) or not _takes(method, parameters):
            absent.append(f"{connection.__name__}.{name}{parameters}")
    if "writing_paused" not in dir(connection):
        absent.append(f"{connection.__name__}.writing_paused")
    try:
        inspect.signature(connection).bind(None, loop=None)
    except TypeError:
        absent.append(f"{connection.__name__}(manager, *, loop, **options)")
    absent += _server_shape(server)
    return absent


def _server_shape(server: type) -> list[str]:
    absent: list[str] = []
    try:
        options = set(inspect.signature(server).parameters)
    except (TypeError, ValueError):
        options = set()
    absent += [f"{server.__name__}({name}=)" for name in SERVER_OPTIONS if name not in options]
    for name, parameters in SERVER_METHODS.items():
        method = getattr(server, name, None)
        if not callable(method) or not _takes(method, parameters):
            absent.append(f"{server.__name__}.{name}{parameters}")
    return absent


def server_missing(server: web.Server) -> list[str]:
    """What of the server internals above ``server`` (made by aiohttp) lacks."""
    return [f"Server.{name}" for name in SERVER_ATTRIBUTES if not hasattr(server, name)]


def _takes(method: object, parameters: Iterable[str]) -> bool:
    try:
        names = list(inspect.signature(method).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    expected = list(parameters)
    return names[: len(expected)] == expected
