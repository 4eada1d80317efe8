"""The OpenAPI 3.1 document of the gateway's own interface, built from the models.

Nothing that code already states is written twice here: the paths, operations and
parameters of each route come from the route declarations (:mod:`gateway.routing`, by
default :data:`gateway.routing.standard.ROUTES`), the body schemas from the pydantic
models the routes declare, and the problem ``type`` URNs from
:mod:`gateway.http.problems`. What is written here is what no code holds as data: the
gateway's own routes, which problem types each status carries, and the headers.

The document is built by ``create_app``, and again by every applied reload (it states
live keys: ``limits.max_limit``, ``cache.honor_client_no_cache``); it is served as bytes
at ``GET /openapi.json``, without a token (``gateway.http.service.ServedDocument``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic.json_schema import models_json_schema

from gateway import __version__
from gateway.config.settings import Settings
from gateway.http.openapi_admin import (
    FEED_SCHEME,
    SECURITY_SCHEME,
    admin_paths,
    admin_schemas,
    feed_scheme,
    route_parameter,
    security_scheme,
)
from gateway.http.openapi_parameters import parameter_components
from gateway.http.openapi_responses import (
    EDGE_ERRORS,
    RESPONSES,
    SCHEMAS,
    header_refs,
    headers,
    problem_schemas,
    response_refs,
    responses,
)
from gateway.normalise.schema import SCHEMA_VERSION
from gateway.routing.routes import Route, RouteTable
from gateway.routing.standard import ROUTES

_JSON = "application/json"
_PARAMETERS = "#/components/parameters/"

# Real answers of the gateway in front of the reference upstream, by example name
# (recorded by tests/http/openapi_examples.py; `make openapi-examples`).
EXAMPLES_FILE = Path(__file__).with_name("openapi_examples.json")

_DESCRIPTION = """\
records-gateway answers the six read routes of the Financial Records Read API with
one canonical form of every record, whatever variant the upstream sent:

- every field of the published schema is present in every record (each is listed as
  `required`); a value the upstream did not send is `null`, except the `id` of every
  record, which is never null (a record without one is a 502 upstream-contract);
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
answered like `GET`, without a body; other methods are 405; a path not listed here is
a 404 not-found problem. Every path can also answer the 400 of a request the HTTP
parser refuses (malformed-request), 417, 500 and 505. On `/expenses`, `dateFrom`
must not be after `dateTo` (a 400 otherwise), a rule between two parameters that the
schemas below cannot state. Answers may come from
the gateway's cache: `X-Cache`, `Cache-Status`, `Age` and `ETag` say so, and
`If-None-Match` and `Cache-Control: no-cache` / `no-store` steer it. Answers are
gzip-compressed (`Content-Encoding: gzip`) for callers whose `Accept-Encoding` prefers
gzip, except bodies under 256 bytes; each representation has its own `ETag`, and every
record answer says `Vary: Accept-Encoding`. Problems are never compressed.
"""


_REQUEST_HEADERS = ("If-None-Match", "Cache-Control", "Pragma", "Accept-Encoding", "X-Request-ID")
_CACHE_HEADERS = ("X-Cache", "Cache-Status", "Age", "ETag", "Cache-Control", "Vary")
_RECORD_ERRORS = tuple(sorted({*EDGE_ERRORS, 401, 403, 404, 405, 429, 502, 503, 504}))

_INFO = {
    "title": "records-gateway",
    "version": SCHEMA_VERSION,
    "x-gateway-version": __version__,
    "contact": {"name": "records-gateway maintainers"},
    "license": {
        "name": "Proprietary: for the organisation's internal use",
        "identifier": "LicenseRef-Proprietary",
    },
}

_RECORD_TEXT = (
    " Every record in the published schema, whatever variant the upstream sent. Needs"
    " the caller's bearer token, which is forwarded to the upstream; answers are cached"
    " per path, query and token (`X-Cache` and `Cache-Status` say whether this one was)."
)


def load_examples() -> dict[str, Any]:
    """The recorded examples, by name; none when the file is missing (while it is being
    recorded for the first time)."""
    try:
        examples: dict[str, Any] = orjson.loads(EXAMPLES_FILE.read_bytes())
    except FileNotFoundError:
        return {}
    return examples


def _nullable_types(schema: dict[str, Any]) -> None:
    """``anyOf: [X, {type: null}]`` as ``X`` with ``type: [t, "null"]`` where X is a
    plain typed schema (not a $ref): the same schema, that generators turn into an
    optional field rather than a union of numbered classes."""
    choices = schema.get("anyOf")
    if not isinstance(choices, list) or len(choices) != 2 or {"type": "null"} not in choices:
        return
    (other,) = (choice for choice in choices if choice != {"type": "null"})
    if "$ref" in other or not isinstance(other.get("type"), str):
        return
    del schema["anyOf"]
    schema.update(other)
    schema["type"] = [other["type"], "null"]


def _model_schemas(routes: RouteTable) -> dict[str, dict[str, Any]]:
    """The schemas of every route's body and what they embed, from the models.

    pydantic leaves a field with a default out of ``required``; the published
    contract is that every field is always present (possibly null), so every
    property is made required, and the defaults and generated titles dropped.
    """
    _, top = models_json_schema(
        [(route.model, "serialization") for route in routes],
        ref_template=SCHEMAS + "{model}",
    )
    schemas: dict[str, dict[str, Any]] = top["$defs"]
    for schema in schemas.values():
        properties: dict[str, dict[str, Any]] = schema["properties"]
        for prop in properties.values():
            prop.pop("default", None)
            prop.pop("title", None)
            _nullable_types(prop)
        schema["required"] = list(properties)
        schema["additionalProperties"] = False
    return schemas


def _example(examples: dict[str, Any], name: str) -> dict[str, Any]:
    """``examples`` of a media type: the recorded answer ``name``, when there is one."""
    if name not in examples:
        return {}
    example = examples[name]
    return {"examples": {name: {"summary": example["request"], "value": example["body"]}}}


def _record_operation(route: Route, examples: dict[str, Any]) -> dict[str, Any]:
    model = route.model
    names = [*([route.path_param] if route.path_param else []), *route.query_params]
    summary = (model.__doc__ or route.name).strip().splitlines()[0]
    operation_id, text = route.operation_id, route.text
    media = {"schema": {"$ref": SCHEMAS + model.__name__}, **_example(examples, route.name)}
    responses_: dict[str, Any] = {
        "200": {
            "description": summary,
            "headers": header_refs("X-Request-ID", *_CACHE_HEADERS, "Content-Encoding"),
            "content": {_JSON: media},
        },
        "304": {"$ref": RESPONSES + "NotModified"},
        **response_refs(*_RECORD_ERRORS),
    }
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": text + _RECORD_TEXT,
        "tags": ["records"],
        "security": [{"bearer": []}],
        "parameters": [{"$ref": _PARAMETERS + name} for name in (*names, *_REQUEST_HEADERS)],
        "responses": responses_,
    }


def _plain_operation(
    operation_id: str,
    summary: str,
    description: str,
    schema: dict[str, Any],
    headers_: dict[str, dict[str, Any]] | None = None,
    media_type: str = _JSON,
) -> dict[str, Any]:
    """A GET of the gateway's own, answered without a token."""
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "tags": ["gateway"],
        "security": [],
        "responses": {
            "200": {
                "description": summary,
                "headers": {**header_refs("X-Request-ID"), **(headers_ or {})},
                "content": {media_type: {"schema": schema}},
            },
            **response_refs(*sorted({*EDGE_ERRORS, 405})),
        },
    }


# the answers of /healthz, /readyz and /metrics are never to be reused
_NO_STORE = {"Cache-Control": {"required": True, "schema": {"type": "string", "const": "no-store"}}}


