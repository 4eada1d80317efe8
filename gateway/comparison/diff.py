"""Two upstreams' answers to one request, compared field by field.

Both answers are brought to the published schema by the gateway's own rules
(``gateway.normalise``) and compared as the gateway's callers would read them: the
status first, then every field by its JSON path with list indices folded
(``data[].amount``). A difference is one of :data:`KINDS`:

- ``value``: the same type, another value (a Decimal in another scale counts: a caller
  reads its text). An enumeration is also compared as it was sent: the gateway
  upper-cases enumerations, so a candidate that spells ``paid`` where the primary
  spells ``PAID`` is reported, with the values as sent;
- ``type``: another JSON type (a string where the primary has a number);
- ``missing``: null or absent in the candidate's answer, present in the primary's;
- ``extra``: present in the candidate's answer, null or absent in the primary's;
- ``order``: a list with the same items in another order;
- ``length``: a list of another length.

The items of a list of records are matched by ``id`` (a record the candidate leaves
out of a page is ``missing`` at ``data[]``; one it adds, ``extra``), so that one item
more or less, or another order, does not make every later item differ. Lists without
ids are compared position by position.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any, get_args

import orjson

from gateway.normalise.coercions import CanonicalError, json_type
from gateway.normalise.normaliser import dump_canonical, json_path, parse_lossless
from gateway.normalise.pages import Page, canonical_body
from gateway.normalise.schema import CanonicalModel, NormaliseContext
from gateway.routing.routes import Route

KINDS = ("value", "type", "missing", "extra", "order", "length")
# the path of an answer's HTTP status among the field paths
STATUS_FIELD = "(status)"
# the path a difference outside the published schema is counted under (none should be:
# both answers are normalised, but a label must stay bounded whatever happens)
OTHER_FIELD = "(other)"
_SHOWN_CHARS = 200
_SHOWN_IDS = 5


class NotComparable(Exception):
    """An answer that cannot be compared: its body is not JSON, or does not fit the
    published schema (``reason`` says where, never quoting a token)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Answer:
    """One upstream's answer to one request: its status and, for a 200, its body as
    sent (parsed losslessly) and as the gateway publishes it (parsed again from the
    published bytes, so that values compare as callers read them)."""

    status: int
    sent: Any = None
    published: Any = None
    # the published bytes themselves, for a report's examples of whole answers
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class Difference:
    """One field that differs: its folded path, the kind, and the two values (as
    parsed; :func:`shown` makes them what a report shows)."""

    field: str
    kind: str
    primary: Any
    candidate: Any


def answer_of(
    route: Route,
    status: int,
    body: bytes | None,
    params: dict[str, str],
    published: bytes | None = None,
) -> Answer:
    """The :class:`Answer` of ``route`` with ``status`` and ``body`` (the body of a 200;
    ``params``: the request's query, whose page and limit fill a page envelope that
    leaves them out, as the gateway does). ``published``, when the gateway has already
    normalised ``body``, is its published bytes, taken instead of normalising again.
    Raises NotComparable."""
    if status != 200 or body is None:
        return Answer(status)
    try:
        sent = parse_lossless(body)
        if published is None:
            context = NormaliseContext(
                page=_int_or_none(params.get("page")), limit=_int_or_none(params.get("limit"))
            )
            # canonicalising works in place: it gets a parse of its own
            published = dump_canonical(canonical_body(route.model, parse_lossless(body), context))
        answer = Answer(status, sent, parse_lossless(published), published)
    except CanonicalError as exc:
        raise NotComparable(
            f"its {json_path(exc.path)} cannot be brought to the published schema: {exc.reason}"
        ) from exc
    except ValueError as exc:
        raise NotComparable(f"the body is not JSON ({exc})") from exc
    return answer


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def compare(route: Route, primary: Answer, candidate: Answer) -> list[Difference]:
    """Every difference of ``candidate`` from ``primary``, both answers of ``route``;
    empty when they are the same. Answers of different statuses differ in their
    status only; two answers of the same error status are the same."""
    if primary.status != candidate.status:
        return [Difference(STATUS_FIELD, "value", primary.status, candidate.status)]
    if primary.status != 200:
        return []
    enums = enumeration_fields(route)
    return list(
        _walk(
            "",
            primary.published,
            candidate.published,
            primary.sent,
            candidate.sent,
            enums,
        )
    )


def _walk(
    path: str, mine: Any, theirs: Any, mine_sent: Any, theirs_sent: Any, enums: frozenset[str]
) -> Iterator[Difference]:
    if mine is None and theirs is None:
        return
    if theirs is None:
        yield Difference(path, "missing", mine, None)
        return
    if mine is None:
        yield Difference(path, "extra", None, theirs)
        return
    kind_mine, kind_theirs = json_type(mine), json_type(theirs)
    if kind_mine != kind_theirs:
        yield Difference(path, "type", mine, theirs)
        return
    if kind_mine == "object":
        mine_sent = mine_sent if isinstance(mine_sent, dict) else {}
        theirs_sent = theirs_sent if isinstance(theirs_sent, dict) else {}
        for key, value in mine.items():
            inner = f"{path}.{key}" if path else key
            if key not in theirs:
                if value is not None:
                    yield Difference(inner, "missing", value, None)
                continue
            yield from _walk(
                inner, value, theirs[key], mine_sent.get(key), theirs_sent.get(key), enums
            )
        for key, value in theirs.items():
            if key not in mine and value is not None:
                yield Difference(f"{path}.{key}" if path else key, "extra", None, value)
        return
    if kind_mine == "array":
        yield from _walk_list(path, mine, theirs, mine_sent, theirs_sent, enums)
        return
    if mine != theirs or (isinstance(mine, Decimal) and str(mine) != str(theirs)):
        yield Difference(path, "value", mine, theirs)
    elif (
        path in enums
        and isinstance(mine_sent, str)
        and isinstance(theirs_sent, str)
        and mine_sent != theirs_sent
    ):
        yield Difference(path, "value", mine_sent, theirs_sent)


