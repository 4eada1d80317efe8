"""What no route takes (gateway/http/unrouted.py), as a client sees it on the wire,
whichever way the gateway is served (ids [fast]/[plain]): a path of no route, whatever
it holds (escaped line ends, ``*``, a target with no path at all), is a 404 problem
with the request's id, counted and logged, and never reaches the upstream. (A target
with no path and an Expect other than 100-continue: tests/fastpath/test_connection.py.)
"""

from __future__ import annotations

import logging

import orjson
import pytest
from aiohttp.test_utils import TestServer

from ..conftest import GatewayFactory, base_url
from .test_edge import head
from .test_wire import exchange, upstream_calls

NO_ROUTE = "no such route; the routes are /users, /clients, /expenses"


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/use%0d%0ars"),
        ("GET", "/%0a"),
        ("GET", "/users%0a"),
        ("GET", "/accounts/ACC-002/%0d%0a"),
        ("HEAD", "/use%0d%0ars"),
        ("DELETE", "/%0a/x"),
        ("OPTIONS", "*"),
        ("GET", "http://g/nowhere%0a"),
        ("CONNECT", "example.com:443"),
        ("CONNECT", "127.0.0.1:80"),
    ],
)
async def test_a_request_no_route_takes_is_a_404_problem_with_its_request_id(
    gateway_factory: GatewayFactory,
    upstream: TestServer,
    caplog: pytest.LogCaptureFixture,
    method: str,
    target: str,
) -> None:
    """aiohttp's router gives these to no resource of the app (its catch-all pattern
    does not match a line feed; ``*`` and ``host:port`` have no path to match) and
    answers a plain-text 404 itself: the gateway's answer is its 404 problem."""
    client = await gateway_factory(base_url(upstream))
    port = client.port
    assert port is not None
    calls = upstream_calls(upstream)
    caplog.set_level(logging.INFO, logger="gateway.access")
    (answer,) = await exchange(
        port, head(target, b"X-Request-ID: unrouted-1", method=method), head=method == "HEAD"
    )
    assert answer.status_line == "HTTP/1.1 404 Not Found"
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["x-request-id"] == "unrouted-1"
    if method != "HEAD":
        body = orjson.loads(answer.body)
        assert (body["status"], body["requestId"]) == (404, "unrouted-1")
        assert body["detail"].startswith(NO_ROUTE)
        assert body["instance"] == target  # the target as sent
    assert upstream_calls(upstream) == calls
    assert [
        (record.__dict__["route"], record.__dict__["status"])
        for record in caplog.records
        if record.name == "gateway.access" and record.__dict__["request_id"] == "unrouted-1"
    ] == [("other", 404)]
