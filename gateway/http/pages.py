"""The files of the pages the gateway serves a person (``GET /docs``, the admin
console): read once from the package at start, served as they are, each with the
page's Content-Security-Policy, and revalidated by their ETag. Nothing a page loads
comes from another origin."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources

from aiohttp import web

CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
}


def packaged(folder: str, name: str) -> bytes:
    """One file of ``gateway/http/<folder>`` as shipped."""
    return resources.files("gateway.http").joinpath(folder, name).read_bytes()


@dataclass(frozen=True, slots=True)
class PageFile:
    """One file of a page: its path, its bytes, and the headers every answer carries."""

    path: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The route's name: ``docs``, ``docs.init.js``."""
        return self.path.strip("/").replace("/", ".").replace("-", "_")

    @property
    def etag(self) -> str:
        return '"' + hashlib.sha256(self.body).hexdigest()[:32] + '"'

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers = {**self.headers, "ETag": self.etag}
        if self.named_in(request.headers.getall("If-None-Match", [])):
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.body, headers=headers)

    def named_in(self, fields: list[str]) -> bool:
        """Whether an ``If-None-Match`` of these ``fields`` names this file's tag (``*``,
        or the tag, weak or strong: RFC 9110 compares them weakly there)."""
        tags = (tag.strip() for field_ in fields for tag in field_.split(","))
        return any(tag == "*" or tag.removeprefix("W/") == self.etag for tag in tags)


def page_files(
    base: str,
    files: Iterable[tuple[str, bytes]],
    policy: str,
    extra: Mapping[str, str] | None = None,
) -> list[PageFile]:
    """A page's files under ``base``: ``("", html)`` is ``base`` itself, ``("x.js",
    body)`` is ``base/x.js``; each with ``policy`` and the headers every page file has."""
    made = []
    for name, body in files:
        kind = (name or "page.html").rpartition(".")[2]
        headers = {
            "Content-Type": CONTENT_TYPES[kind],
            "Content-Security-Policy": policy,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            **(extra or {}),
        }
        made.append(PageFile(f"{base}/{name}" if name else base, body, headers))
    return made
