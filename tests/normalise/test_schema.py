"""Property tests of the canonical models (gateway/normalise/schema.py).

Hypothesis builds upstream bodies in every variant the gateway accepts (decimals as
JSON numbers written digit for digit or as numeric text, percentages and country codes
as numbers or text, UUIDs in any case, paidAt with Z, offsets, naive or microseconds,
enumerations in any case and unknown ones, fields missing, null or extra, envelopes
incomplete, stringly typed or self-contradicting). For each body it knows, from the
rules of the published schema alone, the canonical output and the coercions that must
be counted, and it checks that:

(a) the output validates against the route's published JSON schema and every object
    has exactly the model's keys, in the model's order;
(b) every decimal keeps its exact value, in plain notation, with at least its scale;
(c) paidAt is the same instant (to the millisecond), in UTC with Z;
(d) every text is identical;
(e) the direct path (``canonical_body``) and the pydantic path (``model_validate`` then
    ``dump``) write identical bytes;
(f) the coercion counts are exactly those the body calls for.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gateway.normalise.normaliser import CoercionCounts, Normaliser, dump, parse_lossless
from gateway.normalise.pages import Page
from gateway.normalise.schema import (
    ACCOUNT_TYPES,
    CLIENT_TYPES,
    EXPENSE_STATUSES,
    USER_ROLES,
    Account,
    Bank,
    CanonicalModel,
    Client,
    Expense,
    NormaliseContext,
    User,
)
from gateway.records.routes import parse_record_query
from gateway.routing.standard import ROUTES
from tests.profiles import examples

Counts = Counter[tuple[str, str]]
Path = tuple[str | int, ...]

PROPERTY_SETTINGS = settings(
    max_examples=examples(120),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(autouse=True)
def _quiet_unknown_values() -> Iterator[None]:
    """Generated unknown enumeration values would log thousands of warnings."""
    logger = logging.getLogger("gateway.normalise")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


# ---------------------------------------------------------------- JSON text, exactly


@dataclass(frozen=True, slots=True)
class Num:
    """A JSON number written exactly as ``text`` (1E+2, 12345678901234.5678, -0.0)."""

    text: str


def write_json(value: Any, *, ascii_only: bool) -> str:
    """JSON text in which every Num appears as written; no float is ever involved."""
    if isinstance(value, Num):
        return value.text
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=ascii_only)
    if isinstance(value, list):
        return "[" + ", ".join(write_json(item, ascii_only=ascii_only) for item in value) + "]"
    if isinstance(value, dict):
        members = (
            f"{json.dumps(key, ensure_ascii=ascii_only)}: {write_json(item, ascii_only=ascii_only)}"
            for key, item in value.items()
        )
        return "{" + ", ".join(members) + "}"
    raise TypeError(type(value).__name__)


# ------------------------------------------------------------- what one body calls for

ABSENT = object()  # a key the upstream leaves out


@dataclass(frozen=True, slots=True)
class Check:
    """A property of one published value: ``what`` it is and what the upstream sent."""

    what: str  # "decimal", "number", "instant" or "text"
    sent: Any  # the Decimal, the aware datetime or the str
    scale: int = 0


@dataclass(frozen=True, slots=True)
class Leaf:
    """One upstream value, its published form, the coercion kinds it must count."""

    raw: Any
    expected: Any
    kinds: tuple[str, ...] = ()
    check: Check | None = None


@dataclass(slots=True)
class Generated:
    """An upstream body (with Num leaves) and everything its output must satisfy."""

    raw: Any
    expected: Any
    counts: Counts = field(default_factory=Counter)
    checks: list[tuple[Path, Check]] = field(default_factory=list)

    def absorb(self, other: Generated, *prefix: str | int) -> None:
        self.counts.update(other.counts)
        self.checks.extend(((*prefix, *path), check) for path, check in other.checks)


# -------------------------------------------------------------------------- leaves


def plain(number: Decimal, scale: int) -> str:
    """The published text of ``number``: written out digit by digit, from the spec."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    coefficient = "".join(map(str, digits))
    if exponent >= 0:
        whole, fraction = coefficient + "0" * exponent, ""
    else:
        coefficient = coefficient.rjust(-exponent + 1, "0")
        whole, fraction = coefficient[:exponent], coefficient[exponent:]
    whole = whole.lstrip("0") or "0"
    fraction = fraction.ljust(scale, "0")
    negative = sign == 1 and (whole + fraction).strip("0") != ""
    return ("-" if negative else "") + whole + "." + fraction


