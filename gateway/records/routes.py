"""The six record routes and the validation of their parameters.

Validation turns the raw path and query into a :class:`RecordQuery`: typed,
canonical values with defaults filled in, in a fixed order. Nothing reaches the
upstream unless it passed here, and the canonical form is what the cache keys on,
so ``?limit=10&page=1``, ``?page=1`` and no query are one and the same request.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date
from decimal import Context, Decimal, InvalidOperation
from urllib.parse import quote, unquote_to_bytes

from gateway.errors import InvalidParameters, ParameterProblem

MAX_TEXT_LENGTH = 200
# the reference upstream's own bound (nine digits): a larger page it refuses with 400,
# which would reach the caller as a 502
MAX_PAGE = 999_999_999
DEFAULT_PAGE = 1
DEFAULT_LIMIT = 10
_DIGITS = re.compile(r"[0-9]{1,10}")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
NUMBER_PATTERN = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
_MAX_AMOUNT_DIGITS = 40
_EXACT = Context(prec=_MAX_AMOUNT_DIGITS + 1000)
TYPES = ("CASH", "BANK")


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One record route: its name (also its TTL key), path template and query."""

    name: str
    template: str
    query_params: tuple[str, ...]
    path_param: str | None = None

    @property
    def is_list(self) -> bool:
        return self.path_param is None


_PAGING = ("page", "limit")
USERS = RouteSpec("users", "/users", _PAGING)
CLIENTS = RouteSpec("clients", "/clients", _PAGING)
EXPENSES = RouteSpec(
    "expenses",
    "/expenses",
    (*_PAGING, "dateFrom", "dateTo", "amount", "concept", "account", "status", "type", "user"),
)
EXPENSE = RouteSpec("expense", "/expenses/{expenseId}", (), path_param="expenseId")
ACCOUNTS = RouteSpec("accounts", "/accounts", (*_PAGING, "type", "bankCode"))
ACCOUNT = RouteSpec("account", "/accounts/{accountId}", (), path_param="accountId")
ROUTES: tuple[RouteSpec, ...] = (USERS, CLIENTS, EXPENSES, EXPENSE, ACCOUNTS, ACCOUNT)


@dataclass(frozen=True, slots=True)
class RecordQuery:
    """A validated request for one route, in canonical form."""

    route: RouteSpec
    path_value: str | None
    params: tuple[tuple[str, str], ...]
    canonical_text: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        segment = "" if self.path_value is None else encode_segment(self.path_value)
        query = "&".join(f"{name}={quote(value, safe='')}" for name, value in self.params)
        object.__setattr__(self, "canonical_text", f"{self.route.name}|{segment}|{query}")

    def upstream_path(self) -> str:
        """The path to request upstream, already percent-encoded."""
        if self.path_value is None:
            return self.route.template
        prefix = self.route.template.split("{", 1)[0]
        return prefix + encode_segment(self.path_value)

    def upstream_params(self, bank_code_param: str) -> list[tuple[str, str]]:
        """The query to send upstream, under the upstream's parameter names."""
        return [
            (bank_code_param if name == "bankCode" else name, value) for name, value in self.params
        ]

    def canonical(self) -> str:
        """A stable text for this request, e.g. for a cache key."""
        return self.canonical_text


def encode_segment(value: str) -> str:
    """Percent-encode ``value`` as exactly one path segment.

    Every reserved character is encoded, ``/`` and ``?`` included, and a segment
    made only of dots is encoded too, so that nothing can reach another path.
    """
    encoded = quote(value, safe="")
    if encoded.strip(".") == "":
        encoded = encoded.replace(".", "%2E")
    return encoded


class _Collector:
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


def check_segment(name: str, raw: str) -> None:
    """Raise InvalidParameters when ``raw``, a path segment as sent (not decoded), has a
    ``%`` that starts no escape or escapes that are not UTF-8.

    aiohttp's router leaves such a segment as it is (``%zz``, ``%ff``): forwarded, it
    would be read as the id ``%zz``, the one ``%25zz`` names, not what the caller sent.
    """
    if "%" not in raw:
        return
    if _BAD_ESCAPE.search(raw) is not None:
        message = "has a % that starts no percent-escape (write a % itself as %25)"
    else:
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            message = "is not valid UTF-8 once percent-decoded"
        else:
            return
    raise InvalidParameters([ParameterProblem(name, message)])


def _has_control(value: str) -> bool:
    return any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in value)


def _text(name: str, value: str, problems: _Collector) -> str | None:
    if value == "":
        problems.add(name, "must not be empty")
    elif len(value) > MAX_TEXT_LENGTH:
        problems.add(name, f"must be at most {MAX_TEXT_LENGTH} characters")
    elif _has_control(value):
        problems.add(name, "must not contain control characters")
    elif "\ufffd" in value:
        # aiohttp decodes an invalid percent-escape (%ff) to U+FFFD: refuse rather than
        # forward a value the caller never sent
        problems.add(name, "is not valid UTF-8 once percent-decoded")
    else:
        return value
    return None


