"""The pages a person looks at, in a real headless Chromium (Debian's, driven by
Playwright): the documentation site as `make docs` builds it (its index, the
configuration reference, the errors page and the API reference) and the gateway's own
GET /docs. Each renders its content, logs no console error, and makes no request that
leaves the machine (docs/api.md, docs/testing.md). A screenshot of each is written to
the test's temporary folder for a person to look at."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import Browser, Page, Request, Route, async_playwright

from gateway.config.reference import sections

from ..http.test_errors_page import TYPES

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# what the machine's closed network would otherwise see Chromium try at every start
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RECORD_PATHS = [
    "/users",
    "/clients",
    "/expenses",
    "/expenses/{expenseId}",
    "/accounts",
    "/accounts/{accountId}",
]
Gateway = TestClient[web.Request, web.Application]

# skipped only where no Chromium can be installed: as root, `make test` installs it first
pytestmark = pytest.mark.skipif(
    CHROMIUM is None and os.geteuid() != 0,
    reason="no chromium binary, and not root to install it (`make chromium` installs"
    " Debian's): the pages were not looked at in a browser",
)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it (--strict), into a folder of the session's."""
    site = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    return site


@pytest.fixture
async def site_server(
    aiohttp_server: Callable[..., Awaitable[TestServer]], built_site: Path
) -> TestServer:
    """The built site served from loopback, as any static host serves it."""

    async def index(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(built_site / "index.html")

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_static("/", built_site, append_version=False, show_index=False)

    async def directory_index(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.endswith("/") and request.path != "/":
            return web.FileResponse(built_site / request.path.strip("/") / "index.html")
        return await handler(request)

    app.middlewares.append(web.middleware(directory_index))
    return await aiohttp_server(app)


@dataclass
class Visit:
    """What a page did: its console errors, uncaught exceptions, and the requests it
    made to any host but the loopback one serving it (refused)."""

    page: Page
    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.outside == [], f"requests that leave the machine: {self.outside}"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if CHROMIUM is None:
        pytest.fail("no chromium binary, and this is root: `make chromium` installs Debian's")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        await launched.close()


@pytest.fixture
def visit(browser: Browser, tmp_path: Path) -> Callable[[str, str], Awaitable[Visit]]:
    async def open_page(url: str, name: str) -> Visit:
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        seen = Visit(page)
        page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: seen.errors.append(str(exc)))

        async def guard(route: Route, request: Request) -> None:
            host = re.match(r"[a-z]+://([^/:]+)", request.url)
            if request.url.startswith("data:") or (host and host[1] == "127.0.0.1"):
                await route.continue_()
            else:
                seen.outside.append(request.url)
                await route.abort()

        await page.route("**/*", guard)
        response = await page.goto(url, wait_until="networkidle")
        assert response is not None
        assert response.status == 200, url
        await page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        return seen

    return open_page


async def _headings(page: Page, selector: str) -> list[str]:
    """The texts of the headings ``selector`` finds, without their permalink sign."""
    return [
        text.replace("\u00b6", "").strip()
        for text in await page.locator(selector).all_inner_texts()
    ]


async def test_the_site_s_index_maps_the_documentation_by_reader(
    site_server: TestServer, visit: Callable[[str, str], Awaitable[Visit]]
) -> None:
    seen = await visit(str(site_server.make_url("/")), "index")
    page = seen.page
    assert await _headings(page, "article h1") == ["records-gateway"]
    navigation = await page.locator("nav.md-nav--primary").inner_text()
    for section in ("Calling the gateway", "Running it", "Switching upstreams", "Contributing"):
        assert section in navigation
    assert await page.locator("a[href='calling/']").count() >= 1
    seen.clean()


async def test_the_configuration_reference_has_every_section_and_key(
    site_server: TestServer, visit: Callable[[str, str], Awaitable[Visit]]
) -> None:
    seen = await visit(str(site_server.make_url("/configuration/")), "configuration")
    headings = await _headings(seen.page, "article h2")
    keys = await _headings(seen.page, "article h3")
    for section in sections():
        assert f"[{section.dotted}]" in headings
        for key in section.keys:
            assert key.dotted in keys
    assert "GATEWAY_CACHE__KEY_SECRET" in await seen.page.locator("article").inner_text()
    seen.clean()


async def test_the_errors_page_has_a_section_for_every_problem_type(
    site_server: TestServer, visit: Callable[[str, str], Awaitable[Visit]]
) -> None:
    seen = await visit(str(site_server.make_url("/errors/")), "errors")
    headings = await _headings(seen.page, "article h2")
    for slug in ("invalid-parameters", "upstream-contract", "upstream-timeout", "internal"):
        assert slug in headings
    assert set(headings) == TYPES
    examples = await seen.page.locator("#invalid-parameters ~ div pre").all_inner_texts()
    assert "urn:records-gateway:problem:invalid-parameters" in examples[1]
    seen.clean()


async def _operations(page: Page) -> list[str]:
    await page.locator(".opblock-summary-path").first.wait_for(timeout=15_000)
    return [
        text.strip().replace("\u200b", "")
        for text in await page.locator(".opblock-summary-path").all_inner_texts()
    ]


async def test_the_site_renders_the_api_reference(
    site_server: TestServer, visit: Callable[[str, str], Awaitable[Visit]]
) -> None:
    seen = await visit(str(site_server.make_url("/api/")), "api")
    operations = await _operations(seen.page)
    assert set(RECORD_PATHS) <= set(operations)
    assert "/admin/cache" in operations
    seen.clean()


async def test_the_gateway_s_docs_list_the_six_operations(
    gateway: Gateway, visit: Callable[[str, str], Awaitable[Visit]]
) -> None:
    seen = await visit(str(gateway.make_url("/docs")), "gateway-docs")
    operations = await _operations(seen.page)
    assert set(RECORD_PATHS) <= set(operations)
    assert "/admin/cache" not in operations  # no admin token, no admin routes
    title = await seen.page.locator(".info .title").inner_text()
    assert "records-gateway" in title
    seen.clean()
