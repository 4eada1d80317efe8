"""The admin routes' door: without the admin token nothing under /admin answers but
401 (docs/calling.md, "The routes"), neither the methods a path takes nor which
paths exist."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.http.admin import ADMIN_ROUTES

from ..conftest import AUTH, GatewayFactory, base_url

Client = TestClient[web.Request, web.Application]
ADMIN = "admin-token-0123456789abcdef"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
ADMIN_PATHS = tuple(path for path, _, _ in ADMIN_ROUTES)
# paths under /admin that no admin route takes
UNKNOWN_PATHS = ("/admin", "/admin/", "/admin/nope", "/admin/cache/extra", "/admin/ttl/")
WRONG: tuple[dict[str, str], ...] = (
    {},
    AUTH,  # a caller's token is not the admin token
    {"Authorization": "Bearer " + ADMIN[:-1]},
    {"Authorization": f"Basic {ADMIN}"},
    {"Authorization": ADMIN},
)


@pytest.fixture
async def admin_gateway(gateway_factory: GatewayFactory, upstream: TestServer) -> Client:
    return await gateway_factory(base_url(upstream), admin={"token": ADMIN})


async def answer(client: Client, method: str, path: str, headers: dict[str, str]) -> Any:
    response = await client.request(method, path, headers=headers)
    body = None if method == "HEAD" else await response.json(content_type=None)
    return response, body


@pytest.mark.parametrize("path", ADMIN_PATHS + UNKNOWN_PATHS)
async def test_without_the_admin_token_every_method_on_every_admin_path_is_401(
    admin_gateway: Client, path: str
) -> None:
    for headers in WRONG:
        for method in METHODS:
            response, body = await answer(admin_gateway, method, path, headers)
            assert response.status == 401, (method, path, headers)
            assert "Allow" not in response.headers, (method, path)
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="records-gateway"'
            assert response.headers["Content-Type"] == "application/problem+json"
            if body is not None:
                assert body["type"] == "urn:records-gateway:problem:unauthenticated"
                assert "allowed" not in body["detail"]


@pytest.mark.parametrize(("path", "taken"), [(path, set(h)) for path, _, h in ADMIN_ROUTES])
async def test_with_the_admin_token_another_method_is_405_with_allow(
    admin_gateway: Client, path: str, taken: set[str]
) -> None:
    expected = taken | ({"HEAD"} if "GET" in taken else set())
    for method in sorted(set(METHODS) - expected):
        response, body = await answer(admin_gateway, method, path, ADMIN_AUTH)
        assert response.status == 405, (method, path)
        assert set(response.headers["Allow"].split(", ")) == expected
        if body is not None:
            assert body["type"] == "urn:records-gateway:problem:method-not-allowed"


@pytest.mark.parametrize("path", UNKNOWN_PATHS)
async def test_with_the_admin_token_an_unknown_admin_path_is_404(
    admin_gateway: Client, path: str
) -> None:
    response, body = await answer(admin_gateway, "GET", path, ADMIN_AUTH)
    assert response.status == 404
    assert body["type"] == "urn:records-gateway:problem:not-found"


async def test_without_admin_token_configured_admin_paths_are_plain_404s(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    """With no admin routes there is nothing to guard: /admin is a path like any other."""
    gateway = await gateway_factory(base_url(upstream))
    for path in ADMIN_PATHS + UNKNOWN_PATHS:
        response, body = await answer(gateway, "GET", path, ADMIN_AUTH)
        assert response.status == 404, path
        assert body["type"] == "urn:records-gateway:problem:not-found"


async def test_paths_that_only_begin_like_admin_are_not_guarded(admin_gateway: Client) -> None:
    response, body = await answer(admin_gateway, "GET", "/administrators", {})
    assert response.status == 404
    assert body["type"] == "urn:records-gateway:problem:not-found"
