"""``GET /docs``: the published OpenAPI document rendered for a person by Swagger UI
(``server.docs``). Swagger UI's files ship in the package (``gateway/http/swagger_ui``,
pinned by :data:`PINNED`), so the page asks nothing of any origin but the gateway's:
its Content-Security-Policy says so to the browser too.

``make swagger-ui`` fetches the pinned release again from the npm registry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

SWAGGER_UI_VERSION = "5.35.0"

# the files of swagger-ui-dist, as the npm registry serves its release, by SHA-256
PINNED = {
    "swagger-ui-bundle.js": "e6a898692f2d768e807c3ba4626068a69a2c5dd960dd6c76f3e4d3a3de180af2",
    "swagger-ui.css": "5ed08757e53da3e026d6cbecc61fe5d43585c9560b302d534ad56692519a273d",
}

# what /docs serves: its path under /docs, the package's file, the content type
_FILES = (
    ("", "docs.html", "text/html; charset=utf-8"),
    ("/swagger-ui.css", "swagger-ui.css", "text/css; charset=utf-8"),
    ("/swagger-ui-bundle.js", "swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    ("/init.js", "init.js", "text/javascript; charset=utf-8"),
)

# the browser may load nothing from another origin, and run no inline script; Swagger
# UI sets inline styles, and its icons are data: URLs
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; connect-src 'self'; font-src 'self';"
    " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def asset(name: str) -> bytes:
    """One file of ``gateway/http/swagger_ui`` as shipped."""
    return resources.files("gateway.http").joinpath("swagger_ui", name).read_bytes()


def pinned_asset(name: str) -> bytes:
    """A file of Swagger UI's, refused (ValueError) unless it is the pinned one."""
    body = asset(name)
    if hashlib.sha256(body).hexdigest() != PINNED[name]:
        raise ValueError(f"gateway/http/swagger_ui/{name} is not swagger-ui-dist's pinned file")
    return body


@dataclass(frozen=True, slots=True)
class DocsFile:
    """One file of the page, read once at start and served as it is."""

    path: str
    body: bytes
    content_type: str
    etag: str

    @property
    def name(self) -> str:
        """The route's name: ``docs``, ``docs.init.js``."""
        return self.path.strip("/").replace("/", ".").replace("-", "_")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers = {
            "Content-Type": self.content_type,
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
            "ETag": self.etag,
        }
        if self.named_in(request.headers.getall("If-None-Match", [])):
            return web.Response(status=304, headers=headers)
        return web.Response(body=self.body, headers=headers)

    def named_in(self, fields: list[str]) -> bool:
        """Whether an ``If-None-Match`` of these ``fields`` names this file's tag (``*``,
        or the tag, weak or strong: RFC 9110 compares them weakly there)."""
        tags = (tag.strip() for field in fields for tag in field.split(","))
        return any(tag == "*" or tag.removeprefix("W/") == self.etag for tag in tags)


def docs_files() -> list[DocsFile]:
    """The page and its files, under ``/docs``."""
    files = []
    for suffix, name, content_type in _FILES:
        body = pinned_asset(name) if name in PINNED else asset(name)
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files.append(DocsFile(f"/docs{suffix}", body, content_type, etag))
    return files
