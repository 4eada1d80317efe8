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
from decimal import Decimal
from functools import lru_cache
from typing import Any

NUMERIC_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,18}")
_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_CANONICAL_INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{3})?Z"
)
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MAX_DIGITS = 60
MAX_EXPONENT = 100

Coercion = Callable[[Any], tuple[Any, str | None]]
FastCheck = Callable[[str], object]


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
            raise ValueError(f"the string {_show(value)} is not a plain decimal number")
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
        number = number.quantize(Decimal(1).scaleb(-scale))
    text = format(number, "f")
    return text[1:] if text.startswith("-") and number.is_zero() else text


def scaled_decimal(scale: int) -> tuple[FastCheck, Coercion]:
    """The check and coercion of a decimal quantity published as text with ``scale``."""
    canonical = re.compile(rf"-?(?:0|[1-9][0-9]{{0,39}})\.[0-9]{{{scale},{MAX_EXPONENT}}}")

    def is_canonical(value: str) -> bool:
        return canonical.fullmatch(value) is not None and not value.startswith("-0.0")

    def coerce(value: Any) -> tuple[str, str | None]:
        number, kind = to_decimal(value)
        return decimal_text(number, scale), kind

    return is_canonical, coerce


@lru_cache(maxsize=4096, typed=True)
def to_number(value: Any) -> tuple[Decimal, str | None]:
    """A JSON number (published through orjson.Fragment, exactly) from a number or text.

    Cached: the same few percentages recur in every page.
    """
    number, kind = to_decimal(value)
    return number.normalize(), "string->number" if kind is None else None


def to_integer(value: Any) -> tuple[int, str | None]:
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, int):
        return value, None
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value), "number->integer"
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
    try:
        return str(uuid.UUID(value)), "uuid->canonical"
    except ValueError:
        raise ValueError(f"the string {_show(value)} is not a UUID") from None


# Dates repeat across records; the valid ones seen are remembered (bounded) so that
# checking one again is a set lookup.
_VALID_DATES: set[str] = set()
_MAX_REMEMBERED_DATES = 20_000


def is_known_date(value: str) -> bool:
    """True for a ``YYYY-MM-DD`` already checked to be a real calendar date."""
    return value in _VALID_DATES


def to_date(value: Any) -> tuple[str, str | None]:
    if not isinstance(value, str):
        raise ValueError(f"a JSON {json_type(value)} is not a date")
    if _DATE_TEXT.fullmatch(value) is None:
        raise ValueError(f"the string {_show(value)} is not a date in the form YYYY-MM-DD")
    try:
        date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value} is not a real calendar date") from None
    if len(_VALID_DATES) < _MAX_REMEMBERED_DATES:
        _VALID_DATES.add(value)
    return value, None


def to_instant(value: Any) -> tuple[str, str | None]:
    """ISO 8601 in UTC with ``Z``; offsets converted; a naive time is taken as UTC
    (the reference says paidAt is UTC); fractional seconds kept to the millisecond."""
    if not isinstance(value, str):
        raise ValueError(f"a JSON {json_type(value)} is not an ISO 8601 date-time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"the string {_show(value)} is not an ISO 8601 date-time") from None
    if _CANONICAL_INSTANT.fullmatch(value) is not None:
        return value, None
    kind = "reformatted"
    if moment.tzinfo is None:
        moment, kind = moment.replace(tzinfo=UTC), "naive->utc"
    elif moment.utcoffset():
        moment, kind = moment.astimezone(UTC), "offset->utc"
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond // 1000:03d}"
    return text + "Z", kind


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


def _show(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")
