"""The mix workload: many tokens, thousands of keys over the six routes, Zipf weights.

Internal services do not repeat one request: each calls with its own token, over its
own kept-alive connections, for many different records, some far more often than
others. The mix is that traffic, the same in every run and for every peer:

- **Tokens.** ``TOKENS`` (24) bearer tokens, ``bench-mix-00`` to ``bench-mix-23``; the
  reference upstream is started accepting each of them.
- **Targets.** Request targets (path + query, percent-encoded as sent) taken from the
  reference upstream's own dataset (``generate_dataset`` with the upstream's seed), so
  that every one answers 200: expense pages (limit 5, 10 or 20, unfiltered and
  filtered by type, status, month or quarter ranges, account, user, concept, and some
  of them combined; only pages that exist), single expenses by id, single accounts by
  id (four ids that need no percent-escape, and one escaped name per token), and
  pages of the client, account (also by type and bank code) and user lists. Each
  target is written once, in one spelling, so that two targets are never one cache
  key for the gateway (which canonicalises the query) and two for nginx or Varnish.
- **Keys.** A key is a token and a target. Each token has ``KEYS_PER_TOKEN`` (250)
  keys: a seeded sample of the targets of each route (``PER_TOKEN``: 136 expense
  pages, 70 single expenses, 5 single accounts, 12 account pages, 15 client pages,
  12 user pages), shuffled. Tokens overlap in targets (services ask for some of the
  same records) but a key belongs to one token: 6,000 distinct keys in all.
- **Weights.** The key a token holds at position ``j`` (1 to 250) weighs ``1 / j``:
  each token draws its keys Zipf(s = 1), about 16 % of its requests for its first key
  and about 62 % for its first 25. Every token has the same number of connections,
  each with one request in flight, so each carries the same share of the load;
  over all tokens the key at position j of any token has probability
  ``1 / (24 j H(250))``. Its global rank is ``24 (j - 1) + t + 1`` for token t.
- **Connections.** Connection i carries token ``i mod 24`` for its whole life (see
  ``connection_token``); 48 connections give every token two, one on each of the load
  client's two threads.

``write_keys`` writes the file that ``bench/loadgen.c`` reads.
"""

from __future__ import annotations

import calendar
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import quote

import orjson

from gateway.demo.dataset import Dataset, generate_dataset
from gateway.demo.params import PageRequest, parse_expense_filters
from gateway.demo.store import RecordStore

TOKENS = 24
KEYS_PER_TOKEN = 250
CONNECTIONS = 48  # two per token: divides over the 24 tokens and the 2 threads
SEED = 1124
UPSTREAM_SEED = 42  # the reference upstream's default dataset
# How many of each route's targets every token holds; they add up to KEYS_PER_TOKEN.
PER_TOKEN: Mapping[str, int] = {
    "expenses": 136,
    "expense": 70,
    "account": 5,
    "accounts": 12,
    "clients": 15,
    "users": 12,
}
ROUTES = tuple(PER_TOKEN)
EXPENSE_LIMITS = (5, 10, 20)
# a caller pages through the first few pages of a selection, rarely further
EXPENSE_PAGES = 8
# account ids that need no percent-escape; the others are escaped names (one per token)
PLAIN_ACCOUNT_IDS = ("ACC-001", "ACC-002", "BANCOLOMBIA_MAIN", "SANTANDER-MX-01")
CONCEPTS = ("Rent", "Utilities", "Software", "Travel", "Meals", "Maintenance", "Transport",
            "Taxes", "hotel", "arriendo", "internet", "licencias", "taxi")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the mix: what one token asks for, and how often."""

    token_index: int
    token: str
    route: str
    target: str
    position: int  # 1 = the token's most frequent key

    @property
    def weight(self) -> float:
        return 1.0 / self.position

    @property
    def rank(self) -> int:
        """Its rank over every token's keys (positions interleaved token by token)."""
        return TOKENS * (self.position - 1) + self.token_index + 1

    @property
    def authorization(self) -> str:
        return f"Bearer {self.token}"


def tokens(count: int = TOKENS) -> list[str]:
    return [f"bench-mix-{index:02d}" for index in range(count)]


def connection_token(connection: int, token_count: int = TOKENS) -> int:
    """The token a connection carries for its whole life (as bench/loadgen.c assigns it)."""
    return connection % token_count


def _query(pairs: Iterable[tuple[str, object]]) -> str:
    return "&".join(f"{name}={quote(str(value), safe='')}" for name, value in pairs)


def _paged(path: str, filters: Sequence[tuple[str, str]], limit: int, page: int) -> str:
    """One spelling per request: filters first, then limit, then page when not the first."""
    pairs: list[tuple[str, object]] = [*filters, ("limit", limit)]
    if page > 1:
        pairs.append(("page", page))
    return f"{path}?{_query(pairs)}"


