"""The requests ``records-gateway compare`` sends: read from a file, or generated from
the primary upstream's own data.

Every request is a :class:`gateway.records.routes.RecordQuery`, validated by the
gateway's own rules (``parse_record_query``, with ``limits.max_limit``), so that what
goes to both upstreams is exactly what the gateway would send for it.

A requests file holds one ``path?query`` a line, as a caller sends it to the gateway
(``/expenses?type=BANK&limit=20``, ``/accounts/Caja%20chica``); blank lines and lines
starting with ``#`` are skipped. :func:`read_requests` raises ConfigError naming the
line and its problem.

:func:`sample_requests` makes the default sample from the first pages of the lists
(:func:`seed_queries`), so that ids and filter values are the primary's own: each list
route's page 1 and page 2 with the seed's limit, its default page (no query), and its
last page when it has more than two; then what each id route's declaration samples
(``Route.sample``, read from the first page of the list that lists it), then what each
list route's declaration samples (read from its own first page). The standard routes
sample five expenses and an unknown id, eight accounts by id, four by name and an
unknown one, each expense filter alone with values of the data and in combinations,
and the account filters (``gateway.routing.standard``).

Given the same data, the same requests, in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from yarl import URL

from gateway.errors import ConfigError, InvalidParameters, RequestError
from gateway.records.routes import RecordQuery, check_segment, parse_record_query
from gateway.routing.routes import Route, RouteTable
from gateway.routing.sampling import Record, Seeds
from gateway.routing.standard import ROUTES, UNKNOWN_ACCOUNT, UNKNOWN_EXPENSE

__all__ = [
    "MAX_REQUESTS",
    "SEED_LIMIT",
    "UNKNOWN_ACCOUNT",
    "UNKNOWN_EXPENSE",
    "Sample",
    "parse_target",
    "read_requests",
    "sample_requests",
    "seed_queries",
    "target",
]

# the limit of the seed pages (and of the sample's list pages), at most limits.max_limit
SEED_LIMIT = 20
# more lines than this in a requests file is a mistake, not a sample
MAX_REQUESTS = 10_000


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


def parse_target(line: str, *, max_limit: int, routes: RouteTable = ROUTES) -> RecordQuery:
    """The validated query of one ``path?query`` as a caller sends it to the gateway:
    the route found by its path (an id route's id is its last segment, decoded as the
    gateway's router decodes it), the query read as aiohttp reads it. Raises
    RequestError (InvalidParameters) or ValueError saying what is wrong."""
    raw_path, _, query_string = line.partition("?")
    matched = routes.match(raw_path)
    if matched is None:
        known = ", ".join(route.template for route in routes)
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


def read_requests(
    path: Path, *, max_limit: int, routes: RouteTable = ROUTES
) -> tuple[RecordQuery, ...]:
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
            queries.append(parse_target(line, max_limit=max_limit, routes=routes))
        except (RequestError, ValueError) as exc:
            raise ConfigError(f"--requests {path}, line {number}: {_shown(line)}: {exc}") from exc
    if not queries:
        raise ConfigError(f"--requests {path}: no requests (only blank lines and comments)")
    return tuple(queries)


def _shown(line: str) -> str:
    return repr(line if len(line) <= 120 else line[:117] + "...")


def seed_queries(*, max_limit: int, routes: RouteTable = ROUTES) -> dict[str, RecordQuery]:
    """The first page of each list (``SEED_LIMIT`` items, at most ``max_limit``), by
    route name: what :func:`sample_requests` takes its ids and values from."""
    limit = str(min(SEED_LIMIT, max_limit))
    return {
        route.name: parse_record_query(route, None, [("limit", limit)], max_limit=max_limit)
        for route in routes.list_routes()
    }


def sample_requests(
    seeds: Mapping[str, Any], *, max_limit: int, routes: RouteTable = ROUTES
) -> Sample:
    """The default sample (see the module's docstring) from ``seeds``: the published
    bodies of the first pages of :func:`seed_queries`, by route name; a list missing from
    ``seeds`` (the primary did not give it) has its pages asked for still, but nothing
    taken from it, and the sample says so in its gaps."""
    maker = _Maker(max_limit)
    limit = str(min(SEED_LIMIT, max_limit))
    lists: dict[str, Sequence[Record]] = {}
    for route in routes.list_routes():
        body = seeds.get(route.name)
        lists[route.name] = _records(body)
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
    for route in routes.id_routes():
        maker.sampled(route, Seeds(lists.get(route.listed_by or "", ()), lists, None))
    for route in routes.list_routes():
        maker.sampled(route, Seeds(lists[route.name], lists, limit))
    return Sample(tuple(maker.queries), tuple(maker.gaps))


def _records(body: Any) -> list[Record]:
    items = body.get("data") if isinstance(body, dict) else None
    return [item for item in items or () if isinstance(item, dict)]


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

    def sampled(self, route: Route, seeds: Seeds) -> None:
        """Add what ``route``'s declaration samples of ``seeds``."""
        for sampler in route.sample:
            for pairs in sampler.pairs(seeds):
                path_value = None
                if route.path_param is not None:
                    path_value = dict(pairs)[route.path_param]
                    pairs = tuple(pair for pair in pairs if pair[0] != route.path_param)
                self.add(route, path_value, *pairs)
