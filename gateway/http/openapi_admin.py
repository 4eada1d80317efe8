"""The admin routes in the OpenAPI document (present when ``admin.token`` is set, as the
routes are), with their own security scheme: the admin token, not a caller's token.

The paths and methods come from :data:`gateway.http.admin.ADMIN_ROUTES`; what is written
here is each operation's text and the schemas of its answers.
"""

from __future__ import annotations

from typing import Any

from gateway.comparison.diff import KINDS
from gateway.config.backends import BACKENDS
from gateway.http.admin import ADMIN_ROUTES
from gateway.http.openapi_responses import EDGE_ERRORS, SCHEMAS, header_refs, response_refs
from gateway.http.problems import PROBLEM_JSON
from gateway.routing.routes import RouteTable

_JSON = "application/json"
SECURITY_SCHEME = "adminToken"
FEED_SCHEME = "changeFeedSignature"

_NUMBER_OR_NULL = {"type": ["number", "null"]}
_SHARES = {
    "type": "object",
    "required": ["staleShare", "hitRatio"],
    "properties": {"staleShare": _NUMBER_OR_NULL, "hitRatio": _NUMBER_OR_NULL},
}


_SHADOW_COUNTS = ("compared", "identical", "identicalShare", "different", "noiseOnly", "skipped")


def _shadow_counts() -> dict[str, dict[str, Any]]:
    count = {"type": "integer", "minimum": 0}
    return {
        "compared": {**count, "description": "Requests with both answers compared."},
        "identical": count,
        "identicalShare": {
            "type": ["number", "null"],
            "minimum": 0,
            "maximum": 1,
            "description": "identical / compared; null before any comparison.",
        },
        "different": count,
        "noiseOnly": {**count, "description": "Compared requests that differ in noise only."},
        "skipped": count,
    }


_WORKERS_REACHED = {
    "description": "With several workers (`server.workers`): the workers of this instance"
    " the action was sent to (the one that took it included), and those that confirmed it"
    " is in force in them.",
    "type": "object",
    "required": ["told", "confirmed"],
    "properties": {
        "told": {"type": "integer", "minimum": 2},
        "confirmed": {"type": "integer", "minimum": 1},
    },
}


