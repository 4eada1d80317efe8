"""The caller's bearer credentials.

The Authorization header is kept verbatim, because it is forwarded upstream as the
caller sent it; the token itself never leaves this object except through
the cache's keyed fingerprint and the header that goes upstream. ``repr`` hides both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.errors import AuthenticationRequired

_SCHEME = "bearer"
_MISSING = "this route needs an 'Authorization: Bearer <token>' header"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A caller's ``Authorization: Bearer`` header and the token inside it."""

    authorization: str = field(repr=False)
    token: str = field(repr=False)


def parse_authorization(header: str | None) -> Credentials:
    """Credentials from an Authorization header; AuthenticationRequired if unusable."""
    token, problem = _bearer_token(header)
    if problem:
        raise AuthenticationRequired(problem)
    assert header is not None
    return Credentials(authorization=header, token=token)


def is_bearer(header: str) -> bool:
    """Whether ``parse_authorization(header)`` succeeds (without building credentials)."""
    return not _bearer_token(header)[1]


def _bearer_token(header: str | None) -> tuple[str, str]:
    """The token of a usable header and "", or "" and what is wrong with the header."""
    if header is None:
        return "", _MISSING
    # the usual spelling first: "Bearer", one space, a printable token with no space
    # at either end; anything else goes through the rules below
    token = header[7:]
    usual = header.startswith("Bearer ") and token[:1] > " " and token[-1:] > " "
    if usual and token.isprintable():
        return token, ""
    if not header.strip():
        return "", _MISSING
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != _SCHEME:
        return "", (
            "the Authorization header must use the Bearer scheme: 'Authorization: Bearer <token>'"
        )
    token = token.strip()
    if not token:
        return "", "the bearer token is empty"
    if not token.isprintable():
        return "", "the bearer token contains control characters"
    return token, ""
