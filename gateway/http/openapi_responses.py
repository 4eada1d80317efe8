"""The responses of the OpenAPI document: the response headers, the problem schemas and
every documented error status, as components the operations refer to.

Each error response is a plain ``$ref`` to ``Problem`` (``ValidationProblem`` for a 400),
the form client generators turn into typed models. Which problem types a status can
carry is said in its description and shown by its examples, not narrowed in the schema
(a narrowed ``allOf`` is what generators cannot merge).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway.errors import InvalidParameters
from gateway.http.edge import REQUEST_ID_PATTERN
from gateway.http.problems import PROBLEM_JSON, PROBLEM_TYPE_BASE
from gateway.upstream.retry_after import MAX_RETRY_AFTER_S

SCHEMAS = "#/components/schemas/"
HEADERS = "#/components/headers/"
RESPONSES = "#/components/responses/"

# What edge.choose_request_id echoes; anything else is replaced by a new id.
_REQUEST_ID = f"^{REQUEST_ID_PATTERN.pattern}$"

# What any path can answer, whatever its route: a request the HTTP parser refuses (400),
# an Expect the gateway does not meet (417), a fault of its own (500), another HTTP
# version (505); they are answered by the edge and the fast path, before any handler.
EDGE_ERRORS = (400, 417, 500, 505)


def headers() -> dict[str, dict[str, Any]]:
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
            "description": "On a 429, the upstream's Retry-After when it sent a valid one:"
            f" seconds (at most {MAX_RETRY_AFTER_S}) or an HTTP date (as an IMF-fixdate);"
            " on a 503, the seconds until the gateway tries the upstream again.",
            "schema": {"type": "string"},
        },
        "Allow": {
            "description": "The methods the path takes.",
            "required": True,
            "schema": {"type": "string", "examples": ["GET, HEAD"]},
        },
    }


def header_refs(*names: str) -> dict[str, dict[str, str]]:
    return {name: {"$ref": HEADERS + name} for name in names}


class ProblemResponse(NamedTuple):
    """One documented error status: its problem types, extra headers and examples (by
    name in gateway/http/openapi_examples.json)."""

    status: int
    name: str
    description: str
    slugs: tuple[str, ...]
    headers: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()

    @property
    def schema(self) -> str:
        return "ValidationProblem" if self.status == 400 else "Problem"


def _types(*slugs: str) -> str:
    return ", ".join(f"`{PROBLEM_TYPE_BASE}{slug}`" for slug in slugs)


PROBLEMS = (
    ProblemResponse(
        400,
        "BadRequest",
        "A bad, unknown or repeated parameter, or a dateFrom after dateTo"
        f" (invalid-parameters): `errors` lists them (the first {InvalidParameters.LISTED};"
        " `omittedErrors` counts the others). On any path, a request the HTTP parser"
        " refuses (malformed-request, without `errors`): a request line or a header over"
        " the gateway's limit (32 KiB as `records-gateway serve` runs it), more than 128"
        " header fields, a control byte in one; it is answered as HTTP/1.0 and the"
        " connection closed. Nothing was sent upstream.",
        ("invalid-parameters", "malformed-request"),
        examples=("invalid-parameters", "date-range"),
    ),
    ProblemResponse(
        401,
        "Unauthenticated",
        "No usable `Authorization: Bearer` header (unauthenticated), or, on a record"
        " route, the upstream refused the token (upstream-unauthorized).",
        ("unauthenticated", "upstream-unauthorized"),
        ("WWW-Authenticate",),
        ("unauthenticated", "upstream-unauthorized"),
    ),
    ProblemResponse(403, "Forbidden", "The upstream refused access.", ("upstream-forbidden",)),
    ProblemResponse(
        404, "NotFound", "The upstream has no such record.", ("not-found",), (), ("not-found",)
    ),
    ProblemResponse(
        405,
        "MethodNotAllowed",
        "A method the path does not take (every path takes GET and HEAD but the admin"
        " routes, which take what they document); `Allow` lists the methods it takes."
        " Nothing was sent upstream.",
        ("method-not-allowed",),
        ("Allow",),
        ("method-not-allowed",),
    ),
    ProblemResponse(
        417,
        "ExpectationFailed",
        "An `Expect` field asks for more than `100-continue`. Nothing was sent upstream.",
        ("expectation-failed",),
    ),
    ProblemResponse(
        429,
        "RateLimited",
        "The upstream is rate limiting this caller; its Retry-After is kept.",
        ("rate-limited",),
        ("Retry-After",),
    ),
    ProblemResponse(
        500,
        "InternalError",
        "The gateway failed; the request id is in its logs.",
        ("internal",),
    ),
    ProblemResponse(
        502,
        "BadGateway",
        "The upstream cannot be reached (upstream-unavailable), answered 5xx or an"
        " unexpected status (upstream-failed), or sent a body that breaks the API"
        " contract (upstream-contract): a value that cannot be brought to the published"
        " schema, or a record without its id.",
        ("upstream-unavailable", "upstream-failed", "upstream-contract"),
    ),
    ProblemResponse(
        503,
        "UpstreamUnavailable",
        "The upstream failed repeatedly and its circuit breaker is open: the gateway"
        " answers without calling it, and this request had no stale answer to serve."
        " `Retry-After` says when the gateway tries the upstream again.",
        ("upstream-unavailable",),
        ("Retry-After",),
    ),
    ProblemResponse(
        504,
        "GatewayTimeout",
        "The upstream did not answer within upstream.timeout_s.",
        ("upstream-timeout",),
    ),
    ProblemResponse(
        505,
        "HTTPVersionNotSupported",
        "The request line's version is neither HTTP/1.1 nor HTTP/1.0 (aiohttp answers"
        " in that version); the connection is closed. Nothing was sent upstream.",
        ("http-version-not-supported",),
    ),
)
PROBLEM_BY_STATUS = {problem.status: problem for problem in PROBLEMS}


def _problem_properties() -> dict[str, dict[str, Any]]:
    return {
        "type": {
            "type": "string",
            "pattern": f"^{PROBLEM_TYPE_BASE}[a-z0-9-]+$",
            "description": "A URN naming the kind of problem; each response lists those"
            " it can carry.",
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
    }


_PROBLEM_REQUIRED = ["type", "title", "status", "detail", "instance", "requestId"]


def problem_schemas() -> dict[str, dict[str, Any]]:
    """components.schemas: Problem, ValidationProblem and ParameterError.

    Both problems allow members they do not list: RFC 9457 lets a problem type add
    its own, and a client must ignore those it does not know.
    """
    validation = _problem_properties()
    validation["status"] = {"type": "integer", "const": 400, "description": "Always 400."}
    validation["errors"] = {
        "type": "array",
        "minItems": 1,
        "maxItems": InvalidParameters.LISTED,
        "items": {"$ref": SCHEMAS + "ParameterError"},
        "description": "The bad parameters, in the order of the request; always there"
        " on an invalid-parameters problem, never on a malformed-request one.",
    }
    validation["omittedErrors"] = {
        "type": "integer",
        "minimum": 1,
        "description": "How many more bad parameters there are than `errors` lists"
        " (only when there are more).",
    }
    return {
        "Problem": {
            "title": "Problem",
            "description": "An RFC 9457 problem: the body of every error response but a 400.",
            "type": "object",
            "required": _PROBLEM_REQUIRED,
            "properties": {
                **_problem_properties(),
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
                "outcome": {
                    "type": "string",
                    "enum": ["unknown"],
                    "description": "Of a purge Redis did not confirm: it may have happened"
                    " or not (503 purge-outcome-unknown only).",
                },
            },
        },
        "ValidationProblem": {
            "title": "ValidationProblem",
            "description": "The RFC 9457 problem of a 400: the request was refused before"
            " anything reached the upstream. An invalid-parameters problem always has"
            " `errors`, naming each bad parameter; a malformed-request problem (a request"
            " the HTTP parser refused) has none.",
            "type": "object",
            "required": _PROBLEM_REQUIRED,
            "properties": validation,
        },
        "ParameterError": {
            "title": "ParameterError",
            "description": "One bad parameter of a refused request.",
            "type": "object",
            "required": ["parameter", "message"],
            "properties": {
                "parameter": {"type": "string", "description": "The parameter's name."},
                "message": {"type": "string", "description": "What is wrong with it."},
            },
            "additionalProperties": False,
        },
    }


def problem_response(problem: ProblemResponse, examples: dict[str, Any]) -> dict[str, Any]:
    """One error status as a component: a plain $ref to its schema, with examples."""
    media: dict[str, Any] = {"schema": {"$ref": SCHEMAS + problem.schema}}
    shown = {name: examples[name] for name in problem.examples if name in examples}
    if shown:
        media["examples"] = {
            name: {"summary": example["request"], "value": example["body"]}
            for name, example in shown.items()
        }
    return {
        "description": f"{problem.description} Problem types: {_types(*problem.slugs)}.",
        "headers": header_refs("X-Request-ID", *problem.headers),
        "content": {PROBLEM_JSON: media},
    }


def responses(examples: dict[str, Any], cache_headers: tuple[str, ...]) -> dict[str, Any]:
    """components.responses: 304 and every problem response."""
    built: dict[str, Any] = {
        "NotModified": {
            "description": "If-None-Match matched the ETag of the representation this"
            " request would get; no body.",
            "headers": header_refs("X-Request-ID", *cache_headers),
        }
    }
    built.update({problem.name: problem_response(problem, examples) for problem in PROBLEMS})
    return built


def response_refs(*statuses: int) -> dict[str, dict[str, str]]:
    """The responses of an operation for each of ``statuses``, by reference."""
    return {
        str(status): {"$ref": RESPONSES + PROBLEM_BY_STATUS[status].name} for status in statuses
    }