def admin_schemas(routes: RouteTable) -> dict[str, dict[str, Any]]:
    """components.schemas of the admin answers."""
    return {
        "WorkersReached": _WORKERS_REACHED,
        "PurgeResult": {
            "type": "object",
            "required": ["purged", "backend"],
            "properties": {
                "purged": {
                    "type": "string",
                    "description": "The route purged, `all`, or `records` (a purge by record).",
                    "enum": ["all", "records", *(route.name for route in routes)],
                },
                "records": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "A purge by record: the records, as canonical references.",
                },
                "mode": {
                    "type": "string",
                    "enum": ["hard", "soft"],
                    "description": "A purge by record: removed, or marked stale.",
                },
                "entries": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "A purge by record: the entries that held one of the"
                    " records (with the memory backend and several workers, this worker's).",
                },
                "backend": {
                    "type": "string",
                    "description": "The cache backend, as `cache.backend` names it.",
                    "enum": list(BACKENDS.names()),
                },
                "instances": {
                    "description": "With Redis: the instances told of the purge, and those"
                    " that confirmed dropping their near-cache copies.",
                    "type": "object",
                    "required": ["told", "confirmed"],
                    "properties": {
                        "told": {"type": ["integer", "null"]},
                        "confirmed": {"type": ["integer", "null"]},
                    },
                },
                "workers": {"$ref": SCHEMAS + "WorkersReached"},
            },
        },
        "ReloadResult": {
            "type": "object",
            "required": ["ok", "applied", "needsRestart", "error"],
            "properties": {
                "ok": {"type": "boolean"},
                "applied": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The keys whose new values are in use.",
                },
                "needsRestart": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Changed keys that only a restart applies.",
                },
                "error": {"type": ["string", "null"]},
                "workers": {"$ref": SCHEMAS + "WorkersReached"},
            },
        },
        "ShadowReport": {
            "type": "object",
            "description": "The shadow traffic's report (docs/switching-upstreams.md):"
            " its state, and per route what was compared and how it differed.",
            "required": [
                "primary",
                "candidate",
                "since",
                "totals",
                "routes",
                "enabled",
                "sampleRatio",
                "maxInFlight",
                "inFlight",
                "workers",
            ],
            "properties": {
                "primary": {"type": "string", "description": "The primary's base URL."},
                "candidate": {
                    "type": "string",
                    "description": "The candidate's base URL; empty when none is set.",
                },
                "since": {
                    "type": "string",
                    "format": "date-time",
                    "description": "When the report began (UTC).",
                },
                "totals": {"$ref": SCHEMAS + "ShadowTotals"},
                "routes": {
                    "type": "object",
                    "description": "By route name, the routes with a comparison.",
                    "propertyNames": {"enum": [route.name for route in routes]},
                    "additionalProperties": {"$ref": SCHEMAS + "ShadowRoute"},
                },
                "enabled": {"type": "boolean"},
                "sampleRatio": {"type": "number", "minimum": 0, "maximum": 1},
                "maxInFlight": {"type": "integer", "minimum": 1},
                "inFlight": {"type": "integer", "minimum": 0},
                "workers": {"type": "integer", "minimum": 1},
            },
        },
        "ShadowTotals": {
            "type": "object",
            "description": "Every route's comparisons added up.",
            "required": [*_SHADOW_COUNTS, "candidateErrors"],
            "properties": {
                **_shadow_counts(),
                "candidateErrors": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Requests whose candidate gave no answer to compare.",
                },
            },
        },
        "ShadowRoute": {
            "type": "object",
            "description": "One route's comparisons: the fields that differ, worst first,"
            " and those that differ as the primary differs from itself (noise).",
            "required": [*_SHADOW_COUNTS, "candidateErrors", "fields", "noise"],
            "properties": {
                **_shadow_counts(),
                "candidateErrors": {
                    "type": "object",
                    "description": "Requests whose candidate gave no answer to compare, by"
                    " what it did instead (its status, timeout, unreachable, invalid-body).",
                    "additionalProperties": {"type": "integer", "minimum": 1},
                },
                "fields": {"type": "array", "items": {"$ref": SCHEMAS + "ShadowField"}},
                "noise": {"type": "array", "items": {"$ref": SCHEMAS + "ShadowField"}},
            },
        },
        "ShadowField": {
            "type": "object",
            "description": "One field that differs (`data[].amount`: list indices folded),"
            " how often and in which kinds, and the first examples; a noisy field also has"
            " the primary's own differences as its evidence.",
            "required": ["field", "total", "kinds", "examples"],
            "properties": {
                "field": {"type": "string"},
                "total": {"type": "integer", "minimum": 0},
                "kinds": {
                    "type": "object",
                    "propertyNames": {"enum": list(KINDS)},
                    "additionalProperties": {"type": "integer", "minimum": 1},
                },
                "examples": {"type": "array", "items": {"$ref": SCHEMAS + "ShadowExample"}},
                "evidence": {"type": "array", "items": {"$ref": SCHEMAS + "ShadowExample"}},
            },
        },
        "ShadowExample": {
            "type": "object",
            "description": "One difference seen: the request's id, its kind, and the two"
            " values as the report shows them (any JSON value; text cut to 200 characters,"
            " a caller's token never shown).",
            "required": ["requestId", "kind", "primary", "candidate"],
            "properties": {
                "requestId": {"type": "string"},
                "kind": {"type": "string", "enum": list(KINDS)},
                "primary": {},
                "candidate": {},
            },
        },
        "Fleet": {
            "type": "object",
            "required": ["shared", "instances"],
            "properties": {
                "shared": {
                    "type": "boolean",
                    "description": "Whether the instances share a cache (false: this process"
                    " alone is listed).",
                },
                "instances": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["instance", "mine", "status", "components"],
                        "properties": {
                            "instance": {"type": "string"},
                            "mine": {"type": "boolean"},
                            "fingerprint": {"type": ["string", "null"]},
                            "secondsAgo": {"type": "number"},
                            "status": {"type": "string"},
                            "components": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "circuit": {"type": ["string", "null"]},
                        },
                    },
                },
            },
        },
        "ShadowChanged": {
            "type": "object",
            "description": "What a reload answers (the keys applied), and the shadow now.",
            "required": ["ok", "applied", "needsRestart", "error", "shadow"],
            "properties": {
                "ok": {"type": "boolean"},
                "applied": {"type": "array", "items": {"type": "string"}},
                "needsRestart": {"type": "array", "items": {"type": "string"}},
                "error": {"type": ["string", "null"]},
                "shadow": {
                    "type": "object",
                    "required": ["baseUrl", "sampleRatio"],
                    "properties": {
                        "baseUrl": {"type": ["string", "null"]},
                        "sampleRatio": {"type": "number"},
                    },
                },
                "workers": {"$ref": SCHEMAS + "WorkersReached"},
            },
        },
        "ShadowAnswers": {
            "type": "object",
            "description": "A request that differed: its route, its path and query as sent"
            " to both upstreams, and each upstream's whole answer as the gateway publishes"
            " it (JSON text, a token an upstream echoed shown as [redacted]).",
            "required": ["requestId", "route", "target", "primary", "candidate"],
            "properties": {
                "requestId": {"type": "string"},
                "route": {"type": "string"},
                "target": {"type": "string"},
                "primary": {"type": "string"},
                "candidate": {"type": "string"},
            },
        },
        "ShadowReset": {
            "type": "object",
            "required": ["reset"],
            "properties": {
                "reset": {"type": "boolean", "const": True},
                "workers": {"$ref": SCHEMAS + "WorkersReached"},
            },
        },
        "TtlAdvice": {
            "type": "object",
            "required": ["maxStaleShare", "minTtl", "maxTtl", "routes"],
            "properties": {
                "maxStaleShare": {"type": "number"},
                "minTtl": {"type": "integer"},
                "maxTtl": {"type": "integer"},
                "routes": {"type": "array", "items": {"$ref": SCHEMAS + "RouteTtlAdvice"}},
            },
        },
        "RouteTtlAdvice": {
            "type": "object",
            "description": "One route's TTL now, the evidence of how often its answers"
            " change, and the TTL advised (null while the evidence is too thin).",
            "required": [
                "route",
                "ttl",
                "hitRatio",
                "refreshes",
                "changedShare",
                "changesPerHour",
                "advisedTtl",
                "current",
                "advised",
                "reason",
                "curve",
                "traffic",
            ],
            "properties": {
                "route": {"type": "string"},
                "ttl": {"type": "integer"},
                "hitRatio": _NUMBER_OR_NULL,
                "refreshes": {"type": "integer", "minimum": 0},
                "changedShare": _NUMBER_OR_NULL,
                "changesPerHour": _NUMBER_OR_NULL,
                "advisedTtl": {"type": ["integer", "null"]},
                "current": _SHARES,
                "advised": _SHARES,
                "reason": {"type": "string"},
                "curve": {
                    "type": "array",
                    "description": "The expected share of stale answers and the hit ratio"
                    " at TTLs spread over minTtl..maxTtl (and the TTL now): the curve the"
                    " advice is read from; empty while the change rate is unknown.",
                    "items": {
                        "type": "object",
                        "required": ["ttl", "staleShare", "hitRatio"],
                        "properties": {
                            "ttl": {"type": "integer", "minimum": 1},
                            "staleShare": {"type": "number"},
                            "hitRatio": {"type": "number"},
                        },
                    },
                },
                "traffic": {"$ref": SCHEMAS + "RouteTraffic"},
            },
        },
        "RouteTraffic": {
            "type": "object",
            "description": "The route's requests since the gateway started (every worker"
            " summed), how the cache answered them, and the upstream calls made.",
            "required": [
                "requests",
                "hits",
                "stale",
                "misses",
                "bypasses",
                "hitRatio",
                "staleShare",
                "upstreamCalls",
                "distinctKeys",
                "bestHitRatio",
            ],
            "properties": {
                "requests": {"type": "integer", "minimum": 0},
                "hits": {"type": "integer", "minimum": 0},
                "stale": {"type": "integer", "minimum": 0},
                "misses": {"type": "integer", "minimum": 0},
                "bypasses": {"type": "integer", "minimum": 0},
                "hitRatio": _NUMBER_OR_NULL,
                "staleShare": _NUMBER_OR_NULL,
                "upstreamCalls": {"type": "integer", "minimum": 0},
                "distinctKeys": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Keys of the route fetched from the upstream, each"
                    " counted once per process (estimated).",
                },
                "bestHitRatio": {
                    **_NUMBER_OR_NULL,
                    "description": "The hit ratio the route could have had at best: the"
                    " first request of each key a miss, every later one a hit.",
                },
            },
        },
    }


