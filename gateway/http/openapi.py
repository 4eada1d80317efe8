"""The OpenAPI 3.1 document of the gateway's own interface, built from the models.

Nothing that code already states is written twice here: the paths and the parameters
of each route come from :data:`gateway.records.routes.ROUTES`, the parameters' bounds
from the constants the validation reads, the body schemas from the pydantic models of
:mod:`gateway.normalise.schema` (through ``gateway.normalise.pages.ROUTE_MODELS``) and
the problem ``type`` URNs from :mod:`gateway.http.problems`. What is written here is
what no code holds as data: the descriptions, which problem types each status carries,
and the headers.

The document is built once per app (``create_app``) and served as bytes at
``GET /openapi.json``, without a token.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson
from pydantic.json_schema import models_json_schema

from gateway import __version__
from gateway.config.settings import Settings
from gateway.errors import InvalidParameters
from gateway.http.edge import REQUEST_ID_PATTERN
from gateway.http.openapi_parameters import parameter_components
from gateway.http.problems import PROBLEM_JSON, PROBLEM_TYPE_BASE
from gateway.normalise.pages import ROUTE_MODELS
from gateway.normalise.schema import SCHEMA_VERSION
from gateway.records.routes import ROUTES, RouteSpec

_JSON = "application/json"
_SCHEMAS = "#/components/schemas/"
_PARAMETERS = "#/components/parameters/"
_HEADERS = "#/components/headers/"
_RESPONSES = "#/components/responses/"

# What edge.choose_request_id echoes; anything else is replaced by a new id.
_REQUEST_ID = f"^{REQUEST_ID_PATTERN.pattern}$"

_DESCRIPTION = """\
records-gateway answers the six read routes of the Financial Records Read API with
one canonical form of every record, whatever variant the upstream sent:

- every field of the published schema is present in every record (each is listed as
  `required`); a value the upstream did not send is `null`;
- decimal quantities are JSON strings in plain notation, padded to the scale of the
  reference (`Expense.amount` and `Account.lastBalance` at least 4 decimal places,
  `Account.liquidityThreshold` at least 2) and never rounded;
- `Client.taxRetentionPercentage` is a JSON number, `Bank.country` an integer;
- UUIDs are lower-case canonical; `issueDate` and `dueDate` are `YYYY-MM-DD`;
  `paidAt` is ISO 8601 in UTC ending in `Z`;
- enumerations (`type`, `status`, `role`) are upper case; an unknown value is passed
  through;
- fields the reference does not define are dropped; text is never altered.

