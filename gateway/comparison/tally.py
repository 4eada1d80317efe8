"""What many comparisons of a primary and a candidate upstream add up to, per route:
the report of the shadow traffic (``GET /admin/shadow``) and of ``records-gateway
compare``.

Each request compared ends as one :data:`OUTCOMES`: ``identical``; ``different`` (a
field differs that is not known as noise); ``noise`` (only noisy fields differ);
``candidate_error`` (the candidate gave no answer to compare: a 5xx, a 429, a timeout,
a lost connection, a body that does not fit the published schema); ``skipped`` (shadow
traffic only: too many candidate calls under way already).

Noise is told from regressions as Diffy does: the primary is asked the same request
a second time, and a field that differs between the primary's two answers is noise
for that route (timestamps, generated values). Differences of noisy fields are
counted, and reported apart from the others.

Every value a report holds comes from the answers' bodies (cut short) and the
request's id; no header is kept, so no token can appear in it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.comparison.diff import KINDS, Difference

OUTCOMES = ("identical", "different", "noise", "candidate_error", "skipped")
EXAMPLES_KEPT = 5
# more distinct field paths than a route's published schema has are not kept
_FIELDS_KEPT = 256


@dataclass(slots=True)
class FieldTally:
    """The differences of one field path: how many of each kind, and the first few."""

    kinds: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, difference: Difference, request_id: str) -> None:
        self.kinds[difference.kind] += 1
        if len(self.examples) < EXAMPLES_KEPT:
            self.examples.append(
                {
                    "requestId": request_id,
                    "kind": difference.kind,
                    "primary": difference.primary,
                    "candidate": difference.candidate,
                }
            )

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    def snapshot(self) -> dict[str, Any]:
        return {"kinds": dict(self.kinds), "examples": list(self.examples)}

    def absorb(self, snapshot: dict[str, Any]) -> None:
        self.kinds.update(snapshot["kinds"])
        room = EXAMPLES_KEPT - len(self.examples)
        self.examples.extend(snapshot["examples"][: max(room, 0)])

    def report(self, path: str) -> dict[str, Any]:
        return {
            "field": path,
            "total": self.total,
            "kinds": {kind: self.kinds[kind] for kind in KINDS if self.kinds[kind]},
            "examples": list(self.examples),
        }


@dataclass(slots=True)
class RouteTally:
    """The comparisons of one route."""

    outcomes: Counter[str] = field(default_factory=Counter)
    candidate_errors: Counter[str] = field(default_factory=Counter)
    fields: dict[str, FieldTally] = field(default_factory=dict)
    # the primary against itself: the evidence that a field is noise
    noise: dict[str, FieldTally] = field(default_factory=dict)
    # fields whose difference was checked against a second primary answer at least once
    rechecked: set[str] = field(default_factory=set)

    def snapshot(self) -> dict[str, Any]:
        """Everything counted, as JSON-ready data that :meth:`absorb` adds up."""
        return {
            "outcomes": dict(self.outcomes),
            "candidateErrors": dict(self.candidate_errors),
            "fields": {path: tally.snapshot() for path, tally in self.fields.items()},
            "noise": {path: tally.snapshot() for path, tally in self.noise.items()},
            "rechecked": sorted(self.rechecked),
        }

    def absorb(self, snapshot: dict[str, Any]) -> None:
        """Add the counts of another process's :meth:`snapshot`."""
        self.outcomes.update(snapshot["outcomes"])
        self.candidate_errors.update(snapshot["candidateErrors"])
        for mine, theirs in ((self.fields, snapshot["fields"]), (self.noise, snapshot["noise"])):
            for path, counted in theirs.items():
                if path not in mine:
                    if len(mine) >= _FIELDS_KEPT:
                        continue
                    mine[path] = FieldTally()
                mine[path].absorb(counted)
        self.rechecked.update(snapshot["rechecked"][:_FIELDS_KEPT])

    @property
    def compared(self) -> int:
        """Requests with two answers compared (identical, different or noise)."""
        return self.outcomes["identical"] + self.outcomes["different"] + self.outcomes["noise"]

    def report(self) -> dict[str, Any]:
        compared = self.compared
        noisy = set(self.noise)
        regressions = [(path, tally) for path, tally in self.fields.items() if path not in noisy]
        noise = [(path, tally) for path, tally in self.fields.items() if path in noisy]
        return {
            "compared": compared,
            "identical": self.outcomes["identical"],
            "identicalShare": round(self.outcomes["identical"] / compared, 4) if compared else None,
            "different": self.outcomes["different"],
            "noiseOnly": self.outcomes["noise"],
            "candidateErrors": dict(self.candidate_errors.most_common()),
            "skipped": self.outcomes["skipped"],
            "fields": [tally.report(path) for path, tally in _worst_first(regressions)],
            "noise": [
                {**tally.report(path), "evidence": self.noise[path].examples}
                for path, tally in _worst_first(noise)
            ]
            + [
                {"field": path, "total": 0, "kinds": {}, "examples": [], "evidence": evidence}
                for path, evidence in sorted(
                    (path, tally.examples)
                    for path, tally in self.noise.items()
                    if path not in self.fields
                )
            ],
        }


