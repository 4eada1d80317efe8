"""The TLS context the gateway reaches its upstream with, made from the settings.

Made when the settings are validated (so that a file that does not load is a
configuration error naming its key: exit 2 at start, a refused reload later), and
again by the upstream client at start and on every reload, so that a certificate
renewed in place is read without a restart.

``upstream.ca_file`` *replaces* the system's trust store rather than adding to it:
an upstream behind a private CA is then trusted through that CA alone, and a
certificate some public CA issued for its name is not enough.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def upstream_ssl_context(
    *,
    ca_file: Path | None,
    client_cert_file: Path | None,
    client_key_file: Path | None,
    verify: bool,
) -> ssl.SSLContext | None:
    """The context for the upstream's TLS; None when the defaults do (the system's
    trust store, verification on, no client certificate).

    Raises ValueError whose message starts with the key of the file that did not load.
    """
    if ca_file is None and client_cert_file is None and verify:
        return None
    for key, path in (
        ("ca_file", ca_file),
        ("client_cert_file", client_cert_file),
        ("client_key_file", client_key_file),
    ):
        if path is not None and not path.is_file():
            raise ValueError(f"{key}: {path} is not a readable file")
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"ca_file: {ca_file} does not load as PEM certificates ({_why(exc)})"
        ) from None
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert_file is not None:
        _load_client_certificate(context, client_cert_file, client_key_file)
    return context


def _load_client_certificate(context: ssl.SSLContext, cert: Path, key: Path | None) -> None:
    """The client certificate and its key into ``context``; the ValueError names the
    file at fault: the certificate when it does not parse, else the key (missing,
    unreadable, or not the certificate's)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(cert))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"client_cert_file: {cert} does not load as a PEM certificate ({_why(exc)})"
        ) from None
    try:
        context.load_cert_chain(str(cert), None if key is None else str(key), _no_pass_phrase)
    except _EncryptedKey:
        raise ValueError(
            f"{'client_cert_file' if key is None else 'client_key_file'}: the private key in"
            f" {key or cert} is encrypted; give it unencrypted, readable by the gateway"
            " only (nobody is there to type a pass phrase)"
        ) from None
    except (OSError, ssl.SSLError) as exc:
        if key is None:
            raise ValueError(
                f"client_cert_file: {cert} holds no private key that matches it, and"
                f" client_key_file is not set ({_why(exc)})"
            ) from None
        raise ValueError(
            f"client_key_file: {key} does not load as the private key of {cert} ({_why(exc)})"
        ) from None


class _EncryptedKey(Exception):
    """A private key asked for its pass phrase."""


def _no_pass_phrase() -> str:
    # without this callback OpenSSL would prompt on the terminal and block the process
    raise _EncryptedKey


def _why(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    return exc.strerror or str(exc) or type(exc).__name__
