"""Read side of the reference upstream: sorted records, indexes and response bytes.

``RecordStore`` is built once per app from a ``Dataset``. It serialises every item
once, in each representation it is served in, and keeps the bytes; a page is then
the join of a slice of prepared items inside an envelope, so a request costs a few
lookups and one bytes join, never a JSON encoding of records. The matches of the
last few hundred distinct ``/expenses`` filter combinations are kept, so repeated
filtered queries cost no more than unfiltered ones.

A ``Drift`` (``drift.py``) is applied to the prepared items, or to a page's order; its
``noise`` kind alone costs a decoding and an encoding of each expense answer.

With ``RecordVersions`` (``changes.py``), an item whose record (or a record embedded in
it) has changed is serialised again at its current version when first asked for, and
kept until one of them changes again; an item at version 0 is the prepared one. Only
the items of the page asked for are looked at.

Sort orders: users by username; clients by case-folded name, then id; accounts by id
(code-point order); expenses by issueDate descending, then id ascending.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Protocol, TypeVar

import orjson

from gateway.demo.changes import (
    RecordKind,
    RecordVersions,
    account_at,
    client_at,
    expense_at,
    user_at,
)
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
    start = page.offset
    return _envelope(items[start : start + page.limit], len(items), page, reverse=reverse)


def _envelope(chosen: Sequence[bytes], total: int, page: PageRequest, *, reverse: bool) -> bytes:
    """The envelope of ``page`` holding ``chosen``, of ``total`` matching items."""
    total_pages = -(-total // page.limit)
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


# The versions an item shows: its record's, then those of the records embedded in it.
Versions = tuple[int, ...]


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


class _Items:
    """One representation of the records of a list, in list order: the items at
    version 0, serialised once; with ``versions`` (the versions an item shows: its
    record's and those embedded in it), the items at the versions they show now."""

    __slots__ = ("_made", "_render", "_versions", "prepared")

    def __init__(
        self,
        prepared: tuple[bytes, ...],
        versions: Callable[[int, float], Versions] | None = None,
        render: Callable[[int, Versions], bytes] | None = None,
    ) -> None:
        self.prepared = prepared
        self._versions = versions
        self._render = render
        self._made: dict[int, tuple[Versions, bytes]] = {}

    def page(
        self, positions: Sequence[int], page: PageRequest, elapsed: float, *, reverse: bool
    ) -> bytes:
        """``page`` of the items at ``positions``, as they are ``elapsed`` seconds in."""
        chosen = positions[page.offset : page.offset + page.limit]
        if self._versions is None and isinstance(chosen, range):
            items: Sequence[bytes] = self.prepared[chosen.start : chosen.stop]
        else:
            items = [self.one(position, elapsed) for position in chosen]
        return _envelope(items, len(positions), page, reverse=reverse)

    def one(self, position: int, elapsed: float) -> bytes:
        """The item at ``position`` as it is ``elapsed`` seconds in."""
        if self._versions is None or self._render is None:
            return self.prepared[position]
        versions = self._versions(position, elapsed)
        if not any(versions):
            return self.prepared[position]
        made = self._made.get(position)
        if made is None or made[0] != versions:
            made = (versions, self._render(position, versions))
            self._made[position] = made
        return made[1]


class RecordStore:
    """Prepared responses and lookups over one dataset; with ``versions``, each record
    served at the version it has reached when asked for."""

    __slots__ = (
        "_account_by_folded_key",
        "_account_by_key",
        "_accounts",
        "_accounts_listed",
        "_accounts_single",
        "_all_accounts",
        "_all_expenses",
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
        "_versions",
    )

    def __init__(
        self,
        dataset: Dataset,
        drift: Drift = NO_DRIFT,
        versions: RecordVersions | None = None,
    ) -> None:
        self._reverse = DriftKind.ORDER in drift
        self._noise = PaymentIdNoise() if DriftKind.NOISE in drift else None
        self._versions = versions

        users = sorted(dataset.users, key=lambda user: user.username)
        self._users = self._items(
            (RecordKind.USERS,),
            users,
            self._own_versions(RecordKind.USERS, users),
            lambda i, v: orjson.dumps(user_json(user_at(users[i], *v))),
        )

        clients = sorted(dataset.clients, key=lambda client: (client.name.casefold(), client.id))
        self._clients_listed = self._items(
            (RecordKind.CLIENTS,),
            clients,
            self._own_versions(RecordKind.CLIENTS, clients),
            lambda i, v: orjson.dumps(client_listed_json(client_at(clients[i], *v))),
        )

        accounts = sorted(dataset.accounts, key=lambda account: account.id)
        self._accounts: tuple[Account, ...] = tuple(accounts)
        self._all_accounts = range(len(accounts))
        account_versions = self._own_versions(RecordKind.ACCOUNTS, accounts)
        self._accounts_listed = self._items(
            (RecordKind.ACCOUNTS,),
            accounts,
            account_versions,
            lambda i, v: orjson.dumps(
                drift.account(account_listed_json(account_at(accounts[i], *v)))
            ),
        )
        self._accounts_single = self._items(
            (RecordKind.ACCOUNTS,),
            accounts,
            account_versions,
            lambda i, v: orjson.dumps(
                drift.account(account_single_json(account_at(accounts[i], *v)))
            ),
        )
        self._account_by_key: dict[str, int] = {}
        self._account_by_folded_key: dict[str, int] = {}
        numbered_accounts = list(enumerate(accounts))
        # Ids win over names, exact matches over case-insensitive ones.
        for key, position in [(a.id, i) for i, a in numbered_accounts] + [
            (a.name, i) for i, a in numbered_accounts
        ]:
            self._account_by_key.setdefault(key, position)
            self._account_by_folded_key.setdefault(key.casefold(), position)

        expenses = sorted(dataset.expenses, key=lambda expense: expense.id)
        expenses.sort(key=lambda expense: expense.issue_date, reverse=True)

        def expense_versions(i: int, elapsed: float) -> Versions:
            expense = expenses[i]
            return (
                self._version(RecordKind.EXPENSES, expense.id, elapsed),
                self._version(RecordKind.CLIENTS, expense.client.id, elapsed),
                self._version(RecordKind.USERS, expense.user.id, elapsed),
            )

        self._expenses = self._items(
            (RecordKind.EXPENSES, RecordKind.CLIENTS, RecordKind.USERS),
            expenses,
            expense_versions,
            lambda i, v: orjson.dumps(drift.expense(expense_json(expense_at(expenses[i], *v)))),
        )
        self._all_expenses = range(len(expenses))
        self._expense_by_id = {e.id: i for i, e in enumerate(expenses)}
        # Ascending keys for bisect: the list itself runs from the latest issueDate.
        self._expense_date_keys = tuple(-e.issue_date.toordinal() for e in expenses)
        self._expense_concepts = tuple(
            (e.description.casefold(), e.category.casefold()) for e in expenses
        )
        self._expense_selections: dict[ExpenseFilters, Sequence[int]] = {}
        numbered = tuple(enumerate(expenses))
        self._expense_by_account = _index((i, _account_keys(e)) for i, e in numbered)
        self._expense_by_amount = _index((i, (e.amount,)) for i, e in numbered)
        self._expense_by_status = _index((i, (e.status.casefold(),)) for i, e in numbered)
        self._expense_by_type = _index((i, (e.type.casefold(),)) for i, e in numbered)
        self._expense_by_user = _index((i, _user_keys(e)) for i, e in numbered)

    def _items(
        self,
        kinds: tuple[RecordKind, ...],
        records: Sized,
        versions: Callable[[int, float], Versions],
        render: Callable[[int, Versions], bytes],
    ) -> _Items:
        """The items of ``records``: ``render(position, versions)`` serialises the record
        at ``position`` at ``versions``, one for each of ``kinds`` (the record's kind,
        then those of the records embedded in it), which ``versions`` gives at a time.
        Version 0 of every item is made now."""
        prepared = tuple(render(i, (0,) * len(kinds)) for i in range(len(records)))
        changing = self._versions
        if changing is None or not any(changing.changing(kind) for kind in kinds):
            return _Items(prepared)
        return _Items(prepared, versions, render)

    def _own_versions(
        self, kind: RecordKind, records: Sequence[_Identified]
    ) -> Callable[[int, float], Versions]:
        """The versions an item shows of a record that embeds none of another kind."""

        def versions(position: int, elapsed: float) -> Versions:
            return (self._version(kind, records[position].id, elapsed),)

        return versions

    def _version(self, kind: RecordKind, record_id: str, elapsed: float) -> int:
        versions = self._versions
        return 0 if versions is None else versions.version(kind, record_id, elapsed)

    def _elapsed(self) -> float:
        return 0.0 if self._versions is None else self._versions.elapsed()

    def users_page(self, page: PageRequest) -> bytes:
        users = self._users
        return users.page(range(len(users.prepared)), page, self._elapsed(), reverse=self._reverse)

    def clients_page(self, page: PageRequest) -> bytes:
        clients = self._clients_listed
        return clients.page(
            range(len(clients.prepared)), page, self._elapsed(), reverse=self._reverse
        )

    def accounts_page(self, filters: AccountFilters, page: PageRequest) -> bytes:
        selected: Sequence[int] = self._all_accounts
        if filters.type is not None or filters.bank_code is not None:
            selected = [
                i
                for i, account in enumerate(self._accounts)
                if (filters.type is None or account.type == filters.type)
                and (
                    filters.bank_code is None
                    or (account.bank is not None and account.bank.code == filters.bank_code)
                )
            ]
        return self._accounts_listed.page(selected, page, self._elapsed(), reverse=self._reverse)

    def account(self, key: str) -> bytes | None:
        """An account by id or name: exact first, then case-insensitive."""
        found = self._account_by_key.get(key)
        if found is None:
            found = self._account_by_folded_key.get(key.casefold())
        return None if found is None else self._accounts_single.one(found, self._elapsed())

    def expense(self, expense_id: str) -> bytes | None:
        """An expense by its UUID in canonical form, hex digits in either case."""
        position = self._expense_by_id.get(expense_id.lower())
        if position is None:
            return None
        found = self._expenses.one(position, self._elapsed())
        return found if self._noise is None else self._noise.stamp(found)

    def expenses_page(self, filters: ExpenseFilters, page: PageRequest) -> bytes:
        body = self._expenses.page(
            self._expense_selection(filters), page, self._elapsed(), reverse=self._reverse
        )
        return body if self._noise is None else self._noise.stamp(body)

    def _expense_selection(self, filters: ExpenseFilters) -> Sequence[int]:
        """Positions of the expenses that ``filters`` selects, in list order."""
        if filters == _NO_EXPENSE_FILTERS:
            return self._all_expenses
        selected = self._expense_selections.get(filters)
        if selected is None:
            selected = tuple(self._select_expenses(filters))
            if len(self._expense_selections) >= _SELECTION_CACHE_SIZE:
                # Oldest first: dicts keep insertion order.
                del self._expense_selections[next(iter(self._expense_selections))]
            self._expense_selections[filters] = selected
        return selected

    def _select_expenses(self, filters: ExpenseFilters) -> Sequence[int]:
        """Positions of the matching expenses, in list order."""
        start, stop = 0, len(self._expense_date_keys)
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
