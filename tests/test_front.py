"""The front door: which requests a shortcut may answer before the router."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.app import create_app
from gateway.front import front_door
from gateway.state import SHORTCUT_DECLINED

from .conftest import make_settings

ANSWER = web.Response(text="from the shortcut")
ROUTED = web.Response(text="from the application")


@pytest.mark.parametrize(
    ("method", "path", "headers", "expected", "tried"),
    [
        ("GET", "/expenses?limit=10", {}, ANSWER, ["/expenses"]),
        ("GET", "/expenses/", {}, ROUTED, []),  # not exactly the route's path
        ("GET", "/expenses/e-1", {}, ROUTED, []),
        ("HEAD", "/expenses", {}, ROUTED, []),
        ("POST", "/expenses", {}, ROUTED, []),
        ("GET", "/expenses", {"Expect": "100-continue"}, ROUTED, []),
        ("GET", "/users", {}, ROUTED, ["/users"]),  # the shortcut declined: the app answers
    ],
)
async def test_only_a_plain_get_on_a_shortcut_path_is_tried(
    method: str,
    path: str,
    headers: dict[str, str],
    expected: web.Response,
    tried: list[str],
) -> None:
    calls: list[str] = []

    def answer(request: web.Request) -> web.StreamResponse | None:
        calls.append(request.path)
        return ANSWER

    def decline(request: web.Request) -> web.StreamResponse | None:
        calls.append(request.path)
        return None

    routed: list[str] = []

    async def application(request: web.BaseRequest) -> web.StreamResponse:
        routed.append(request.path)
        return ROUTED

    handle = front_door(application, {"/expenses": answer, "/users": decline})
    request = make_mocked_request(method, path, headers=headers)
    response = await handle(request)
    assert response is expected
    assert calls == tried
    assert routed == ([] if expected is ANSWER else [path.split("?")[0]])
    # a declined shortcut is not tried again by the route's handler
    assert request.get(SHORTCUT_DECLINED, False) == (tried == ["/users"])


def test_the_app_has_nothing_the_front_door_would_skip() -> None:
    """Front-door answers bypass aiohttp's middlewares and on_response_prepare; the
    gateway must not rely on either (add one, and hits on list routes would miss it)."""
    app = create_app(make_settings("http://127.0.0.1:9"))
    assert list(app.middlewares) == []
    assert list(app.on_response_prepare) == []
