"""The kinds of route parameters: each validates a value and describes itself.

A kind turns the text a caller sent into its canonical text (or records why not in
:class:`Problems`), and states the JSON Schema and the sentence of its OpenAPI
description from the same bounds it checks with, so that validation and documentation
cannot disagree. A :class:`Param` gives a kind its name, its description and where its
example comes from.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import date
from decimal import Context, Decimal, InvalidOperation
from typing import Any, Protocol

from gateway.errors import InvalidParameters, ParameterProblem

MAX_TEXT_LENGTH = 200
NUMBER_PATTERN = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_DIGITS = re.compile(r"[0-9]{1,10}")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_MAX_AMOUNT_DIGITS = 40
_EXACT = Context(prec=_MAX_AMOUNT_DIGITS + 1000)
# what Text refuses: C0, DEL and C1
_NO_CONTROL = r"^[^\u0000-\u001f\u007f-\u009f]*$"


class Problems:
    """Gathers the problems of one request, so that the 400 lists them together: the
    first ``InvalidParameters.LISTED``, and how many more (a request may have thousands
    of bad parameters; the gateway keeps no more of them than it lists)."""

    def __init__(self) -> None:
        self.problems: list[ParameterProblem] = []
        self.left_out = 0

    def add(self, parameter: str, message: str) -> None:
        if len(self.problems) < InvalidParameters.LISTED:
            self.problems.append(ParameterProblem(parameter, message))
        else:
            self.left_out += 1

    def raise_any(self) -> None:
        if self.problems:
            raise InvalidParameters(self.problems, left_out=self.left_out)


class Kind(Protocol):
    """What a parameter's values are: how one is checked and how the kind is described."""

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        """The canonical text of ``raw``, or None after adding why to ``problems``."""

    def schema(self, max_limit: int) -> dict[str, Any]:
        """The JSON Schema of the values the kind accepts."""

    def describe(self, text: str, max_limit: int) -> str:
        """The OpenAPI description of a parameter of this kind whose own words are ``text``."""

    def default(self, max_limit: int) -> str | None:
        """The value taken when the parameter is absent; None: absent stays absent."""


class Absent:
    """What most kinds share: described by the parameter's own words, and absent when
    not sent (a kind with a bound or a default says more)."""

    __slots__ = ()

    def describe(self, text: str, max_limit: int) -> str:
        return text

    def default(self, max_limit: int) -> str | None:
        return None


def _has_control(value: str) -> bool:
    return any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in value)


@dataclass(frozen=True, slots=True)
class Text(Absent):
    """Any non-empty text of at most ``MAX_TEXT_LENGTH`` characters without control
    characters, as sent."""

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        if raw == "":
            problems.add(name, "must not be empty")
        elif len(raw) > MAX_TEXT_LENGTH:
            problems.add(name, f"must be at most {MAX_TEXT_LENGTH} characters")
        elif _has_control(raw):
            problems.add(name, "must not contain control characters")
        elif "\ufffd" in raw:
            # aiohttp decodes an invalid percent-escape (%ff) to U+FFFD: refuse rather
            # than forward a value the caller never sent
            problems.add(name, "is not valid UTF-8 once percent-decoded")
        else:
            return raw
        return None

    def schema(self, max_limit: int) -> dict[str, Any]:
        return {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_TEXT_LENGTH,
            "pattern": _NO_CONTROL,
        }

    def describe(self, text: str, max_limit: int) -> str:
        return f"{text} Non-empty, at most {MAX_TEXT_LENGTH} characters, no control characters."


