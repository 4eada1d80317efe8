"""The parameters of the OpenAPI document: every route parameter with its validation,
read from the constants that gateway.records.routes validates with, and the request headers.
"""

from __future__ import annotations

from typing import Any

from gateway.config.settings import Settings
from gateway.records.routes import (
    DEFAULT_LIMIT,
    DEFAULT_PAGE,
    MAX_PAGE,
    MAX_TEXT_LENGTH,
    NUMBER_PATTERN,
    ROUTES,
    TYPES,
)

# What params._has_control refuses: C0, DEL and C1.
_NO_CONTROL = r"^[^\u0000-\u001f\u007f-\u009f]*$"


def _text(description: str) -> tuple[str, dict[str, Any]]:
    schema = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TEXT_LENGTH,
        "pattern": _NO_CONTROL,
    }
    return (
        f"{description} Non-empty, at most {MAX_TEXT_LENGTH} characters, no control characters.",
        schema,
    )


def _parameter_rules(max_limit: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """(description, JSON Schema) of every path and query parameter, by name.

    Mirrors ``gateway.records.routes.parse_record_query``; tests/http/test_openapi.py checks both
    against the same sample values.
    """
    limit: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": max_limit}
    limit_description = f"Items per page, from 1 to {max_limit} (the gateway's limits.max_limit)."
    limit["default"] = min(DEFAULT_LIMIT, max_limit)
    return {
        "page": (
            "Page number.",
            {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
        ),
        "limit": (limit_description, limit),
        "dateFrom": (
            "Only expenses issued on or after this day: a real calendar date YYYY-MM-DD,"
            " not after dateTo.",
            {"type": "string", "format": "date"},
        ),
        "dateTo": (
            "Only expenses issued on or before this day: a real calendar date YYYY-MM-DD,"
            " not before dateFrom.",
            {"type": "string", "format": "date"},
        ),
        "amount": (
            "Only expenses of this amount: a finite decimal number such as 12.50, -3 or"
            " 1E2, at most 40 digits once written out; forwarded in plain notation"
            " (12.5, 100).",
            {"type": "string", "pattern": f"^(?:{NUMBER_PATTERN.pattern})$"},
        ),
        "concept": _text("Text searched in the expenses' description and category."),
        "account": _text("Only expenses of this account, by id or name."),
        "status": _text("Only expenses with this status, e.g. PAID."),
        "type": (
            " or ".join(TYPES) + ", in any case (e.g. cash); forwarded in upper case.",
            {"type": "string", "enum": list(TYPES)},
        ),
        "user": _text("Only expenses of this user, by id or username."),
        "bankCode": _text("Only accounts of the bank with this code."),
        "expenseId": (
            "The expense's UUID, in any case (the 32-hex-digit form without hyphens is"
            " accepted too); forwarded in lower-case canonical form.",
            {"type": "string", "format": "uuid"},
        ),
        "accountId": _text(
            "The account's id or name; percent-encode spaces, '/' and non-ASCII letters."
            " Forwarded percent-encoded as exactly one path segment."
        ),
    }


def _parameter_examples(examples: dict[str, Any]) -> dict[str, Any]:
    """An example of each parameter, taken from the recorded answers (an expense and an
    account the reference upstream holds, and their values), so that a tool that sends
    the examples finds records."""
    values: dict[str, Any] = {"page": DEFAULT_PAGE, "limit": 2}
    expense = examples.get("expense", {}).get("body")
    account = examples.get("account", {}).get("body")
    if expense is not None:
        values.update(
            expenseId=expense["id"],
            dateFrom=expense["issueDate"],
            dateTo=expense["issueDate"],
            amount=expense["amount"],
            concept=expense["category"],
            account=expense["account"]["name"],
            status=expense["status"],
            type=expense["type"],
            user=expense["user"]["username"],
        )
    if account is not None:
        values.update(accountId=account["id"], bankCode=account["bankCode"])
    return {name: value for name, value in values.items() if value is not None}


def parameter_components(settings: Settings, examples: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """components.parameters: every route parameter by its name, with an example, and
    the request headers."""
    rules = _parameter_rules(settings.limits.max_limit)
    shown = _parameter_examples(examples)
    parameters: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        if route.path_param is not None:
            parameters[route.path_param] = _parameter(route.path_param, "path", rules)
        for name in route.query_params:
            parameters[name] = _parameter(name, "query", rules)
    for name, value in shown.items():
        parameters[name]["example"] = value
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


def _parameter(
    name: str, where: str, rules: dict[str, tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    description, schema = rules[name]
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema,
    }


def _header_parameter(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": {"type": "string"},
    }
