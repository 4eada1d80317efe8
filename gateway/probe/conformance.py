"""The conformance probe: how far an upstream is from the published schema.

``records-gateway probe`` calls every route of the configured upstream once, in this
order: the first page of ``/users``, ``/clients``, ``/expenses`` and ``/accounts``,
then ``/expenses/{expenseId}`` and ``/accounts/{accountId}`` with the id of the first
item of each list as the upstream sent it. Each body is parsed losslessly and checked
with the models of ``gateway.normalise.schema``, which record every variant and coercion in a
:class:`NormaliseContext`. Unlike the gateway, which stops at the first bad value of
an answer, the probe looks for every one: the envelope and each record are validated
on their own, and a bad value is set to null and its record validated again, until
nothing new fails.

A route is OK when its body normalises; it fails on an upstream error (unreachable,
timeout, 401, a body that is not JSON...) or on any value that cannot be brought to
the published schema. A detail route is skipped when its list gave no id to ask for.
A record's id may not be null: a bad or missing one is replaced by a stand-in instead,
so that it hides none of the record's other bad values.
``docs/probe.md`` explains how to read the report.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidParameters, UpstreamError
from gateway.normalise.coercions import CanonicalError, json_type
from gateway.normalise.normaliser import json_path, locate, parse_lossless
from gateway.normalise.pages import (
    Page,
    RecordModel,
    canonical_body,
    page_bound,
    too_many_items,
)
from gateway.normalise.schema import CanonicalModel, NormaliseContext
from gateway.records.routes import RecordQuery, parse_record_query
from gateway.routing.routes import Route, RouteTable
from gateway.routing.standard import ROUTES
from gateway.upstream.client import UpstreamClient

# The reference's default page size; the probe asks for it whatever limits.max_limit is.
PROBE_LIMIT = 10
# What a record's bad or missing id is replaced with while its other values are checked:
# canonical text and a canonical UUID, which every id's rule accepts.
ID_STAND_IN = "00000000-0000-0000-0000-000000000000"
_REQUIRED_FIELDS = frozenset(
    name
    for model in CanonicalModel.__subclasses__()
    for name, field in model.model_fields.items()
    if field.is_required()
)
_ABSENT = ("null", "missing")

Outcome = Literal["ok", "failed", "skipped"]
Location = tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """A value that cannot be brought to the published schema, and why."""

    path: str  # "data[3].amount"
    reason: str


@dataclass(frozen=True, slots=True)
class FieldReport:
    """What one field looked like in one route's answer.

    ``variants`` counts the JSON types sent (``missing`` when the key was absent);
    ``coercions`` counts what the normaliser did, by kind (``string->number``);
    ``unknown_values`` are enumeration values outside the known set, passed through.
    """

    field: str  # "Expense.amount"
    variants: dict[str, int]
    coercions: dict[str, int]
    unknown_values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RouteReport:
    """The probe of one route.

    ``target`` is what was requested (``/expenses?page=1&limit=10``), None when the
    route was skipped; ``detail`` the upstream error or why the route was skipped.
    ``filled_with_null`` counts, by field, the records that lacked it; ``dropped``
    names the fields the reference does not define (``Expense.internalRef``).
    """

    route: str  # "expenses", a gateway.routing.routes.Route name
    template: str  # "/expenses"
    outcome: Outcome
    target: str | None = None
    detail: str | None = None
    upstream_status: int | None = None
    request_id: str | None = None
    elapsed_ms: int | None = None
    records: int = 0
    fields: tuple[FieldReport, ...] = ()
    filled_with_null: dict[str, int] = dataclasses.field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """The probe of every route of one upstream."""

    base_url: str
    routes: tuple[RouteReport, ...]

    @property
    def ok(self) -> bool:
        return all(route.outcome != "failed" for route in self.routes)

    @property
    def exit_code(self) -> int:
        """0 when every route normalises (skipped ones aside), 1 otherwise."""
        return 0 if self.ok else 1

    def count(self, outcome: Outcome) -> int:
        return sum(route.outcome == outcome for route in self.routes)

    def route(self, name: str) -> RouteReport:
        """The report of the route named ``name`` (``gateway.routing.routes.Route.name``)."""
        return next(route for route in self.routes if route.route == name)

    def variants(self, field: str) -> dict[str, int]:
        """The JSON types of ``field`` over every route."""
        total: Counter[str] = Counter()
        for route in self.routes:
            for seen in route.fields:
                if seen.field == field:
                    total.update(seen.variants)
        return _ordered(total)

    def mixed_types(self) -> dict[str, dict[str, dict[str, int]]]:
        """Fields sent as more than one JSON type (null and missing aside), by route."""
        by_field: dict[str, dict[str, dict[str, int]]] = {}
        for route in self.routes:
            for seen in route.fields:
                by_field.setdefault(seen.field, {})[route.template] = seen.variants
        return {
            field: routes
            for field, routes in by_field.items()
            if len({kind for variants in routes.values() for kind in variants} - set(_ABSENT)) > 1
        }


async def run_probe(
    upstream: UpstreamClient, token: str, routes: RouteTable = ROUTES
) -> ProbeReport:
    """Call every route of ``routes`` on ``upstream`` once with ``token`` and check every
    answer: each list route's first page, then each id route with the first id of the
    list route it is ``listed_by`` (skipped when there is none)."""
    run_id = uuid.uuid4().hex[:12]
    authorization = f"Bearer {token}"
    reports: dict[str, RouteReport] = {}
    bodies: dict[str, Any] = {}
    for route in routes.list_routes():
        query = parse_record_query(route, None, (), max_limit=PROBE_LIMIT)
        reports[route.name], bodies[route.name] = await _probe_route(
            upstream, query, authorization, f"probe-{run_id}-{route.name}"
        )
    for detail in routes.id_routes():
        if detail.listed_by is None:
            reason = "no list route is declared to take an id from"
            reports[detail.name] = RouteReport(
                detail.name, detail.template, "skipped", detail=reason
            )
            continue
        listing = routes.route(detail.listed_by)
        target, reason = _first_id(detail, listing, bodies[listing.name])
        if target is None:
            reports[detail.name] = RouteReport(
                detail.name, detail.template, "skipped", detail=reason
            )
            continue
        reports[detail.name], _ = await _probe_route(
            upstream, target, authorization, f"probe-{run_id}-{detail.name}"
        )
    order = (*routes.list_routes(), *routes.id_routes())
    return ProbeReport(upstream.base_url, tuple(reports[route.name] for route in order))


async def _probe_route(
    upstream: UpstreamClient, query: RecordQuery, authorization: str, request_id: str
) -> tuple[RouteReport, Any]:
    """Fetch and check one route; returns its report and the parsed body (or None)."""
    target = str(upstream.url_for(query)).removeprefix(upstream.base_url)
    route = query.route
    try:
        reply = await upstream.fetch(query, authorization=authorization, request_id=request_id)
    except UpstreamError as exc:
        failed = RouteReport(
            route.name,
            route.template,
            "failed",
            target=target,
            detail=exc.detail,
            upstream_status=exc.upstream_status,
            request_id=request_id,
        )
        return failed, None
    elapsed_ms = round(reply.elapsed_s * 1000)
    try:
        data = parse_lossless(reply.body)
    except CanonicalError as exc:  # a key repeated: JSON the gateway refuses to read
        failed = RouteReport(
            route.name,
            route.template,
            "failed",
            target=target,
            upstream_status=reply.status,
            request_id=request_id,
            elapsed_ms=elapsed_ms,
            failures=(Failure(json_path(exc.path), exc.reason),),
        )
        return failed, None
    except ValueError as exc:
        failed = RouteReport(
            route.name,
            route.template,
            "failed",
            target=target,
            detail=f"GET {route.template}: the upstream answered with a body that is not JSON"
            f" ({exc})",
            upstream_status=reply.status,
            request_id=request_id,
            elapsed_ms=elapsed_ms,
        )
        return failed, None
    context, failures = _check(route.model, data, query.path_value)
    report = RouteReport(
        route.name,
        route.template,
        "failed" if failures else "ok",
        target=target,
        upstream_status=reply.status,
        request_id=request_id,
        elapsed_ms=elapsed_ms,
        records=_records(route, data),
        fields=_fields(route.model, context),
        filled_with_null={
            name: count
            for (name, kind), count in sorted(context.coercions.items())
            if kind == "missing->null"
        },
        dropped=tuple(sorted(context.dropped)),
        failures=tuple(failures),
    )
    return report, data


def check_body(
    route_name: str, data: Any, *, record_id: str | None = None, routes: RouteTable = ROUTES
) -> tuple[NormaliseContext, list[Failure]]:
    """Check one parsed body of ``route_name``: what was seen and coerced, and every failure.

    The envelope of a list and each of its records are validated on their own, so that
    a bad envelope does not hide the records, nor one bad record the others. What the
    gateway refuses of a whole body (a page larger than its limit, a record other than
    ``record_id``, the id asked for) is a failure too.
    """
    return _check(routes.route(route_name).model, data, record_id)


def _check(
    model: RecordModel, data: Any, record_id: str | None
) -> tuple[NormaliseContext, list[Failure]]:
    context = NormaliseContext(track_variants=True, page=1, limit=PROBE_LIMIT)
    problems: list[tuple[Location, str]] = []
    if issubclass(model, Page) and isinstance(data, dict) and isinstance(data.get("data"), list):
        problems += _problems(model, {**data, "data": []}, context)
        bound = page_bound(data.get("limit"), context.limit)
        if bound is not None and len(data["data"]) > bound:
            # the gateway refuses the page whatever its items: none is looked at
            problems.append((("data",), too_many_items(len(data["data"]), bound)))
            return context, [Failure(json_path(where), reason) for where, reason in problems]
        for index, item in enumerate(data["data"]):
            problems += [
                (("data", index, *location), reason)
                for location, reason in _problems(model.item_model, item, context)
            ]
    else:
        problems += _problems(model, data, context)
    failures = [Failure(json_path(location), reason) for location, reason in problems]
    if not failures:
        # The gateway normalises with canonical_body, not the models; what it refuses
        # must not pass here.
        try:
            canonical_body(
                model,
                copy.deepcopy(data),
                NormaliseContext(page=1, limit=PROBE_LIMIT, record_id=record_id),
            )
        except CanonicalError as exc:
            failures.append(Failure(json_path(exc.path), exc.reason))
    return context, failures


def _problems(
    model: type[BaseModel], value: Any, context: NormaliseContext
) -> list[tuple[Location, str]]:
    """Every value of ``value`` that ``model`` refuses, with its location and reason.

    The models stop at the first bad value of a record; each one found is set to null
    in a copy, and the copy validated again (counting into a scratch context, so that
    nothing is counted twice) until no new value fails.
    """
    found: dict[Location, str] = {}
    current, counting = value, context
    # Each round nulls at least one value that was not null, so the loop ends.
    while True:
        try:
            model.model_validate(current, context=counting)
        except ValidationError as exc:
            new = [
                (location, reason)
                for location, reason in map(locate, exc.errors(include_url=False))
                if location not in found
            ]
        else:
            break
        found.update(new)
        if counting is context:
            current = copy.deepcopy(value)
            counting = NormaliseContext(page=context.page, limit=context.limit)
        if not any([_set_aside(current, location) for location, _ in new]):  # noqa: C419 - all
            break
    return list(found.items())


def _set_aside(value: Any, location: Location) -> bool:
    """Set the value at ``location`` inside ``value`` to null, or, for a field that may
    not be null (every record's id), to a stand-in its rule accepts, present or not;
    False when there is nothing to change."""
    if not location:
        return False
    container = value
    for part in location[:-1]:
        if not _holds(container, part):
            return False
        container = container[part]
    last = location[-1]
    if last in _REQUIRED_FIELDS and isinstance(container, dict):
        if container.get(last) == ID_STAND_IN:
            return False
        container[last] = ID_STAND_IN
        return True
    if not _holds(container, last) or container[last] is None:
        return False
    container[last] = None
    return True


def _holds(container: Any, part: int | str) -> bool:
    if isinstance(container, dict):
        return part in container
    return isinstance(container, list) and isinstance(part, int) and 0 <= part < len(container)


def _first_id(detail: Route, listing: Route, data: Any) -> tuple[RecordQuery | None, str]:
    """The query for ``detail`` with the first id of the ``listing`` body, or why not."""
    if data is None:
        return None, f"GET {listing.template} failed, so there is no id to ask for"
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None, f"GET {listing.template} has no data array to take an id from"
    if not items:
        return None, f"GET {listing.template} returned no records to take an id from"
    first = items[0]
    record_id = first.get("id") if isinstance(first, dict) else None
    if not isinstance(record_id, str):
        return None, (
            f"the first record of GET {listing.template} has no id (a JSON {json_type(record_id)})"
        )
    try:
        return parse_record_query(detail, record_id, (), max_limit=PROBE_LIMIT), ""
    except InvalidParameters as exc:
        return None, f"the first id of GET {listing.template}, {record_id!r}, is unusable: {exc}"


def _records(route: Route, data: Any) -> int:
    if not route.is_list:
        return 1
    items = data.get("data") if isinstance(data, dict) else None
    return len(items) if isinstance(items, list) else 0


def _fields(model: RecordModel, context: NormaliseContext) -> tuple[FieldReport, ...]:
    """One report per field seen or coerced, in the order of the published schema."""
    coercions: dict[str, Counter[str]] = {}
    for (field, kind), count in context.coercions.items():
        # "Expense" / extra-field-dropped: the dropped fields are listed by name instead.
        if "." in field:
            coercions.setdefault(field, Counter())[kind] += count
    unknown: dict[str, list[str]] = {}
    for field, value in sorted(context.unknown_values):
        unknown.setdefault(field, []).append(value)
    order = _field_order(model)
    names = sorted(
        context.variants.keys() | coercions.keys(),
        key=lambda name: (order.get(name, len(order)), name),
    )
    reports = []
    for name in names:
        variants = Counter(context.variants.get(name, {}))
        reports.append(
            FieldReport(
                field=name,
                variants=_ordered(+variants),
                coercions=_ordered(coercions.get(name, Counter())),
                unknown_values=tuple(unknown.get(name, ())),
            )
        )
    return tuple(reports)


@functools.cache
def _field_order(model: type[BaseModel]) -> dict[str, int]:
    """Qualified field names in the published order: envelope, record, embedded records."""
    names: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        names.extend(f"{prefix}.{name}" for name in model.model_fields)
        for info in model.model_fields.values():
            for inner in get_args(info.annotation):
                if isinstance(inner, type) and issubclass(inner, CanonicalModel):
                    walk(inner, inner.__name__)

    if issubclass(model, Page):
        walk(Page, "Page")
        walk(model.item_model, model.item_model.__name__)
    else:
        walk(model, model.__name__)
    return {name: index for index, name in enumerate(dict.fromkeys(names))}


def _ordered(counts: Counter[str] | dict[str, int]) -> dict[str, int]:
    """Most frequent first, then by name: a stable order for the text and the JSON."""
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
