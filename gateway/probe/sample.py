"""The requests ``records-gateway compare`` sends: read from a file, or generated from
the primary upstream's own data.

Every request is a :class:`gateway.records.routes.RecordQuery`, validated by the
gateway's own rules (``parse_record_query``, with ``limits.max_limit``), so that what
goes to both upstreams is exactly what the gateway would send for it.

A requests file holds one ``path?query`` a line, as a caller sends it to the gateway
(``/expenses?type=BANK&limit=20``, ``/accounts/Caja%20chica``); blank lines and lines
starting with ``#`` are skipped. :func:`read_requests` raises ConfigError naming the
line and its problem.

:func:`sample_requests` makes the default sample from the first pages of the four
lists (:func:`seed_queries`), so that ids and filter values are the primary's own:

- each list: page 1 and page 2 with the seed's limit, the default page (no query), and
  its last page when it has more than two;
- ``/expenses/{expenseId}``: five expenses of the first page, and one unknown id;
- ``/accounts/{accountId}``: eight accounts of the first page by id, four whose name is
  not their id by name too (escaped as one path segment), and one unknown account;
- ``/expenses``, each filter alone with a value from the data: ``dateFrom`` and
  ``dateTo`` (an expense's issueDate), a range around an issueDate, ``amount`` (an
  expense's), ``concept`` (a word of a description), ``account`` (an account name),
  ``status`` (each status seen), ``type`` (each type seen), ``user`` (a username, and a
  user id); then two combinations, and the second page of the status filter;
- ``/accounts``: ``type=CASH``, ``type=BANK``, the bank code filter with a code from the
  data, and the code with ``type=BANK``.

Given the same data, the same requests, in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from yarl import URL

from gateway.errors import ConfigError, InvalidParameters, RequestError
from gateway.records.routes import RecordQuery, check_segment, parse_record_query
from gateway.routing.routes import Route
from gateway.routing.standard import ACCOUNT, ACCOUNTS, EXPENSE, EXPENSES, ROUTES, TYPES

# the limit of the seed pages (and of the sample's list pages), at most limits.max_limit
SEED_LIMIT = 20
# more lines than this in a requests file is a mistake, not a sample
MAX_REQUESTS = 10_000
LIST_ROUTES = ROUTES.list_routes()
UNKNOWN_EXPENSE = "00000000-0000-4000-8000-000000000000"
UNKNOWN_ACCOUNT = "records-gateway-compare-no-such-account"
_EXPENSES_ASKED = 5
_ACCOUNTS_ASKED = 8
_NAMES_ASKED = 4
_WORD = re.compile(r"[^\W\d_]{4,}")
_RANGE_DAYS = 3


@dataclass(frozen=True, slots=True)
class Sample:
    """The requests to compare, and what the generated sample had to leave out (a list
    whose first page the primary did not give)."""

    queries: tuple[RecordQuery, ...]
    gaps: tuple[str, ...] = ()


def target(query: RecordQuery) -> str:
    """``query`` as a line of a requests file: its path and canonical query, with the
    gateway's parameter names (``/accounts?page=1&limit=10&bankCode=007``)."""
    query_text = query.canonical_text.rpartition("|")[2]
    path = query.upstream_path()
    return f"{path}?{query_text}" if query_text else path


def parse_target(line: str, *, max_limit: int) -> RecordQuery:
    """The validated query of one ``path?query`` as a caller sends it to the gateway:
    the route found by its path (an id route's id is its last segment, decoded as the
    gateway's router decodes it), the query read as aiohttp reads it. Raises
    RequestError (InvalidParameters) or ValueError saying what is wrong."""
    raw_path, _, query_string = line.partition("?")
    matched = ROUTES.match(raw_path)
    if matched is None:
        known = ", ".join(route.template for route in ROUTES)
        raise ValueError(f"{raw_path!r} is not the path of a record route ({known})")
    route, segment = matched
    path_value: str | None = None
    if segment is not None:
        check_segment(route.path_param or "", segment)
        path_value = unquote(segment, errors="strict")
        if path_value.strip(".") == "" and "%" not in segment:
            raise ValueError(f"{raw_path!r} ends in a dot segment, which names no record")
    return parse_record_query(route, path_value, _query_pairs(query_string), max_limit=max_limit)


