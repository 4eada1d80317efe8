"""The JSON shapes the reference upstream sends, one function per representation.

The published API is not consistent with itself and this upstream reproduces that on
purpose, because the gateway's normaliser exists to fix it:

- a client in ``/clients`` has ``taxRetentionPercentage`` as a JSON number and no
  ``description``; a client embedded in an expense has ``description`` and the
  percentage as a four-decimal string;
- an account has three shapes: in ``/accounts`` it carries a nested ``bank`` object
  and ``lastBalance`` but no ``bankCode``; from ``/accounts/{accountId}`` it carries
  ``bankCode`` and ``lastBalance`` but no ``bank``; embedded in an expense it carries
  ``bankCode`` but neither ``bank`` nor ``lastBalance``.

Every function returns a fresh dict of JSON-ready values (str, int, float, bool, None,
list, dict); money is formatted from ``Decimal`` without passing through ``float``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from gateway.demo.dataset import Account, Client, Expense, User

JsonObject = dict[str, Any]

_FOUR_PLACES = Decimal("0.0001")
_TWO_PLACES = Decimal("0.01")


def _fixed(value: Decimal, places: Decimal) -> str:
    return format(value.quantize(places), "f")


def _number(value: Decimal) -> int | float:
    # The list representation is a JSON number: 15, 2.5, 0.
    return int(value) if value == value.to_integral_value() else float(value)


def user_json(user: User) -> JsonObject:
    """A user, the same in ``/users`` and embedded in an expense."""
    return {
        "id": user.id,
        "username": user.username,
        "mail": user.mail,
        "role": user.role,
        "phone": user.phone,
        "accounts": list(user.account_names),
    }


def client_listed_json(client: Client) -> JsonObject:
    """A client in ``/clients``: numeric percentage, no description."""
    return {
        "id": client.id,
        "name": client.name,
        "vatNumber": client.vat_number,
        "type": client.type,
        "taxRetentionPercentage": _number(client.tax_retention_percentage),
    }


def client_embedded_json(client: Client) -> JsonObject:
    """A client inside an expense: with description, percentage as "15.0000"."""
    return {
        "id": client.id,
        "name": client.name,
        "description": client.description,
        "vatNumber": client.vat_number,
        "type": client.type,
        "taxRetentionPercentage": _fixed(client.tax_retention_percentage, _FOUR_PLACES),
    }


def _account_base(account: Account) -> JsonObject:
    return {
        "id": account.id,
        "name": account.name,
        "accountNumber": account.account_number,
        "description": account.description,
        "type": account.type,
    }


def account_listed_json(account: Account) -> JsonObject:
    """An account in ``/accounts``: nested ``bank`` (null for CASH), no ``bankCode``."""
    bank = account.bank
    return {
        **_account_base(account),
        "bank": None
        if bank is None
        else {
            "name": bank.name,
            "country": bank.country,
            "code": bank.code,
            "swiftCode": bank.swift_code,
        },
        "liquidityThreshold": _fixed(account.liquidity_threshold, _TWO_PLACES),
        "lastBalance": _fixed(account.last_balance, _FOUR_PLACES),
    }


def account_single_json(account: Account) -> JsonObject:
    """An account from ``/accounts/{accountId}``: ``bankCode``, no ``bank``."""
    return {
        **_account_base(account),
        "bankCode": None if account.bank is None else account.bank.code,
        "liquidityThreshold": _fixed(account.liquidity_threshold, _TWO_PLACES),
        "lastBalance": _fixed(account.last_balance, _FOUR_PLACES),
    }


def account_embedded_json(account: Account) -> JsonObject:
    """An account inside an expense: ``bankCode``, no ``bank``, no ``lastBalance``."""
    return {
        **_account_base(account),
        "bankCode": None if account.bank is None else account.bank.code,
        "liquidityThreshold": _fixed(account.liquidity_threshold, _TWO_PLACES),
    }


def expense_json(expense: Expense) -> JsonObject:
    """An expense, the same in ``/expenses`` and ``/expenses/{expenseId}``."""
    paid_at = expense.paid_at
    return {
        "id": expense.id,
        "paymentId": expense.payment_id,
        "currencyCode": expense.currency_code,
        "amount": _fixed(expense.amount, _FOUR_PLACES),
        "paidAt": None if paid_at is None else paid_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": expense.method,
        "description": expense.description,
        "category": expense.category,
        "issueDate": expense.issue_date.isoformat(),
        "dueDate": expense.due_date.isoformat(),
        "type": expense.type,
        "status": expense.status,
        "account": account_embedded_json(expense.account),
        "client": client_embedded_json(expense.client),
        "user": user_json(expense.user),
    }
