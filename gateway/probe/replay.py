"""``records-gateway compare``: the same requests to the configured upstream (the
primary) and to a candidate, their answers diffed as the gateway's callers would read
them.

Each request (``gateway.probe.sample``: a requests file, or the sample made from the
primary's first pages) goes three times: once to the candidate and twice to the
primary, with the same ``X-Request-ID`` (``compare-<n>``) and the same token, a few
requests at a time (:data:`CONCURRENCY`), without a circuit breaker. Every answer is
brought to the published schema and compared with ``gateway.comparison.diff``.

Noise is found before anything is judged: once every answer is in, each request's two
primary answers are compared, and whatever differs between them is noise for that
route (``Tally.learn_noise``; two answers of different statuses teach nothing of the
fields); only then is each candidate answer recorded against the first primary answer
(``Tally.record``), so that every request is judged with all the evidence, not only
that of the requests before it.

What an answer is:

- a 200 whose body normalises, or a 401, 403 or 404 from the candidate (compared as a
  status: a candidate that refuses what the primary serves differs at ``(status)``);
  a 403 or 404 from the primary is an answer too;
- otherwise an error, named as the tally names it: the status (``503``, ``429``,
  ``400``), ``timeout``, ``unreachable``, or ``invalid-body`` (a 2xx whose body is not
  JSON, does not fit the published schema or is over ``upstream.max_body_bytes``).

A candidate error is counted against the candidate (``Tally.candidate_failed``). A
request on which either primary answer is an error, or a 401 (the primary refused the
token: two refusals compared would prove nothing), is a *primary error*: it is not
compared, it is counted apart, and it makes the exit status 1, since the comparison
is incomplete.

Exit status (:attr:`Comparison.exit_code`): 0 when every request was compared and
nothing but noise differs; 1 when a request differs in more than noise, the candidate
failed one, or the primary failed one. The report holds the answers' values (cut
short), the requests' paths and ids, never a header: the token is in none of it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gateway.comparison.diff import Answer, Difference, NotComparable, answer_of, compare
from gateway.comparison.shadow import COMPARED_STATUSES
from gateway.comparison.tally import Tally
from gateway.comparison.terminal import to_text as tally_text
from gateway.config.settings import (
    ShadowSettings,
    UpstreamSettings,
    describe_validation_error,
)
from gateway.errors import (
    AuthenticationRequired,
    ConfigError,
    UpstreamContractError,
    UpstreamError,
)
from gateway.probe.sample import Sample, sample_requests, seed_queries, target
from gateway.records.credentials import parse_authorization
from gateway.records.routes import RecordQuery
from gateway.routing.routes import RouteTable
from gateway.routing.standard import ROUTES
from gateway.upstream.client import UpstreamClient, outcome_of
from gateway.upstream.link import UpstreamLink

# requests under way at once (each: one candidate call, two primary calls)
CONCURRENCY = 4
REQUEST_ID_PREFIX = "compare-"
_TLS_KEYS = ("ca_file", "client_cert_file", "client_key_file", "tls_verify")


@dataclass(frozen=True, slots=True)
class Failed:
    """A call that gave no answer to compare: what (``503``, ``timeout``, ...) and the
    detail (the upstream error's, never quoting a token)."""

    what: str
    detail: str


Result = Answer | Failed


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request and its three answers."""

    request_id: str
    query: RecordQuery
    primary: Result
    again: Result  # the primary's second answer: the noise check
    candidate: Result


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What became of one request: ``identical``, ``different``, ``noise``,
    ``candidate_error`` or ``primary_error``; the fields that differed (noise too), or
    the error."""

    request_id: str
    route: str
    target: str
    outcome: str
    fields: tuple[str, ...] = ()
    error: Failed | None = None

    def report(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": self.request_id,
            "route": self.route,
            "target": self.target,
            "outcome": self.outcome,
        }
        if self.fields:
            entry["fields"] = list(self.fields)
        if self.error is not None:
            entry["error"] = self.error.what
            entry["detail"] = self.error.detail
        return entry


@dataclass(frozen=True, slots=True)
class Comparison:
    """A finished comparison: the tally, what became of each request, and the sample."""

    tally: Tally
    requests: tuple[RequestOutcome, ...]
    source: str  # "generated", or the requests file
    gaps: tuple[str, ...] = ()

    def errors(self, outcome: str) -> list[RequestOutcome]:
        return [request for request in self.requests if request.outcome == outcome]

    @property
    def exit_code(self) -> int:
        """0 when every request was compared and nothing but noise differs, else 1."""
        failed = self.tally.regressions or self.errors("primary_error")
        return 1 if failed or not self.requests else 0

    def report(self) -> dict[str, Any]:
        """``Tally.report()`` with ``totals.requests`` and ``totals.primaryErrors``,
        then ``primaryErrors`` (by route, by what), ``requests`` (each with its id,
        route, target and outcome), ``sample`` (its source and gaps) and ``exitCode``."""
        report = self.tally.report()
        primary_errors: dict[str, Counter[str]] = {}
        for request in self.errors("primary_error"):
            assert request.error is not None
            primary_errors.setdefault(request.route, Counter())[request.error.what] += 1
        report["totals"]["requests"] = len(self.requests)
        report["totals"]["primaryErrors"] = len(self.errors("primary_error"))
        report["primaryErrors"] = {
            route: dict(counts.most_common()) for route, counts in sorted(primary_errors.items())
        }
        report["requests"] = [request.report() for request in self.requests]
        report["sample"] = {"source": self.source, "gaps": list(self.gaps)}
        report["exitCode"] = self.exit_code
        return report


def candidate_settings(upstream: UpstreamSettings, base_url: str) -> UpstreamSettings:
    """The upstream settings pointed at the candidate ``base_url``, validated as
    ``upstream.base_url`` is: the upstream's timeouts, body limit and parameter names;
    for an https candidate, the TLS keys of ``[upstream.shadow]`` (the primary's are
    never used for it). Raises ConfigError naming ``--candidate`` or the shadow key."""
    shadow = upstream.shadow
    https = base_url.strip().lower().startswith("https://")
    tls = {key: getattr(shadow if https else ShadowSettings(), key) for key in _TLS_KEYS}
    try:
        return UpstreamSettings.model_validate(
            {
                **{name: getattr(upstream, name) for name in UpstreamSettings.model_fields},
                **tls,
                "base_url": base_url,
                "shadow": ShadowSettings(),
            }
        )
    except ValidationError as exc:
        key, _, message = describe_validation_error(exc).partition(": ")
        where = "--candidate" if key == "base_url" else f"upstream.shadow.{key}"
        raise ConfigError(f"{where}: {message}") from exc


def bearer(token: str) -> str:
    """The Authorization header sent to both upstreams; ConfigError (naming
    ``--token``, never quoting it) for a token the gateway would refuse from a caller."""
    try:
        return parse_authorization(f"Bearer {token}").authorization
    except AuthenticationRequired as exc:
        raise ConfigError(f"--token: {exc}") from None


async def compare_upstreams(
    primary: UpstreamSettings,
    candidate: UpstreamSettings,
    token: str,
    *,
    max_limit: int,
    queries: Sequence[RecordQuery] | None = None,
    source: str = "generated",
) -> Comparison:
    """Compare the candidate with the primary over ``queries`` (None: the generated
    sample), each over connections of its own."""
    async with UpstreamLink(primary) as primary_link, UpstreamLink(candidate) as candidate_link:
        return await run_compare(
            UpstreamClient(primary_link, primary),
            UpstreamClient(candidate_link, candidate),
            token,
            max_limit=max_limit,
            queries=queries,
            source=source,
        )


async def run_compare(
    primary: UpstreamClient,
    candidate: UpstreamClient,
    token: str,
    *,
    max_limit: int,
    queries: Sequence[RecordQuery] | None = None,
    source: str = "generated",
    routes: RouteTable = ROUTES,
) -> Comparison:
    """Send every request (None: the sample made from the primary's first pages of
    ``routes``' lists) to both upstreams, then judge them all (see the module's
    docstring)."""
    authorization = bearer(token)
    sample = (
        Sample(tuple(queries))
        if queries is not None
        else await generated_sample(primary, authorization, max_limit=max_limit, routes=routes)
    )
    exchanges = await exchange_all(primary, candidate, sample.queries, authorization)
    tally = Tally(primary=primary.base_url, candidate=candidate.base_url)
    # never shown in a report, should an upstream echo it in a field
    secrets = tuple({authorization, token} - {""})
    return Comparison(tally, tuple(judge(tally, exchanges, secrets)), source, sample.gaps)


async def generated_sample(
    primary: UpstreamClient, authorization: str, *, max_limit: int, routes: RouteTable = ROUTES
) -> Sample:
    """The sample of ``gateway.probe.sample`` from the primary's first page of each list
    of ``routes``."""
    seeds: dict[str, Any] = {}
    for name, query in seed_queries(max_limit=max_limit, routes=routes).items():
        answer = await _fetch_result(
            primary, query, authorization, f"{REQUEST_ID_PREFIX}seed-{name}"
        )
        if isinstance(answer, Answer) and answer.status == 200:
            seeds[name] = answer.published
    return sample_requests(seeds, max_limit=max_limit, routes=routes)


async def exchange_all(
    primary: UpstreamClient,
    candidate: UpstreamClient,
    queries: Sequence[RecordQuery],
    authorization: str,
) -> list[Exchange]:
    """Every request's three answers, in the order of ``queries``; ``CONCURRENCY``
    requests under way at once, the three calls of one request at the same time."""
    exchanges: list[Exchange | None] = [None] * len(queries)
    pending: Iterator[int] = iter(range(len(queries)))

    async def worker() -> None:
        for index in pending:
            query = queries[index]
            request_id = f"{REQUEST_ID_PREFIX}{index + 1}"
            first, again, theirs = await asyncio.gather(
                _fetch_result(primary, query, authorization, request_id),
                _fetch_result(primary, query, authorization, request_id),
                _fetch_result(candidate, query, authorization, request_id),
            )
            exchanges[index] = Exchange(request_id, query, first, again, theirs)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(CONCURRENCY, len(queries))):
            group.create_task(worker())
    return [exchange for exchange in exchanges if exchange is not None]


