"""The admin console (docs/console.md) in a real headless Chromium: a gateway in front of
the reference upstream, whose accounts change, shadowed to a drifting twin that also
returns a hostile record. Sign in; the fleet; the TTL chart; `data[].amount` a
regression and `paymentId` noise, an example side by side; a purge and its count; the
hostile record as text. No console error, no request leaving the machine; a screenshot
of each view in the test's folder."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import Browser, Page, Request, Route, async_playwright
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.demo import create_demo_app
from gateway.http.admin import SHADOW
from gateway.http.app import create_app

from ..conftest import AUTH, FakeClock, base_url, gateway_client, make_settings, until
from .test_pages import CHROMIUM, CHROMIUM_ARGS, pytestmark  # noqa: F401  (the skip)

ADMIN_TOKEN = "console-admin-token-0123456789"
HOSTILE = "<img src=x onerror=window.__pwned=1>"
Client = TestClient[web.Request, web.Application]


def _hostile_twin(twin: TestServer) -> web.Application:
    """The drifting twin, with one client's description made markup."""

    async def relay(request: web.Request) -> web.Response:
        async with ClientSession() as session:
            url = twin.make_url(request.path_qs)
            async with session.get(
                url, headers={"Authorization": request.headers.get("Authorization", "")}
            ) as answer:
                body = await answer.read()
                status = answer.status
        if request.path == "/clients" and status == 200:
            page = json.loads(body)
            page["data"][0]["description"] = HOSTILE
            body = json.dumps(page).encode()
        return web.Response(body=body, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", relay)
    return app


@pytest.fixture
async def console_gateway(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, clock: FakeClock
) -> Client:
    primary = await aiohttp_server(
        create_demo_app(drift=["noise"], change_rates={"accounts": 0.05}, clock=clock, seed=7)
    )
    twin = await aiohttp_server(
        create_demo_app(drift=["amount-scale", "noise"], clock=clock, seed=7)
    )
    candidate = await aiohttp_server(_hostile_twin(twin))
    settings = make_settings(
        base_url(primary),
        admin={"token": ADMIN_TOKEN},
        cache={"ttl_s": {"accounts": 60}, "max_stale_share": 0.1},
        upstream={"shadow": {"base_url": base_url(candidate), "sample_ratio": 1.0}},
    )
    client = await gateway_client(aiohttp_client, create_app(settings, clock=clock))
    shadow = client.app[SHADOW]
    # evidence for the TTL advice: 40 refreshes of /accounts, 70 s apart, some changed
    assert (await client.get("/accounts", headers=AUTH)).status == 200
    for _ in range(40):
        for _ in range(3):
            assert (await client.get("/accounts", headers=AUTH)).status == 200
        clock.advance(70)
        assert (await client.get("/accounts", headers=AUTH)).status == 200
        await until(lambda: shadow.in_flight == 0)
    for path in ("/clients", "/expenses", "/expenses?page=2", "/expenses?page=3"):
        assert (await client.get(path, headers=AUTH)).status == 200
        await until(lambda: shadow.in_flight == 0)
    return client


def _shot(tmp_path: Path, name: str) -> list[Path]:
    """Where a view's screenshot goes: the test's folder, and the documentation's
    images too when `make console-screenshots` asks (RECORDS_GATEWAY_SCREENSHOTS)."""
    places = [tmp_path / f"{name}.png"]
    folder = os.environ.get("RECORDS_GATEWAY_SCREENSHOTS")
    if folder:
        places.append(Path(folder) / f"{name}.png")
    return places


async def _screenshot(page: Page, tmp_path: Path, name: str) -> None:
    image = await page.screenshot(full_page=True)
    for place in _shot(tmp_path, name):
        place.write_bytes(image)


class Seen:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.outside: list[str] = []

    def clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.outside == [], self.outside


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[tuple[Page, Seen]]:
    if CHROMIUM is None:
        pytest.fail("no chromium binary, and this is root: `make chromium` installs Debian's")
    async with async_playwright() as playwright:
        browser: Browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        opened = await browser.new_page(viewport={"width": 1280, "height": 900})
        seen = Seen()
        opened.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
        opened.on("pageerror", lambda exc: seen.errors.append(str(exc)))

        async def guard(route: Route, request: Request) -> None:
            if request.url.startswith(("http://127.0.0.1:", "data:")):
                await route.continue_()
            else:
                seen.outside.append(request.url)
                await route.abort()

        await opened.route("**/*", guard)
        yield opened, seen
        await browser.close()


async def _sign_in(page: Page, client: Client, token: str) -> None:
    response = await page.goto(str(client.make_url("/admin/console")), wait_until="networkidle")
    assert response is not None
    assert response.status == 200
    await page.get_by_label("Admin token").fill(token)
    await page.keyboard.press("Enter")


async def test_the_console_is_served_with_its_policy_and_without_the_token_shows_only_the_login(
    console_gateway: Client, page: tuple[Page, Seen], tmp_path: Path
) -> None:
    opened, seen = page
    answer = await console_gateway.get("/admin/console")
    policy = answer.headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy
    assert "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert answer.headers["X-Frame-Options"] == "DENY"
    assert answer.headers["Cache-Control"] == "no-store"
    response = await opened.goto(str(console_gateway.make_url("/admin/console")))
    assert response is not None
    assert await opened.locator("#login").is_visible()
    assert not await opened.locator("#app").is_visible()
    await _sign_in(opened, console_gateway, "not-the-admin-token")
    alert = opened.locator("#login-problem")
    await alert.get_by_text("Authentication required").wait_for()
    assert not await opened.locator("#app").is_visible()
    await _screenshot(opened, tmp_path, "console-login")
    # the token is nowhere but in the page's memory
    assert "not-the-admin-token" not in opened.url
    assert await opened.context.cookies() == []
    assert await opened.evaluate("localStorage.length + sessionStorage.length") == 0
    seen.errors = [error for error in seen.errors if "401" not in error]
    seen.clean()


async def test_the_console_s_views_by_keyboard(
    console_gateway: Client, page: tuple[Page, Seen], tmp_path: Path
) -> None:
    opened, seen = page
    await _sign_in(opened, console_gateway, ADMIN_TOKEN)
    # Fleet: readiness, the traffic of each route, the configuration (secrets redacted)
    await opened.locator("#config").wait_for()
    fleet = await opened.locator("#view").inner_text()
    assert "upstream" in fleet
    assert "expenses" in fleet
    assert "This instance (no shared cache)" in fleet  # the memory backend: no fleet
    assert ADMIN_TOKEN not in fleet
    assert "**********" in fleet
    await _screenshot(opened, tmp_path, "console-fleet")

    # TTLs, by the arrow key from the focused tab: the chart of the expenses route
    await opened.locator("#tab-fleet").focus()
    await opened.keyboard.press("ArrowRight")
    chart = opened.locator("#ttl-accounts svg.chart")
    await chart.wait_for()
    assert await chart.locator("polyline.curve").count() == 1
    assert await chart.locator("line.limit").count() == 1
    assert "max 10.0%" in (await chart.text_content() or "")
    # the best hit rate of accounts: one key, 161 requests
    accounts = await opened.locator("#view table tr", has_text="accounts").first.inner_text()
    assert accounts.split("\t")[-1].strip() == "99.4%"
    await _screenshot(opened, tmp_path, "console-ttls")

    # Switching upstreams: amount a regression, paymentId noise, an example side by side
    await opened.keyboard.press("ArrowRight")
    expenses = opened.locator("#shadow-expenses")
    await expenses.wait_for()
    regressions = await expenses.locator("table").nth(0).inner_text()
    noise = await expenses.locator("table").nth(1).inner_text()
    assert "data[].amount" in regressions
    assert "paymentId" not in regressions
    assert "paymentId" in noise
    # the worst route first: expenses (3 requests differ) before clients (1)
    sections = await opened.locator("#view section").evaluate_all("nodes => nodes.map(n => n.id)")
    assert sections.index("shadow-expenses") < sections.index("shadow-clients")
    await expenses.locator("button[data-field='data[].amount']").press("Enter")
    example = opened.locator("#examples .side-by-side").first
    await example.wait_for()
    assert await example.locator("mark.differs").count() == 2
    # the two whole answers of the first example, the amounts' lines marked
    await opened.locator("#examples button.whole").first.press("Enter")
    whole = opened.locator("#examples pre.whole-answer").first
    await whole.wait_for()
    marked = await whole.locator("mark.differs").all_inner_texts()
    assert any('"amount"' in line for line in marked)
    assert not any('"id"' in line for line in marked)  # the same records, in order
    # the hostile record is text: its characters shown, nothing made of them
    clients = opened.locator("#shadow-clients")
    await clients.locator("button[data-field='data[].description']").press("Enter")
    shown = opened.locator("#examples .side-by-side").first
    await shown.get_by_text(HOSTILE, exact=False).wait_for()
    assert await opened.locator("#view img").count() == 0
    assert await opened.evaluate("window.__pwned === undefined")
    await _screenshot(opened, tmp_path, "console-shadow")
    # the shadow's share changed from the page: a reload of that key, after the change is shown
    await opened.locator("#shadow-ratio").fill("0.5")
    await opened.locator("#shadow-apply").press("Enter")
    shown_change = await opened.locator("#shadow-change li").all_inner_texts()
    assert shown_change[-1] == "upstream.shadow.sample_ratio: 1 → 0.5"
    await opened.keyboard.press("Enter")  # the confirmation has the focus
    await (
        opened.locator("#shadow-result")
        .get_by_text("Applied: upstream.shadow.sample_ratio")
        .wait_for()
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    report = await (await console_gateway.get("/admin/shadow", headers=admin)).json()
    assert report["sampleRatio"] == 0.5

    # Purging a route: the confirmation says what, the answer its count
    await opened.keyboard.press("Shift+Tab")  # back into the page, then to the tabs
    await opened.locator("#tab-shadow").focus()
    await opened.keyboard.press("ArrowRight")
    await opened.locator("#purge-what").select_option("route")
    await opened.locator("#purge-route").select_option("expenses")
    await opened.locator("#purge-start").press("Enter")
    said = await opened.locator("#purge-said").inner_text()
    assert "route expenses" in said
    await opened.keyboard.press("Enter")  # the confirmation has the focus
    result = opened.locator("#purge-result")
    await result.wait_for()
    assert "Purged: expenses" in await result.inner_text()
    await _screenshot(opened, tmp_path, "console-purge")
    answer = await console_gateway.get("/expenses", headers=AUTH)
    assert answer.headers["X-Cache"] == "MISS"
    seen.clean()


async def test_without_an_admin_token_there_is_no_console(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    secret = "a-change-feed-secret-of-32-characters-or-more"
    for admin in ({}, {"change_feed_secret": secret}):
        settings = make_settings(base_url(upstream), admin=admin)
        client = await gateway_client(aiohttp_client, create_app(settings))
        answer = await client.get("/admin/console")
        assert answer.status in (401, 404)
        assert answer.headers["Content-Type"] == "application/problem+json"


async def _tab_to(page: Page, element_id: str, most: int = 12) -> None:
    """Press Tab until the element ``element_id`` has the focus."""
    for _ in range(most):
        if await page.evaluate("document.activeElement && document.activeElement.id") == element_id:
            return
        await page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached #{element_id}")


async def test_a_purge_with_the_keyboard_alone(
    console_gateway: Client, page: tuple[Page, Seen]
) -> None:
    """docs/console.md, "With the keyboard": signing in, choosing a view and purging a
    route with Tab, the arrow keys and Enter, and no pointer."""
    opened, seen = page
    response = await opened.goto(str(console_gateway.make_url("/admin/console")))
    assert response is not None
    await _tab_to(opened, "token")
    await opened.keyboard.type(ADMIN_TOKEN)
    await opened.keyboard.press("Enter")
    await opened.locator("#config").wait_for()
    await _tab_to(opened, "tab-fleet")
    for _ in range(3):
        await opened.keyboard.press("ArrowRight")
    await opened.locator("#purge-what").wait_for()
    await _tab_to(opened, "purge-route")
    await opened.keyboard.press("ArrowDown")  # users -> clients
    await _tab_to(opened, "purge-start")
    await opened.keyboard.press("Enter")
    assert "route clients" in await opened.locator("#purge-said").inner_text()
    await opened.keyboard.press("Escape")  # no, after all
    assert await opened.locator("#purge-said").count() == 0
    await _tab_to(opened, "purge-start")
    await opened.keyboard.press("Enter")
    await opened.keyboard.press("Enter")  # the confirmation's Purge has the focus
    result = opened.locator("#purge-result")
    await result.wait_for()
    assert "Purged: clients" in await result.inner_text()
    assert await opened.evaluate("document.activeElement.id") == "purge-result"
    seen.clean()