def _walk_list(
    path: str,
    mine: list[Any],
    theirs: list[Any],
    mine_sent: Any,
    theirs_sent: Any,
    enums: frozenset[str],
) -> Iterator[Difference]:
    items = f"{path}[]"
    # what was sent, item by item (canonical forms keep the items and their order)
    mine_sent = mine_sent if isinstance(mine_sent, list) and len(mine_sent) == len(mine) else []
    theirs_sent = (
        theirs_sent if isinstance(theirs_sent, list) and len(theirs_sent) == len(theirs) else []
    )
    if len(mine) != len(theirs):
        yield Difference(path, "length", len(mine), len(theirs))
    mine_ids, theirs_ids = _ids(mine), _ids(theirs)
    if mine_ids is not None and theirs_ids is not None:
        at = {item_id: index for index, item_id in enumerate(theirs_ids)}
        common = [item_id for item_id in mine_ids if item_id in at]
        shared = set(common)
        in_their_order = [item_id for item_id in theirs_ids if item_id in shared]
        if common != in_their_order:
            # the ids from the first place where the orders part
            first = next(
                i for i, (a, b) in enumerate(zip(common, in_their_order, strict=True)) if a != b
            )
            shown_ids = slice(first, first + _SHOWN_IDS)
            yield Difference(path, "order", common[shown_ids], in_their_order[shown_ids])
        for index, item_id in enumerate(mine_ids):
            other = at.get(item_id)
            if other is None:
                yield Difference(items, "missing", item_id, None)
                continue
            yield from _walk(
                items,
                mine[index],
                theirs[other],
                mine_sent[index] if mine_sent else None,
                theirs_sent[other] if theirs_sent else None,
                enums,
            )
        known = set(mine_ids)
        for item_id in theirs_ids:
            if item_id not in known:
                yield Difference(items, "extra", None, item_id)
        return
    if len(mine) == len(theirs):
        if mine != theirs and sorted(map(_sort_key, mine)) == sorted(map(_sort_key, theirs)):
            yield Difference(path, "order", mine, theirs)
            return
        for index, (left, right) in enumerate(zip(mine, theirs, strict=True)):
            yield from _walk(
                items,
                left,
                right,
                mine_sent[index] if mine_sent else None,
                theirs_sent[index] if theirs_sent else None,
                enums,
            )


def _ids(items: list[Any]) -> list[Any] | None:
    """The ids of a list of records, when every item is one with an id of its own."""
    ids = []
    for item in items:
        if not isinstance(item, dict):
            return None
        item_id = item.get("id")
        if item_id is None or isinstance(item_id, dict | list):
            return None
        ids.append(item_id)
    return ids if len(set(ids)) == len(ids) else None


def _sort_key(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS)


def shown(value: Any) -> Any:
    """A value as a report shows it, as JSON: a Decimal as its exact text, a text
    longer than 200 characters cut short with "...", a container as it is, or as its
    JSON text cut short when that is longer."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dict | list):
        text = orjson.dumps(value, default=lambda item: format(item, "f")).decode()
        return orjson.loads(text) if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return value[:_SHOWN_CHARS] + "..."
    return value


@cache
def schema_fields(route: Route) -> frozenset[str]:
    """Every folded path of the published schema of ``route`` (and ``(status)``): the
    only field labels a report or a metric can carry."""
    model = route.model
    paths: dict[str, str] = {STATUS_FIELD: "status"}
    if issubclass(model, Page):
        for name in model.model_fields:
            paths[name] = "envelope"
        paths["data[]"] = "object"
        _model_fields(model.item_model, "data[].", paths)
    else:
        _model_fields(model, "", paths)
    return frozenset(paths)


@cache
def enumeration_fields(route: Route) -> frozenset[str]:
    """The folded paths of ``route``'s enumerations (compared as sent too)."""
    model = route.model
    paths: dict[str, str] = {}
    if issubclass(model, Page):
        _model_fields(model.item_model, "data[].", paths)
    else:
        _model_fields(model, "", paths)
    return frozenset(path for path, kind in paths.items() if kind == "enum")


def _model_fields(model: type[CanonicalModel], prefix: str, paths: dict[str, str]) -> None:
    for name, info in model.model_fields.items():
        path = prefix + name
        extra = info.json_schema_extra
        kind = extra.get("x-canonical") if isinstance(extra, dict) else None
        paths[path] = str(kind or "value")
        if kind == "text[]":
            paths[path + "[]"] = "text"
        nested = _nested_model(info.annotation)
        if nested is not None:
            _model_fields(nested, path + ".", paths)


def _nested_model(annotation: Any) -> type[CanonicalModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, CanonicalModel):
        return annotation
    for argument in get_args(annotation):
        found = _nested_model(argument)
        if found is not None:
            return found
    return None


def field_label(route: Route, field: str) -> str:
    """``field`` when it is a path of ``route``'s published schema, else ``(other)``."""
    return field if field in schema_fields(route) else OTHER_FIELD