def _worst_first(fields: Iterable[tuple[str, FieldTally]]) -> list[tuple[str, FieldTally]]:
    return sorted(fields, key=lambda item: (-item[1].total, item[0]))


class Tally:
    """The comparisons of every route since the start or the last :meth:`reset`."""

    def __init__(self, *, primary: str, candidate: str) -> None:
        self.primary = primary
        self.candidate = candidate
        self._routes: dict[str, RouteTally] = {}
        self._since = time.time()
        self._changes = 0

    @property
    def changes(self) -> int:
        """How many times something was counted (a snapshot is worth writing again
        only when this moved)."""
        return self._changes

    def snapshot(self) -> dict[str, Any]:
        """Everything counted, as JSON-ready data: what another process's
        :meth:`absorb` adds to its own (the workers of one instance, one report)."""
        return {
            "primary": self.primary,
            "candidate": self.candidate,
            "since": self._since,
            "routes": {name: tally.snapshot() for name, tally in self._routes.items()},
        }

    def absorb(self, snapshot: dict[str, Any]) -> None:
        """Add the counts of :meth:`snapshot` of a tally of the same two upstreams."""
        self._since = min(self._since, float(snapshot["since"]))
        for name, routed in snapshot["routes"].items():
            self.route(name).absorb(routed)

    def route(self, name: str) -> RouteTally:
        tally = self._routes.get(name)
        if tally is None:
            tally = self._routes[name] = RouteTally()
        return tally

    def needs_recheck(self, route: str, differences: list[Difference]) -> bool:
        """Whether a field of ``differences`` was never checked against a second primary
        answer on ``route`` (then the primary is asked again, whatever the sample)."""
        rechecked = self.route(route).rechecked
        return any(difference.field not in rechecked for difference in differences)

    def learn_noise(
        self,
        route: str,
        checked: Iterable[Difference],
        primary_against_itself: list[Difference],
        request_id: str,
    ) -> None:
        """What a second primary answer said: ``checked`` (the candidate's differences
        of that request) were rechecked; the fields of ``primary_against_itself`` are
        noise."""
        tally = self.route(route)
        self._changes += 1
        for difference in checked:
            if len(tally.rechecked) < _FIELDS_KEPT:
                tally.rechecked.add(difference.field)
        for difference in primary_against_itself:
            evidence = tally.noise.get(difference.field)
            if evidence is None:
                if len(tally.noise) >= _FIELDS_KEPT:
                    continue
                evidence = tally.noise[difference.field] = FieldTally()
            evidence.add(difference, request_id)

    def noisy(self, route: str) -> frozenset[str]:
        return frozenset(self.route(route).noise)

    def record(self, route: str, request_id: str, differences: list[Difference]) -> str:
        """Count one request compared; returns its outcome (identical, different or
        noise, by the noise known now)."""
        tally = self.route(route)
        if not differences:
            outcome = "identical"
        else:
            noisy = tally.noise
            outcome = "noise" if all(d.field in noisy for d in differences) else "different"
            for difference in differences:
                counted = tally.fields.get(difference.field)
                if counted is None:
                    if len(tally.fields) >= _FIELDS_KEPT:
                        continue
                    counted = tally.fields[difference.field] = FieldTally()
                counted.add(difference, request_id)
        tally.outcomes[outcome] += 1
        self._changes += 1
        return outcome

    def candidate_failed(self, route: str, what: str) -> None:
        """Count a request whose candidate gave no answer to compare (``what``: its
        status, or ``timeout``, ``unreachable``, ``invalid-body``)."""
        tally = self.route(route)
        tally.outcomes["candidate_error"] += 1
        tally.candidate_errors[what] += 1
        self._changes += 1

    def skipped(self, route: str) -> None:
        self.route(route).outcomes["skipped"] += 1
        self._changes += 1

    @property
    def regressions(self) -> int:
        """Requests that differ in more than noise, or whose candidate failed."""
        return sum(
            tally.outcomes["different"] + tally.outcomes["candidate_error"]
            for tally in self._routes.values()
        )

    def report(self) -> dict[str, Any]:
        """The report as JSON-ready data: per route (worst fields first), and totals."""
        routes = {name: self._routes[name].report() for name in sorted(self._routes)}
        totals: Counter[str] = Counter()
        for tally in self._routes.values():
            totals.update(tally.outcomes)
        compared = totals["identical"] + totals["different"] + totals["noise"]
        return {
            "primary": self.primary,
            "candidate": self.candidate,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._since)),
            "totals": {
                "compared": compared,
                "identical": totals["identical"],
                "identicalShare": round(totals["identical"] / compared, 4) if compared else None,
                "different": totals["different"],
                "noiseOnly": totals["noise"],
                "candidateErrors": totals["candidate_error"],
                "skipped": totals["skipped"],
            },
            "routes": routes,
        }