@dataclass(frozen=True, slots=True)
class Integer(Absent):
    """A whole number from ``low`` to ``high`` in plain digits; ``fallback`` when absent."""

    low: int
    high: int
    fallback: int | None = None

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        return _bounded(name, raw, self.low, self.high, problems)

    def schema(self, max_limit: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer", "minimum": self.low, "maximum": self.high}
        if self.fallback is not None:
            schema["default"] = self.fallback
        return schema

    def default(self, max_limit: int) -> str | None:
        return None if self.fallback is None else str(self.fallback)


@dataclass(frozen=True, slots=True)
class PageSize:
    """A whole number from 1 to the deployment's ``limits.max_limit``; ``fallback`` (or
    ``max_limit`` when smaller) when absent."""

    fallback: int

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        return _bounded(name, raw, 1, max_limit, problems)

    def schema(self, max_limit: int) -> dict[str, Any]:
        return {
            "type": "integer",
            "minimum": 1,
            "maximum": max_limit,
            "default": min(self.fallback, max_limit),
        }

    def describe(self, text: str, max_limit: int) -> str:
        return f"{text}, from 1 to {max_limit} (the gateway's limits.max_limit)."

    def default(self, max_limit: int) -> str | None:
        return str(min(self.fallback, max_limit))


def _bounded(name: str, raw: str, low: int, high: int, problems: Problems) -> str | None:
    if _DIGITS.fullmatch(raw) is None or not low <= int(raw) <= high:
        problems.add(name, f"must be an integer from {low} to {high}")
        return None
    return str(int(raw))


@dataclass(frozen=True, slots=True)
class Day(Absent):
    """A real calendar date written YYYY-MM-DD; canonical in the same form."""

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        if _DATE.fullmatch(raw) is None:
            problems.add(name, "must be a date in the form YYYY-MM-DD")
            return None
        try:
            return date.fromisoformat(raw).isoformat()
        except ValueError:
            problems.add(name, "is not a real calendar date")
            return None

    def schema(self, max_limit: int) -> dict[str, Any]:
        return {"type": "string", "format": "date"}


def canonical_decimal(value: str) -> str | None:
    """Plain decimal text for a finite number given as text, or None."""
    if NUMBER_PATTERN.fullmatch(value) is None:
        return None
    try:
        number = Decimal(value)
    except InvalidOperation:
        return None
    if not number.is_finite() or len(number.as_tuple().digits) > _MAX_AMOUNT_DIGITS:
        return None
    # normalised in a context wide enough never to round (the default keeps 28 digits)
    text = format(number.normalize(_EXACT), "f")
    if len(text.lstrip("-").replace(".", "")) > _MAX_AMOUNT_DIGITS:
        return None
    return "0" if text in ("-0", "0") else text


@dataclass(frozen=True, slots=True)
class Amount(Absent):
    """A finite decimal number of at most 40 digits once written out, as a Decimal's
    plain text (never a float); canonical without exponent or trailing zeros."""

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        text = canonical_decimal(raw)
        if text is None:
            if NUMBER_PATTERN.fullmatch(raw) is None:
                problems.add(name, "must be a finite decimal number such as 12.50")
            else:  # a number all the same: what it is refused for is its length
                problems.add(
                    name, f"must have at most {_MAX_AMOUNT_DIGITS} digits once written out"
                )
        return text

    def schema(self, max_limit: int) -> dict[str, Any]:
        return {"type": "string", "pattern": f"^(?:{NUMBER_PATTERN.pattern})$"}


@dataclass(frozen=True, slots=True)
class Choice(Absent):
    """One of ``choices``, in any case; canonical in upper case."""

    choices: tuple[str, ...]

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        upper = raw.upper()
        if upper not in self.choices:
            problems.add(name, f"must be {' or '.join(self.choices)}")
            return None
        return upper

    def schema(self, max_limit: int) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices)}

    def describe(self, text: str, max_limit: int) -> str:
        return f"{' or '.join(self.choices)}, {text}"


@dataclass(frozen=True, slots=True)
class Uuid(Absent):
    """A UUID in any case, with or without hyphens; canonical in lower-case hyphenated form."""

    def check(self, name: str, raw: str, problems: Problems, max_limit: int) -> str | None:
        if len(raw) in (32, 36):
            try:
                return str(uuid.UUID(raw))
            except ValueError:
                pass
        problems.add(name, "must be a UUID such as 3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f")
        return None

    def schema(self, max_limit: int) -> dict[str, Any]:
        return {"type": "string", "format": "uuid"}


@dataclass(frozen=True, slots=True)
class Param:
    """A named parameter of a route: its kind, its own words for the OpenAPI document,
    and its example: ``example``, or the value at ``example_from`` in a recorded answer
    (the answer's name, then the keys down to the value), so that a tool that sends the
    examples finds records."""

    name: str
    kind: Kind
    text: str
    example: str | int | None = None
    example_from: tuple[str, ...] = ()

    def check(self, raw: str, problems: Problems, max_limit: int) -> str | None:
        return self.kind.check(self.name, raw, problems, max_limit)

    def describe(self, max_limit: int) -> str:
        return self.kind.describe(self.text, max_limit)

    def example_in(self, recorded: dict[str, Any]) -> Any:
        """The example value, taken from ``recorded`` answers by name; None when none."""
        if not self.example_from:
            return self.example
        name, *keys = self.example_from
        value: Any = recorded.get(name, {}).get("body")
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value
