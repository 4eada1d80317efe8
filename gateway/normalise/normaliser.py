"""The normalise step of the pipeline: an upstream body in, the published body out.

The body is parsed losslessly (every JSON number with a fraction becomes a
``Decimal``, never a ``float``), validated into the route's model from
``gateway.normalise.schema``, and written with orjson. A value that cannot be brought to its
canonical type makes the whole answer an :class:`UpstreamContractError` whose
detail names the JSON path of the first bad value (``data[3].amount``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Protocol

import jiter
import orjson
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gateway.errors import UpstreamContractError
from gateway.normalise.coercions import CanonicalError
from gateway.normalise.duplicates import repeated_key
from gateway.normalise.holdings import records_held
from gateway.normalise.pages import RecordModel, canonical_body
from gateway.normalise.rules import compiled, compiled_in_use
from gateway.normalise.schema import NormaliseContext

log = logging.getLogger("gateway.normalise")
_MAX_LOGGED_VALUES = 1000
# what an enumeration value looks like (CASH, BANK, CREDIT_CARD); another is not logged
_ENUMERATION_SHAPE = re.compile(r"[A-Z][A-Z0-9_]{0,39}")


class NormaliseRoute(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def template(self) -> str: ...

    @property
    def model(self) -> RecordModel: ...


class NormaliseQuery(Protocol):
    """What the normaliser needs of a validated query: its route, the ``page`` and
    ``limit`` it asked for (a page envelope that leaves them out gets the request's; a
    page holds no more than ``limit`` items), and the id in its path (the record it
    asked for)."""

    @property
    def route(self) -> NormaliseRoute: ...

    @property
    def params(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def path_value(self) -> str | None: ...


class CoercionCounts:
    """Every coercion the normaliser performed, by (field, kind), since start.

    ``add`` (once per answer) counts into what is new; ``take`` (the metrics, at each
    flush) hands that over and folds it into the totals, so an answer's counts are
    added once, not once here and once more for the metrics.
    """

    def __init__(self) -> None:
        self._totals: Counter[tuple[str, str]] = Counter()  # handed over by take
        self._new: Counter[tuple[str, str]] = Counter()  # added since the last take
        self._lock = threading.Lock()

    def add(self, counts: Counter[tuple[str, str]]) -> None:
        with self._lock:
            self._new.update(counts)

    def take(self) -> Counter[tuple[str, str]]:
        """What was added since the last take."""
        with self._lock:
            new, self._new = self._new, Counter()
            self._totals.update(new)
        return new

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._totals + self._new)


def parse_lossless(body: bytes) -> Any:
    """Parse JSON with every fractional number as a Decimal; ValueError if not JSON,
    CanonicalError (gateway.normalise.duplicates) if a key repeats in any object.

    What comes out is jiter's Decimal parse, errors included; with the Python rules in
    use (gateway.normalise.rules) it is that parse alone, with jiter's check for
    repeated keys. With the compiled canonicaliser, the body is parsed first in jiter's
    float mode, which is markedly quicker on every body, fractions in it or not, and
    again with Decimals only when that parse fails or holds a float anywhere (``shape``,
    a walk in C). Without a float, the two parses are the same values of the same
    types; with one, the float is never used (tests/normalise/test_rules.py holds the
    two to that). A repeated key is found there by counting: the entries of the parsed
    dicts against the members in the text (``members``, a scan in C), which differ
    exactly when a key repeats. Both ways, a body that is not JSON is that error,
    whatever keys repeat in it."""
    if not compiled_in_use():
        try:
            return jiter.from_json(
                body, float_mode="decimal", allow_inf_nan=False, catch_duplicate_keys=True
            )
        except ValueError as exc:
            if not str(exc).startswith(_REPEATED):
                raise
        # not JSON further on is that error, as it is for the compiled canonicaliser
        jiter.from_json(body, float_mode="decimal", allow_inf_nan=False)
        raise repeated_key(body)
    try:
        quick = jiter.from_json(body, allow_inf_nan=False)
    except ValueError:
        data = jiter.from_json(body, float_mode="decimal", allow_inf_nan=False)
        _, entries = compiled.shape(data)
    else:
        floats, entries = compiled.shape(quick)
        if floats:
            del quick  # not held while the body is parsed again: a page's tree is large
            data = jiter.from_json(body, float_mode="decimal", allow_inf_nan=False)
        else:
            data = quick
    if entries != compiled.members(body if type(body) is bytes else bytes(body)):
        raise repeated_key(body)
    return data


# how jiter's message for a repeated key begins (the key it quotes is never shown)
_REPEATED = "Detected duplicate key"


def json_path(location: Iterable[int | str]) -> str:
    """``("data", 3, "amount")`` -> ``data[3].amount``."""
    path = ""
    for part in location:
        if part == "(body)":
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "(body)"


def first_problem(exc: ValidationError) -> tuple[str, str]:
    """The JSON path and the reason of the first bad value in ``exc``."""
    location, reason = locate(exc.errors(include_url=False)[0])
    return json_path(location), reason


def locate(error: ErrorDetails) -> tuple[tuple[int | str, ...], str]:
    """The location and the reason of one validation error: a record's coercion failure
    (type "canonical") names its field in the error's context."""
    location: list[int | str] = list(error["loc"])
    reason = error["msg"]
    context = error.get("ctx") or {}
    if error["type"] == "canonical":
        location.extend(
            int(part) if part.isdigit() else part for part in str(context["field"]).split(".")
        )
        reason = str(context["reason"])
    elif error["type"] == "missing":
        reason = "missing"
    return tuple(location), reason


