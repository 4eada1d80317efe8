"""Shadow traffic: a sampled share of the requests that reach the upstream is sent
again to a candidate upstream, and the two answers are compared (``diff``) into a
:class:`~gateway.comparison.tally.Tally`.

What the caller gets never depends on the candidate: the pipeline offers a request
once the primary's answer is in hand (:meth:`Shadow.offer` is synchronous and does no
I/O), the candidate is asked in a task of its own, and nothing is parsed or compared
before the candidate's answer is in, by when the callers have theirs. Nothing of the
candidate's answer is stored or served. At most ``max_in_flight`` candidate calls run at once
(a request sampled beyond that is counted ``skipped``); each is bounded by the
upstream's timeouts; none goes through the primary's circuit breaker or metrics of
upstream calls.

The candidate gets the caller's own ``Authorization`` header (it must, to answer
as the primary would): configure only a candidate trusted with the callers' tokens.
The header is held by the task for the call only; it is never logged or kept in the
report.

A differing request is rechecked (its primary asked a second time, through the
primary's own client) when one of its fields was never rechecked on that route, and
otherwise for ``recheck_ratio`` of them: what differs between the primary's two
answers is noise (``tally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlencode

from gateway.comparison.diff import (
    STATUS_FIELD,
    Answer,
    Difference,
    NotComparable,
    answer_of,
    compare,
    field_label,
)
from gateway.comparison.tally import Tally
from gateway.comparison.workers import WorkerReports
from gateway.config.settings import ShadowSettings, UpstreamSettings
from gateway.errors import UpstreamContractError, UpstreamError, UpstreamRejected
from gateway.ops.metrics import Metrics
from gateway.ops.trace import CURRENT_TRACE, current_trace
from gateway.routing.routes import Route
from gateway.upstream.client import UpstreamClient, UpstreamQuery, UpstreamReply, outcome_of
from gateway.upstream.link import UpstreamLink

log = logging.getLogger("gateway.shadow")

# the statuses of answers about the request itself, compared as statuses (a 200 where
# the primary said 404 is a difference); any other failure is no answer to compare
COMPARED_STATUSES = frozenset({401, 403, 404})

# a second primary answer, asked through the primary's client
AskAgain = Callable[[], Awaitable[UpstreamReply]]


class ShadowQuery(UpstreamQuery, Protocol):
    """What the shadow needs of a request: what the upstream client needs, and its
    query parameters (page and limit fill an envelope that leaves them out), and its
    route's declaration (the schema its answers are compared by)."""

    @property
    def route(self) -> Route: ...

    @property
    def params(self) -> tuple[tuple[str, str], ...]: ...


def _candidate_keys(settings: UpstreamSettings) -> tuple[object, ...]:
    """What the candidate's connections depend on: a change of any makes new ones."""
    shadow = settings.shadow
    return (
        shadow.base_url,
        shadow.ca_file,
        shadow.client_cert_file,
        shadow.client_key_file,
        shadow.tls_verify,
        shadow.max_in_flight,
        settings.timeout_s,
        settings.connect_timeout_s,
        settings.max_body_bytes,
        settings.bank_code_param,
    )


