"""Drift: known ways for the reference upstream to answer unlike itself.

Started with a drift, the reference upstream is a *candidate* twin for the gateway's
upstream comparison (shadow traffic, ``records-gateway compare``): on the seed of an
undrifted twin it serves the same records, and its answers differ from the twin's only
as its kinds say. A drift changes how the returned records are represented, never which
records are returned: filters, sorting and paging run on the dataset as usual (an
``amount`` filter matches the true amount), then the drift applies to the JSON.

``amount-scale``
    an expense's ``amount`` rounded to whole units, half up, without fraction:
    ``"17385.6800"`` is sent as ``"17386"`` (``/expenses``, ``/expenses/{expenseId}``).
``order``
    the ``data`` of every list page reversed; same items, same envelope.
``drop-bank``
    no account carries a ``bank`` object: the key is left out of every account that
    has one. In this upstream only BANK accounts have one (a CASH account's is null,
    which a published answer shows the same as no key), and only the ``/accounts``
    list has that key; the other account shapes carry ``bankCode``.
``enum-case``
    an expense's ``status`` in lower case: ``"paid"``.
``noise``
    an expense's ``paymentId`` with a suffix that is new on every call. Meant for both
    twins: each app counts its calls from its own random start, so consecutive calls
    never repeat a value and two apps do not share one.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum

import orjson

from gateway.demo.representations import JsonObject

_UNIT = Decimal(1)


class DriftKind(StrEnum):
    AMOUNT_SCALE = "amount-scale"
    ORDER = "order"
    DROP_BANK = "drop-bank"
    ENUM_CASE = "enum-case"
    NOISE = "noise"


KNOWN_KINDS = ", ".join(DriftKind)


@dataclass(frozen=True, slots=True)
class Drift:
    """The kinds of drift an app answers with; empty for a faithful upstream."""

    kinds: frozenset[DriftKind] = frozenset()

    @classmethod
    def of(cls, names: Iterable[str] | str) -> Drift:
        """The drift named by ``names`` (a single name is one kind); ``ValueError``
        naming the known kinds for any other name."""
        if isinstance(names, str):
            names = (names,)
        kinds = set()
        for name in names:
            try:
                kinds.add(DriftKind(name))
            except ValueError:
                raise ValueError(
                    f"unknown drift kind {name!r}; the known kinds are {KNOWN_KINDS}"
                ) from None
        return cls(frozenset(kinds))

    def __contains__(self, kind: object) -> bool:
        return kind in self.kinds

    def __iter__(self) -> Iterator[DriftKind]:
        return (kind for kind in DriftKind if kind in self.kinds)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def __str__(self) -> str:
        return ", ".join(self) or "none"

    def expense(self, body: JsonObject) -> JsonObject:
        """An expense's representation as this drift sends it (changed in place)."""
        if DriftKind.AMOUNT_SCALE in self.kinds:
            body["amount"] = _whole_units(body["amount"])
        if DriftKind.ENUM_CASE in self.kinds:
            body["status"] = body["status"].lower()
        self.account(body["account"])
        return body

    def account(self, body: JsonObject) -> JsonObject:
        """An account's representation, any shape, as this drift sends it (changed in
        place)."""
        if DriftKind.DROP_BANK in self.kinds:
            body.pop("bank", None)
        return body


NO_DRIFT = Drift()


class PaymentIdNoise:
    """The ``noise`` kind of one app: a ``paymentId`` suffix per call."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        # A random start rather than 0: a primary and a candidate answering in
        # lockstep must not send the same values.
        self._calls = itertools.count(secrets.randbits(48))

    def stamp(self, body: bytes) -> bytes:
        """``body``, an expense or a page of expenses, with ``-`` and this call's
        number in hex after every ``paymentId``."""
        suffix = f"-{next(self._calls):012x}"
        document = orjson.loads(body)
        for expense in document.get("data", (document,)):
            expense["paymentId"] += suffix
        return orjson.dumps(document)


def _whole_units(amount: str) -> str:
    # Money is text in every representation of this upstream, and stays Decimal here.
    return format(Decimal(amount).quantize(_UNIT, rounding=ROUND_HALF_UP), "f")
