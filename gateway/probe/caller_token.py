"""Where ``probe`` and ``compare`` take the caller's bearer token from.

A command line is visible to every user of the machine (``ps``, ``/proc/PID/cmdline``)
for the whole run, so the token is best read from a file (``--token-file PATH``) or
from the environment (:data:`TOKEN_ENV`); ``--token T`` remains for a machine of one's
own. A flag wins over the environment; ``--token`` and ``--token-file`` together are a
usage error of the parser. A token that is missing, unreadable or one the gateway
would refuse from a caller is a ConfigError naming its source, never quoting it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gateway.errors import AuthenticationRequired, ConfigError
from gateway.records.credentials import parse_authorization

TOKEN_ENV = "RECORDS_GATEWAY_TOKEN"
# far more than any bearer token; a larger file is not one
_MAX_FILE_BYTES = 64 * 1024


def caller_token(given: str | None, path: Path | None, environ: Mapping[str, str]) -> str:
    """The token of ``--token`` (``given``), else of ``--token-file`` (``path``, one
    trailing line break dropped), else of :data:`TOKEN_ENV` in ``environ``."""
    if given is not None:
        return _checked(given, "--token")
    if path is not None:
        return _checked(_read(path), f"--token-file {path}", path=str(path))
    if TOKEN_ENV in environ:
        return _checked(environ[TOKEN_ENV], TOKEN_ENV)
    raise ConfigError(
        f"no bearer token: give --token-file PATH or set {TOKEN_ENV}"
        " (or --token T, which other users of the machine can see)"
    )


def _read(path: Path) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"--token-file {path}: cannot read it ({exc.strerror or type(exc).__name__})",
            path=str(path),
        ) from None
    if len(data) > _MAX_FILE_BYTES:
        raise ConfigError(
            f"--token-file {path}: larger than {_MAX_FILE_BYTES} bytes; not a token",
            path=str(path),
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {path}: not UTF-8 text", path=str(path)) from None
    return text.removesuffix("\n").removesuffix("\r")


def _checked(token: str, source: str, **where: str) -> str:
    try:
        parse_authorization(f"Bearer {token}")
    except AuthenticationRequired as exc:
        raise ConfigError(f"{source}: {exc}", **where) from None
    if token != token.strip():
        # sent as it is, so not trimmed the way the gateway trims a caller's header
        raise ConfigError(f"{source}: the bearer token has white space at an end", **where)
    return token
