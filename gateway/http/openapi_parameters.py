"""The parameters of the OpenAPI document: every route parameter as its declaration
describes it (gateway.routing: the same kinds and bounds the validation checks with),
and the request headers.
"""

from __future__ import annotations

from typing import Any

from gateway.config.settings import Settings
from gateway.routing.parameters import Param
from gateway.routing.routes import RouteTable


def parameter_components(
    settings: Settings, examples: dict[str, Any], routes: RouteTable
) -> dict[str, dict[str, Any]]:
    """components.parameters: every parameter of ``routes`` by its name, with its
    example (taken from the recorded ``examples`` where it says so), and the request
    headers."""
    max_limit = settings.limits.max_limit
    parameters: dict[str, dict[str, Any]] = {}
    for route in routes:
        if route.path is not None:
            parameters[route.path.name] = _parameter(route.path, "path", max_limit)
        for param in route.query:
            parameters[param.name] = _parameter(param, "query", max_limit)
    for param in routes.params.values():
        value = param.example_in(examples)
        if value is not None:
            parameters[param.name]["example"] = value
    parameters["If-None-Match"] = _header_parameter(
        "If-None-Match",
        "ETags of answers the caller holds (or *); when one matches the current answer's"
        " ETag, the answer is 304 without a body.",
    )
    no_cache = (
        "no-cache: do not serve a stored answer; ask the upstream and store its answer."
        if settings.cache.honor_client_no_cache
        else "no-cache: ignored by this deployment (cache.honor_client_no_cache is off)."
    )
    parameters["Cache-Control"] = _header_parameter(
        "Cache-Control",
        f"{no_cache} no-store: neither serve nor store a stored answer. Other directives"
        " are ignored.",
    )
    parameters["Pragma"] = _header_parameter(
        "Pragma", "no-cache is taken as Cache-Control: no-cache when Cache-Control is absent."
    )
    parameters["Accept-Encoding"] = _header_parameter(
        "Accept-Encoding",
        "Content codings the caller accepts (RFC 9110): the answer is gzip-compressed when"
        " gzip (or x-gzip, or *) is acceptable and not less preferred than identity;"
        " otherwise, and when the field is absent or empty, it is not compressed.",
    )
    parameters["X-Request-ID"] = _header_parameter(
        "X-Request-ID",
        "The caller's request id, echoed in X-Request-ID and sent upstream when it is 1"
        " to 128 characters of [A-Za-z0-9._-]; otherwise the gateway makes a new one.",
    )
    return parameters


def _parameter(param: Param, where: str, max_limit: int) -> dict[str, Any]:
    return {
        "name": param.name,
        "in": where,
        "required": where == "path",
        "description": param.describe(max_limit),
        "schema": param.kind.schema(max_limit),
    }


def _header_parameter(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }
