"""The reference upstream: the Financial Records Read API over a generated dataset.

``create_demo_app()`` builds an aiohttp application that answers the six GET
operations of the API (HEAD is accepted on each) from ``generate_dataset(seed)``.
Where the published reference says "not shown", this upstream makes the choices
below; ``docs/reference-upstream.md`` repeats them for people running it.

Authentication
    Every request, on every path, needs ``Authorization: Bearer <token>`` with a token
    from ``tokens`` (the scheme is case-insensitive, the token is not). Otherwise:
    401, ``WWW-Authenticate: Bearer``, body ``{"error": "unauthorized", "message"}``.

Pagination (``/users``, ``/clients``, ``/expenses``, ``/accounts``)
    ``page`` and ``limit`` are decimal integers, ``page >= 1`` (default 1) and
    ``1 <= limit <= 1000`` (default 10); anything else is 400. ``totalPages`` is
    ``ceil(total / limit)`` (0 when nothing matches), ``hasNext`` is
    ``page < totalPages``, ``hasPrevious`` is ``page > 1``. A page beyond the last
    answers 200 with empty ``data`` and the true ``total`` and ``totalPages``.

Sort order
    users by username; clients by case-folded name, then id; accounts by id
    (code-point order); expenses by issueDate descending, then id ascending.

Filters of ``/expenses`` (combined with AND)
    - ``dateFrom``, ``dateTo``: ``YYYY-MM-DD``, inclusive bounds on ``issueDate``;
      any other form is 400. ``dateFrom`` after ``dateTo`` matches nothing.
    - ``amount``: a plain decimal (``12.5``, ``-3``, ``.50``), equal in value to
      ``amount`` whatever the currency: ``12.5`` matches ``"12.5000"``. Exponents,
      ``NaN`` and other forms are 400.
    - ``concept``: case-insensitive substring of ``description`` or of ``category``.
    - ``account``: the account's id or its name, case-insensitive, whole value.
    - ``status``: case-insensitive, whole value (PAID, PENDING, CANCELLED); an unknown
      status matches nothing.
    - ``type``: CASH or BANK, case-insensitive; any other value is 400.
    - ``user``: the user's id or username, case-insensitive, whole value.

Filters of ``/accounts``
    ``type`` as above; ``bankCode``: exact, case-sensitive equality with
    ``bank.code`` (cash accounts have no bank and never match).

For every parameter the first occurrence wins; a filter with an empty value is
ignored; unknown parameters are ignored. Errors are 400
``{"error": "invalid_parameter", "message"}`` naming the parameter.

Lookups
    ``/expenses/{expenseId}``: the UUID in canonical hyphenated form, hex digits in
    either case; anything else, valid UUID or not, is 404 ``{"error": "not_found"}``.
    ``/accounts/{accountId}``: the decoded path segment (an encoded ``/`` is part of
    the segment) equal to an account id, else to an account name, else the same two
    comparisons case-insensitively; otherwise 404. Unknown paths are 404 and other
    methods 405, with the same JSON error body.

Drift
    With ``drift`` kinds (``drift.py``), the app is a candidate twin that answers
    unlike itself in those known ways; selection, paging and errors are unchanged.
    ``app[DRIFT]`` says which kinds are on.

Records that change
    With ``change_rates`` (``changes.py``), each record of a kind given a rate changes
    at random at that rate, independently of the others, measured on ``clock`` from
    the app's creation, deterministically from ``seed``; every answer shows each record
    it holds at its version of the moment (0, the dataset's, without a rate). A version
    changes one field that no filter or sort order reads. ``app[CHANGE_RATES]`` says
    which rates are on.

Every request, rejected ones included, is recorded in the ``RequestLog`` under
``REQUEST_LOG`` before latency and authentication; with ``latency_ms > 0`` every
request then waits that long before being answered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gateway.demo.changes import ChangeRates, RecordVersions
from gateway.demo.dataset import Dataset, generate_dataset
from gateway.demo.drift import Drift
from gateway.demo.params import (
    InvalidParameter,
    parse_account_filters,
    parse_expense_filters,
    parse_page,
)
from gateway.demo.request_log import RequestLog, RequestRecord
from gateway.demo.store import RecordStore, page_envelope

DEFAULT_TOKENS = frozenset({"demo-token"})


@dataclass(frozen=True, slots=True)
class DemoConfig:
    tokens: frozenset[str]
    latency_ms: float
    seed: int
    drift: Drift
    change_rates: ChangeRates


DEMO_CONFIG = web.AppKey("demo_config", DemoConfig)
DATASET = web.AppKey("dataset", Dataset)
DRIFT = web.AppKey("drift", Drift)
CHANGE_RATES = web.AppKey("change_rates", ChangeRates)
RECORD_STORE = web.AppKey("record_store", RecordStore)
REQUEST_LOG = web.AppKey("request_log", RequestLog)


def create_demo_app(
    *,
    tokens: frozenset[str] = DEFAULT_TOKENS,
    latency_ms: float = 0.0,
    seed: int = 42,
    drift: Iterable[str] = (),
    change_rates: Mapping[str, float] | None = None,
    clock: Callable[[], float] = time.time,
    collections: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> web.Application:
    """The reference upstream app, serving ``generate_dataset(seed)``; with
    ``collections`` (records by path, e.g. ``{"/projects": [...]}``), those records too,
    paged at the path and each at ``<path>/<its id>``, as given; with ``drift``
    (kind names or a ``Drift``), a candidate that differs in those ways; with
    ``change_rates`` (changes per minute by record kind, or ``ChangeRates``), records
    that change at random at those rates, on ``clock`` from now. ``ValueError`` for an
    unknown kind or a bad value."""
    if not tokens:
        raise ValueError("tokens: at least one accepted token is required")
    if not latency_ms >= 0:
        raise ValueError(f"latency_ms: must be zero or positive, got {latency_ms!r}")
    config = DemoConfig(
        tokens=frozenset(tokens),
        latency_ms=latency_ms,
        seed=seed,
        drift=Drift.of(drift),
        change_rates=ChangeRates.of(change_rates),
    )
    dataset = generate_dataset(seed)
    request_log = RequestLog()
    versions = None
    if any(rate > 0 for rate in config.change_rates.values()):
        versions = RecordVersions(config.change_rates, seed, clock)

    app = web.Application(middlewares=[_edge_middleware(config, request_log)])
    app[DEMO_CONFIG] = config
    app[DATASET] = dataset
    app[DRIFT] = config.drift
    app[CHANGE_RATES] = config.change_rates
    app[RECORD_STORE] = RecordStore(dataset, config.drift, versions)
    app[REQUEST_LOG] = request_log
    app.router.add_get("/users", users)
    app.router.add_get("/clients", clients)
    app.router.add_get("/expenses", expenses)
    app.router.add_get("/expenses/{expenseId}", expense)
    app.router.add_get("/accounts", accounts)
    app.router.add_get("/accounts/{accountId}", account)
    for path, records in (collections or {}).items():
        _add_collection(app, path, records)
    return app


def _add_collection(app: web.Application, path: str, records: Sequence[Mapping[str, Any]]) -> None:
    """Serve ``records`` at ``path`` (pages, in the order given) and each by its ``id``."""
    items = [orjson.dumps(dict(record)) for record in records]
    by_id = {str(record["id"]): item for record, item in zip(records, items, strict=True)}

    async def listing(request: web.Request) -> web.Response:
        return _json(page_envelope(items, parse_page(request.query)))

    async def one(request: web.Request) -> web.Response:
        record_id = request.match_info["id"]
        item = by_id.get(record_id)
        if item is None:
            return _error(404, "not_found", f"no record with id {record_id!r}")
        return _json(item)

    app.router.add_get(path, listing)
    app.router.add_get(path + "/{id}", one)


async def users(request: web.Request) -> web.Response:
    store = request.app[RECORD_STORE]
    return _json(store.users_page(parse_page(request.query)))


async def clients(request: web.Request) -> web.Response:
    store = request.app[RECORD_STORE]
    return _json(store.clients_page(parse_page(request.query)))


async def expenses(request: web.Request) -> web.Response:
    query = request.query
    filters = parse_expense_filters(query)
    return _json(request.app[RECORD_STORE].expenses_page(filters, parse_page(query)))


async def expense(request: web.Request) -> web.Response:
    expense_id = request.match_info["expenseId"]
    body = request.app[RECORD_STORE].expense(expense_id)
    if body is None:
        return _error(404, "not_found", f"no expense with id {expense_id!r}")
    return _json(body)


async def accounts(request: web.Request) -> web.Response:
    query = request.query
    filters = parse_account_filters(query)
    return _json(request.app[RECORD_STORE].accounts_page(filters, parse_page(query)))


async def account(request: web.Request) -> web.Response:
    account_id = request.match_info["accountId"]
    body = request.app[RECORD_STORE].account(account_id)
    if body is None:
        return _error(404, "not_found", f"no account with id or name {account_id!r}")
    return _json(body)


def _edge_middleware(config: DemoConfig, request_log: RequestLog) -> Middleware:
    latency_s = config.latency_ms / 1000
    tokens = config.tokens

    @web.middleware
    async def edge(request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        authorization = headers.get("Authorization")
        request_log.record(
            RequestRecord(
                method=request.method,
                path=request.path,
                raw_path=request.raw_path,
                query=tuple(request.query.items()),
                authorization=authorization,
                request_id=headers.get("X-Request-ID"),
                traceparent=headers.get("traceparent"),
                tracestate=headers.get("tracestate"),
            )
        )
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        refusal = _refuse_authorization(authorization, tokens)
        if refusal is not None:
            return _error(401, "unauthorized", refusal, {"WWW-Authenticate": "Bearer"})
        try:
            return await handler(request)
        except InvalidParameter as exc:
            return _error(400, "invalid_parameter", f"{exc.name}: {exc.message}")
        except web.HTTPException as exc:
            # Routing failures (unknown path, other method) keep their status and
            # headers (e.g. Allow) but get the JSON error body.
            allow = exc.headers.get("Allow")
            code = exc.reason.lower().replace(" ", "_")
            return _error(exc.status, code, exc.reason, None if allow is None else {"Allow": allow})

    return edge


def _refuse_authorization(authorization: str | None, tokens: frozenset[str]) -> str | None:
    """Why the request is not authorised, or ``None`` when it is."""
    if authorization is None:
        return "missing Authorization header"
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return "Authorization must use the Bearer scheme"
    if token not in tokens:
        return "invalid bearer token"
    return None


def _json(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


def _error(
    status: int, error: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = orjson.dumps({"error": error, "message": message})
    response = web.Response(body=body, status=status, headers=headers)
    response.content_type = "application/json"
    return response