async def _fetch_result(
    upstream: UpstreamClient, query: RecordQuery, authorization: str, request_id: str
) -> Result:
    try:
        reply = await upstream.fetch(query, authorization=authorization, request_id=request_id)
    except UpstreamError as exc:
        status = exc.upstream_status
        if status in COMPARED_STATUSES and not isinstance(exc, UpstreamContractError):
            return Answer(status)
        return Failed(outcome_of(exc), exc.detail)
    try:
        return answer_of(query.route, reply.status, reply.body, dict(query.params))
    except NotComparable as exc:
        return Failed("invalid-body", f"GET {query.route.template}: {exc.reason}")


def judge(
    tally: Tally, exchanges: Sequence[Exchange], secrets: tuple[str, ...] = ()
) -> list[RequestOutcome]:
    """Learn the noise of every request first, then record every request (see the
    module's docstring); what became of each, in order. ``secrets`` (the token) are
    never shown in the report's values."""
    checked: list[tuple[Exchange, Failed | list[Difference]]] = []
    for exchange in exchanges:
        primary = _primary_answers(exchange)
        if isinstance(primary, Failed):
            checked.append((exchange, primary))
            continue
        first, again = primary
        route, theirs = exchange.query.route, exchange.candidate
        differences = compare(route, first, theirs) if isinstance(theirs, Answer) else []
        if first.status == again.status:
            # (two statuses of the primary say nothing of which fields are noise)
            itself = compare(route, first, again)
            tally.learn_noise(route.name, differences, itself, exchange.request_id, secrets=secrets)
        checked.append((exchange, differences))
    return [_record(tally, exchange, result, secrets) for exchange, result in checked]