class Shadow:
    """The shadow traffic of one process (see the module's docstring)."""

    def __init__(
        self,
        settings: UpstreamSettings,
        *,
        metrics: Metrics | None = None,
        sample: Callable[[], float] = random.random,
        shared: Path | None = None,
    ) -> None:
        """``sample`` draws the number in [0, 1) that decides each sampling; ``shared``
        is the folder this process's workers share, when there are several
        (gateway.comparison.workers): the report is then theirs together."""
        self._workers = None if shared is None else WorkerReports(shared)
        self._settings: ShadowSettings = settings.shadow
        self._keys = _candidate_keys(settings)
        self._primary = settings.base_url
        self._metrics = metrics
        self._sample = sample
        self.tally = Tally(primary=settings.base_url, candidate=settings.shadow.base_url or "")
        self._client: UpstreamClient | None = None
        self._link: UpstreamLink | None = None
        # comparisons under way with the current candidate (what max_in_flight bounds)
        self._running: set[asyncio.Task[None]] = set()
        # comparisons still under way with candidates a reload replaced, and their links
        self._retired: set[asyncio.Task[None]] = set()
        self._retired_links: set[UpstreamLink] = set()
        self._closers: set[asyncio.Task[None]] = set()
        if self._settings.enabled:
            self._connect(settings)

    @property
    def enabled(self) -> bool:
        return self._client is not None and self._settings.sample_ratio > 0

    @property
    def in_flight(self) -> int:
        """Comparisons under way now (with any candidate)."""
        return len(self._running) + len(self._retired)

    def _connect(self, settings: UpstreamSettings) -> None:
        candidate = settings.candidate()
        self._link = UpstreamLink(candidate)
        self._client = UpstreamClient(self._link, candidate)
        log.warning(
            "shadow traffic on: %.0f%% of the upstream calls are sent again to %s, with"
            " the callers' own tokens",
            self._settings.sample_ratio * 100,
            candidate.base_url,
            extra={"event": "shadow", "candidate": candidate.base_url},
        )

    def reconfigure(self, settings: UpstreamSettings) -> None:
        """Take new settings (a reload): the shadow is turned on or off, and a new
        candidate (or new TLS keys, timeouts or bounds) gets new connections while the
        old ones close once their calls are over. The report starts again when the
        primary or the candidate is another upstream."""
        before = (self._primary, self._settings.base_url)
        keys = _candidate_keys(settings)
        if keys != self._keys or settings.shadow.enabled != self._settings.enabled:
            self._retire()
            self._settings = settings.shadow
            if settings.shadow.enabled:
                self._connect(settings)
            else:
                log.info("shadow traffic off", extra={"event": "shadow"})
        elif self._client is not None:
            # the same files: read again, so that a certificate renewed in place is taken
            self._client.reconfigure(settings.candidate())
        self._settings = settings.shadow
        self._keys = keys
        self._primary = settings.base_url
        if (self._primary, self._settings.base_url) != before:
            self._restart()

    def state(self) -> dict[str, object]:
        """What the shadow does now, for the report: on or off, its sample and bound,
        and the comparisons under way."""
        return {
            "enabled": self.enabled,
            "sampleRatio": self._settings.sample_ratio,
            "maxInFlight": self._settings.max_in_flight,
            "inFlight": len(self._running),
        }

    def reset(self) -> None:
        """Forget every comparison (of every worker): a new report (comparisons under
        way go to the old)."""
        self._restart()
        if self._workers is not None:
            try:
                self._workers.announce_reset()
                self._workers.publish(self.tally)
            except OSError as exc:
                log.warning(
                    "shadow: the reset could not be told to the other workers",
                    extra={"event": "shadow", "error": str(exc)},
                )

    def take_reset(self) -> None:
        """Start again now, as another worker of the instance did (its :meth:`reset`
        announced the new report); comparisons under way go to the old."""
        if self._workers is not None:
            self._workers.reset_due()
        self._restart()
        self.publish()

    def _restart(self) -> None:
        self.tally = Tally(primary=self._primary, candidate=self._settings.base_url or "")

    def report(self) -> dict[str, Any]:
        """The report (``Tally.report``) of this process, or of every worker of the
        instance, with :meth:`state` and how many workers it adds up."""
        tally, workers = self._gathered()
        return {**tally.report(), **self.state(), "workers": workers}

    def answers(self, request_id: str) -> dict[str, str] | None:
        """The two whole answers kept of a request that differed (by this process, or
        by any worker of the instance), or None."""
        tally, _ = self._gathered()
        return tally.answers(request_id)

    def _gathered(self) -> tuple[Tally, int]:
        """This process's tally, or every worker's added up; how many workers."""
        if self._workers is None:
            return self.tally, 1
        self.publish()
        return self._workers.gather(self.tally)

    def publish(self) -> None:
        """Hand this worker's counts to the others, and take a reset one of them
        announced (once a second, with several workers; nothing otherwise)."""
        workers = self._workers
        if workers is None:
            return
        if workers.reset_due():
            self._restart()
        try:
            workers.publish(self.tally)
        except OSError as exc:
            log.warning(
                "shadow: this worker's counts could not be written for the others",
                extra={"event": "shadow", "error": str(exc)},
            )

    def _counting(self, tally: Tally) -> Tally:
        """The tally a comparison begun under ``tally`` is counted in: the current
        one while it compares the same two upstreams (after a reset too, which is taken
        here when another worker announced it, so that nothing compared after a reset
        is lost); ``tally`` itself when a reload changed an upstream since."""
        workers = self._workers
        if workers is not None and workers.reset_due():
            self._restart()
        current = self.tally
        if (current.primary, current.candidate) == (tally.primary, tally.candidate):
            return current
        return tally

    def _retire(self) -> None:
        """Close the candidate's current connections once the comparisons on them end
        (they no longer count against ``max_in_flight``)."""
        link, running = self._link, self._running
        self._link = self._client = None
        self._running = set()
        if link is None:
            return
        self._retired |= running
        self._retired_links.add(link)

        async def close_after() -> None:
            try:
                if running:
                    await asyncio.wait(running)
            finally:
                self._retired_links.discard(link)
                await link.close()

        closer = asyncio.ensure_future(close_after())
        self._closers.add(closer)
        closer.add_done_callback(self._closers.discard)

    def offer(
        self,
        query: ShadowQuery,
        *,
        authorization: str,
        request_id: str,
        status: int,
        body: bytes | None,
        again: AskAgain,
        published: bytes | None = None,
    ) -> None:
        """A request the primary answered with ``status`` (and ``body``, for a 2xx, with
        ``published``, its bytes as the gateway published them, when it has them):
        compare the candidate's answer to it, when this request is sampled. Returns at
        once; the candidate is asked in the background."""
        client = self._client
        if client is None or not (200 <= status < 300 or status in COMPARED_STATUSES):
            return  # (a 429 or a failure of the primary says nothing of the candidate)
        if self._sample() >= self._settings.sample_ratio:
            return
        route = query.route.name
        tally = self.tally
        if len(self._running) >= self._settings.max_in_flight:
            tally.skipped(route)
            self._count(route, "skipped")
            return
        mirror = self._mirror(
            client, tally, query, authorization, request_id, Sent(status, body), published, again
        )
        # a context of its own: the caller's (its spans, its log fields) is not touched;
        # the calls carry the caller's trace id all the same, with no span recorded
        context = contextvars.Context()
        trace = current_trace()
        if trace is not None:
            context.run(CURRENT_TRACE.set, trace.detached())
        task = asyncio.get_running_loop().create_task(mirror, context=context)
        self._running.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._retired.discard(task)

    async def _mirror(
        self,
        client: UpstreamClient,
        tally: Tally,
        query: ShadowQuery,
        authorization: str,
        request_id: str,
        primary: Sent,
        published: bytes | None,
        again: AskAgain,
    ) -> None:
        route = query.route.name
        params = dict(query.params)
        # never shown in a report, should an upstream echo it in a field
        secrets = tuple({authorization, authorization.partition(" ")[2].strip()} - {""})
        try:
            reply = await client.fetch(query, authorization=authorization, request_id=request_id)
        except UpstreamError as exc:
            candidate: Sent | str = _sent_of(exc)
        else:
            candidate = Sent(reply.status, reply.body)
        tally = self._counting(tally)
        if isinstance(candidate, str):
            self._failed(tally, route, candidate)
            return
        if primary == candidate:
            outcome = tally.record(route, request_id, [])  # the same bytes: nothing to parse
            self._count(route, outcome)
            return
        # parsing and comparing whole bodies takes a while: not in the event loop
        judged = await asyncio.to_thread(_judge, query.route, params, primary, candidate, published)
        if judged is None:
            return  # the primary's answer does not parse (the pipeline would not offer it)
        if isinstance(judged, str):
            self._failed(tally, route, judged)
            return
        first, theirs, differences = judged
        if (
            differences
            and differences[0].field != STATUS_FIELD
            and (
                tally.needs_recheck(route, differences)
                or self._sample() < self._settings.recheck_ratio
            )
        ):
            try:
                second = await again()
            except UpstreamError:
                pass  # the primary cannot say now: the differences stand as they are
            else:
                itself = await asyncio.to_thread(
                    _recheck, query.route, params, first, Sent(second.status, second.body)
                )
                if itself is not None:
                    tally.learn_noise(route, differences, itself, request_id, secrets=secrets)
        tally = self._counting(tally)
        outcome = tally.record(route, request_id, differences, secrets=secrets)
        self._count(route, outcome)
        if outcome == "different" and first.body is not None and theirs.body is not None:
            target = query.upstream_path()
            if query.params:
                target += "?" + urlencode(query.params)
            tally.keep_answers(route, request_id, target, first.body, theirs.body, secrets)
        metrics = self._metrics
        if metrics is not None and outcome == "different":
            counts = Counter(
                (field_label(query.route, d.field), d.kind)
                for d in differences
                if not tally.is_noise(route, d)
            )
            for (label, kind), count in counts.items():
                metrics.shadow_differences.labels(route, label, kind).inc(count)

    def _failed(self, tally: Tally, route: str, what: str) -> None:
        tally.candidate_failed(route, what)
        self._count(route, "candidate_error")
        log.debug(
            "shadow: the candidate gave no answer to compare",
            extra={"event": "shadow", "route": route, "error": what},
        )

    def _count(self, route: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.shadow_requests.labels(route, outcome).inc()

    async def close(self) -> None:
        """Stop every comparison under way and close every candidate connection."""
        tasks = (*self._running, *self._retired, *self._closers)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        links = [*self._retired_links, *([self._link] if self._link is not None else [])]
        self._retired_links.clear()
        self._link = self._client = None
        for link in links:
            await link.close()
        if self._workers is not None:
            self._workers.remove()


class Sent(NamedTuple):
    """An upstream's answer as it came: its status, and the body of a 2xx."""

    status: int
    body: bytes | None


def _sent_of(exc: UpstreamError) -> Sent | str:
    """A failed call as an answer to compare (a 401, 403 or 404), or what went wrong
    instead (a status, or ``timeout``, ``unreachable``, ``invalid-body``)."""
    if isinstance(exc, UpstreamRejected) and exc.upstream_status in COMPARED_STATUSES:
        return Sent(exc.upstream_status or 0, None)
    if isinstance(exc, UpstreamContractError):
        return "invalid-body"
    return outcome_of(exc)


def _judge(
    route: Route, params: dict[str, str], primary: Sent, candidate: Sent, published: bytes | None
) -> tuple[Answer, Answer, list[Difference]] | str | None:
    """The primary's answer (``published``: its published bytes, when the gateway has
    them) and the candidate's differences from it; ``invalid-body`` when the
    candidate's body cannot be compared, None when the primary's cannot (run in a
    worker thread)."""
    try:
        theirs = answer_of(route, candidate.status, candidate.body, params)
    except NotComparable:
        return "invalid-body"
    try:
        mine = answer_of(route, primary.status, primary.body, params, published)
    except NotComparable:
        return None
    return mine, theirs, compare(route, mine, theirs)


def _recheck(
    route: Route, params: dict[str, str], first: Answer, second: Sent
) -> list[Difference] | None:
    """The differences of the primary's second answer from its first (None when they
    cannot be compared: another status, a body that does not fit)."""
    if second.status != first.status:
        return None
    try:
        return compare(route, first, answer_of(route, second.status, second.body, params))
    except NotComparable:
        return None