_NOT_CONFIRMED = {
    "description": "A worker of this instance did not confirm the change in time: it is in"
    " force in `workers.confirmed` of `workers.told` workers (the others may still take it);"
    " send it again to be sure. Problem type:"
    " `urn:records-gateway:problem:workers-not-confirmed`.",
    "headers": header_refs("X-Request-ID"),
    "content": {PROBLEM_JSON: {"schema": {"$ref": SCHEMAS + "Problem"}}},
}


_NOT_KEPT = {
    "description": "No answers are kept of this request. Problem type:"
    " `urn:records-gateway:problem:not-found`.",
    "headers": header_refs("X-Request-ID"),
    "content": {PROBLEM_JSON: {"schema": {"$ref": SCHEMAS + "Problem"}}},
}


def _notice_problem(description: str, slug: str) -> dict[str, Any]:
    return {
        "description": f"{description} Problem type: `urn:records-gateway:problem:{slug}`.",
        "headers": header_refs("X-Request-ID"),
        "content": {PROBLEM_JSON: {"schema": {"$ref": SCHEMAS + "Problem"}}},
    }


# (operationId, summary, description, body schema, extra responses) by (path, method)
_TEXT: dict[tuple[str, str], tuple[str, str, str, dict[str, Any], dict[str, Any]]] = {
    ("/admin/cache", "DELETE"): (
        "purgeCache",
        "Purge the cache",
        "Drops every cached answer of this namespace and of the upstream in use, or with"
        " `route` those of one route for every token, or with `record` those that hold one"
        " of the records (or, `mode=soft`, marks them stale). With Redis the purge reaches every"
        " instance sharing it; with the memory backend and several workers, every worker"
        " has purged its own before the answer.",
        {"$ref": SCHEMAS + "PurgeResult"},
        {
            "503": {
                "description": "Redis, or a worker of this instance, did not confirm the"
                " purge in time: it may have happened or not (Redis retries it in the"
                " background; `workers` counts the workers reached); send it again to be"
                " sure. Problem type: `urn:records-gateway:problem:purge-outcome-unknown`.",
                "headers": header_refs("X-Request-ID"),
                "content": {PROBLEM_JSON: {"schema": {"$ref": SCHEMAS + "Problem"}}},
            }
        },
    ),
    ("/admin/records/changed", "POST"): (
        "recordsChanged",
        "Tell the gateway which records changed",
        "A change notice from an upstream's change feed or a CDC pipeline: every answer,"
        " of every token, that holds one of the records is purged as `DELETE /admin/cache"
        "?record=` purges it (`soft`: marked stale). Nothing is purged unless every"
        " reference is valid. With the admin token, or signed with admin.change_feed_secret"
        " (`X-Gateway-Timestamp` and `X-Gateway-Signature`: `v1=` and the hex HMAC-SHA256"
        " of `v1`, a newline, the timestamp, a newline and the body), within 300 s of the"
        " gateway's clock and once. docs/purging.md.",
        {"$ref": SCHEMAS + "PurgeResult"},
        {
            "409": _notice_problem(
                "The signed notice was taken before: nothing was purged again. A retry is"
                " signed again, with its own timestamp.",
                "notice-replayed",
            ),
            "413": _notice_problem("The body is over 262144 bytes.", "content-too-large"),
            "415": _notice_problem(
                "The body is not sent as `application/json`.", "unsupported-media-type"
            ),
            "503": _notice_problem(
                "The purge was not confirmed everywhere (as for `DELETE /admin/cache`),"
                " or the cache did not answer whether a signed notice was taken before"
                " (nothing purged): sign it again and send it again.",
                "purge-outcome-unknown`, `urn:records-gateway:problem:notice-not-taken",
            ),
        },
    ),
    ("/admin/config", "GET"): (
        "getConfig",
        "The effective configuration",
        "Every setting in use, secrets shown as `**********`.",
        {"type": "object", "additionalProperties": True},
        {},
    ),
    ("/admin/reload", "POST"): (
        "reloadConfig",
        "Reload the configuration",
        "What SIGHUP does: re-reads the configuration file and the environment, applies"
        " the live keys and names those that need a restart. With several workers, every"
        " worker runs the new live keys before the answer.",
        {"$ref": SCHEMAS + "ReloadResult"},
        {
            "503": _NOT_CONFIRMED,
            "422": {
                "description": "The new configuration failed validation; the running one"
                " stays. Problem type: `urn:records-gateway:problem:config-refused`.",
                "headers": header_refs("X-Request-ID"),
                "content": {PROBLEM_JSON: {"schema": {"$ref": SCHEMAS + "Problem"}}},
            },
        },
    ),
    ("/admin/fleet", "GET"): (
        "getFleet",
        "Every instance's readiness",
        "Every instance sharing the cache (Redis), with its readiness as it last announced"
        " it (every 5 s): its status, each component's and the upstream's circuit; without"
        " a shared cache, this process alone. Takes no query.",
        {"$ref": SCHEMAS + "Fleet"},
        {},
    ),
    ("/admin/shadow", "GET"): (
        "getShadowReport",
        "The shadow traffic's report",
        "What the candidate upstream answered beside the primary, per route, worst fields"
        " first, noise apart (docs/switching-upstreams.md). Takes no query.",
        {"$ref": SCHEMAS + "ShadowReport"},
        {},
    ),
    ("/admin/shadow", "PUT"): (
        "setShadow",
        "Point, change or stop the shadow traffic",
        "Sets `upstream.shadow.base_url` (`baseUrl`) and `upstream.shadow.sample_ratio`"
        " (`sampleRatio`, 0 turns the shadow off) on every worker, as a reload of those keys"
        " would, and answers as a reload does; a reload from the file later sets them as the"
        " file says. The candidate gets the callers' own tokens. Takes no query.",
        {"$ref": SCHEMAS + "ShadowChanged"},
        {"503": _NOT_CONFIRMED},
    ),
    ("/admin/shadow", "DELETE"): (
        "resetShadowReport",
        "Reset the shadow traffic's report",
        "Forgets every comparison, on every worker, before the answer; the report starts"
        " again. Takes no query.",
        {"$ref": SCHEMAS + "ShadowReset"},
        {"503": _NOT_CONFIRMED},
    ),
    ("/admin/shadow/answers/{requestId}", "GET"): (
        "getShadowAnswers",
        "Two answers of a request that differed",
        "The primary's and the candidate's whole answers, as the gateway publishes them, of"
        " a request the shadow report names in its examples (up to ten a route, of at most"
        " 32 KiB each, are kept). A 404 not-found for any other request. Takes no query.",
        {"$ref": SCHEMAS + "ShadowAnswers"},
        {"404": _NOT_KEPT},
    ),
    ("/admin/ttl", "GET"): (
        "getTtlAdvice",
        "The TTL advice",
        "Per route: the TTL now, how often its answers change, and the TTL that keeps"
        " stale answers under cache.max_stale_share. Never applied by itself. Takes no query.",
        {"$ref": SCHEMAS + "TtlAdvice"},
        {},
    ),
}


# every admin route: no admin token, another method, and what any path can answer (a
# 400 among them: invalid-parameters from the routes that read or refuse a query, a
# malformed-request from any)
_ERRORS = tuple(sorted({*EDGE_ERRORS, 401, 405}))


def admin_paths(route_parameter: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The admin paths; ``route_parameter`` is the purge's ``route`` query parameter."""
    paths: dict[str, dict[str, Any]] = {}
    for path, _, handlers in ADMIN_ROUTES:
        for method in handlers:
            operation_id, summary, description, schema, extra = _TEXT[(path, method)]
            responses = {
                "200": {
                    "description": summary,
                    "headers": header_refs("X-Request-ID"),
                    "content": {_JSON: {"schema": schema}},
                },
                **response_refs(*_ERRORS),
                **extra,
            }
            operation: dict[str, Any] = {
                "operationId": operation_id,
                "summary": summary,
                "description": description,
                "tags": ["admin"],
                "security": [{SECURITY_SCHEME: []}],
                "responses": dict(sorted(responses.items())),
            }
            if path == "/admin/cache":
                operation["parameters"] = [route_parameter, *_RECORD_PARAMETERS]
            if path == "/admin/records/changed":
                operation["security"].append({FEED_SCHEME: []})
                operation["requestBody"] = _NOTICE_BODY
            if (path, method) == ("/admin/shadow", "PUT"):
                operation["requestBody"] = _SHADOW_BODY
            if path.endswith("{requestId}"):
                operation["parameters"] = [_REQUEST_ID_PARAMETER]
            paths.setdefault(path, {})[method.lower()] = operation
    return paths


_SHADOW_BODY = {
    "required": True,
    "content": {
        _JSON: {
            "schema": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": False,
                "properties": {
                    "baseUrl": {
                        "type": ["string", "null"],
                        "description": "The candidate upstream's base URL.",
                    },
                    "sampleRatio": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": 1,
                        "description": "The share of upstream calls mirrored; 0 is off.",
                    },
                },
            }
        }
    },
}

_REQUEST_ID_PARAMETER = {
    "name": "requestId",
    "in": "path",
    "required": True,
    "description": "The request id of an example of the shadow report.",
    "schema": {"type": "string", "minLength": 1},
}


def route_parameter(routes: RouteTable) -> dict[str, Any]:
    return {
        "name": "route",
        "in": "query",
        "required": False,
        "description": "Purge only this route's answers, for every token; without it, everything.",
        "schema": {"type": "string", "enum": [route.name for route in routes]},
    }


_RECORD_PARAMETERS = [
    {
        "name": "record",
        "in": "query",
        "required": False,
        "description": "Purge every answer, of every token, that holds this record (embedded"
        " ones count): `<kind>:<id>`, the kind `expense`, `account`, `client` or `user`."
        " Up to 100 times; not with `route`. docs/purging.md.",
        "style": "form",
        "explode": True,
        "schema": {
            "type": "array",
            "maxItems": 100,
            "items": {"type": "string", "pattern": "^(expense|account|client|user):.+$"},
        },
    },
    {
        "name": "mode",
        "in": "query",
        "required": False,
        "description": "With `record`: `hard` removes the answers, `soft` marks them stale"
        " (served under stale_while_revalidate_s while one refresh replaces each).",
        "schema": {"type": "string", "enum": ["hard", "soft"], "default": "hard"},
    },
]