def _primary_answers(exchange: Exchange) -> tuple[Answer, Answer] | Failed:
    """A request's two primary answers, or why they cannot be compared with."""
    first, again = exchange.primary, exchange.again
    if isinstance(first, Failed):
        return first
    if isinstance(again, Failed):
        return again
    if 401 in (first.status, again.status):
        return Failed("401", "the primary did not accept the bearer token (status 401)")
    return first, again


def _record(
    tally: Tally,
    exchange: Exchange,
    result: Failed | list[Difference],
    secrets: tuple[str, ...],
) -> RequestOutcome:
    request_id, route = exchange.request_id, exchange.query.route.name
    where = target(exchange.query)
    if isinstance(result, Failed):
        return RequestOutcome(request_id, route, where, "primary_error", error=result)
    theirs = exchange.candidate
    if isinstance(theirs, Failed):
        tally.candidate_failed(route, theirs.what)
        return RequestOutcome(request_id, route, where, "candidate_error", error=theirs)
    verdict = tally.record(route, request_id, result, secrets=secrets)
    fields = tuple(sorted({difference.field for difference in result}))
    return RequestOutcome(request_id, route, where, verdict, fields)


def to_json(comparison: Comparison) -> str:
    """The report (:meth:`Comparison.report`) as JSON."""
    return json.dumps(comparison.report(), indent=2, ensure_ascii=False, default=str)


def to_text(comparison: Comparison) -> str:
    """The report for a person: the tally's text, the errors' details, the sample, and
    the verdict last."""
    report = comparison.report()
    lines = [tally_text(report), ""]
    primary_errors = report["primaryErrors"]
    if primary_errors:
        lines.append("primary errors (these requests were not compared):")
        for route, counts in primary_errors.items():
            shown = ", ".join(f"{what} x{count}" for what, count in counts.items())
            lines.append(f"   {route}: {shown}")
    for outcome, whose in (("primary_error", "primary"), ("candidate_error", "candidate")):
        first_of: dict[str, RequestOutcome] = {}
        for request in comparison.errors(outcome):
            assert request.error is not None
            first_of.setdefault(request.error.what, request)
        for what, request in first_of.items():
            assert request.error is not None
            lines.append(
                f"{whose} {what}, e.g. request {request.request_id} ({request.target}):"
                f" {request.error.detail}"
            )
    source = (
        "generated from the primary's first pages"
        if comparison.source == "generated"
        else (f"from {comparison.source}")
    )
    lines.append(f"sample: {len(comparison.requests)} requests, {source}")
    lines += [f"   left out: {gap}" for gap in comparison.gaps]
    lines.append(_verdict(comparison, report["totals"]))
    return "\n".join(lines)


def _verdict(comparison: Comparison, totals: dict[str, Any]) -> str:
    if comparison.exit_code == 0:
        return f"Exit 0: {totals['compared']} requests compared; nothing but noise differs."
    return (
        f"Exit 1: {totals['different']} different, {totals['candidateErrors']} candidate"
        f" errors, {totals['primaryErrors']} primary errors (not compared)."
    )
