"""Coercions of single upstream values into their canonical form.

Each coercion takes a value as parsed by the lossless JSON parser (numbers with a
fraction are ``Decimal``, never ``float``) and returns ``(canonical value, kind)``,
where ``kind`` names the coercion performed (``"string->number"``) or is None when the
value was already canonical. A value that cannot be brought to its canonical type
raises :class:`CanonicalError` with the reason; nothing is ever guessed, rounded or
nulled.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from functools import lru_cache
from typing import Any

MAX_DIGITS = 60
MAX_EXPONENT = 100

# The canonical forms as regular expressions (no top-level alternation, so that "^" and
# "$" around one anchor all of it). The checks below are these patterns, and
# gateway.normalise.schema publishes them as the fields' JSON Schema patterns: what the
# gateway says it publishes and what it takes as already published are one text.
UUID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
DATE_PATTERN = "[0-9]{4}-[0-9]{2}-[0-9]{2}"
INSTANT_PATTERN = DATE_PATTERN + r"T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{3})?Z"


def decimal_pattern(scale: int, *, most_whole: int | None = None, most: int | None = None) -> str:
    """Plain notation with at least ``scale`` decimals, no leading zero: every decimal
    quantity the gateway publishes matches it. ``most_whole`` and ``most`` bound the
    whole digits and the decimals (the quick check's bounds; unbounded when None)."""
    whole = "[0-9]*" if most_whole is None else f"[0-9]{{0,{most_whole - 1}}}"
    decimals = f"{{{scale},}}" if most is None else f"{{{scale},{most}}}"
    return rf"-?(?:0|[1-9]{whole})\.[0-9]{decimals}"


NUMERIC_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,18}")
_DATE_TEXT = re.compile(DATE_PATTERN)
_DATE_ONLY = re.compile(r"[0-9]{4}-?[0-9]{2}-?[0-9]{2}")
_CANONICAL_INSTANT = re.compile(INSTANT_PATTERN)
CANONICAL_UUID = re.compile(UUID_PATTERN)
# What uuid.UUID means to accept; on its own it also takes signs, spaces and "_"
# (it ends in int(hex, 16)), which would turn garbage into an id.
_UUID_TEXT = re.compile(
    r"(?:urn:uuid:)?\{?[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
    r"[0-9a-fA-F]{12}\}?"
)
# Room for every digit the limits above allow, so that padding and normalising never
# round (the default context's 28 digits would, or signal InvalidOperation).
_EXACT = Context(prec=MAX_DIGITS + MAX_EXPONENT + 10)
# orjson writes integers of at most 64 bits.
_INTEGER_LIMIT = 2**63

Coercion = Callable[[Any], tuple[Any, str | None]]
FastCheck = Callable[[str], object]


# Why a record without one of its required fields (every id) breaks the contract.
REQUIRED_REASON = "missing or null; every record has one"


