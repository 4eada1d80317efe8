"""The caller's bearer credentials.

The Authorization header is kept verbatim, because it is forwarded upstream as the
caller sent it; the token itself never leaves this object except through
``fingerprint`` (a keyed hash) and the header that goes upstream. ``repr`` hides both.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from gateway.errors import AuthenticationRequired

_SCHEME = "bearer"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A caller's ``Authorization: Bearer`` header and the token inside it."""

    authorization: str = field(repr=False)
    token: str = field(repr=False)

    def fingerprint(self, secret: bytes) -> str:
        """HMAC-SHA256 of the token under ``secret``, hex, for keys and logs."""
        return hmac.new(secret, self.token.encode(), hashlib.sha256).hexdigest()


def parse_authorization(header: str | None) -> Credentials:
    """Credentials from an Authorization header; AuthenticationRequired if unusable."""
    if header is None or not header.strip():
        raise AuthenticationRequired("this route needs an 'Authorization: Bearer <token>' header")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != _SCHEME:
        raise AuthenticationRequired(
            "the Authorization header must use the Bearer scheme: 'Authorization: Bearer <token>'"
        )
    token = token.strip()
    if not token:
        raise AuthenticationRequired("the bearer token is empty")
    if any(ch < " " or ch == "\x7f" for ch in token):
        raise AuthenticationRequired("the bearer token contains control characters")
    return Credentials(authorization=header, token=token)