def _readiness_schema() -> dict[str, Any]:
    component = {
        "type": "object",
        "required": ["status", "lastError"],
        "properties": {
            "status": {"$ref": SCHEMAS + "ComponentStatus"},
            "lastError": {"type": ["string", "null"]},
            "source": {"type": "string", "enum": ["traffic", "check"]},
            "circuit": {
                "description": "The component's circuit breaker: open, the gateway does not"
                " call it (the upstream: stale answers and 503s; the cache: skipped)",
                "type": "string",
                "enum": ["closed", "open", "half-open"],
            },
            "reads": {
                "$ref": SCHEMAS + "CallCounts",
                "description": "The cache's recent reads (the cache component only)",
            },
            "writes": {
                "$ref": SCHEMAS + "CallCounts",
                "description": "The cache's recent writes (the cache component only)",
            },
            "probes": {
                "$ref": SCHEMAS + "CallCounts",
                "description": "The readiness check's recent probes of the cache (the cache"
                " component only)",
            },
        },
    }
    return {
        "Readiness": {
            "type": "object",
            "required": ["status", "components"],
            "properties": {
                "status": {"$ref": SCHEMAS + "ReadinessStatus"},
                "components": {"$ref": SCHEMAS + "ReadinessComponents"},
            },
        },
        "ReadinessComponents": {
            "type": "object",
            "required": ["upstream", "cache"],
            "properties": {
                "upstream": {"$ref": SCHEMAS + "ComponentHealth"},
                "cache": {"$ref": SCHEMAS + "ComponentHealth"},
                "fleet": {"$ref": SCHEMAS + "FleetHealth"},
                "workers": {"$ref": SCHEMAS + "WorkersHealth"},
            },
        },
        "ComponentHealth": component,
        "CallCounts": {
            "type": "object",
            "required": ["ok", "failed"],
            "properties": {
                "ok": {"type": "integer", "minimum": 0},
                "failed": {"type": "integer", "minimum": 0},
            },
            "additionalProperties": False,
        },
        # named, so that generators name each enumeration for what it is
        "ReadinessStatus": {"type": "string", "enum": ["ok", "degraded", "down"]},
        "ComponentStatus": {"type": "string", "enum": ["ok", "degraded", "down", "disabled"]},
        "FleetStatus": {"type": "string", "enum": ["ok", "degraded", "unknown"]},
        "FleetHealth": {
            "description": "With the redis backend: whether every instance sharing the"
            " cache runs the same cache configuration",
            "type": "object",
            "required": ["status", "fingerprint", "lastError"],
            "properties": {
                "status": {"$ref": SCHEMAS + "FleetStatus"},
                "fingerprint": {"type": "string"},
                "instances": {"type": "integer"},
                "configurations": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                },
                "lastError": {"type": ["string", "null"]},
            },
        },
        "WorkersHealth": {
            "description": "With several workers (`server.workers`): whether every worker"
            " of this instance runs the same live configuration (a fingerprint of its live"
            " keys); `degraded` while one does not",
            "type": "object",
            "required": ["status", "workers", "fingerprint", "configurations"],
            "properties": {
                "status": {"type": "string", "enum": ["ok", "degraded"]},
                "workers": {"type": "integer", "minimum": 2},
                "fingerprint": {"type": "string"},
                "configurations": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": {"status": {"type": "string", "const": "ok"}},
            "additionalProperties": False,
        },
    }