class CanonicalError(ValueError):
    """A value that cannot be brought to its canonical type; ``path`` locates it."""

    def __init__(self, field: str | int, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str | int] = [field]

    def within(self, part: str | int) -> CanonicalError:
        """Prefix the path with an enclosing field or index; returns self."""
        self.path.insert(0, part)
        return self


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value, for reasons and reports."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | Decimal | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def to_decimal(value: Any) -> tuple[Decimal, str | None]:
    """A finite Decimal from a JSON number or a numeric string."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a decimal number")
    if isinstance(value, Decimal):
        number, kind = value, "number->string"
    elif isinstance(value, int):
        number, kind = Decimal(value), "number->string"
    elif isinstance(value, str):
        if NUMERIC_TEXT.fullmatch(value) is None:
            raise ValueError("a string that is not a plain decimal number")
        number, kind = Decimal(value), None
    elif isinstance(value, float):  # the lossless parser never produces one
        raise ValueError("a binary floating-point value cannot be taken exactly")
    else:
        raise ValueError(f"a JSON {json_type(value)} is not a decimal number")
    if not number.is_finite():
        raise ValueError("not a finite number")
    sign_digits_exponent = number.as_tuple()
    exponent = sign_digits_exponent.exponent
    if (
        not isinstance(exponent, int)
        or abs(exponent) > MAX_EXPONENT
        or len(sign_digits_exponent.digits) > MAX_DIGITS
    ):
        raise ValueError("a number out of the range that a financial value can take")
    return number, kind


def decimal_text(number: Decimal, scale: int) -> str:
    """Plain notation with at least ``scale`` decimals; more decimals are all kept."""
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    if exponent > -scale:
        number = number.quantize(Decimal(1).scaleb(-scale), context=_EXACT)
    text = format(number, "f")
    return text[1:] if text.startswith("-") and number.is_zero() else text


class DecimalCheck:
    """True for text that is already a canonical decimal of at least ``scale`` decimals:
    plain notation, no leading zeros, no negative zero.

    A quick check, not the whole rule: it takes at most ``MAX_WHOLE_DIGITS`` whole digits
    and ``max_scale`` decimals (and no ``-0.0...``), which bounds the work per value; a
    longer decimal, or a small negative one, goes through the coercion, which gives it
    back as it is. Its pattern is :func:`decimal_pattern` with those bounds."""

    MAX_WHOLE_DIGITS = 40

    def __init__(self, scale: int) -> None:
        self.scale = scale
        self.max_scale = MAX_EXPONENT
        self.pattern = decimal_pattern(scale, most_whole=self.MAX_WHOLE_DIGITS, most=MAX_EXPONENT)
        self._pattern = re.compile(self.pattern)

    def __call__(self, value: str) -> bool:
        return self._pattern.fullmatch(value) is not None and not value.startswith("-0.0")


def scaled_decimal(scale: int) -> tuple[DecimalCheck, Coercion]:
    """The check and coercion of a decimal quantity published as text with ``scale``."""

    def coerce(value: Any) -> tuple[str, str | None]:
        number, kind = to_decimal(value)
        text = decimal_text(number, scale)
        if kind is None and text != value:
            kind = "reformatted"
        return text, kind

    return DecimalCheck(scale), coerce


def to_number(value: Any) -> tuple[Decimal, str | None]:
    """A JSON number (published through orjson.Fragment, exactly) from a number or text."""
    if isinstance(value, list | dict):  # unhashable: the cache would raise TypeError
        raise ValueError(f"a JSON {json_type(value)} is not a decimal number")
    if isinstance(value, Decimal):
        # by its text: Decimal("-0") == Decimal("0") with the same hash, so a cache
        # keyed by the value would answer whichever zero it saw first
        return _decimal_number(str(value))
    return _to_number(value)


@lru_cache(maxsize=4096, typed=True)
def _to_number(value: Any) -> tuple[Decimal, str | None]:
    # Cached: the same few percentages recur in every page. Only str, int and bool
    # reach it: values that are equal and of one type are the same value.
    return _number(value)


@lru_cache(maxsize=4096)
def _decimal_number(text: str) -> tuple[Decimal, str | None]:
    return _number(Decimal(text))


def _number(value: Any) -> tuple[Decimal, str | None]:
    number, kind = to_decimal(value)
    return number.normalize(_EXACT), "string->number" if kind is None else None


def clear_value_caches() -> None:
    """Forget the dates proven real and the numbers converted (a fresh process's state;
    for measurements and tests)."""
    KNOWN_DATES.clear()
    _to_number.cache_clear()
    _decimal_number.cache_clear()


def to_integer(value: Any) -> tuple[int, str | None]:
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    number: int | Decimal | None
    if isinstance(value, int):
        number, kind = value, None
    elif isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        number, kind = value, "number->integer"
    else:
        number = None
    if number is not None:
        if not -_INTEGER_LIMIT <= number < _INTEGER_LIMIT:
            raise ValueError("an integer out of the 64-bit range")
        return int(number), kind
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        return int(value), "string->integer"
    raise ValueError(f"a JSON {json_type(value)} that is not an integer")


def to_boolean(value: Any) -> tuple[bool, str | None]:
    if isinstance(value, bool):
        return value, None
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true", "string->boolean"
    raise ValueError(f"a JSON {json_type(value)} that is not a boolean")


def to_uuid(value: Any) -> tuple[str, str | None]:
    if not isinstance(value, str):
        raise ValueError(f"a JSON {json_type(value)} is not a UUID")
    if CANONICAL_UUID.fullmatch(value) is not None:
        return value, None
    if _UUID_TEXT.fullmatch(value) is None:
        raise ValueError("a string that is not a UUID")
    return str(uuid.UUID(value)), "uuid->canonical"


# Dates repeat across records; the valid ones seen are remembered (bounded) so that
# checking one again is a set lookup (gateway.normalise.compiled looks in it too).
KNOWN_DATES: set[str] = set()
_MAX_REMEMBERED_DATES = 20_000


def is_known_date(value: str) -> bool:
    """True for a ``YYYY-MM-DD`` already checked to be a real calendar date."""
    return value in KNOWN_DATES


def to_date(value: Any) -> tuple[str, str | None]:
    if not isinstance(value, str):
        raise ValueError(f"a JSON {json_type(value)} is not a date")
    if _DATE_TEXT.fullmatch(value) is None:
        raise ValueError("a string that is not a date in the form YYYY-MM-DD")
    try:
        date.fromisoformat(value)
    except ValueError:
        raise ValueError("a date that is not a real calendar date") from None
    if len(KNOWN_DATES) < _MAX_REMEMBERED_DATES:
        KNOWN_DATES.add(value)
    return value, None


def to_instant(value: Any) -> tuple[str, str | None]:
    """ISO 8601 in UTC with ``Z``; offsets converted; a naive time is taken as UTC
    (the reference says paidAt is UTC); fractional seconds kept to the millisecond."""
    if not isinstance(value, str):
        raise ValueError(f"a JSON {json_type(value)} is not an ISO 8601 date-time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("a string that is not an ISO 8601 date-time") from None
    if _CANONICAL_INSTANT.fullmatch(value) is not None:
        return value, None
    if _DATE_ONLY.fullmatch(value) is not None:  # midnight would be a guess
        raise ValueError("a string that is a date without a time")
    kind = "reformatted"
    if moment.tzinfo is None:
        moment, kind = moment.replace(tzinfo=UTC), "naive->utc"
    elif moment.utcoffset():
        try:
            moment = moment.astimezone(UTC)
        except OverflowError:
            raise ValueError("a date-time outside the years 1 to 9999 in UTC") from None
        kind = "offset->utc"
    # isoformat, not strftime: glibc's %Y does not pad years before 1000.
    timespec = "milliseconds" if moment.microsecond else "seconds"
    return moment.replace(tzinfo=None).isoformat(timespec=timespec) + "Z", kind


def is_canonical_instant(value: str) -> bool:
    if _CANONICAL_INSTANT.fullmatch(value) is None:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def enumeration(known: frozenset[str]) -> Coercion:
    """Upper case; a value outside ``known`` passes through as kind "unknown-value"."""

    def coerce(value: Any) -> tuple[str, str | None]:
        if not isinstance(value, str):
            raise ValueError(f"a JSON {json_type(value)} where an enumeration value is expected")
        upper = value.upper()
        if upper not in known:
            return upper, "unknown-value"
        return upper, "lowercase->uppercase"

    return coerce


def text_list(value: Any) -> tuple[list[str], str | None]:
    if not isinstance(value, list) or not all(type(item) is str for item in value):
        raise ValueError(f"a JSON {json_type(value)} where an array of strings is expected")
    return value, None