_SPECIAL_DECIMALS = [
    Decimal("12345678901234.5678"),
    Decimal("0.1"),
    Decimal("1E+2"),
    Decimal("-0.0"),
    Decimal("0"),
    Decimal("1694.83"),
    Decimal("0.00001"),
    Decimal("-999999999999999999.999999999"),
    Decimal("123456789012345678901234567890.123456789"),  # past the default 28 digits
    Decimal("-1E+30"),
]
decimals = st.one_of(
    st.sampled_from(_SPECIAL_DECIMALS),
    st.builds(
        lambda negative, coefficient, exponent: Decimal(
            (int(negative), tuple(int(c) for c in str(coefficient)), exponent)
        ),
        st.booleans(),
        st.integers(0, 10**30),
        st.integers(-12, 6),
    ),
)


@st.composite
def number_text(draw: st.DrawFn, number: Decimal) -> str:
    """``number`` as JSON number text, in one of several exact spellings."""
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    minus = "-" if sign else ""
    coefficient = "".join(map(str, digits))
    form = draw(st.sampled_from(["fixed", "exponent", "scientific"]))
    if form == "fixed":
        text = format(number, "f")
    elif form == "exponent":
        e = draw(st.sampled_from(["e", "E"]))
        exp_sign = "+" if exponent >= 0 and draw(st.booleans()) else ""
        text = f"{minus}{coefficient}{e}{exp_sign}{exponent}"
    else:
        shifted = exponent + len(coefficient) - 1
        mantissa = coefficient[0] + ("." + coefficient[1:] if len(coefficient) > 1 else "")
        text = f"{minus}{mantissa}E{shifted:+d}"
    assert Decimal(text) == number
    return text


@st.composite
def numeric_string(draw: st.DrawFn, number: Decimal) -> str:
    """``number`` as numeric text: fewer or more decimals, exponent, sign, leading zeros."""
    fixed = format(number, "f")
    form = draw(st.sampled_from(["fixed", "padded", "exponent", "plus", "zeros", "bare"]))
    if form == "padded":
        text = fixed + ("" if "." in fixed else ".") + "0" * draw(st.integers(1, 8))
    elif form == "exponent":
        text = draw(number_text(number))
    elif form == "plus" and not fixed.startswith("-"):
        text = "+" + fixed
    elif form == "zeros":
        text = fixed.replace("-", "-00", 1) if fixed.startswith("-") else "00" + fixed
    elif form == "bare" and fixed.startswith("0."):
        text = fixed[1:]
    else:
        text = fixed
    assert Decimal(text) == number
    return text


@st.composite
def decimal_leaf(draw: st.DrawFn, scale: int) -> Leaf:
    number = draw(decimals)
    check = Check("decimal", number, scale)
    if draw(st.booleans()):
        text = draw(number_text(number))
        return Leaf(Num(text), plain(Decimal(text), scale), ("number->string",), check)
    text = draw(numeric_string(number))
    expected = plain(Decimal(text), scale)  # every written decimal is kept, zeros too
    return Leaf(text, expected, () if text == expected else ("reformatted",), check)


@st.composite
def percentage_leaf(draw: st.DrawFn) -> Leaf:
    number = draw(decimals)
    if draw(st.booleans()):
        return Leaf(Num(draw(number_text(number))), number, (), Check("number", number))
    text = draw(numeric_string(number))
    return Leaf(text, number, ("string->number",), Check("number", number))


