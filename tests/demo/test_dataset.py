"""The generated dataset of the reference upstream: determinism and coverage."""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal

import pytest

from gateway.demo.dataset import Dataset, generate_dataset


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return generate_dataset(42)


def test_same_seed_gives_equal_data(dataset: Dataset) -> None:
    again = generate_dataset(42)

    assert again == dataset
    assert [e.id for e in again.expenses] == [e.id for e in dataset.expenses]


def test_other_seed_gives_other_data(dataset: Dataset) -> None:
    other = generate_dataset(7)

    assert other.seed == 7
    assert {e.id for e in other.expenses}.isdisjoint(e.id for e in dataset.expenses)
    assert [u.id for u in other.users] != [u.id for u in dataset.users]


def test_seed_42_is_pinned(dataset: Dataset) -> None:
    # Other test suites hard-code these; changing the generator must be deliberate.
    assert dataset.expenses[0].id == "b1a6b1f1-620e-49d3-bb33-f3d8269cd696"
    assert [u.username for u in dataset.users][:2] == ["admin", "maria.gomez"]


def test_counts(dataset: Dataset) -> None:
    assert len(dataset.users) >= 5
    assert len(dataset.clients) == 50
    assert len(dataset.accounts) == 8
    assert len(dataset.expenses) == 2000


def test_ids_are_unique(dataset: Dataset) -> None:
    for records in (dataset.users, dataset.clients, dataset.accounts, dataset.expenses):
        ids = [record.id for record in records]
        assert len(set(ids)) == len(ids)
    assert len({e.payment_id for e in dataset.expenses}) == len(dataset.expenses)
    assert len({u.username for u in dataset.users}) == len(dataset.users)


def test_uuid_ids_are_canonical_lower_case(dataset: Dataset) -> None:
    for records in (dataset.users, dataset.clients, dataset.expenses):
        for record in records:
            assert str(uuid.UUID(record.id)) == record.id


def test_both_kinds_of_clients_and_accounts(dataset: Dataset) -> None:
    assert {c.type for c in dataset.clients} == {"CLIENT", "PROVIDER"}
    assert {a.type for a in dataset.accounts} == {"CASH", "BANK"}
    for account in dataset.accounts:
        assert (account.bank is None) == (account.type == "CASH")
    banks = [a.bank for a in dataset.accounts if a.bank is not None]
    assert any(bank.swift_code is None for bank in banks)
    assert any(bank.swift_code is not None for bank in banks)


def test_account_ids_are_not_uuids_and_include_awkward_ones(dataset: Dataset) -> None:
    ids = {a.id for a in dataset.accounts}

    assert {"ACC-001", "BANCOLOMBIA_MAIN", "Caja chica Bogotá", "Cuenta Ñandú Ahorros"} <= ids
    assert "Tesorería EUR/USD" in ids
    assert any(" " in i and not i.isascii() for i in ids)
    assert any(a.id == a.name for a in dataset.accounts)
    assert any(a.id != a.name for a in dataset.accounts)


def test_account_ids_and_names_do_not_collide(dataset: Dataset) -> None:
    # /accounts/{accountId} takes an id or a name, also case-insensitively.
    keys: dict[str, str] = {}
    for account in dataset.accounts:
        for key in {account.id.casefold(), account.name.casefold()}:
            assert keys.setdefault(key, account.id) == account.id


def test_several_currencies_and_statuses(dataset: Dataset) -> None:
    assert {e.currency_code for e in dataset.expenses} == {"EUR", "USD", "COP", "MXN", "GBP"}
    statuses = [e.status for e in dataset.expenses]
    assert set(statuses) == {"PAID", "PENDING", "CANCELLED"}
    assert statuses.count("PAID") > len(statuses) / 2


def test_expense_dates_cover_two_years(dataset: Dataset) -> None:
    issued = [e.issue_date for e in dataset.expenses]

    assert min(issued) >= date(2024, 1, 1)
    assert max(issued) <= date(2025, 12, 31)
    assert {d.year for d in issued} == {2024, 2025}
    for expense in dataset.expenses:
        assert expense.due_date >= expense.issue_date


def test_paid_at_only_for_paid_expenses(dataset: Dataset) -> None:
    for expense in dataset.expenses:
        if expense.status == "PAID":
            assert expense.paid_at is not None
            assert expense.paid_at.utcoffset() is not None
            assert not expense.paid_at.utcoffset()
            assert expense.paid_at.date() >= expense.issue_date
        else:
            assert expense.paid_at is None


def test_amounts_are_four_decimal_decimals(dataset: Dataset) -> None:
    for expense in dataset.expenses:
        assert isinstance(expense.amount, Decimal)
        assert expense.amount.as_tuple().exponent == -4
        assert expense.amount > 0
    for account in dataset.accounts:
        assert account.last_balance.as_tuple().exponent == -4
        assert account.liquidity_threshold.as_tuple().exponent == -2


def test_expense_type_method_and_user_follow_the_account(dataset: Dataset) -> None:
    for expense in dataset.expenses:
        assert expense.type == expense.account.type
        assert (expense.method == "CASH") == (expense.account.type == "CASH")
        assert expense.account.name in expense.user.account_names


def test_users_reference_existing_account_names(dataset: Dataset) -> None:
    names = {a.name for a in dataset.accounts}
    for user in dataset.users:
        assert user.account_names
        assert set(user.account_names) <= names
    assert "ADMIN" in {u.role for u in dataset.users}


def test_sizes_can_be_changed() -> None:
    small = generate_dataset(1, n_clients=3, n_expenses=5)

    assert len(small.clients) == 3
    assert len(small.expenses) == 5