# The JSON text of the Decimals written lately, by the Decimal object:
# gateway.normalise.coercions hands out one Decimal object per number text it converted
# (its caches), so a page's repeated numbers are written once, not formatted again on
# every answer (formatting them is a sizeable part of writing a page). Keyed by id(),
# each with the Decimal itself: while its entry is here the object lives, and no other
# can have its id. Never keyed by value: Decimal("4") == Decimal("4.0") == Decimal("4.00").
_FRAGMENTS: dict[int, tuple[Decimal, orjson.Fragment]] = {}
_FRAGMENTS_KEPT = 512  # a bound on what is kept, whatever the pages


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        made = _FRAGMENTS.get(id(value))
        if made is not None and made[0] is value:
            return made[1]
        fragment = orjson.Fragment(format(value, "f"))
        if len(_FRAGMENTS) >= _FRAGMENTS_KEPT:
            _FRAGMENTS.clear()
        _FRAGMENTS[id(value)] = (value, fragment)
        return fragment
    raise TypeError(f"cannot serialise {type(value).__name__}")


def dump(model: BaseModel) -> bytes:
    """The published bytes of a validated model."""
    return orjson.dumps(model.model_dump(), default=_json_default)


def dump_canonical(data: Any) -> bytes:
    """The published bytes of a canonical body from ``canonical_body``."""
    return orjson.dumps(data, default=_json_default)


class Normaliser:
    """Turns upstream bodies into the published schema and counts what it coerced."""

    def __init__(self, counts: CoercionCounts) -> None:
        self._counts = counts
        self._logged: set[tuple[str, str]] = set()

    def normalise(self, query: NormaliseQuery, body: bytes) -> bytes:
        """The published bytes of the upstream's ``body`` for ``query``. Raises
        UpstreamContractError when it cannot be brought to the published schema."""
        # a copy of exact size: orjson keeps its growth room in the bytes it returns,
        # which a cached body would otherwise hold for its whole life
        return bytes(memoryview(dump_canonical(self._canonical(query, body))))

    def normalise_held(
        self, query: NormaliseQuery, body: bytes, *, versions: bool = False
    ) -> tuple[bytes, dict[str, str]]:
        """:meth:`normalise`, and the records the body holds, each with its version
        when ``versions`` (``gateway.normalise.holdings``; otherwise "")."""
        canonical = self._canonical(query, body)
        held = records_held(query.route.model, canonical, dump_canonical if versions else None)
        return bytes(memoryview(dump_canonical(canonical))), held

    def _canonical(self, query: NormaliseQuery, body: bytes) -> Any:
        what = f"GET {query.route.template}"
        try:
            data = parse_lossless(body)
        except CanonicalError as exc:
            raise self._refused(what, exc) from exc
        except ValueError as exc:
            raise UpstreamContractError(
                f"{what}: the upstream answered with a body that is not JSON ({exc})"
            ) from exc
        params = dict(query.params)
        context = NormaliseContext(
            page=int(params["page"]) if "page" in params else None,
            limit=int(params["limit"]) if "limit" in params else None,
            record_id=query.path_value,
        )
        try:
            canonical = canonical_body(query.route.model, data, context)
        except CanonicalError as exc:
            raise self._refused(what, exc) from exc
        if context.coercions:
            self._counts.add(context.coercions)
        if context.unknown_values:
            self._log_unknown(what, context.unknown_values)
        return canonical

    @staticmethod
    def _refused(what: str, exc: CanonicalError) -> UpstreamContractError:
        return UpstreamContractError(
            f"{what}: the upstream's {json_path(exc.path)} cannot be brought to the"
            f" published schema: {exc.reason}"
        )

    def _log_unknown(self, what: str, values: set[tuple[str, str]]) -> None:
        for name, value in values - self._logged:
            if len(self._logged) >= _MAX_LOGGED_VALUES:
                return
            self._logged.add((name, value))
            # the value is shown when it has the shape of one (an upstream may put
            # anything in the field, a caller's token among it); else its size alone
            shown = value if _ENUMERATION_SHAPE.fullmatch(value) else f"({len(value)} characters)"
            log.warning(
                "upstream sent an unknown enumeration value; passed through",
                extra={"route": what, "field": name, "value": shown},
            )