@st.composite
def country_leaf(draw: st.DrawFn) -> Leaf:
    code = draw(st.integers(0, 10**9))
    form = draw(st.sampled_from(["number", "string", "zeros", "fraction", "exponent"]))
    if form == "number":
        return Leaf(Num(str(code)), code)
    if form == "string":
        return Leaf(str(code), code, ("string->integer",))
    if form == "zeros":
        return Leaf("00" + str(code), code, ("string->integer",))
    if form == "fraction":
        return Leaf(Num(f"{code}.0"), code, ("number->integer",))
    return Leaf(Num(f"{code}E0"), code, ("number->integer",))


@st.composite
def recased(draw: st.DrawFn, text: str) -> str:
    form = draw(st.sampled_from(["as-is", "upper", "lower", "mixed"]))
    if form == "upper":
        return text.upper()
    if form == "lower":
        return text.lower()
    if form == "mixed":
        flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
        return "".join(c.upper() if up else c.lower() for c, up in zip(text, flips, strict=True))
    return text


@st.composite
def uuid_leaf(draw: st.DrawFn) -> Leaf:
    canonical = str(draw(st.uuids()))
    form = draw(st.sampled_from(["canonical", "canonical", "hex", "braces", "urn"]))
    text = {
        "canonical": canonical,
        "hex": canonical.replace("-", ""),
        "braces": "{" + canonical + "}",
        "urn": "urn:uuid:" + canonical,
    }[form]
    text = draw(recased(text)) if form != "urn" else "urn:uuid:" + draw(recased(canonical))
    return Leaf(text, canonical, () if text == canonical else ("uuid->canonical",))


def enum_leaf(known: frozenset[str]) -> st.SearchStrategy[Leaf]:
    unknown = st.from_regex(r"[A-Z][A-Z_]{0,10}", fullmatch=True).filter(lambda v: v not in known)

    @st.composite
    def leaf(draw: st.DrawFn) -> Leaf:
        value = draw(st.one_of(st.sampled_from(sorted(known)), unknown))
        text = draw(recased(value))
        if value not in known:
            return Leaf(text, value, ("unknown-value",))
        return Leaf(text, value, () if text == value else ("lowercase->uppercase",))

    return leaf()


_OFFSETS = [timedelta(hours=5, minutes=30), timedelta(hours=-3), timedelta(0)]
_OFFSETS += [timedelta(hours=14), timedelta(hours=-12), timedelta(minutes=45)]


def _offset_text(offset: timedelta) -> str:
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


