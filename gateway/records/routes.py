"""The validation of a request against its route's declaration (gateway.routing).

Validation turns the raw path and query into a :class:`RecordQuery`: typed,
canonical values with defaults filled in, in a fixed order. Nothing reaches the
upstream unless it passed here, and the canonical form is what the cache keys on,
so ``?limit=10&page=1``, ``?page=1`` and no query are one and the same request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_to_bytes

from gateway.errors import InvalidParameters, ParameterProblem
from gateway.routing.parameters import Problems
from gateway.routing.routes import Route

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class RecordQuery:
    """A validated request for one route, in canonical form."""

    route: Route
    path_value: str | None
    params: tuple[tuple[str, str], ...]
    canonical_text: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        segment = "" if self.path_value is None else encode_segment(self.path_value)
        query = "&".join(f"{name}={quote(value, safe='')}" for name, value in self.params)
        object.__setattr__(self, "canonical_text", f"{self.route.name}|{segment}|{query}")

    def upstream_path(self) -> str:
        """The path to request upstream, already percent-encoded."""
        if self.path_value is None:
            return self.route.template
        prefix = self.route.template.split("{", 1)[0]
        return prefix + encode_segment(self.path_value)

    def upstream_params(self, names: Mapping[str, str]) -> list[tuple[str, str]]:
        """The query to send upstream, each parameter under the upstream's name for it
        (``names``: the gateway's name to the upstream's, where they differ)."""
        return [(names.get(name, name), value) for name, value in self.params]

    def canonical(self) -> str:
        """A stable text for this request, e.g. for a cache key."""
        return self.canonical_text


def encode_segment(value: str) -> str:
    """Percent-encode ``value`` as exactly one path segment.

    Every reserved character is encoded, ``/`` and ``?`` included, and a segment
    made only of dots is encoded too, so that nothing can reach another path.
    """
    encoded = quote(value, safe="")
    if encoded.strip(".") == "":
        encoded = encoded.replace(".", "%2E")
    return encoded


def check_segment(name: str, raw: str) -> None:
    """Raise InvalidParameters when ``raw``, a path segment as sent (not decoded), has a
    ``%`` that starts no escape or escapes that are not UTF-8.

    aiohttp's router leaves such a segment as it is (``%zz``, ``%ff``): forwarded, it
    would be read as the id ``%zz``, the one ``%25zz`` names, not what the caller sent.
    """
    if "%" not in raw:
        return
    if _BAD_ESCAPE.search(raw) is not None:
        message = "has a % that starts no percent-escape (write a % itself as %25)"
    else:
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            message = "is not valid UTF-8 once percent-decoded"
        else:
            return
    raise InvalidParameters([ParameterProblem(name, message)])


def parse_record_query(
    route: Route,
    path_value: str | None,
    query: Iterable[tuple[str, str]],
    *,
    max_limit: int,
) -> RecordQuery:
    """Validate one request for ``route`` as its declaration says; raise
    InvalidParameters listing every problem: unknown and repeated parameters first, then
    the path parameter, then each query parameter in the route's order, then the
    route's rules."""
    problems = Problems()
    names = route.query_params
    given = _given(names, query, problems)
    canonical_path: str | None = None
    if route.path is not None:
        canonical_path = route.path.check(path_value or "", problems, max_limit)
    values: dict[str, str] = {}
    for param in route.query:
        raw = given.get(param.name)
        if raw is None:
            raw = param.kind.default(max_limit)
            if raw is None:
                continue
        checked = param.check(raw, problems, max_limit)
        if checked is not None:
            values[param.name] = checked
    for rule in route.rules:
        rule.check(values, problems)
    problems.raise_any()
    ordered = tuple((name, values[name]) for name in names if name in values)
    return RecordQuery(route=route, path_value=canonical_path, params=ordered)


def _given(
    names: tuple[str, ...], query: Iterable[tuple[str, str]], problems: Problems
) -> dict[str, str]:
    """The query's values by name; an unknown or repeated name is a problem."""
    allowed = ", ".join(names) or "none"
    given: dict[str, str] = {}
    for name, value in query:
        if name not in names:
            problems.add(name, f"unknown query parameter; allowed: {allowed}")
        elif name in given:
            problems.add(name, f"given more than once; allowed once each: {allowed}")
        else:
            given[name] = value
    return given


class QueryMemo:
    """Validated queries by their raw form, so that a repeated request is validated once.

    Validation is a pure function of the route, the path value, the raw (undecoded)
    query string and ``max_limit``; only valid queries up to ``longest`` characters are
    remembered, at most ``size`` of them (about 1 KB each): past it the oldest is
    forgotten, so that a set of queries larger than the memo costs a validation (a few
    microseconds) for the ones forgotten, never a memo emptied at once.
    """

    def __init__(self, size: int = 4096, longest: int = 512) -> None:
        self.size = size
        self._longest = longest
        self._known: dict[tuple[str, str | None, str, int], RecordQuery] = {}

    def __len__(self) -> int:
        return len(self._known)

    def known(
        self, route: Route, path_value: str | None, query_string: str, max_limit: int
    ) -> RecordQuery | None:
        """The query already validated for this raw form, or None (``parse`` it)."""
        return self._known.get((route.name, path_value, query_string, max_limit))

    def parse(
        self,
        route: Route,
        path_value: str | None,
        query_string: str,
        query: Callable[[], Iterable[tuple[str, str]]],
        *,
        max_limit: int,
    ) -> RecordQuery:
        """``query`` gives the parsed pairs of ``query_string``; called on a miss only."""
        memo_key = (route.name, path_value, query_string, max_limit)
        known = self._known.get(memo_key)
        if known is not None:
            return known
        parsed = parse_record_query(route, path_value, query(), max_limit=max_limit)
        if len(query_string) + len(path_value or "") > self._longest:
            return parsed  # long ones are rare: remembering them would only cost memory
        known_queries = self._known
        if len(known_queries) >= self.size:
            del known_queries[next(iter(known_queries))]
        known_queries[memo_key] = parsed
        return parsed