_NOTICE_BODY = {
    "required": True,
    "content": {
        _JSON: {
            "schema": {
                "type": "object",
                "required": ["records"],
                "additionalProperties": False,
                "properties": {
                    "records": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 1000,
                        "items": {
                            "type": "string",
                            "pattern": "^(expense|account|client|user):.+$",
                        },
                        "description": "The records that changed, `<kind>:<id>`.",
                    },
                    "soft": {
                        "type": "boolean",
                        "default": False,
                        "description": "Mark their answers stale instead of removing them.",
                    },
                },
            },
            "example": {"records": ["expense:3f6c1a52-8d0e-4f7b-9a41-2b5d0c7e9f13"]},
        }
    },
}


def feed_scheme() -> dict[str, Any]:
    return {
        "type": "apiKey",
        "in": "header",
        "name": "X-Gateway-Signature",
        "description": "A change notice signed with admin.change_feed_secret: `v1=` and"
        " the lowercase hex HMAC-SHA256 of `v1`, a newline, `X-Gateway-Timestamp` (whole"
        " seconds since the Unix epoch, within 300 s of the gateway's clock), a newline"
        " and the body. Taken once; POST /admin/records/changed alone.",
    }


def security_scheme() -> dict[str, Any]:
    return {
        "type": "http",
        "scheme": "bearer",
        "description": "The gateway's admin.token (not a caller's token); the admin routes"
        " exist only when it is set. Without it, every method on every path under /admin"
        " is answered 401 before anything else (no 405, no 404).",
    }
