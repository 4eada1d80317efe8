"""What many comparisons of a primary and a candidate upstream add up to, per route:
the report of the shadow traffic (``GET /admin/shadow``) and of ``records-gateway
compare``.

Each request compared ends as one :data:`OUTCOMES`: ``identical``; ``different`` (a
field differs that is not known as noise); ``noise`` (only noisy fields differ);
``candidate_error`` (the candidate gave no answer to compare: a 5xx, a 429, a timeout,
a lost connection, a body that does not fit the published schema); ``skipped`` (shadow
traffic only: too many candidate calls under way already).

Noise is told from regressions as Diffy does: the primary is asked the same request
a second time, and a difference between the primary's two answers is noise for that
route (timestamps, generated values). Noise is known by field *and kind*: a list whose
length changes between two primary answers (live data) makes the length of that list
noise, not the order of its items nor a record the candidate leaves out. Differences
that are noise are counted, and reported apart from the others.

Every value a report holds comes from the answers' bodies (cut short) and the
request's id; no header is kept, and a value that holds the caller's token (an
upstream that echoes it) has it replaced by ``[redacted]``.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.comparison.diff import KINDS, Difference, shown

OUTCOMES = ("identical", "different", "noise", "candidate_error", "skipped")
EXAMPLES_KEPT = 5
REDACTED = "[redacted]"
# more (field, kind) pairs than a route's published schema has are not kept
_FIELDS_KEPT = 1024
# the pairs of whole answers kept a route (those of the requests the report's examples
# name), and the largest answer kept (a page of about twenty records); every worker's
# are handed to the others with its counts
ANSWERS_KEPT = 10
ANSWER_MAX_BYTES = 32 * 1024
_ANSWER_PARTS = ("target", "primary", "candidate")
_serials = itertools.count(1)

# a field path and a kind of difference: what is counted, and what noise is known by
Spot = tuple[str, str]


def _spot(difference: Difference) -> Spot:
    return (difference.field, difference.kind)


def _redacted(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret in it replaced by ``[redacted]``."""
    for secret in sorted(secrets, key=len, reverse=True):  # a whole header first
        text = text.replace(secret, REDACTED)
    return text


