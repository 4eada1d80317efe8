"""``GET /docs``: the published OpenAPI document rendered for a person by Swagger UI
(``server.docs``). Swagger UI's files ship in the package (``gateway/http/swagger_ui``,
pinned by :data:`PINNED`), so the page asks nothing of any origin but the gateway's:
its Content-Security-Policy says so to the browser too.

``make swagger-ui`` fetches the pinned release again from the npm registry.
"""

from __future__ import annotations

import hashlib

from gateway.http.pages import PageFile, packaged, page_files

SWAGGER_UI_VERSION = "5.35.0"

# the files of swagger-ui-dist, as the npm registry serves its release, by SHA-256
PINNED = {
    "swagger-ui-bundle.js": "e6a898692f2d768e807c3ba4626068a69a2c5dd960dd6c76f3e4d3a3de180af2",
    "swagger-ui.css": "5ed08757e53da3e026d6cbecc61fe5d43585c9560b302d534ad56692519a273d",
}

# what /docs serves: the page, and its files under /docs/
_FILES = (
    ("", "docs.html"),
    ("swagger-ui.css", "swagger-ui.css"),
    ("swagger-ui-bundle.js", "swagger-ui-bundle.js"),
    ("init.js", "init.js"),
)

# the browser may load nothing from another origin, and run no inline script; Swagger
# UI sets inline styles, and its icons are data: URLs
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; connect-src 'self'; font-src 'self';"
    " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def asset(name: str) -> bytes:
    """One file of ``gateway/http/swagger_ui`` as shipped."""
    return packaged("swagger_ui", name)


def pinned_asset(name: str) -> bytes:
    """A file of Swagger UI's, refused (ValueError) unless it is the pinned one."""
    body = asset(name)
    if hashlib.sha256(body).hexdigest() != PINNED[name]:
        raise ValueError(f"gateway/http/swagger_ui/{name} is not swagger-ui-dist's pinned file")
    return body


def docs_files() -> list[PageFile]:
    """The page and its files, under ``/docs``; revalidated on every load."""
    files = [(path, pinned_asset(name) if name in PINNED else asset(name)) for path, name in _FILES]
    return page_files("/docs", files, CONTENT_SECURITY_POLICY, {"Cache-Control": "no-cache"})