Every request is validated before anything reaches the upstream; every error is an
RFC 9457 problem (`application/problem+json`) whose `type` is a
`urn:records-gateway:problem:` URN. The record routes need
`Authorization: Bearer <token>`, forwarded to the upstream verbatim. `HEAD` is
answered like `GET`, without a body; other methods are 405. Answers may come from
the gateway's cache: `X-Cache`, `Cache-Status`, `Age` and `ETag` say so, and
`If-None-Match` and `Cache-Control: no-cache` / `no-store` steer it. Answers are
gzip-compressed (`Content-Encoding: gzip`) for callers whose `Accept-Encoding` prefers
gzip, except bodies under 256 bytes; each representation has its own `ETag`, and every
record answer says `Vary: Accept-Encoding`. Problems are never compressed.
"""


def _headers() -> dict[str, dict[str, Any]]:
    """components.headers: every response header the gateway documents."""
    return {
        "X-Request-ID": {
            "description": "The id of this request: the caller's X-Request-ID when usable,"
            " otherwise a new one. Also sent upstream and logged.",
            "required": True,
            "schema": {"type": "string", "pattern": _REQUEST_ID},
        },
        "X-Cache": {
            "description": "What the cache did: HIT (a fresh stored answer), STALE (a stored"
            " answer past its freshness, served while it is refreshed or instead of an"
            " upstream failure), MISS (fetched from the upstream), BYPASS (the cache was"
            " not consulted: caching is off for the route, or the caller sent no-store or"
            " no-cache).",
            "required": True,
            "schema": {"type": "string", "enum": ["HIT", "MISS", "STALE", "BYPASS"]},
        },
        "Cache-Status": {
            "description": "The same as an RFC 9211 Cache-Status field, e.g."
            " `records-gateway; hit; ttl=25` or `records-gateway; fwd=miss; stored`.",
            "required": True,
            "schema": {"type": "string"},
        },
        "Age": {
            "description": "Seconds since the answer was fetched from the upstream (RFC 9111).",
            "required": True,
            "schema": {"type": "integer", "minimum": 0},
        },
        "ETag": {
            "description": "A strong ETag of the representation sent (the gzip one's ends in"
            " -gzip inside the quotes); send it back in If-None-Match.",
            "required": True,
            "schema": {"type": "string"},
        },
        "Vary": {
            "description": "The answer depends on the request's Accept-Encoding.",
            "required": True,
            "schema": {"type": "string", "const": "Accept-Encoding"},
        },
        "Content-Encoding": {
            "description": "gzip when the body is gzip-compressed (the caller's"
            " Accept-Encoding prefers it, and the body is 256 bytes or more); absent when"
            " it is not.",
            "schema": {"type": "string", "const": "gzip"},
        },
        "Cache-Control": {
            "description": "How long the caller may reuse the answer, e.g."
            " `private, max-age=30`: the seconds it stays fresh in the cache, 0 when it is"
            " stale or was not stored.",
            "required": True,
            "schema": {"type": "string"},
        },
        "WWW-Authenticate": {
            "description": "The scheme to authenticate with.",
            "required": True,
            "schema": {"type": "string", "examples": ['Bearer realm="records-gateway"']},
        },
        "Retry-After": {
            "description": "On a 429, the upstream's Retry-After (seconds or an HTTP date),"
            " when it sent one; on a 503, the seconds until the gateway tries the upstream"
            " again.",
            "schema": {"type": "string"},
        },
    }


def _header_refs(*names: str) -> dict[str, dict[str, str]]:
    return {name: {"$ref": _HEADERS + name} for name in names}


_REQUEST_HEADERS = ("If-None-Match", "Cache-Control", "Pragma", "Accept-Encoding", "X-Request-ID")
_CACHE_HEADERS = ("X-Cache", "Cache-Status", "Age", "ETag", "Cache-Control", "Vary")


class _ProblemResponse(NamedTuple):
    """One documented error status: its problem types and extra headers."""

    status: int
    name: str
    description: str
    slugs: tuple[str, ...]
    headers: tuple[str, ...] = ()


_PROBLEMS = (
    _ProblemResponse(
        400,
        "InvalidParameters",
        "A bad, unknown or repeated parameter; `errors` lists them (the first"
        f" {InvalidParameters.LISTED}; `omittedErrors` counts the others). Nothing was"
        " sent upstream.",
        ("invalid-parameters",),
    ),
    _ProblemResponse(
        401,
        "Unauthenticated",
        "No usable `Authorization: Bearer` header (unauthenticated), or the upstream"
        " refused the token (upstream-unauthorized).",
        ("unauthenticated", "upstream-unauthorized"),
        ("WWW-Authenticate",),
    ),
    _ProblemResponse(403, "Forbidden", "The upstream refused access.", ("upstream-forbidden",)),
    _ProblemResponse(404, "NotFound", "The upstream has no such record.", ("not-found",)),
    _ProblemResponse(
        417,
        "ExpectationFailed",
        "An `Expect` field asks for more than `100-continue`. Nothing was sent upstream.",
        ("expectation-failed",),
    ),
    _ProblemResponse(
        429,
        "RateLimited",
        "The upstream is rate limiting this caller; its Retry-After is kept.",
        ("rate-limited",),
        ("Retry-After",),
    ),
    _ProblemResponse(
        500,
        "InternalError",
        "The gateway failed; the request id is in its logs.",
        ("internal",),
    ),
    _ProblemResponse(
        502,
        "BadGateway",
        "The upstream cannot be reached (upstream-unavailable), answered 5xx or an"
        " unexpected status (upstream-failed), or sent a body that breaks the API"
        " contract (upstream-contract).",
        ("upstream-unavailable", "upstream-failed", "upstream-contract"),
    ),
    _ProblemResponse(
        503,
        "UpstreamUnavailable",
        "The upstream failed repeatedly and its circuit breaker is open: the gateway"
        " answers without calling it, and this request had no stale answer to serve."
        " `Retry-After` says when the gateway tries the upstream again.",
        ("upstream-unavailable",),
        ("Retry-After",),
    ),
    _ProblemResponse(
        504,
        "GatewayTimeout",
        "The upstream did not answer within upstream.timeout_s.",
        ("upstream-timeout",),
    ),
    _ProblemResponse(
        505,
        "HTTPVersionNotSupported",
        "The request line's version is neither HTTP/1.1 nor HTTP/1.0 (aiohttp answers"
        " in that version); the connection is closed. Nothing was sent upstream.",
        ("http-version-not-supported",),
    ),
)


def _problem_schemas() -> dict[str, dict[str, Any]]:
    return {
        "Problem": {
            "title": "Problem",
            "description": "An RFC 9457 problem: the body of every error response.",
            "type": "object",
            "required": ["type", "title", "status", "detail", "instance", "requestId"],
            "properties": {
                "type": {
                    "type": "string",
                    "pattern": f"^{PROBLEM_TYPE_BASE}[a-z0-9-]+$",
                    "description": "A URN naming the kind of problem.",
                },
                "title": {"type": "string", "description": "A summary of the kind."},
                "status": {
                    "type": "integer",
                    "minimum": 400,
                    "maximum": 599,
                    "description": "The HTTP status.",
                },
                "detail": {
                    "type": "string",
                    "description": "What happened, for a person; never contains the token.",
                },
                "instance": {
                    "type": "string",
                    "description": "The request's path and query, as sent.",
                },
                "requestId": {
                    "type": "string",
                    "description": "The X-Request-ID of the request.",
                },
                "upstreamStatus": {
                    "type": "integer",
                    "minimum": 100,
                    "maximum": 599,
                    "description": "The upstream's status, when it answered.",
                },
                "retryAfter": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Seconds until the gateway tries the upstream again, as"
                    " its Retry-After says (503 upstream-unavailable only).",
                },
                "errors": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": InvalidParameters.LISTED,
                    "items": {"$ref": _SCHEMAS + "ParameterError"},
                    "description": "The bad parameters, in the order of the request (400 only).",
                },
                "omittedErrors": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "How many more bad parameters there are than `errors`"
                    " lists (400 only, when there are more).",
                },
            },
        },
        "ParameterError": {
            "title": "ParameterError",
            "type": "object",
            "required": ["parameter", "message"],
            "properties": {
                "parameter": {"type": "string", "description": "The parameter's name."},
                "message": {"type": "string", "description": "What is wrong with it."},
            },
            "additionalProperties": False,
        },
    }


def _problem_response(problem: _ProblemResponse) -> dict[str, Any]:
    narrowed: dict[str, Any] = {
        "properties": {
            "type": {"enum": [PROBLEM_TYPE_BASE + slug for slug in problem.slugs]},
            "status": {"const": problem.status},
        }
    }
    if problem.status == 400:
        narrowed["required"] = ["errors"]
    return {
        "description": problem.description,
        "headers": _header_refs("X-Request-ID", *problem.headers),
        "content": {
            PROBLEM_JSON: {"schema": {"allOf": [{"$ref": _SCHEMAS + "Problem"}, narrowed]}}
        },
    }


def _responses() -> dict[str, dict[str, Any]]:
    """components.responses: 304 and every problem response."""
    responses = {
        "NotModified": {
            "description": "If-None-Match matched the ETag of the representation this"
            " request would get; no body.",
            "headers": _header_refs("X-Request-ID", *_CACHE_HEADERS),
        }
    }
    responses.update({problem.name: _problem_response(problem) for problem in _PROBLEMS})
    return responses


def _model_schemas() -> dict[str, dict[str, Any]]:
    """The schemas of every route's body and what they embed, from the models.

    pydantic leaves a field with a default out of ``required``; the published
    contract is that every field is always present (possibly null), so every
    property is made required, and the defaults and generated titles dropped.
    """
    _, top = models_json_schema(
        [(model, "serialization") for model in ROUTE_MODELS.values()],
        ref_template=_SCHEMAS + "{model}",
    )
    schemas: dict[str, dict[str, Any]] = top["$defs"]
    for schema in schemas.values():
        properties: dict[str, dict[str, Any]] = schema["properties"]
        for prop in properties.values():
            prop.pop("default", None)
            prop.pop("title", None)
        schema["required"] = list(properties)
        schema["additionalProperties"] = False
    return schemas


def _record_operation(route: RouteSpec) -> dict[str, Any]:
    model = ROUTE_MODELS[route.name]
    names = [*([route.path_param] if route.path_param else []), *route.query_params]
    summary = (model.__doc__ or route.name).strip().splitlines()[0]
    responses: dict[str, Any] = {
        "200": {
            "description": summary,
            "headers": _header_refs("X-Request-ID", *_CACHE_HEADERS, "Content-Encoding"),
            "content": {_JSON: {"schema": {"$ref": _SCHEMAS + model.__name__}}},
        },
        "304": {"$ref": _RESPONSES + "NotModified"},
    }
    for problem in _PROBLEMS:
        responses[str(problem.status)] = {"$ref": _RESPONSES + problem.name}
    return {
        "operationId": f"get_{route.name}",
        "summary": summary,
        "tags": ["records"],
        "security": [{"bearer": []}],
        "parameters": [{"$ref": _PARAMETERS + name} for name in (*names, *_REQUEST_HEADERS)],
        "responses": responses,
    }


def _plain_operation(
    operation_id: str,
    summary: str,
    schema: dict[str, Any],
    headers: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A GET of the gateway's own, answered without a token."""
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["gateway"],
        "security": [],
        "responses": {
            "200": {
                "description": summary,
                "headers": {**_header_refs("X-Request-ID"), **(headers or {})},
                "content": {_JSON: {"schema": schema}},
            }
        },
    }


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The document as plain data."""
    paths: dict[str, Any] = {route.template: {"get": _record_operation(route)} for route in ROUTES}
    paths["/healthz"] = {
        "get": _plain_operation(
            "healthz",
            "Liveness: the process answers. Touches neither the upstream nor the cache.",
            {
                "type": "object",
                "required": ["status"],
                "properties": {"status": {"const": "ok"}},
                "additionalProperties": False,
            },
            {"Cache-Control": {"required": True, "schema": {"const": "no-store"}}},
        )
    }
    component = {
        "type": "object",
        "required": ["status", "lastError"],
        "properties": {
            "status": {"enum": ["ok", "degraded", "down", "disabled"]},
            "lastError": {"type": ["string", "null"]},
            "source": {"enum": ["traffic", "check"]},
            "circuit": {
                "description": "The component's circuit breaker: open, the gateway does not"
                " call it (the upstream: stale answers and 503s; the cache: skipped)",
                "enum": ["closed", "open", "half-open"],
            },
        },
    }
    readiness = {
        "type": "object",
        "required": ["status", "components"],
        "properties": {
            "status": {"enum": ["ok", "degraded", "down"]},
            "components": {
                "type": "object",
                "required": ["upstream", "cache"],
                "properties": {
                    "upstream": component,
                    "cache": component,
                    "fleet": {
                        "description": "With the redis backend: whether every instance"
                        " sharing the cache runs the same cache configuration",
                        "type": "object",
                        "required": ["status", "fingerprint", "lastError"],
                        "properties": {
                            "status": {"enum": ["ok", "degraded", "unknown"]},
                            "fingerprint": {"type": "string"},
                            "instances": {"type": "integer"},
                            "configurations": {
                                "type": "object",
                                "additionalProperties": {"type": "integer"},
                            },
                            "lastError": {"type": ["string", "null"]},
                        },
                    },
                },
            },
        },
    }
    ready = _plain_operation(
        "readyz",
        "Readiness: 200 while the gateway can serve (a cache that is down only degrades it),"
        " 503 when the upstream is down and there is no cache to serve from.",
        readiness,
    )
    ready["responses"]["503"] = {
        "description": "Not ready: the upstream is down and nothing can be served.",
        "content": {_JSON: {"schema": readiness}},
    }
    paths["/readyz"] = {"get": ready}
    metrics = _plain_operation(
        "metrics", "Prometheus metrics, text exposition format.", {"type": "string"}
    )
    metrics["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    paths["/metrics"] = {"get": metrics}
    paths["/openapi.json"] = {
        "get": _plain_operation("openapi", "This document.", {"type": "object"})
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "records-gateway",
            "version": SCHEMA_VERSION,
            "description": _DESCRIPTION,
            "x-gateway-version": __version__,
        },
        "tags": [
            {"name": "records", "description": "The six record routes; a bearer token each."},
            {"name": "gateway", "description": "The gateway's own routes; no token."},
        ],
        "paths": paths,
        "components": {
            "schemas": {**_model_schemas(), **_problem_schemas()},
            "parameters": parameter_components(settings),
            "headers": _headers(),
            "responses": _responses(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The caller's token for the upstream; the"
                    " Authorization header is forwarded to it verbatim.",
                }
            },
        },
    }


def openapi_bytes(settings: Settings) -> bytes:
    """The document as the bytes served at GET /openapi.json."""
    return orjson.dumps(openapi_document(settings))
