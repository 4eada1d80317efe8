"""The OpenAPI 3.1 document of the gateway's own interface, built from the models."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.settings import Settings


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The document as plain data."""
    return {"openapi": "3.1.0", "info": {"title": "records-gateway", "version": "0"}, "paths": {}}


def openapi_bytes(settings: Settings) -> bytes:
    """The document as the bytes served at GET /openapi.json."""
    return orjson.dumps(openapi_document(settings))
