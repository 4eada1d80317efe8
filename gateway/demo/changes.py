"""Records that change: each record of a kind given a rate changes at random, at that
rate, and is served at the version it has reached.

``ChangeRates`` says how many changes a minute each record of a kind makes on average
(``users``, ``clients``, ``expenses``, ``accounts``; a kind not named never changes).
``RecordVersions`` answers, for one app, how many changes a record has made since the
app was created: its version, 0 being the dataset as generated. The ``*_at`` functions
say what a version changes: one field per kind that no filter and no sort order reads,
so a record's version never changes which records a request selects, or their order.

Each record's changes are a Poisson process (exponential gaps) of its own, drawn from
random generators named by the seed, the kind, the record's id and a place in a fixed
tree of its changes (``ChangeTimes``). A record's version at a moment is therefore a
function of those and of the elapsed time alone: it does not depend on which requests
were made before, in which order or how far apart.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from decimal import Decimal
from enum import StrEnum

from gateway.demo.dataset import Account, Client, Expense, User

# Above it a record changes faster than anything could see between two of its answers.
MAX_PER_MINUTE = 60_000.0
# Changes a record makes per block: the times of a block's inner changes are drawn
# together, when a question first falls in the block.
_BLOCK = 32


class RecordKind(StrEnum):
    USERS = "users"
    CLIENTS = "clients"
    EXPENSES = "expenses"
    ACCOUNTS = "accounts"


KNOWN_KINDS = ", ".join(RecordKind)


class ChangeRates(Mapping[str, float]):
    """Changes per minute of each record, by record kind (a ``RecordKind`` value): a
    finite number from 0 to ``MAX_PER_MINUTE``. Kinds not in it do not change, like
    those at 0. Iterates in ``RecordKind`` order."""

    __slots__ = ("_per_minute",)

    def __init__(self, per_minute: Mapping[str, float] | None = None) -> None:
        """``ValueError`` naming the known kinds for another kind, and naming the kind
        for a rate that is not a number in range."""
        checked: dict[RecordKind, float] = {}
        for name, rate in (per_minute or {}).items():
            kind = _kind(name)
            checked[kind] = _rate(kind, rate)
        self._per_minute = {kind: checked[kind] for kind in RecordKind if kind in checked}

    @classmethod
    def of(cls, rates: Mapping[str, float] | None) -> ChangeRates:
        """``rates`` checked, or as they are when already ``ChangeRates``."""
        return rates if isinstance(rates, ChangeRates) else cls(rates)

    @classmethod
    def parse(cls, texts: Iterable[str]) -> ChangeRates:
        """The rates written ``KIND=PER_MINUTE`` (``expenses=6``), one kind at most
        once; ``ValueError`` saying what is wrong with the first that is not."""
        rates: dict[str, float] = {}
        for text in texts:
            name, equals, number = text.partition("=")
            name = name.strip()
            if not equals or not name:
                raise ValueError(f"{text!r} is not KIND=PER_MINUTE, such as expenses=6")
            kind = _kind(name)
            if kind in rates:
                raise ValueError(f"{kind} is given twice")
            try:
                rate = float(number)
            except ValueError:
                raise ValueError(_bad_rate(kind, number)) from None
            rates[kind] = _rate(kind, rate, shown=number)
        return cls(rates)

    def per_minute(self, kind: RecordKind) -> float:
        """Changes per minute of each record of ``kind`` (0 when it does not change)."""
        return self._per_minute.get(kind, 0.0)

    def __getitem__(self, kind: str) -> float:
        try:
            return self._per_minute[RecordKind(kind)]
        except ValueError:
            raise KeyError(kind) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._per_minute)

    def __len__(self) -> int:
        return len(self._per_minute)

    def __hash__(self) -> int:
        return hash(frozenset(self._per_minute.items()))

    def __repr__(self) -> str:
        return f"ChangeRates({self._per_minute!r})"

    def __str__(self) -> str:
        """``expenses=6/min, accounts=0.5/min``, or ``none``."""
        return ", ".join(f"{k}={_number(r)}/min" for k, r in self._per_minute.items()) or "none"


NO_CHANGES = ChangeRates()


def _kind(name: str) -> RecordKind:
    try:
        return RecordKind(name)
    except ValueError:
        raise ValueError(
            f"unknown record kind {name!r}; the known kinds are {KNOWN_KINDS}"
        ) from None


def _rate(kind: RecordKind, rate: object, *, shown: object = None) -> float:
    """``rate`` as a float; ``ValueError`` showing ``shown`` (or ``rate``) when it is
    not a number from 0 to ``MAX_PER_MINUTE``."""
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not 0 <= rate <= MAX_PER_MINUTE  # NaN fails too
    ):
        raise ValueError(_bad_rate(kind, rate if shown is None else shown))
    return float(rate)


def _bad_rate(kind: RecordKind, shown: object) -> str:
    return (
        f"the rate of {kind} must be a number of changes per minute from 0 to"
        f" {_number(MAX_PER_MINUTE)}, got {shown!r}"
    )


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


class ChangeTimes:
    """The changes of one record, on a time axis in units of its mean gap: a Poisson
    process of rate 1.

    Change ``k`` happens at ``S(k)``, the sum of ``k`` exponential gaps; changes come in
    blocks of ``_BLOCK``. The time of the first change of every power-of-two block
    follows from the one before by a gamma draw; the time of a block halfway between two
    known ones, by a beta draw (given both ends, the share of the time before it is
    beta-distributed); the inner changes of a block are uniform between its ends, sorted.
    Every draw comes from a ``random.Random`` named by ``name`` and by the draw's place
    in that tree, never from a shared stream, so the time of every change is fixed
    whatever was asked before. A question costs, when it falls outside the block of
    the one before, a draw per level of the tree (the log of the changes so far) and
    the draw of one block; inside it, a bisection.
    """

    __slots__ = ("_block", "_end", "_inner", "_name", "_powers", "_start")

    def __init__(self, name: str) -> None:
        self._name = name
        # _powers[j]: the time of change _BLOCK * 2**j, the start of block 2**j
        self._powers: list[float] = []
        self._block = 0
        self._start, self._end = 1.0, 0.0  # no block drawn yet
        self._inner: list[float] = []

    def changes_by(self, time: float) -> int:
        """How many changes happened in ``(0, time]`` (0 for ``time <= 0``)."""
        if not self._start <= time < self._end:
            if not time > 0:
                return 0
            self._enter(*self._block_of(time))
        return self._block * _BLOCK + bisect.bisect_right(self._inner, time)

    def _block_of(self, time: float) -> tuple[int, float, float]:
        """The block ``time`` falls in, with its start and end."""
        if time < self._power(0):
            return 0, 0.0, self._power(0)
        level = 1
        while time >= self._power(level):
            level += 1
        low, high = 2 ** (level - 1), 2**level
        low_time, high_time = self._power(level - 1), self._power(level)
        while high - low > 1:
            middle = (low + high) // 2
            share = self._random(f"{low}-{high}").betavariate(
                _BLOCK * (middle - low), _BLOCK * (high - middle)
            )
            middle_time = low_time + (high_time - low_time) * share
            if time < middle_time:
                high, high_time = middle, middle_time
            else:
                low, low_time = middle, middle_time
        return low, low_time, high_time

    def _power(self, level: int) -> float:
        powers = self._powers
        while len(powers) <= level:
            known = len(powers)
            # block 0 alone, then blocks 2**(known-1) to 2**known - 1
            blocks = 2 ** (known - 1) if known else 1
            gap = self._random(f"power{known}").gammavariate(_BLOCK * blocks, 1.0)
            powers.append((powers[-1] if known else 0.0) + gap)
        return powers[level]

    def _enter(self, block: int, start: float, end: float) -> None:
        draw = self._random(f"block{block}").random
        span = end - start
        # 1 - random() is in (0, 1]: no inner change at the block's start
        self._inner = sorted(start + span * (1.0 - draw()) for _ in range(_BLOCK - 1))
        self._block, self._start, self._end = block, start, end

    def _random(self, node: str) -> random.Random:
        # A node name never holds the separator, so no two (name, node) pairs collide.
        return random.Random(f"{self._name}\x1f{node}")


class RecordVersions:
    """The version of each record of one app: the number of its changes since the app
    was created, measured on ``clock`` (seconds; its value at creation is time 0)."""

    __slots__ = ("_clock", "_origin", "_per_second", "_seed", "_times")

    def __init__(self, rates: ChangeRates, seed: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._origin = clock()
        self._seed = seed
        self._per_second = {RecordKind(kind): rate / 60 for kind, rate in rates.items() if rate > 0}
        self._times: dict[tuple[RecordKind, str], ChangeTimes] = {}

    def changing(self, kind: RecordKind) -> bool:
        """Whether records of ``kind`` change at all."""
        return kind in self._per_second

    def elapsed(self) -> float:
        """Seconds on the clock since the app was created; ``ValueError`` when the
        clock gives no finite time."""
        elapsed = self._clock() - self._origin
        if not math.isfinite(elapsed):
            raise ValueError(f"the clock gave no finite time: {elapsed!r}")
        return elapsed

    def version(self, kind: RecordKind, record_id: str, elapsed: float) -> int:
        """The version of the record ``record_id`` of ``kind`` ``elapsed`` seconds
        after the app was created."""
        per_second = self._per_second.get(kind)
        if per_second is None:
            return 0
        times = self._times.get((kind, record_id))
        if times is None:
            times = ChangeTimes(f"{self._seed}\x1f{kind}\x1f{record_id}")
            self._times[kind, record_id] = times
        return times.changes_by(elapsed * per_second)


def user_at(user: User, version: int) -> User:
    """A user at ``version``: its ``phone`` with `` (rev N)`` after it."""
    return replace(user, phone=_revised(user.phone, version)) if version else user


def client_at(client: Client, version: int) -> Client:
    """A client at ``version``: its ``vatNumber`` with `` (rev N)`` after it."""
    return replace(client, vat_number=_revised(client.vat_number, version)) if version else client


def account_at(account: Account, version: int) -> Account:
    """An account at ``version``: its ``lastBalance`` up by one unit per change."""
    if not version:
        return account
    return replace(account, last_balance=account.last_balance + Decimal(version))


def expense_at(expense: Expense, version: int, client_version: int, user_version: int) -> Expense:
    """An expense at ``version``, its method with `` (rev N)`` after it, embedding its
    client and its user at theirs. (Its embedded account carries no ``lastBalance``.)"""
    if not (version or client_version or user_version):
        return expense
    return replace(
        expense,
        method=_revised(expense.method, version),
        client=client_at(expense.client, client_version),
        user=user_at(expense.user, user_version),
    )


def _revised(text: str, version: int) -> str:
    return f"{text} (rev {version})" if version else text