def _integer(name: str, value: str, low: int, high: int, problems: _Collector) -> int | None:
    if _DIGITS.fullmatch(value) is None or not low <= int(value) <= high:
        problems.add(name, f"must be an integer from {low} to {high}")
        return None
    return int(value)


def _date(name: str, value: str, problems: _Collector) -> date | None:
    if _DATE.fullmatch(value) is None:
        problems.add(name, "must be a date in the form YYYY-MM-DD")
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        problems.add(name, "is not a real calendar date")
        return None


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


def _amount(name: str, value: str, problems: _Collector) -> str | None:
    text = canonical_decimal(value)
    if text is None:
        if NUMBER_PATTERN.fullmatch(value) is None:
            problems.add(name, "must be a finite decimal number such as 12.50")
        else:  # a number all the same: what it is refused for is its length
            problems.add(name, f"must have at most {_MAX_AMOUNT_DIGITS} digits once written out")
    return text


def _type(name: str, value: str, problems: _Collector) -> str | None:
    upper = value.upper()
    if upper not in TYPES:
        problems.add(name, "must be CASH or BANK")
        return None
    return upper


def _expense_id(value: str, problems: _Collector) -> str | None:
    if len(value) in (32, 36):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            pass
    problems.add("expenseId", "must be a UUID such as 3f2c1a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f")
    return None


def parse_record_query(
    route: RouteSpec,
    path_value: str | None,
    query: Iterable[tuple[str, str]],
    *,
    max_limit: int,
) -> RecordQuery:
    """Validate one request for ``route``; raise InvalidParameters listing every problem."""
    problems = _Collector()
    allowed = ", ".join(route.query_params) or "none"
    given: dict[str, str] = {}
    for name, value in query:
        if name not in route.query_params:
            problems.add(name, f"unknown query parameter; allowed: {allowed}")
        elif name in given:
            problems.add(name, f"given more than once; allowed once each: {allowed}")
        else:
            given[name] = value

    canonical_path: str | None = None
    if route.path_param == "expenseId":
        canonical_path = _expense_id(path_value or "", problems)
    elif route.path_param == "accountId":
        canonical_path = _text("accountId", path_value or "", problems)

    values: dict[str, str] = {}
    if route.is_list:
        default_limit = str(min(DEFAULT_LIMIT, max_limit))
        page = _integer("page", given.get("page", str(DEFAULT_PAGE)), 1, MAX_PAGE, problems)
        limit = _integer("limit", given.get("limit", default_limit), 1, max_limit, problems)
        values["page"] = str(page)
        values["limit"] = str(limit)
    dates: dict[str, date] = {}
    for name in route.query_params[len(_PAGING) :]:
        if name not in given:
            continue
        raw = given[name]
        checked: str | None
        if name in ("dateFrom", "dateTo"):
            day = _date(name, raw, problems)
            checked = None if day is None else day.isoformat()
            if day is not None:
                dates[name] = day
        elif name == "amount":
            checked = _amount(name, raw, problems)
        elif name == "type":
            checked = _type(name, raw, problems)
        else:
            checked = _text(name, raw, problems)
        if checked is not None:
            values[name] = checked
    if "dateFrom" in dates and "dateTo" in dates and dates["dateFrom"] > dates["dateTo"]:
        problems.add("dateFrom", "must not be after dateTo")

    problems.raise_any()
    ordered = tuple((name, values[name]) for name in route.query_params if name in values)
    return RecordQuery(route=route, path_value=canonical_path, params=ordered)


class QueryMemo:
    """Validated queries by their raw form, so that a repeated request is validated once.

    Validation is a pure function of the route, the path value, the raw (undecoded)
    query string and ``max_limit``; only valid queries up to ``longest`` characters are
    remembered, at most ``size`` of them (about 1 KB each): past it the oldest is
    forgotten, so that a set of queries larger than the memo costs a validation (a few
    microseconds) for the ones forgotten, never a memo emptied at once.
    """

    def __init__(self, size: int = 4096, longest: int = 512) -> None:
        self.size = size
        self._longest = longest
        self._known: dict[tuple[str, str | None, str, int], RecordQuery] = {}

    def __len__(self) -> int:
        return len(self._known)

    def known(
        self, route: RouteSpec, path_value: str | None, query_string: str, max_limit: int
    ) -> RecordQuery | None:
        """The query already validated for this raw form, or None (``parse`` it)."""
        return self._known.get((route.name, path_value, query_string, max_limit))

    def parse(
        self,
        route: RouteSpec,
        path_value: str | None,
        query_string: str,
        query: Callable[[], Iterable[tuple[str, str]]],
        *,
        max_limit: int,
    ) -> RecordQuery:
        """``query`` gives the parsed pairs of ``query_string``; called on a miss only."""
        memo_key = (route.name, path_value, query_string, max_limit)
        known = self._known.get(memo_key)
        if known is not None:
            return known
        parsed = parse_record_query(route, path_value, query(), max_limit=max_limit)
        if len(query_string) + len(path_value or "") > self._longest:
            return parsed  # long ones are rare: remembering them would only cost memory
        known_queries = self._known
        if len(known_queries) >= self.size:
            del known_queries[next(iter(known_queries))]
        known_queries[memo_key] = parsed
        return parsed