def _pages(total: int, limit: int, most: int | None = None) -> range:
    last = -(-total // limit)
    return range(1, (last if most is None else min(last, most)) + 1)


def _months() -> list[tuple[str, str]]:
    return [
        (f"{year}-{month:02d}-01", f"{year}-{month:02d}-{calendar.monthrange(year, month)[1]:02d}")
        for year in (2024, 2025)
        for month in range(1, 13)
    ]


def _quarters() -> list[tuple[str, str]]:
    months = _months()
    return [(months[q][0], months[q + 2][1]) for q in range(0, len(months), 3)]


def _expense_filters(dataset: Dataset) -> list[list[tuple[str, str]]]:
    """The filter combinations of the expense pages, in a fixed order."""
    months, quarters = _months(), _quarters()
    users = [user.username for user in dataset.users]
    types, statuses = ("CASH", "BANK"), ("PAID", "PENDING", "CANCELLED")
    combos: list[list[tuple[str, str]]] = [[]]
    combos += [[("type", kind)] for kind in types]
    combos += [[("status", status)] for status in statuses]
    combos += [[("dateFrom", first), ("dateTo", last)] for first, last in (*months, *quarters)]
    combos += [[("account", account)] for account in (*PLAIN_ACCOUNT_IDS, "Caja General")]
    combos += [[("user", user)] for user in users]
    combos += [[("concept", concept)] for concept in CONCEPTS]
    combos += [[("type", kind), ("status", status)] for kind in types for status in statuses]
    combos += [[("type", k), ("dateFrom", f), ("dateTo", t)] for k in types for f, t in quarters]
    combos += [[("status", "PAID"), ("dateFrom", f), ("dateTo", t)] for f, t in months]
    combos += [
        [("account", account), ("dateFrom", first), ("dateTo", last)]
        for account in PLAIN_ACCOUNT_IDS
        for first, last in quarters
    ]
    combos += [[("user", user), ("status", "PAID")] for user in users]
    return combos


@cache
def targets() -> dict[str, tuple[str, ...]]:
    """Every target of the mix, by route, from the reference upstream's dataset; each
    one answers 200 with at least one record."""
    dataset = generate_dataset(UPSTREAM_SEED)
    store = RecordStore(dataset)
    found: dict[str, list[str]] = {route: [] for route in ROUTES}
    for filters in _expense_filters(dataset):
        page = orjson.loads(store.expenses_page(parse_expense_filters(dict(filters)), _FIRST))
        for limit in EXPENSE_LIMITS:
            for number in _pages(page["total"], limit, EXPENSE_PAGES):
                found["expenses"].append(_paged("/expenses", filters, limit, number))
    found["expense"] = [f"/expenses/{expense.id}" for expense in dataset.expenses]
    found["account"] = [f"/accounts/{quote(name, safe='')}" for name in _account_names(dataset)]
    accounts, banks = dataset.accounts, sorted({a.bank.code for a in dataset.accounts if a.bank})
    for limit in (1, 2, 4, 5, 10, 20, 50, 100):
        pages = _pages(len(accounts), limit)
        found["accounts"] += [_paged("/accounts", [], limit, n) for n in pages]
    for kind in ("CASH", "BANK"):
        count = sum(1 for account in accounts if account.type == kind)
        for limit in (2, 5, 10):
            pages = _pages(count, limit)
            found["accounts"] += [_paged("/accounts", [("type", kind)], limit, n) for n in pages]
    found["accounts"] += [_paged("/accounts", [("bankCode", code)], 10, 1) for code in banks]
    for route, total, limits in (
        ("clients", len(dataset.clients), (2, 5, 10, 20, 25, 50, 100)),
        ("users", len(dataset.users), (1, 2, 3, 5, 10, 20, 50, 100)),
    ):
        for limit in limits:
            found[route] += [_paged(f"/{route}", [], limit, n) for n in _pages(total, limit)]
    return {route: tuple(values) for route, values in found.items()}


_FIRST = PageRequest(page=1, limit=1)


def _account_names(dataset: Dataset) -> list[str]:
    """The plain ids first, then every account's name, which needs a percent-escape
    (spaces, accents, a ``/``): how an account is asked for by its name."""
    names = sorted(account.name for account in dataset.accounts)
    return [*PLAIN_ACCOUNT_IDS, *(name for name in names if quote(name, safe="") != name)]


def token_targets(token_index: int, seed: int = SEED) -> list[tuple[str, str]]:
    """(route, target) of one token's keys, most frequent first."""
    rng = random.Random(seed * 1000 + token_index)
    pool = targets()
    chosen: list[tuple[str, str]] = []
    for route, count in PER_TOKEN.items():
        if route == "account":
            plain = pool[route][: len(PLAIN_ACCOUNT_IDS)]
            escaped = pool[route][len(PLAIN_ACCOUNT_IDS) :]
            picked = [*plain, escaped[token_index % len(escaped)]][:count]
        else:
            picked = rng.sample(pool[route], count)
        chosen += [(route, target) for target in picked]
    rng.shuffle(chosen)
    return chosen


@cache
def every_key(seed: int = SEED) -> tuple[Key, ...]:
    """Every key of the mix, token by token, each token's in order of frequency."""
    names = tokens()
    return tuple(
        Key(index, names[index], route, target, position)
        for index in range(TOKENS)
        for position, (route, target) in enumerate(token_targets(index, seed), start=1)
    )


def write_keys(path: Path, chosen: Sequence[Key], *, flat: bool = False) -> None:
    """The keys file of bench/loadgen.c: a ``token`` line, then ``weight target`` lines
    (``flat``: every key at weight 1, no hot set)."""
    lines = [f"# records-gateway bench mix: {len(chosen)} keys (bench/mix.py)"]
    current = None
    for key in chosen:
        if key.token_index != current:
            if current is not None and key.token_index != current + 1:
                raise ValueError("keys must come token by token, in token order")
            current = key.token_index
            lines.append(f"token {key.authorization}")
        lines.append(f"{1.0 if flat else key.weight!r} {key.target}")
    path.write_text("\n".join(lines) + "\n")
