"""GET /docs (docs/api.md): the published document for a person, from files the
gateway ships and serves itself, under a policy that lets the page load nothing from
another origin; absent with ``server.docs = false``. The page rendered in a real browser
is tests/browser/test_pages.py's."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.http.api_docs import PINNED, SWAGGER_UI_VERSION, asset, pinned_asset

from ..conftest import GatewayFactory, base_url

Gateway = TestClient[web.Request, web.Application]


async def test_docs_is_a_page_of_the_gateway_s_own_files(gateway: Gateway) -> None:
    response = await gateway.get("/docs")
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    page = await response.text()
    assert 'data-openapi="/openapi.json"' in page
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'self';" in policy  # no inline script, no other origin
    assert "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    for src in ("/docs/swagger-ui.css", "/docs/swagger-ui-bundle.js", "/docs/init.js"):
        assert f'"{src}"' in page
        served = await gateway.get(src)
        assert served.status == 200, src
        assert served.headers["X-Content-Type-Options"] == "nosniff"
        assert await served.read() == asset(src.removeprefix("/docs/"))
    assert "http://" not in page
    assert "https://" not in page


async def test_the_page_s_files_are_revalidated_by_etag(gateway: Gateway) -> None:
    first = await gateway.get("/docs/swagger-ui-bundle.js")
    etag = first.headers["ETag"]
    for sent in (etag, f'"other", W/{etag}', "*"):
        again = await gateway.get("/docs/swagger-ui-bundle.js", headers={"If-None-Match": sent})
        assert again.status == 304, sent
        assert await again.read() == b""
    other = await gateway.get(
        "/docs/swagger-ui-bundle.js", headers={"If-None-Match": etag[:-2] + '"'}
    )
    assert other.status == 200


async def test_a_file_the_page_does_not_have_is_the_gateway_s_404(gateway: Gateway) -> None:
    response = await gateway.get("/docs/swagger-ui.js.map")
    assert response.status == 404
    assert response.headers["Content-Type"] == "application/problem+json"


async def test_server_docs_false_leaves_no_docs(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    gateway = await gateway_factory(base_url(upstream), server={"docs": False})
    for path in ("/docs", "/docs/swagger-ui-bundle.js"):
        response = await gateway.get(path)
        assert response.status == 404, path
    document: dict[str, Any] = await (await gateway.get("/openapi.json")).json()
    assert "/docs" not in document["paths"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_swagger_ui_s_files_are_the_pinned_release(name: str) -> None:
    """The files of swagger-ui-dist as the npm registry serves its pinned release
    (`make swagger-ui` fetches them again)."""
    body = pinned_asset(name)
    assert hashlib.sha256(body).hexdigest() == PINNED[name]
    if name.endswith(".js"):
        assert f'PACKAGE_VERSION:"{SWAGGER_UI_VERSION}"'.encode() in body