def _gateway_paths(examples: dict[str, Any]) -> dict[str, Any]:
    """/healthz, /readyz, /metrics and /openapi.json: no token."""
    healthz = _plain_operation(
        "getHealth",
        "Liveness",
        "200 while the process answers. Touches neither the upstream nor the cache: for"
        " a container's or orchestrator's liveness check.",
        {"$ref": SCHEMAS + "Health"},
        _NO_STORE,
    )
    healthz["responses"]["200"]["content"][_JSON].update(_example(examples, "healthz"))
    ready = _plain_operation(
        "getReadiness",
        "Readiness",
        "200 while the gateway can serve (a cache that is down only degrades it), 503"
        " when the upstream is down and there is no cache to serve from: for a load"
        " balancer.",
        {"$ref": SCHEMAS + "Readiness"},
        _NO_STORE,
    )
    ready["responses"]["503"] = {
        "description": "Not ready: the upstream is down and nothing can be served.",
        "headers": {**header_refs("X-Request-ID"), **_NO_STORE},
        "content": {_JSON: {"schema": {"$ref": SCHEMAS + "Readiness"}}},
    }
    ready["responses"] = dict(sorted(ready["responses"].items()))
    metrics = _plain_operation(
        "getMetrics",
        "Prometheus metrics",
        "Every metric of the gateway (of every worker), in Prometheus' text exposition format.",
        {"type": "string"},
        _NO_STORE,
        media_type="text/plain",
    )
    document = _plain_operation(
        "getOpenapi",
        "This document",
        "The OpenAPI document of this gateway, as configured (limits, admin routes).",
        {"type": "object"},
    )
    return {
        "/healthz": {"get": healthz},
        "/readyz": {"get": ready},
        "/metrics": {"get": metrics},
        "/openapi.json": {"get": document},
    }


def _docs_operation() -> dict[str, Any]:
    """GET /docs (``server.docs``): this document for a person, an HTML page."""
    return _plain_operation(
        "getApiDocs",
        "API documentation",
        "This document rendered for a person by Swagger UI, whose files the gateway"
        " serves itself (under /docs/): the page asks nothing of any other origin.",
        {"type": "string"},
        media_type="text/html",
    )


def _console_operation() -> dict[str, Any]:
    """GET /admin/console (with ``admin.token``): the admin console, an HTML page."""
    operation = _plain_operation(
        "getAdminConsole",
        "Admin console",
        "A page for the people who tune and switch: it asks for the admin token, keeps it"
        " in its memory, and shows what the admin routes say (readiness, traffic, TTL"
        " advice, the shadow report) and purges. The page itself holds no data; its files"
        " are under /admin/console/.",
        {"type": "string"},
        media_type="text/html",
    )
    operation["tags"] = ["admin"]
    return operation


def openapi_document(settings: Settings, routes: RouteTable = ROUTES) -> dict[str, Any]:
    """The document of a gateway serving ``routes``, as plain data."""
    examples = load_examples()
    paths: dict[str, Any] = {
        route.template: {"get": _record_operation(route, examples)} for route in routes
    }
    paths.update(_gateway_paths(examples))
    if settings.server.docs:
        paths["/docs"] = {"get": _docs_operation()}
    tags = [
        {"name": "records", "description": "The six record routes; the caller's bearer token."},
        {"name": "gateway", "description": "The gateway's own routes; no token."},
    ]
    security_schemes = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "The caller's token for the upstream; the Authorization header"
            " is forwarded to it verbatim.",
        }
    }
    schemas = {**_model_schemas(routes), **problem_schemas(), **_readiness_schema()}
    if settings.admin.routes_exist:
        paths.update(admin_paths(route_parameter(routes)))
    if settings.admin.token is not None:
        paths["/admin/console"] = {"get": _console_operation()}
        tags.append({"name": "admin", "description": "Operations; the admin token."})
        security_schemes[SECURITY_SCHEME] = security_scheme()
        security_schemes[FEED_SCHEME] = feed_scheme()
        schemas.update(admin_schemas(routes))
    return {
        "openapi": "3.1.0",
        "info": {**_INFO, "description": _DESCRIPTION},
        "servers": [
            {
                "url": "/",
                "description": "The gateway that serves this document, at the address it"
                " was fetched from",
            }
        ],
        "tags": tags,
        "paths": paths,
        "components": {
            "schemas": schemas,
            "parameters": parameter_components(settings, examples, routes),
            "headers": headers(),
            "responses": responses(examples, _CACHE_HEADERS),
            "securitySchemes": security_schemes,
        },
    }


def openapi_bytes(settings: Settings, routes: RouteTable = ROUTES) -> bytes:
    """The document as the bytes served at GET /openapi.json."""
    return orjson.dumps(openapi_document(settings, routes))
