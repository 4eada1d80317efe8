"""docs/errors.md: a section for every problem type, and its examples the gateway's real
answers: the curl examples asked of the gateway in front of the reference upstream, the
upstream's faults provoked with an upstream that commits them, the parser's refusals
sent as raw bytes. Only ``requestId`` (new on every request) is not compared."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, unused_port
from yarl import URL

from gateway.config.settings import Settings
from gateway.http.openapi import openapi_bytes

from ..conftest import AUTH, GatewayFactory, base_url
from ..process.test_listener import Listening, listening  # noqa: F401  (the fixture)
from .test_wire import filter_parser_log

PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
TYPE_BASE = "urn:records-gateway:problem:"
ADMIN = "an-admin-token-of-some-length"
Gateway = TestClient[web.Request, web.Application]

# every problem type the gateway answers with: those its published document names, the
# admin routes' included
TYPES = set(
    re.findall(
        r"urn:records-gateway:problem:([a-z-]+)",
        openapi_bytes(Settings.model_validate({"admin": {"token": ADMIN}})).decode(),
    )
)


@dataclass
class Section:
    slug: str
    statuses: set[int]
    curl: str | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)

    def example(self, status: int) -> dict[str, Any]:
        (found,) = [example for example in self.examples if example["status"] == status]
        return found


def _sections() -> dict[str, Section]:
    text = PAGE.read_text(encoding="utf-8")
    found: dict[str, Section] = {}
    for part in re.split(r"\n## ", text)[1:]:
        heading = re.match(r"`([a-z-]+)` \{ #([a-z-]+) \}\n\n\*\*([0-9, ]+)\*\*", part)
        assert heading is not None, part[:80]
        assert heading[1] == heading[2], "the section's anchor is its type"
        section = Section(heading[1], {int(status) for status in heading[3].split(", ")})
        curl = re.search(r"```console\n\$ (.*)\n```", part)
        section.curl = curl[1] if curl else None
        section.examples = [
            json.loads(block) for block in re.findall(r"```json\n(.*?)```", part, re.S)
        ]
        found[section.slug] = section
    return found


SECTIONS = _sections()


def _shown(answer: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in answer.items() if name != "requestId"}


def test_every_problem_type_has_a_section() -> None:
    assert len(TYPES) >= 20
    assert set(SECTIONS) == TYPES


@pytest.mark.parametrize("slug", sorted(TYPES))
def test_every_example_is_a_problem_of_its_section(slug: str) -> None:
    section = SECTIONS[slug]
    assert section.examples, f"{slug} has no example"
    assert {example["status"] for example in section.examples} == section.statuses
    for example in section.examples:
        assert example["type"] == TYPE_BASE + slug
        assert {"title", "detail", "instance", "requestId"} <= set(example)


@pytest.mark.parametrize("slug", sorted(slug for slug, s in SECTIONS.items() if s.curl))
async def test_a_curl_example_is_what_the_gateway_answers(gateway: Gateway, slug: str) -> None:
    """The command as `make run` would take it: the gateway in front of the reference
    upstream, token demo-token."""
    section = SECTIONS[slug]
    assert section.curl is not None
    words = shlex.split(section.curl)
    assert words[:2] == ["curl", "-s"]
    method, headers = "GET", {}
    for flag, value in itertools.pairwise(words):
        if flag == "-X":
            method = value
        if flag == "-H":
            name, _, text = value.partition(": ")
            headers[name] = text
    url = URL(words[-1])
    assert (url.host, url.port) == ("127.0.0.1", 8080)
    response = await gateway.request(method, url.path_qs, headers=headers)
    (status,) = section.statuses
    assert response.status == status
    assert response.headers["Content-Type"] == "application/problem+json"
    assert _shown(await response.json(content_type=None)) == _shown(section.example(status))


def _faulty_upstream() -> web.Application:
    """An upstream that commits one fault a route."""

    async def forbidden(request: web.Request) -> web.Response:
        return web.json_response({"error": "no"}, status=403)

    async def limited(request: web.Request) -> web.Response:
        return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "30"})

    async def failing(request: web.Request) -> web.Response:
        return web.json_response({"error": "boom"}, status=500)

    async def off_schema(request: web.Request) -> web.Response:
        page = {"data": [{"id": "EXP-1", "amount": "abc"}], "total": 1, "page": 1, "limit": 10}
        return web.json_response(page)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/users", forbidden)
    app.router.add_get("/clients", limited)
    app.router.add_get("/accounts", failing)
    app.router.add_get("/expenses", off_schema)
    app.router.add_get("/accounts/{id}", slow)
    return app


async def test_the_upstream_s_faults_are_answered_as_shown(
    aiohttp_server: Any, gateway_factory: GatewayFactory
) -> None:
    upstream = await aiohttp_server(_faulty_upstream())
    gateway = await gateway_factory(
        base_url(upstream), upstream={"timeout_s": 1.0, "breaker_failures": 1000}
    )
    asked = {
        "upstream-forbidden": "/users",
        "rate-limited": "/clients",
        "upstream-failed": "/accounts",
        "upstream-contract": "/expenses",
        "upstream-timeout": "/accounts/ACC-001",
    }
    for slug, path in asked.items():
        response = await gateway.get(path, headers=AUTH)
        (status,) = SECTIONS[slug].statuses
        assert response.status == status, slug
        assert _shown(await response.json(content_type=None)) == _shown(
            SECTIONS[slug].example(status)
        ), slug


async def test_an_upstream_that_cannot_be_reached_and_its_open_circuit_are_answered_as_shown(
    gateway_factory: GatewayFactory,
) -> None:
    port = unused_port()
    gateway = await gateway_factory(f"http://127.0.0.1:{port}", upstream={"breaker_failures": 1})
    section = SECTIONS["upstream-unavailable"]
    unreachable = await gateway.get("/users", headers=AUTH)
    assert unreachable.status == 502
    answer = _shown(await unreachable.json(content_type=None))
    # the page shows the default upstream's port
    answer["detail"] = answer["detail"].replace(str(port), "9090")
    assert answer == _shown(section.example(502))
    open_circuit = await gateway.get("/users", headers=AUTH)
    assert open_circuit.status == 503
    shown = _shown(section.example(503))
    answered = _shown(await open_circuit.json(content_type=None))
    # the seconds left until the trial depend on how long the first request took
    left = answered.pop("retryAfter")
    assert 1 <= left <= shown.pop("retryAfter")
    answered["detail"] = answered["detail"].replace(f"about {left} s", "about 5 s")
    assert answered == shown


async def test_a_change_notice_s_refusals_are_answered_as_shown(
    gateway_factory: GatewayFactory, upstream: TestServer
) -> None:
    gateway = await gateway_factory(base_url(upstream), admin={"token": ADMIN})
    admin = {"Authorization": f"Bearer {ADMIN}"}
    plain = await gateway.post(
        "/admin/records/changed", data=b"expense:1", headers={**admin, "Content-Type": "text/plain"}
    )
    assert _shown(await plain.json(content_type=None)) == _shown(
        SECTIONS["unsupported-media-type"].example(415)
    )
    large = await gateway.post(
        "/admin/records/changed",
        data=b"[" + b" " * (256 * 1024) + b"]",
        headers={**admin, "Content-Type": "application/json"},
    )
    assert _shown(await large.json(content_type=None)) == _shown(
        SECTIONS["content-too-large"].example(413)
    )


async def _raw(port: int, request: bytes) -> tuple[bytes, dict[str, Any]]:
    """The status line and the problem of ``request`` sent as bytes, read to the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "plain"])
async def test_the_parser_s_refusals_are_answered_as_shown(
    listening: Listening,  # noqa: F811  (the fixture of tests/process/test_listener.py)
    monkeypatch: pytest.MonkeyPatch,
    fast_path: bool,
) -> None:
    """Both ways, served as a worker serves it: the fast path's, and aiohttp's parser
    behind the listener's cuts."""
    filter_parser_log(monkeypatch)
    listening_port = await listening(fast_path)
    head = b"GET /users HTTP/1.1\r\nHost: x\r\nBad\x01: y\r\n\r\n"
    line, malformed = await _raw(listening_port, head)
    assert line == b"HTTP/1.0 400 Bad Request"
    assert _shown(malformed) == _shown(SECTIONS["malformed-request"].example(400))
    line, version = await _raw(listening_port, b"GET /users HTTP/2.0\r\nHost: x\r\n\r\n")
    assert line == b"HTTP/1.1 505 HTTP Version Not Supported"
    assert _shown(version) == _shown(SECTIONS["http-version-not-supported"].example(505))