def _scrubbed(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` as a report shows it (``diff.shown``), with every secret in it
    replaced by ``[redacted]``."""
    value = shown(value)
    if not secrets or value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _redacted(value, secrets)
    text = orjson.dumps(value).decode()
    if not any(secret in text for secret in secrets):
        return value
    return _scrubbed(text, secrets)  # (a container holding one: shown as its text)


@dataclass(slots=True)
class SpotTally:
    """The differences of one field of one kind: how many, and the first few."""

    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, difference: Difference, request_id: str, secrets: tuple[str, ...]) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES_KEPT:
            self.examples.append(
                {
                    "requestId": request_id,
                    "kind": difference.kind,
                    "primary": _scrubbed(difference.primary, secrets),
                    "candidate": _scrubbed(difference.candidate, secrets),
                }
            )

    def snapshot(self) -> dict[str, Any]:
        return {"count": self.count, "examples": list(self.examples)}

    def absorb(self, snapshot: dict[str, Any]) -> None:
        self.count += int(snapshot["count"])
        room = EXAMPLES_KEPT - len(self.examples)
        self.examples.extend(list(snapshot["examples"])[: max(room, 0)])


def _counted(spots: dict[Spot, SpotTally], difference: Difference) -> SpotTally | None:
    """The tally of ``difference``'s spot, made when there is room."""
    spot = _spot(difference)
    counted = spots.get(spot)
    if counted is None and len(spots) < _FIELDS_KEPT:
        counted = spots[spot] = SpotTally()
    return counted


def _by_field(spots: Iterable[tuple[Spot, SpotTally]]) -> list[dict[str, Any]]:
    """Spots grouped by field, worst first: each field's total, count of each kind,
    and up to five examples."""
    fields: dict[str, dict[str, Any]] = {}
    for (path, kind), counted in spots:
        entry = fields.setdefault(path, {"field": path, "total": 0, "kinds": {}, "examples": []})
        entry["total"] += counted.count
        if counted.count:
            entry["kinds"][kind] = counted.count
        entry["examples"].extend(counted.examples)
    for entry in fields.values():
        entry["kinds"] = {kind: entry["kinds"][kind] for kind in KINDS if kind in entry["kinds"]}
        entry["examples"] = entry["examples"][:EXAMPLES_KEPT]
    return sorted(fields.values(), key=lambda entry: (-entry["total"], entry["field"]))


@dataclass(slots=True)
class RouteTally:
    """The comparisons of one route."""

    outcomes: Counter[str] = field(default_factory=Counter)
    candidate_errors: Counter[str] = field(default_factory=Counter)
    spots: dict[Spot, SpotTally] = field(default_factory=dict)
    # the primary against itself: the evidence that a difference is noise
    noise: dict[Spot, SpotTally] = field(default_factory=dict)
    # differences checked against a second primary answer at least once
    rechecked: set[Spot] = field(default_factory=set)
    # the whole answers of the first requests that differed, by request id
    answers: dict[str, dict[str, str]] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        """Everything counted, as JSON-ready data that :meth:`absorb` adds up."""
        return {
            "outcomes": dict(self.outcomes),
            "candidateErrors": dict(self.candidate_errors),
            "spots": [[*spot, counted.snapshot()] for spot, counted in self.spots.items()],
            "noise": [[*spot, counted.snapshot()] for spot, counted in self.noise.items()],
            "rechecked": sorted(self.rechecked),
            "answers": self.answers,
        }

    def absorb(self, snapshot: dict[str, Any]) -> None:
        """Add the counts of another process's :meth:`snapshot`."""
        self.outcomes.update({str(k): int(v) for k, v in snapshot["outcomes"].items()})
        self.candidate_errors.update(
            {str(k): int(v) for k, v in snapshot["candidateErrors"].items()}
        )
        for mine, theirs in ((self.spots, snapshot["spots"]), (self.noise, snapshot["noise"])):
            for path, kind, counted in theirs:
                spot = (str(path), str(kind))
                if spot not in mine:
                    if len(mine) >= _FIELDS_KEPT:
                        continue
                    mine[spot] = SpotTally()
                mine[spot].absorb(counted)
        for path, kind in snapshot["rechecked"][:_FIELDS_KEPT]:
            self.rechecked.add((str(path), str(kind)))
        for request_id, kept in dict(snapshot.get("answers", {})).items():
            if len(self.answers) < ANSWERS_KEPT:
                self.answers[str(request_id)] = {name: str(kept[name]) for name in _ANSWER_PARTS}

    @property
    def compared(self) -> int:
        """Requests with two answers compared (identical, different or noise)."""
        return self.outcomes["identical"] + self.outcomes["different"] + self.outcomes["noise"]

    def report(self) -> dict[str, Any]:
        compared = self.compared
        noise = self.noise
        regressions = [(spot, tally) for spot, tally in self.spots.items() if spot not in noise]
        noisy = [(spot, tally) for spot, tally in self.spots.items() if spot in noise]
        # noise the primary showed that no candidate answer did (yet)
        noisy += [(spot, SpotTally()) for spot in noise if spot not in self.spots]
        noise_fields = _by_field(noisy)
        for entry in noise_fields:
            entry["evidence"] = [
                example
                for (path, _), evidence in noise.items()
                if path == entry["field"]
                for example in evidence.examples
            ][:EXAMPLES_KEPT]
        return {
            "compared": compared,
            "identical": self.outcomes["identical"],
            "identicalShare": round(self.outcomes["identical"] / compared, 4) if compared else None,
            "different": self.outcomes["different"],
            "noiseOnly": self.outcomes["noise"],
            "candidateErrors": dict(self.candidate_errors.most_common()),
            "skipped": self.outcomes["skipped"],
            "fields": _by_field(regressions),
            "noise": noise_fields,
        }


class Tally:
    """The comparisons of every route since it was made."""

    def __init__(self, *, primary: str, candidate: str) -> None:
        self.primary = primary
        self.candidate = candidate
        self._routes: dict[str, RouteTally] = {}
        self._since = time.time()
        self._changes = 0
        # this tally among every tally of the process (a new one is a new report)
        self.serial = next(_serials)

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
        """Add the counts of :meth:`snapshot` of a tally of the same two upstreams.
        Raises KeyError, TypeError or ValueError for data of another shape."""
        self._since = min(self._since, float(snapshot["since"]))
        for name, routed in snapshot["routes"].items():
            self.route(str(name)).absorb(routed)

    def route(self, name: str) -> RouteTally:
        tally = self._routes.get(name)
        if tally is None:
            tally = self._routes[name] = RouteTally()
        return tally

    def needs_recheck(self, route: str, differences: list[Difference]) -> bool:
        """Whether a difference of this field and kind was never checked against a
        second primary answer on ``route`` (then the primary is asked again, whatever
        the sample)."""
        rechecked = self.route(route).rechecked
        return any(_spot(difference) not in rechecked for difference in differences)

    def learn_noise(
        self,
        route: str,
        checked: Iterable[Difference],
        primary_against_itself: list[Difference],
        request_id: str,
        *,
        secrets: tuple[str, ...] = (),
    ) -> None:
        """What a second primary answer said: ``checked`` (the candidate's differences
        of that request) were rechecked; the differences of ``primary_against_itself``
        (each field with its kind) are noise. ``secrets``: text never to show."""
        tally = self.route(route)
        self._changes += 1
        for difference in checked:
            if len(tally.rechecked) < _FIELDS_KEPT:
                tally.rechecked.add(_spot(difference))
        for difference in primary_against_itself:
            evidence = _counted(tally.noise, difference)
            if evidence is not None:
                evidence.add(difference, request_id, secrets)

    def is_noise(self, route: str, difference: Difference) -> bool:
        """Whether ``difference`` (its field and kind) is noise on ``route``."""
        return _spot(difference) in self.route(route).noise

    def record(
        self,
        route: str,
        request_id: str,
        differences: list[Difference],
        *,
        secrets: tuple[str, ...] = (),
    ) -> str:
        """Count one request compared; returns its outcome (identical, different or
        noise, by the noise known now). ``secrets``: text never to show (the caller's
        token)."""
        tally = self.route(route)
        if not differences:
            outcome = "identical"
        else:
            noise = tally.noise
            outcome = "noise" if all(_spot(d) in noise for d in differences) else "different"
            for difference in differences:
                counted = _counted(tally.spots, difference)
                if counted is not None:
                    counted.add(difference, request_id, secrets)
        tally.outcomes[outcome] += 1
        self._changes += 1
        return outcome

    def keep_answers(
        self,
        route: str,
        request_id: str,
        target: str,
        primary: bytes,
        candidate: bytes,
        secrets: tuple[str, ...] = (),
    ) -> None:
        """Keep the two published answers of a request that differed, for a report's
        side-by-side view, when an example of the report names it: at most
        :data:`ANSWERS_KEPT` a route, each at most :data:`ANSWER_MAX_BYTES` (a larger
        pair is not kept). ``secrets``: text never to show."""
        tally = self.route(route)
        answers = tally.answers
        if len(answers) >= ANSWERS_KEPT or max(len(primary), len(candidate)) > ANSWER_MAX_BYTES:
            return
        named = any(
            example["requestId"] == request_id
            for counted in tally.spots.values()
            for example in counted.examples
        )
        if not named:
            return
        parts = (target, primary.decode(), candidate.decode())
        answers[request_id] = dict(
            zip(_ANSWER_PARTS, (_redacted(part, secrets) for part in parts), strict=True)
        )
        self._changes += 1

    def answers(self, request_id: str) -> dict[str, str] | None:
        """The kept answers of ``request_id`` (its route, target, and the primary's and
        the candidate's published answers, as JSON text), or None."""
        for name, tally in self._routes.items():
            kept = tally.answers.get(request_id)
            if kept is not None:
                return {"requestId": request_id, "route": name, **kept}
        return None

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
