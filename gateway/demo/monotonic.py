"""Whether callers were served a record older than one they had been served before:
read from the reference upstream's records as a gateway serves them (their changes,
``changes.py``, leave a revision in one field per kind), for the consistency workload
(``bench/consistency.py``, docs/purging.md).

An answer is *older* for a caller when one of the records it holds, embedded ones
included, is at a revision below one that caller was served before; for everyone, below
one anybody was served before. An account's revision is read from its ``lastBalance``
(its views without one say nothing of it).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

from gateway.demo.dataset import Dataset

_REVISION = re.compile(r" \(rev (\d+)\)$")
# the field that carries a record's revision, by the kind of record that holds it
_REVISED = {"expense": "method", "user": "phone", "client": "vatNumber"}


class Monotonic:
    """The answers served to each caller, and those older than one served before."""

    def __init__(self, dataset: Dataset) -> None:
        self._balances = {account.id: account.last_balance for account in dataset.accounts}
        self._callers: dict[tuple[str, str], int] = {}
        self._everyone: dict[str, int] = {}
        self.answers = 0
        self.older_for_caller = 0
        self.older_for_anyone = 0

    def served(self, caller: str, answer: Any) -> bool:
        """Count ``answer`` (a parsed body) served to ``caller``; whether it held a
        record older than one that caller was served before."""
        self.answers += 1
        older_caller = older_anyone = False
        for ref, revision in self._revisions(answer):
            mine = self._callers.get((caller, ref), -1)
            older_caller |= revision < mine
            older_anyone |= revision < self._everyone.get(ref, -1)
            self._callers[(caller, ref)] = max(mine, revision)
            self._everyone[ref] = max(self._everyone.get(ref, -1), revision)
        self.older_for_caller += older_caller
        self.older_for_anyone += older_anyone
        return older_caller

    def _revisions(self, answer: Any) -> Iterator[tuple[str, int]]:
        items = answer.get("data") if isinstance(answer, dict) and "data" in answer else [answer]
        for item in items if isinstance(items, list) else ():
            yield from self._record(item)

    def _record(self, record: Any) -> Iterator[tuple[str, int]]:
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            return
        kind = _kind(record)
        if kind == "account":
            revision = self._balance_revision(record)
            if revision is not None:
                yield f"account:{record['id']}", revision
            return
        field = record.get(_REVISED[kind])
        matched = _REVISION.search(field) if isinstance(field, str) else None
        yield f"{kind}:{record['id']}", int(matched.group(1)) if matched else 0
        for name in ("account", "client", "user"):
            yield from self._record(record.get(name))

    def _balance_revision(self, record: dict[str, Any]) -> int | None:
        base = self._balances.get(record["id"])
        try:
            balance = Decimal(record["lastBalance"]) if record.get("lastBalance") else None
        except InvalidOperation:
            return None
        if base is None or balance is None:
            return None
        return int(balance - base)

    def report(self) -> dict[str, float | int]:
        """The counts, and the shares of answers older for their caller and for anyone."""
        share = 1 / self.answers if self.answers else 0.0
        return {
            "answers": self.answers,
            "olderForCaller": self.older_for_caller,
            "olderForAnyone": self.older_for_anyone,
            "olderForCallerShare": self.older_for_caller * share,
            "olderForAnyoneShare": self.older_for_anyone * share,
        }


def _kind(record: dict[str, Any]) -> str:
    if "username" in record:
        return "user"
    if "vatNumber" in record:
        return "client"
    if "method" in record or "amount" in record:
        return "expense"
    return "account"


class MixedReads:
    """A caller's next read, drawn at random: pages of expenses (1 to ``pages``, ten
    each), single expenses among those the pages listed, the accounts, single
    accounts, the users and the clients: list and detail views of the same records,
    as the callers of a gateway read them. :meth:`learn` takes each answer, so that
    single expenses are drawn from those already listed."""

    def __init__(self, dataset: Dataset, seed: int = 7, pages: int = 5) -> None:
        self._rng = random.Random(seed)
        self._pages = pages
        self._accounts = [account.id for account in dataset.accounts]
        self._expenses: list[str] = []

    def next_path(self) -> str:
        rng = self._rng
        draw = rng.random()
        if draw < 0.35 or not self._expenses:
            return f"/expenses?page={rng.randint(1, self._pages)}&limit=10"
        if draw < 0.65:
            return f"/expenses/{rng.choice(self._expenses)}"
        if draw < 0.75:
            return "/accounts"
        if draw < 0.85:
            return f"/accounts/{quote(rng.choice(self._accounts), safe='')}"
        if draw < 0.93:
            return "/users"
        return "/clients?limit=50"

    def learn(self, answer: Any) -> None:
        items = answer.get("data") if isinstance(answer, dict) else None
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and "amount" in item and item.get("id") not in self._expenses:
                self._expenses.append(item["id"])
