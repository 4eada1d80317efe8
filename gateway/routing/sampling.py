"""How a route is sampled by ``records-gateway compare``: what its requests are made of,
declared with the route (``Route.sample``) and read from an upstream's own data.

The data is the first page of every list route (:class:`Seeds`). A list route's
samplers read its own first page; an id route's read the first page of the list route
that lists it (``Route.listed_by``). Each sampler gives the parameters of requests, one
tuple of ``(name, value)`` pairs a request: an id route's path parameter by its name,
a list route's query parameters (a paged sampler adds the sample's ``limit``). What a
sampler gives is validated by the route's own rules before it is sent; a value the
gateway refuses is left out and said.

Values are read at a path of keys in a record (``("account", "name")``) and taken as
they are when they are non-empty text, each value once, in the order of the records.
Given the same data, the same requests, in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Protocol

Record = Mapping[str, Any]
Pairs = tuple[tuple[str, str], ...]
_WORD = re.compile(r"[^\W\d_]{4,}")


@dataclass(frozen=True, slots=True)
class Seeds:
    """What a route's samplers read: ``records``, the first page of its list (an id
    route's: the list that lists it); ``lists``, the first page of every list route,
    by route name; ``limit``, the ``limit`` a paged sampler adds (None for an id
    route: it takes no query)."""

    records: Sequence[Record]
    lists: Mapping[str, Sequence[Record]]
    limit: str | None


class Sampler(Protocol):
    """One kind of request of a route's sample."""

    def names(self) -> tuple[str, ...]:
        """The parameters it gives values to (the route must declare them)."""

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        """The parameters of its requests, read from ``seeds``."""


def texts(records: Iterable[Record], at: tuple[str, ...]) -> Iterator[str]:
    """The non-empty text values at ``at`` in ``records``, in order, each once."""
    seen: set[str] = set()
    for record in records:
        value: Any = record
        for key in at:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, str) and value and value not in seen:
            seen.add(value)
            yield value


def _paged(seeds: Seeds, paged: bool, pairs: Pairs) -> Pairs:
    return (*pairs, ("limit", seeds.limit)) if paged and seeds.limit is not None else pairs


@dataclass(frozen=True, slots=True)
class First:
    """``param`` set to each of the first ``count`` values at ``at`` (after ``skip``):
    each alone, and each with the pairs ``also`` when given. ``of``: read the records
    of that list route instead, or when it has none, the objects at ``otherwise`` in
    the route's own records (the users of ``/users``, else each expense's ``user``).
    ``unless``: leave out a value that is also a value at ``unless`` in the records
    (an account's name that is some account's id)."""

    param: str
    at: tuple[str, ...]
    count: int = 1
    skip: int = 0
    paged: bool = True
    of: str | None = None
    otherwise: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    also: Pairs = ()

    def names(self) -> tuple[str, ...]:
        return (self.param, *(name for name, _ in self.also))

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        records = self._records(seeds)
        excluded = set(texts(records, self.unless)) if self.unless else set()
        values = [value for value in texts(records, self.at) if value not in excluded]
        for value in values[self.skip : self.skip + self.count]:
            yield _paged(seeds, self.paged, ((self.param, value), *self.also))

    def _records(self, seeds: Seeds) -> Sequence[Record]:
        if self.of is None:
            return seeds.records
        records = seeds.lists.get(self.of) or ()
        if records or not self.otherwise:
            return records
        return list(_objects(seeds.records, self.otherwise))


def _objects(records: Iterable[Record], at: tuple[str, ...]) -> Iterator[Record]:
    for record in records:
        value: Any = record
        for key in at:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, Mapping):
            yield value


@dataclass(frozen=True, slots=True)
class OneParam:
    """A sampler of one query parameter, ``param``."""

    param: str

    def names(self) -> tuple[str, ...]:
        return (self.param,)


@dataclass(frozen=True, slots=True)
class Each(OneParam):
    """``param`` set to every value at ``at``, in sorted order; with ``within``, only
    those of its values."""

    at: tuple[str, ...]
    within: tuple[str, ...] | None = None
    paged: bool = True

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        values = set(texts(seeds.records, self.at))
        if self.within is not None:
            values &= set(self.within)
        for value in sorted(values):
            yield _paged(seeds, self.paged, ((self.param, value),))


@dataclass(frozen=True, slots=True)
class Fixed(OneParam):
    """``param`` set to each of ``values``, whatever the data (each choice of a
    parameter, an id no record has)."""

    values: tuple[str, ...]
    paged: bool = True

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        for value in self.values:
            yield _paged(seeds, self.paged, ((self.param, value),))


@dataclass(frozen=True, slots=True)
class Spread(OneParam):
    """``param`` set to ``count`` values at ``at`` spread evenly over the records."""

    at: tuple[str, ...]
    count: int

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        values = list(texts(seeds.records, self.at))
        step = max(1, len(values) // self.count)
        for value in values[::step][: self.count]:
            yield ((self.param, value),)


@dataclass(frozen=True, slots=True)
class Word(OneParam):
    """``param`` set to the first word of four letters or more in the texts at ``at``
    (a word a text search finds)."""

    at: tuple[str, ...]
    paged: bool = True

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        for text in texts(seeds.records, self.at):
            for word in _WORD.findall(text):
                yield _paged(seeds, self.paged, ((self.param, word),))
                return


@dataclass(frozen=True, slots=True)
class DaysAround:
    """A day range's bounds ``first`` and ``last`` from the middle one of the days at
    ``at`` (YYYY-MM-DD): ``first`` alone, ``last`` alone, then both ``days`` around it."""

    first: str
    last: str
    at: tuple[str, ...]
    days: int = 3
    paged: bool = True

    def names(self) -> tuple[str, ...]:
        return (self.first, self.last)

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        found = [day for day in map(_day_or_none, texts(seeds.records, self.at)) if day]
        if not found:
            return
        middle = found[len(found) // 2]
        low, high = middle - timedelta(days=self.days), middle + timedelta(days=self.days)
        yield _paged(seeds, self.paged, ((self.first, middle.isoformat()),))
        yield _paged(seeds, self.paged, ((self.last, middle.isoformat()),))
        around = ((self.first, low.isoformat()), (self.last, high.isoformat()))
        yield _paged(seeds, self.paged, around)


def _day_or_none(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Together:
    """Parameters combined, each set to its value in one record (``record``: its index
    in the records, -1 the last), so that the request matches that record at least;
    with the pairs ``also``. Nothing when a value is missing."""

    values: tuple[tuple[str, tuple[str, ...]], ...]
    record: int = 0
    also: Pairs = ()
    paged: bool = True

    def names(self) -> tuple[str, ...]:
        return (*(name for name, _ in self.values), *(name for name, _ in self.also))

    def pairs(self, seeds: Seeds) -> Iterator[Pairs]:
        if not seeds.records:
            return
        record = seeds.records[self.record]
        given = [(name, next(texts([record], at), None)) for name, at in self.values]
        pairs = tuple((name, value) for name, value in given if value is not None)
        if len(pairs) == len(given):
            yield _paged(seeds, self.paged, (*pairs, *self.also))
