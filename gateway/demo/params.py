"""Query parameters of the reference upstream, parsed into typed values.

``parse_*`` take the request's query (first value wins when a name repeats; unknown
names are ignored) and raise ``InvalidParameter`` for a value the upstream rejects
with 400. A filter given with an empty value is treated as absent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, InvalidOperation

DEFAULT_PAGE = 1
DEFAULT_LIMIT = 10
MAX_LIMIT = 1000
ACCOUNT_TYPES = frozenset({"CASH", "BANK"})

_DIGITS = re.compile(r"[0-9]{1,9}")
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


class InvalidParameter(Exception):
    """A query parameter the upstream answers with 400."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


@dataclass(frozen=True, slots=True)
class PageRequest:
    page: int
    limit: int

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.limit


@dataclass(frozen=True, slots=True)
class ExpenseFilters:
    """Filters of ``/expenses``; text values are already case-folded."""

    date_from: date | None = None
    date_to: date | None = None
    amount: Decimal | None = None
    concept: str | None = None
    account: str | None = None
    status: str | None = None
    type: str | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True)
class AccountFilters:
    """Filters of ``/accounts``: ``type`` upper-cased, ``bank_code`` verbatim."""

    type: str | None = None
    bank_code: str | None = None


def parse_page(query: Mapping[str, str]) -> PageRequest:
    page = _positive_int(query, "page", DEFAULT_PAGE)
    limit = _positive_int(query, "limit", DEFAULT_LIMIT)
    if limit > MAX_LIMIT:
        raise InvalidParameter("limit", f"must be at most {MAX_LIMIT}, got {limit}")
    return PageRequest(page=page, limit=limit)


def parse_expense_filters(query: Mapping[str, str]) -> ExpenseFilters:
    return ExpenseFilters(
        date_from=_date(query, "dateFrom"),
        date_to=_date(query, "dateTo"),
        amount=_amount(query, "amount"),
        concept=_folded(query, "concept"),
        account=_folded(query, "account"),
        status=_folded(query, "status"),
        type=_account_type(query, "type"),
        user=_folded(query, "user"),
    )


def parse_account_filters(query: Mapping[str, str]) -> AccountFilters:
    type_ = _account_type(query, "type")
    return AccountFilters(
        type=None if type_ is None else type_.upper(),
        bank_code=query.get("bankCode") or None,
    )


def _positive_int(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw):
        raise InvalidParameter(name, f"must be an integer from 1 to 999999999, got {raw!r}")
    value = int(raw)
    if value < 1:
        raise InvalidParameter(name, f"must be at least 1, got {value}")
    return value


def _date(query: Mapping[str, str], name: str) -> date | None:
    raw = query.get(name)
    if not raw:
        return None
    # date.fromisoformat alone would also take "20240101" on Python 3.11.
    if _ISO_DATE.fullmatch(raw):
        try:
            return date.fromisoformat(raw)
        except ValueError:
            pass
    raise InvalidParameter(name, f"must be a date in the form YYYY-MM-DD, got {raw!r}")


def _amount(query: Mapping[str, str], name: str) -> Decimal | None:
    raw = query.get(name)
    if not raw:
        return None
    if _DECIMAL.fullmatch(raw):
        try:
            return Decimal(raw)
        except InvalidOperation:
            pass
    raise InvalidParameter(name, f"must be a decimal number such as 12.5, got {raw!r}")


def _folded(query: Mapping[str, str], name: str) -> str | None:
    raw = query.get(name)
    return raw.casefold() if raw else None


def _account_type(query: Mapping[str, str], name: str) -> str | None:
    folded = _folded(query, name)
    if folded is None:
        return None
    if folded.upper() not in ACCOUNT_TYPES:
        raise InvalidParameter(name, f"must be CASH or BANK, got {query[name]!r}")
    return folded
