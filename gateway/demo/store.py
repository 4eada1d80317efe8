"""Read side of the reference upstream: sorted records, indexes and response bytes.

``RecordStore`` is built once per app from a ``Dataset``. It serialises every item
once, in each representation it is served in, and keeps the bytes; a page is then
the join of a slice of prepared items inside an envelope, so a request costs a few
lookups and one bytes join, never a JSON encoding of records. The matches of the
last few hundred distinct ``/expenses`` filter combinations are kept, so repeated
filtered queries cost no more than unfiltered ones.

A ``Drift`` (``drift.py``) is applied to the prepared items, or to a page's order; its
``noise`` kind alone costs a decoding and an encoding of each expense answer.

Sort orders: users by username; clients by case-folded name, then id; accounts by id
(code-point order); expenses by issueDate descending, then id ascending.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TypeVar

import orjson

from gateway.demo.dataset import Account, Dataset, Expense
from gateway.demo.drift import NO_DRIFT, Drift, DriftKind, PaymentIdNoise
from gateway.demo.params import AccountFilters, ExpenseFilters, PageRequest
from gateway.demo.representations import (
    account_listed_json,
    account_single_json,
    client_listed_json,
    expense_json,
    user_json,
)

_Key = TypeVar("_Key")

_NO_EXPENSE_FILTERS = ExpenseFilters()
# Distinct filter combinations whose matches are kept; a benchmark repeats a few.
_SELECTION_CACHE_SIZE = 256

_ENVELOPE = (
    b'{"data":[%b],"total":%d,"page":%d,"limit":%d,"totalPages":%d,"hasNext":%b,"hasPrevious":%b}'
)


def page_envelope(items: Sequence[bytes], page: PageRequest, *, reverse: bool = False) -> bytes:
    """The page envelope around ``page``'s slice of ``items`` (already JSON), the
    slice reversed with ``reverse``."""
    total = len(items)
    total_pages = -(-total // page.limit)
    start = page.offset
    chosen = items[start : start + page.limit]
    return _ENVELOPE % (
        b",".join(reversed(chosen) if reverse else chosen),
        total,
        page.page,
        page.limit,
        total_pages,
        b"true" if page.page < total_pages else b"false",
        b"true" if page.page > 1 else b"false",
    )


def _index(
    positions: Iterable[tuple[int, Iterable[_Key]]],
) -> dict[_Key, frozenset[int]]:
    grouped: defaultdict[_Key, set[int]] = defaultdict(set)
    for position, keys in positions:
        for key in keys:
            grouped[key].add(position)
    return {key: frozenset(members) for key, members in grouped.items()}


class RecordStore:
    """Prepared responses and lookups over one dataset."""

    __slots__ = (
        "_account_by_folded_key",
        "_account_by_key",
        "_accounts",
        "_accounts_listed",
        "_clients_listed",
        "_expense_by_account",
        "_expense_by_amount",
        "_expense_by_id",
        "_expense_by_status",
        "_expense_by_type",
        "_expense_by_user",
        "_expense_concepts",
        "_expense_date_keys",
        "_expense_selections",
        "_expenses",
        "_noise",
        "_reverse",
        "_users",
    )

    def __init__(self, dataset: Dataset, drift: Drift = NO_DRIFT) -> None:
        self._reverse = DriftKind.ORDER in drift
        self._noise = PaymentIdNoise() if DriftKind.NOISE in drift else None

        users = sorted(dataset.users, key=lambda user: user.username)
        self._users = tuple(orjson.dumps(user_json(user)) for user in users)

        clients = sorted(dataset.clients, key=lambda client: (client.name.casefold(), client.id))
        self._clients_listed = tuple(orjson.dumps(client_listed_json(c)) for c in clients)

        accounts = sorted(dataset.accounts, key=lambda account: account.id)
        self._accounts: tuple[Account, ...] = tuple(accounts)
        self._accounts_listed = tuple(
            orjson.dumps(drift.account(account_listed_json(a))) for a in accounts
        )
        self._account_by_key: dict[str, bytes] = {}
        self._account_by_folded_key: dict[str, bytes] = {}
        singles = [(a, orjson.dumps(drift.account(account_single_json(a)))) for a in accounts]
        # Ids win over names, exact matches over case-insensitive ones.
        for key, single in [(a.id, b) for a, b in singles] + [(a.name, b) for a, b in singles]:
            self._account_by_key.setdefault(key, single)
            self._account_by_folded_key.setdefault(key.casefold(), single)

        expenses = sorted(dataset.expenses, key=lambda expense: expense.id)
        expenses.sort(key=lambda expense: expense.issue_date, reverse=True)
        self._expenses = tuple(orjson.dumps(drift.expense(expense_json(e))) for e in expenses)
        self._expense_by_id = dict(zip((e.id for e in expenses), self._expenses, strict=True))
        # Ascending keys for bisect: the list itself runs from the latest issueDate.
        self._expense_date_keys = tuple(-e.issue_date.toordinal() for e in expenses)
        self._expense_concepts = tuple(
            (e.description.casefold(), e.category.casefold()) for e in expenses
        )
        self._expense_selections: dict[ExpenseFilters, tuple[bytes, ...]] = {}
        numbered = tuple(enumerate(expenses))
        self._expense_by_account = _index((i, _account_keys(e)) for i, e in numbered)
        self._expense_by_amount = _index((i, (e.amount,)) for i, e in numbered)
        self._expense_by_status = _index((i, (e.status.casefold(),)) for i, e in numbered)
        self._expense_by_type = _index((i, (e.type.casefold(),)) for i, e in numbered)
        self._expense_by_user = _index((i, _user_keys(e)) for i, e in numbered)

    def users_page(self, page: PageRequest) -> bytes:
        return page_envelope(self._users, page, reverse=self._reverse)

    def clients_page(self, page: PageRequest) -> bytes:
        return page_envelope(self._clients_listed, page, reverse=self._reverse)

    def accounts_page(self, filters: AccountFilters, page: PageRequest) -> bytes:
        if filters.type is None and filters.bank_code is None:
            return page_envelope(self._accounts_listed, page, reverse=self._reverse)
        selected = [
            item
            for account, item in zip(self._accounts, self._accounts_listed, strict=True)
            if (filters.type is None or account.type == filters.type)
            and (
                filters.bank_code is None
                or (account.bank is not None and account.bank.code == filters.bank_code)
            )
        ]
        return page_envelope(selected, page, reverse=self._reverse)

    def account(self, key: str) -> bytes | None:
        """An account by id or name: exact first, then case-insensitive."""
        found = self._account_by_key.get(key)
        if found is None:
            found = self._account_by_folded_key.get(key.casefold())
        return found

    def expense(self, expense_id: str) -> bytes | None:
        """An expense by its UUID in canonical form, hex digits in either case."""
        found = self._expense_by_id.get(expense_id.lower())
        if found is None or self._noise is None:
            return found
        return self._noise.stamp(found)

    def expenses_page(self, filters: ExpenseFilters, page: PageRequest) -> bytes:
        body = page_envelope(self._expense_selection(filters), page, reverse=self._reverse)
        return body if self._noise is None else self._noise.stamp(body)

    def _expense_selection(self, filters: ExpenseFilters) -> Sequence[bytes]:
        """The prepared expenses that ``filters`` selects, in list order."""
        if filters == _NO_EXPENSE_FILTERS:
            return self._expenses
        selected = self._expense_selections.get(filters)
        if selected is None:
            items = self._expenses
            selected = tuple(items[i] for i in self._select_expenses(filters))
            if len(self._expense_selections) >= _SELECTION_CACHE_SIZE:
                # Oldest first: dicts keep insertion order.
                del self._expense_selections[next(iter(self._expense_selections))]
            self._expense_selections[filters] = selected
        return selected

    def _select_expenses(self, filters: ExpenseFilters) -> Sequence[int]:
        """Positions of the matching expenses, in list order."""
        start, stop = 0, len(self._expenses)
        if filters.date_to is not None:
            start = bisect.bisect_left(self._expense_date_keys, -filters.date_to.toordinal())
        if filters.date_from is not None:
            stop = bisect.bisect_right(self._expense_date_keys, -filters.date_from.toordinal())
        stop = max(start, stop)

        sets = [
            index.get(wanted, frozenset())
            for index, wanted in (
                (self._expense_by_account, filters.account),
                (self._expense_by_status, filters.status),
                (self._expense_by_type, filters.type),
                (self._expense_by_user, filters.user),
            )
            if wanted is not None
        ]
        if filters.amount is not None:
            sets.append(self._expense_by_amount.get(filters.amount, frozenset()))
        candidates: Sequence[int]
        if sets:
            matched = sorted(frozenset.intersection(*sets))
            candidates = matched[
                bisect.bisect_left(matched, start) : bisect.bisect_left(matched, stop)
            ]
        else:
            candidates = range(start, stop)

        concept = filters.concept
        if concept is None:
            return candidates
        concepts = self._expense_concepts
        return [i for i in candidates if _contains(concepts[i], concept)]


def _contains(texts: tuple[str, str], needle: str) -> bool:
    return needle in texts[0] or needle in texts[1]


def _account_keys(expense: Expense) -> set[str]:
    return {expense.account.id.casefold(), expense.account.name.casefold()}


def _user_keys(expense: Expense) -> set[str]:
    return {expense.user.id.casefold(), expense.user.username.casefold()}
