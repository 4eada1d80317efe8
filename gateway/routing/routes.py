"""The declaration of a record route, and a table of them.

One :class:`Route` holds everything the gateway knows of a route: its path template
and path parameter, its query parameters in canonical order, the rules between them,
the record model its answers are normalised to, its TTL key and default, and, for an
id route, the list route whose first record the probe asks for, and how ``compare``
samples it (:mod:`gateway.routing.sampling`). A :class:`RouteTable`
is what the rest of the gateway is given; :data:`gateway.routing.standard.ROUTES` is
the one it serves unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from gateway.normalise.pages import Page, RecordModel
from gateway.routing.parameters import Param, Problems
from gateway.routing.sampling import Sampler

# the bounds of every route's TTL (cache.ttl_s.<route>), in seconds
MAX_TTL_S = 86_400


class Rule(Protocol):
    """A rule between the canonical values of a route's query parameters."""

    def check(self, values: Mapping[str, str], problems: Problems) -> None:
        """Add to ``problems`` what breaks the rule; values that failed their own
        check are absent from ``values``."""


@dataclass(frozen=True, slots=True)
class NotAfter:
    """``first`` must not be after ``last`` (canonical values that order as text, such
    as dates YYYY-MM-DD); checked when both are present and valid."""

    first: str
    last: str

    def check(self, values: Mapping[str, str], problems: Problems) -> None:
        first, last = values.get(self.first), values.get(self.last)
        if first is not None and last is not None and first > last:
            problems.add(self.first, f"must not be after {self.last}")


@dataclass(frozen=True, slots=True)
class Route:
    """One record route. ``name`` is also its TTL key (``cache.ttl_s.<name>``) and its
    name in metrics, purges and reports; ``template`` has at most one ``{parameter}``,
    the last segment, which ``path`` declares. ``operation_id`` and ``text`` are its
    OpenAPI operation's id and description (its summary is the model's docstring)."""

    name: str
    template: str
    model: RecordModel
    ttl_s: int
    operation_id: str
    text: str
    query: tuple[Param, ...] = ()
    path: Param | None = None
    rules: tuple[Rule, ...] = ()
    # an id route: the list route whose first record's id the probe asks for, and
    # whose first page its sample reads
    listed_by: str | None = None
    # what ``compare``'s sample asks of it, in order (gateway.routing.sampling)
    sample: tuple[Sampler, ...] = ()
    query_params: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "query_params", tuple(param.name for param in self.query))
        if (self.path is None) != ("{" not in self.template):
            raise ValueError(f"route {self.name}: a path parameter iff the template has one")
        if self.path is not None and not self.template.endswith("/{" + self.path.name + "}"):
            raise ValueError(f"route {self.name}: the path parameter must be the last segment")
        if not 0 <= self.ttl_s <= MAX_TTL_S:
            raise ValueError(f"route {self.name}: ttl_s must be from 0 to {MAX_TTL_S}")
        declared = {*self.query_params, *([self.path.name] if self.path else [])}
        for sampler in self.sample:
            unknown = set(sampler.names()) - declared
            if unknown:
                raise ValueError(f"route {self.name}: sampled {sorted(unknown)} not declared")

    @property
    def path_param(self) -> str | None:
        """The name of the path parameter; None for a list route."""
        return None if self.path is None else self.path.name

    @property
    def is_list(self) -> bool:
        return self.path is None

    @property
    def is_page(self) -> bool:
        """Whether the answer is a page of records (else one record)."""
        return issubclass(self.model, Page)

    @property
    def parent(self) -> str:
        """An id route's path above the id (``/expenses``); a list route's whole path."""
        return self.template if self.path is None else self.template.rpartition("/")[0]


class RouteTable(Sequence[Route]):
    """Record routes in the order they are served, documented and probed.

    Raises ValueError for two routes of one name or path, for two parameters of one
    name that are not declared alike (the OpenAPI document describes a parameter once,
    by name), and for an id route whose ``listed_by`` is no list route of the table.
    """

    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.routes = routes
        self.by_name = {route.name: route for route in routes}
        self.lists = {route.template: route for route in routes if route.is_list}
        self.ids = {route.parent: route for route in routes if not route.is_list}
        if len(self.by_name) != len(routes) or len(self.lists) + len(self.ids) != len(routes):
            raise ValueError("two routes of one name or one path")
        self.params: dict[str, Param] = {}
        for route in routes:
            for param in (*([route.path] if route.path else []), *route.query):
                if self.params.setdefault(param.name, param) != param:
                    raise ValueError(f"parameter {param.name}: declared two ways")
            if route.listed_by is not None and (
                route.listed_by not in self.by_name or not self.by_name[route.listed_by].is_list
            ):
                raise ValueError(f"route {route.name}: listed_by names no list route")

    def __iter__(self) -> Iterator[Route]:
        return iter(self.routes)

    def __len__(self) -> int:
        return len(self.routes)

    @overload
    def __getitem__(self, index: int) -> Route: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Route]: ...

    def __getitem__(self, index: int | slice) -> Route | Sequence[Route]:
        return self.routes[index]

    def route(self, name: str) -> Route:
        """The route called ``name``; KeyError when there is none."""
        return self.by_name[name]

    def models(self) -> dict[str, RecordModel]:
        """The record model of each route, by route name."""
        return {route.name: route.model for route in self.routes}

    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)

    def list_routes(self) -> tuple[Route, ...]:
        return tuple(route for route in self.routes if route.is_list)

    def id_routes(self) -> tuple[Route, ...]:
        return tuple(route for route in self.routes if not route.is_list)

    def match(self, path: str) -> tuple[Route, str | None] | None:
        """The route of ``path`` as sent and its last segment, still percent-encoded,
        when it is an id route; None when ``path`` is no record route."""
        route = self.lists.get(path)
        if route is not None:
            return route, None
        parent, _, segment = path.rpartition("/")
        route = self.ids.get(parent) if segment else None
        return None if route is None else (route, segment)

    def ttls(self, configured: Mapping[str, Any]) -> dict[str, int]:
        """Each route's TTL: ``configured[name]`` when given, else the route's default."""
        return {route.name: int(configured.get(route.name, route.ttl_s)) for route in self.routes}