def _query_pairs(query_string: str) -> list[tuple[str, str]]:
    # the pairs aiohttp's request.query gives for this raw query (yarl's reading), as
    # the gateway's handlers read them (gateway.http.records.query_pairs)
    return list(URL.build(query_string=query_string, encoded=True).query.items())


def read_requests(path: Path, *, max_limit: int) -> tuple[RecordQuery, ...]:
    """The requests of a requests file (see the module's docstring). Raises ConfigError
    naming the file, and the line number and problem of the first bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--requests {path}: cannot be read ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--requests {path}: not UTF-8 text ({exc.reason})") from exc
    queries: list[RecordQuery] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(queries) >= MAX_REQUESTS:
            raise ConfigError(f"--requests {path}: more than {MAX_REQUESTS} requests")
        if not line.startswith("/"):
            raise ConfigError(
                f"--requests {path}, line {number}: {_shown(line)} is not a path starting"
                " with / (write /expenses?type=BANK, not a full URL)"
            )
        try:
            queries.append(parse_target(line, max_limit=max_limit))
        except (RequestError, ValueError) as exc:
            raise ConfigError(f"--requests {path}, line {number}: {_shown(line)}: {exc}") from exc
    if not queries:
        raise ConfigError(f"--requests {path}: no requests (only blank lines and comments)")
    return tuple(queries)


def _shown(line: str) -> str:
    return repr(line if len(line) <= 120 else line[:117] + "...")


def seed_queries(*, max_limit: int) -> dict[str, RecordQuery]:
    """The first page of each list (``SEED_LIMIT`` items, at most ``max_limit``), by
    route name: what :func:`sample_requests` takes its ids and values from."""
    limit = str(min(SEED_LIMIT, max_limit))
    return {
        route.name: parse_record_query(route, None, [("limit", limit)], max_limit=max_limit)
        for route in LIST_ROUTES
    }


def sample_requests(seeds: Mapping[str, Any], *, max_limit: int) -> Sample:
    """The default sample (see the module's docstring) from ``seeds``: the published
    bodies of the first pages of :func:`seed_queries`, by route name; a list missing from
    ``seeds`` (the primary did not give it) has its pages asked for still, but nothing
    taken from it, and the sample says so in its gaps."""
    maker = _Maker(max_limit)
    limit = str(min(SEED_LIMIT, max_limit))
    records: dict[str, list[dict[str, Any]]] = {}
    for route in LIST_ROUTES:
        body = seeds.get(route.name)
        items = body.get("data") if isinstance(body, dict) else None
        records[route.name] = [item for item in items or () if isinstance(item, dict)]
        if body is None:
            maker.gaps.append(
                f"GET {route.template}: the primary gave no first page; nothing was taken from it"
            )
        maker.add(route, None, ("limit", limit))
        maker.add(route, None, ("page", "2"), ("limit", limit))
        maker.add(route, None)
        total_pages = body.get("totalPages") if isinstance(body, dict) else None
        if isinstance(total_pages, int) and total_pages > 2:
            maker.add(route, None, ("page", str(total_pages)), ("limit", limit))
    expenses, accounts, users = records["expenses"], records["accounts"], records["users"]
    _expense_lookups(maker, expenses)
    _account_lookups(maker, accounts)
    _expense_filters(maker, expenses, users)
    _account_filters(maker, accounts)
    return Sample(tuple(maker.queries), tuple(maker.gaps))


class _Maker:
    """The sample as it is made: each query validated, duplicates and values the gateway
    refuses left out (a refused one noted in the gaps)."""

    def __init__(self, max_limit: int) -> None:
        self.max_limit = max_limit
        self.queries: list[RecordQuery] = []
        self.gaps: list[str] = []
        self._seen: set[str] = set()

    def add(self, route: Route, path_value: str | None, *pairs: tuple[str, str]) -> None:
        try:
            query = parse_record_query(route, path_value, pairs, max_limit=self.max_limit)
        except InvalidParameters as exc:
            self.gaps.append(f"GET {route.template}: a value of the data is refused ({exc})")
            return
        if query.canonical_text not in self._seen:
            self._seen.add(query.canonical_text)
            self.queries.append(query)


def _texts(items: Iterable[dict[str, Any]], *path: str) -> Iterator[str]:
    """The text values at ``path`` in ``items``, in order, each once."""
    seen: set[str] = set()
    for item in items:
        value: Any = item
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value and value not in seen:
            seen.add(value)
            yield value


def _expense_lookups(maker: _Maker, expenses: list[dict[str, Any]]) -> None:
    ids = list(_texts(expenses, "id"))
    step = max(1, len(ids) // _EXPENSES_ASKED)
    for expense_id in ids[::step][:_EXPENSES_ASKED]:
        maker.add(EXPENSE, expense_id)
    maker.add(EXPENSE, UNKNOWN_EXPENSE)


def _account_lookups(maker: _Maker, accounts: list[dict[str, Any]]) -> None:
    ids = list(_texts(accounts, "id"))
    for account_id in ids[:_ACCOUNTS_ASKED]:
        maker.add(ACCOUNT, account_id)
    names = [name for name in _texts(accounts, "name") if name not in ids]
    for name in names[:_NAMES_ASKED]:
        maker.add(ACCOUNT, name)
    maker.add(ACCOUNT, UNKNOWN_ACCOUNT)


def _expense_filters(
    maker: _Maker, expenses: list[dict[str, Any]], users: list[dict[str, Any]]
) -> None:
    limit = ("limit", str(min(SEED_LIMIT, maker.max_limit)))
    days = [day for day in map(_date_or_none, _texts(expenses, "issueDate")) if day is not None]
    if days:
        middle = days[len(days) // 2]
        maker.add(EXPENSES, None, ("dateFrom", middle.isoformat()), limit)
        maker.add(EXPENSES, None, ("dateTo", middle.isoformat()), limit)
        around = (middle - timedelta(days=_RANGE_DAYS), middle + timedelta(days=_RANGE_DAYS))
        maker.add(
            EXPENSES,
            None,
            ("dateFrom", around[0].isoformat()),
            ("dateTo", around[1].isoformat()),
            limit,
        )
    for amount in list(_texts(expenses, "amount"))[:1]:
        maker.add(EXPENSES, None, ("amount", amount))
    words = (word for text in _texts(expenses, "description") for word in _WORD.findall(text))
    for word in list(words)[:1]:
        maker.add(EXPENSES, None, ("concept", word), limit)
    for name in list(_texts(expenses, "account", "name"))[:1]:
        maker.add(EXPENSES, None, ("account", name), limit)
    for status in sorted(_texts(expenses, "status")):
        maker.add(EXPENSES, None, ("status", status), limit)
    for type_ in sorted(set(_texts(expenses, "type")) & set(TYPES)):
        maker.add(EXPENSES, None, ("type", type_), limit)
    people = users or [item["user"] for item in expenses if isinstance(item.get("user"), dict)]
    for username in list(_texts(people, "username"))[:1]:
        maker.add(EXPENSES, None, ("user", username), limit)
    for user_id in list(_texts(people, "id"))[1:2]:
        maker.add(EXPENSES, None, ("user", user_id), limit)
    # combinations, each from one expense (so that it matches at least that one)
    if expenses:
        first, last = expenses[0], expenses[-1]
        _combine(
            maker,
            ("status", _text_at(first, "status")),
            ("type", _text_at(first, "type")),
            limit,
        )
        _combine(
            maker,
            ("account", _text_at(last, "account", "name")),
            ("user", _text_at(last, "user", "username")),
            ("dateTo", _text_at(last, "issueDate")),
            limit,
        )
        _combine(maker, ("status", _text_at(first, "status")), ("page", "2"), limit)


def _combine(maker: _Maker, *pairs: tuple[str, str | None]) -> None:
    given = [(name, value) for name, value in pairs if value is not None]
    if len(given) == len(pairs):
        maker.add(EXPENSES, None, *given)


def _text_at(item: dict[str, Any], *path: str) -> str | None:
    found = list(_texts([item], *path))
    return found[0] if found else None


def _date_or_none(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _account_filters(maker: _Maker, accounts: list[dict[str, Any]]) -> None:
    for type_ in TYPES:
        maker.add(ACCOUNTS, None, ("type", type_))
    for code in list(_texts(accounts, "bankCode"))[:1]:
        maker.add(ACCOUNTS, None, ("bankCode", code))
        maker.add(ACCOUNTS, None, ("type", "BANK"), ("bankCode", code))