@st.composite
def instant_leaf(draw: st.DrawFn) -> Leaf:
    naive = draw(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1)))
    micro = draw(st.sampled_from(["none", "millis", "micros"]))
    if micro == "none":
        naive = naive.replace(microsecond=0)
    elif micro == "millis":
        naive = naive.replace(microsecond=naive.microsecond // 1000 * 1000)
    moment = naive.replace(tzinfo=UTC)
    published = f"{naive:%Y-%m-%dT%H:%M:%S}"
    if naive.microsecond:
        published += f".{naive.microsecond // 1000:03d}"
    published += "Z"

    def fraction(value: datetime) -> str:
        if not value.microsecond:
            return ""
        if value.microsecond % 1000 == 0 and draw(st.booleans()):
            return f".{value.microsecond // 1000:03d}"
        return f".{value.microsecond:06d}"

    form = draw(st.sampled_from(["Z", "offset", "naive"]))
    check = Check("instant", moment)
    if form == "Z":
        text = f"{naive:%Y-%m-%dT%H:%M:%S}{fraction(naive)}Z"
        return Leaf(text, published, () if text == published else ("reformatted",), check)
    if form == "naive":
        separator = draw(st.sampled_from(["T", " "]))
        text = f"{naive:%Y-%m-%d}{separator}{naive:%H:%M:%S}{fraction(naive)}"
        return Leaf(text, published, ("naive->utc",), check)
    offset = draw(st.sampled_from(_OFFSETS))
    local = naive + offset
    text = f"{local:%Y-%m-%dT%H:%M:%S}{fraction(local)}{_offset_text(offset)}"
    return Leaf(text, published, ("offset->utc",) if offset else ("reformatted",), check)


texts = st.text(max_size=12)
text_leaf = texts.map(lambda s: Leaf(s, s, (), Check("text", s)))
date_leaf = st.dates(min_value=date(1900, 1, 1)).map(lambda d: Leaf(d.isoformat(), d.isoformat()))
names_leaf = st.lists(texts, max_size=3).map(lambda names: Leaf(names, list(names)))

LEAVES: dict[type[CanonicalModel], dict[str, st.SearchStrategy[Leaf]]] = {
    User: {"id": uuid_leaf(), "role": enum_leaf(USER_ROLES), "accounts": names_leaf},
    Client: {
        "id": uuid_leaf(),
        "type": enum_leaf(CLIENT_TYPES),
        "taxRetentionPercentage": percentage_leaf(),
    },
    Bank: {"country": country_leaf()},
    Account: {
        "type": enum_leaf(ACCOUNT_TYPES),
        "liquidityThreshold": decimal_leaf(2),
        "lastBalance": decimal_leaf(4),
    },
    Expense: {
        "id": uuid_leaf(),
        "amount": decimal_leaf(4),
        "paidAt": instant_leaf(),
        "issueDate": date_leaf,
        "dueDate": date_leaf,
        "type": enum_leaf(ACCOUNT_TYPES),
        "status": enum_leaf(EXPENSE_STATUSES),
    },
}
EMBEDDED: dict[type[CanonicalModel], dict[str, type[CanonicalModel]]] = {
    Account: {"bank": Bank},
    Expense: {"account": Account, "client": Client, "user": User},
}
json_values = st.one_of(
    st.none(), st.booleans(), texts, st.integers(-(10**6), 10**6), st.lists(texts, max_size=2)
)


# ------------------------------------------------------------------------- bodies


@st.composite
def records(draw: st.DrawFn, model: type[CanonicalModel]) -> Generated:
    """One record of ``model`` as the upstream might send it."""
    name = model.__name__
    out = Generated(raw={}, expected={})
    for key, spec in model.model_fields.items():
        # an id is never missing or null in an answer the gateway accepts (see
        # test_a_record_without_an_id_breaks_the_contract)
        presence = (
            "value"
            if spec.is_required()
            else draw(st.sampled_from(["value", "value", "value", "value", "null", "missing"]))
        )
        if presence == "missing":
            out.expected[key] = None
            out.counts[(f"{name}.{key}", "missing->null")] += 1
            continue
        if presence == "null":
            out.raw[key] = out.expected[key] = None
            continue
        embedded = EMBEDDED.get(model, {}).get(key)
        if embedded is not None:
            inner = draw(records(embedded))
            out.raw[key], out.expected[key] = inner.raw, inner.expected
            out.absorb(inner, key)
            continue
        leaf = draw(LEAVES.get(model, {}).get(key, text_leaf))
        out.raw[key], out.expected[key] = leaf.raw, leaf.expected
        out.counts.update((f"{name}.{key}", kind) for kind in leaf.kinds)
        if leaf.check is not None:
            out.checks.append(((key,), leaf.check))
    if model is Account and out.expected["bankCode"] is None:
        bank = out.expected["bank"]
        if isinstance(bank, dict) and isinstance(bank["code"], str):
            out.expected["bankCode"] = bank["code"]
            out.counts[("Account.bankCode", "filled-from-bank.code")] += 1
            if "bankCode" not in out.raw:  # filled, so not counted as left null
                out.counts[("Account.bankCode", "missing->null")] -= 1
            out.checks.append((("bankCode",), Check("text", bank["code"])))
    extras = draw(
        st.dictionaries(
            texts.filter(lambda k: k not in model.model_fields), json_values, max_size=2
        )
    )
    if extras:
        out.counts[(name, "extra-field-dropped")] += len(extras)
        out.raw.update(extras)
    if draw(st.booleans()):
        order = draw(st.permutations(list(out.raw)))
        out.raw = {key: out.raw[key] for key in order}
    return out


def _int_variant(draw: st.DrawFn, name: str, value: int, counts: Counts) -> Any:
    form = draw(st.sampled_from(["number", "number", "string", "fraction"]))
    if form == "string":
        counts[(f"Page.{name}", "string->integer")] += 1
        return str(value)
    if form == "fraction":
        counts[(f"Page.{name}", "number->integer")] += 1
        return Num(f"{value}.0")
    return Num(str(value))


def _derived_variant(draw: st.DrawFn, name: str, right: int | bool, counts: Counts) -> Any:
    """What the upstream sends for a derived field: right, wrong, as text, junk, nothing."""
    key = f"Page.{name}"
    form = draw(st.sampled_from(["right", "right", "missing", "null", "text", "wrong", "junk"]))
    if form in ("missing", "null"):
        counts[(key, "missing->derived")] += 1
        return None if form == "null" else ABSENT
    if form == "junk":
        counts[(key, "invalid->derived")] += 1
        junk = ["many", True, Num("2.5"), []] if name == "totalPages" else ["yes", Num("1"), []]
        return draw(st.sampled_from(junk))
    value: int | bool = right
    if form == "wrong":
        counts[(key, "inconsistent->derived")] += 1
        value = (not right) if isinstance(right, bool) else right + draw(st.integers(1, 9))
    if form == "text" or (form == "wrong" and draw(st.booleans())):
        counts[(key, "string->boolean" if isinstance(value, bool) else "string->integer")] += 1
        return draw(recased(str(value).lower())) if isinstance(value, bool) else str(value)
    return value if isinstance(value, bool) else Num(str(value))


@st.composite
def pages(draw: st.DrawFn, item: type[CanonicalModel]) -> tuple[Generated, int, int]:
    """A page envelope of ``item`` records, and the page and limit requested."""
    items = draw(st.lists(records(item), max_size=3))
    total = draw(st.integers(0, 10**6))
    limit = draw(st.integers(max(1, len(items)), 1000))  # a page holds at most its limit
    total_pages = -(-total // limit)
    page = draw(st.integers(1, total_pages + 2))
    out = Generated(raw={"data": [one.raw for one in items]}, expected={})
    out.expected["data"] = [one.expected for one in items]
    for index, one in enumerate(items):
        out.absorb(one, "data", index)
    for key, value in (("total", total), ("page", page), ("limit", limit)):
        if key != "total" and draw(st.integers(0, 4)) == 0:
            out.counts[(f"Page.{key}", "missing->request")] += 1
            if draw(st.booleans()):
                out.raw[key] = None
        else:
            out.raw[key] = _int_variant(draw, key, value, out.counts)
        out.expected[key] = value
    derived: dict[str, int | bool] = {
        "totalPages": total_pages,
        "hasNext": page < total_pages,
        "hasPrevious": page > 1,
    }
    for key, right in derived.items():
        sent = _derived_variant(draw, key, right, out.counts)
        if sent is not ABSENT:
            out.raw[key] = sent
        out.expected[key] = right
    extras = draw(st.dictionaries(st.sampled_from(["meta", "links", "sort"]), json_values))
    if extras:
        out.counts[("Page", "extra-field-dropped")] += 1
        out.raw.update(extras)
    if draw(st.booleans()):
        order = draw(st.permutations(list(out.raw)))
        out.raw = {key: out.raw[key] for key in order}
    return out, page, limit


ITEMS: dict[str, type[CanonicalModel]] = {
    "users": User,
    "clients": Client,
    "expenses": Expense,
    "accounts": Account,
    "expense": Expense,
    "account": Account,
}
PATH_VALUES = {"expense": "3730bf79-913a-47af-a917-9e028868b644", "account": "ACC-001"}


@st.composite
def bodies(draw: st.DrawFn, route: str) -> tuple[bytes, Generated, int | None, int | None]:
    """An upstream body of ``route`` as bytes, what it calls for, the page and limit."""
    model = ITEMS[route]
    if route in PATH_VALUES:
        generated, page, limit = draw(records(model)), None, None
    else:
        generated, page, limit = draw(pages(model))
    text = write_json(generated.raw, ascii_only=draw(st.booleans()))
    return text.encode(), generated, page, limit


# ----------------------------------------------------------------------- properties

VALIDATORS = {
    name: Draft202012Validator(model.model_json_schema(mode="serialization"))
    for name, model in ROUTES.models().items()
}
_PLAIN_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\.([0-9]+)")


def assert_shape(value: Any, model: type[CanonicalModel]) -> None:
    """Every field of ``model`` present, nothing else, in the model's order (a)."""
    if value is None:
        return
    assert list(value) == list(model.model_fields)
    for key, embedded in EMBEDDED.get(model, {}).items():
        assert_shape(value[key], embedded)


def at(document: Any, path: Path) -> Any:
    for part in path:
        document = document[part]
    return document


def assert_check(published: Any, check: Check) -> None:
    if check.what == "decimal":  # (b)
        assert isinstance(published, str)
        match = _PLAIN_DECIMAL.fullmatch(published)
        assert match is not None, published
        assert len(match.group(2)) >= check.scale
        assert Decimal(published) == check.sent
    elif check.what == "number":  # (b), Client.taxRetentionPercentage
        assert type(published) in (int, Decimal), published
        assert published == check.sent
    elif check.what == "instant":  # (c)
        assert isinstance(published, str)
        assert published.endswith("Z")
        moment = datetime.fromisoformat(published.removesuffix("Z") + "+00:00")
        sent: datetime = check.sent
        assert moment == sent.replace(microsecond=sent.microsecond // 1000 * 1000)
    else:  # (d)
        assert published == check.sent


def normalise_both_ways(
    route: str, body: bytes, page: int | None, limit: int | None
) -> tuple[bytes, dict[tuple[str, str], int], bytes, Counts]:
    """The gateway's path (Normaliser) and the pydantic path, with their counts."""
    spec = next(r for r in ROUTES if r.name == route)
    query = [] if page is None else [("page", str(page)), ("limit", str(limit))]
    request = parse_record_query(spec, PATH_VALUES.get(route), query, max_limit=1000)
    if not spec.is_list:  # the request asks for the record the body holds
        request = dataclasses.replace(request, path_value=json.loads(body)["id"])
    counts = CoercionCounts()
    direct = Normaliser(counts).normalise(request, body)
    context = NormaliseContext(page=page, limit=limit)
    model = ROUTES.models()[route].model_validate(parse_lossless(body), context=context)
    return direct, counts.snapshot(), dump(model), context.coercions


@pytest.mark.parametrize("route", list(ITEMS))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_every_accepted_variant_is_published_exactly(route: str, data: st.DataObject) -> None:
    body, generated, page, limit = data.draw(bodies(route), label="upstream body")
    direct, counts, via_models, model_counts = normalise_both_ways(route, body, page, limit)

    published = parse_lossless(direct)
    VALIDATORS[route].validate(json.loads(direct))  # (a)
    if route in PATH_VALUES:
        assert_shape(published, ITEMS[route])
    else:
        assert list(published) == list(Page.model_fields)
        for item in published["data"]:
            assert_shape(item, ITEMS[route])
    for path, check in generated.checks:  # (b), (c), (d)
        assert_check(at(published, path), check)
    assert published == generated.expected
    assert via_models == direct  # (e)
    expected_counts = {key: n for key, n in generated.counts.items() if n}
    assert counts == expected_counts  # (f)
    assert dict(model_counts) == expected_counts


@PROPERTY_SETTINGS
@given(number=decimals, scale=st.sampled_from([2, 4]), as_number=st.booleans(), data=st.data())
def test_decimal_quantities_are_exact_plain_and_padded(
    number: Decimal, scale: int, as_number: bool, data: st.DataObject
) -> None:
    raw = Num(data.draw(number_text(number))) if as_number else data.draw(numeric_string(number))
    key = "liquidityThreshold" if scale == 2 else "lastBalance"
    body = write_json({"id": "x", key: raw}, ascii_only=True).encode()
    direct, _, via_models, _ = normalise_both_ways("account", body, None, None)
    published = parse_lossless(direct)[key]
    assert published == plain(Decimal(raw.text if isinstance(raw, Num) else raw), scale)
    assert_check(published, Check("decimal", number, scale))
    assert via_models == direct
