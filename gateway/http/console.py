"""``GET /admin/console``: the admin console, a page for the people who tune and switch
(TTL evidence, the shadow report, purges), served while ``admin.token`` is set.

The page is static files of the package (``gateway/http/console_files``), with no build
step and nothing from another origin. It asks for the admin token once, keeps it in the
page's memory, and reads every view from the admin API the command line uses; it
writes every value it shows as text. Its files are served with a policy that allows
no inline script and no other origin, may not be framed, and are never stored.
"""

from __future__ import annotations

from gateway.http.pages import PageFile, packaged, page_files

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

HEADERS = {
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    # no other page of the origin (/docs among them) keeps a handle on the console's window
    "Cross-Origin-Opener-Policy": "same-origin",
}

_FILES = (("", "console.html"), ("console.js", "console.js"), ("console.css", "console.css"))


def console_files() -> list[PageFile]:
    """The console's page and files, under ``/admin/console``."""
    files = [(path, packaged("console_files", name)) for path, name in _FILES]
    return page_files("/admin/console", files, CONTENT_SECURITY_POLICY, HEADERS)
