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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from gateway.comparison.diff import (
    STATUS_FIELD,
    Answer,
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
    query parameters (page and limit fill an envelope that leaves them out)."""

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
        self._running: set[asyncio.Task[None]] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        if self._settings.enabled:
            self._connect(settings)

    @property
    def enabled(self) -> bool:
        return self._client is not None and self._settings.sample_ratio > 0

    @property
    def in_flight(self) -> int:
        """Candidate comparisons under way now."""
        return len(self._running)

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
            self._workers.announce_reset()
            self._workers.publish(self.tally)

    def _restart(self) -> None:
        self.tally = Tally(primary=self._primary, candidate=self._settings.base_url or "")

    def report(self) -> dict[str, Any]:
        """The report (``Tally.report``) of this process, or of every worker of the
        instance, with :meth:`state` and how many workers it adds up."""
        tally, workers = self.tally, 1
        if self._workers is not None:
            self.publish()
            tally, workers = self._workers.gather(self.tally)
        return {**tally.report(), **self.state(), "workers": workers}

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

    def _retire(self) -> None:
        """Close the candidate's current connections once the calls on them end."""
        link, running = self._link, set(self._running)
        self._link = self._client = None
        if link is None:
            return

        async def close_after() -> None:
            if running:
                await asyncio.wait(running)
            await link.close()

        task = asyncio.ensure_future(close_after())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def offer(
        self,
        query: ShadowQuery,
        *,
        authorization: str,
        request_id: str,
        status: int,
        body: bytes | None,
        again: AskAgain,
    ) -> None:
        """A request the primary answered with ``status`` (and ``body``, for a 2xx):
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
        mirror = self._mirror(client, tally, query, authorization, request_id, status, body, again)
        # a context of its own: the caller's (its trace, its log fields) is not touched
        task = asyncio.get_running_loop().create_task(mirror, context=contextvars.Context())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _mirror(
        self,
        client: UpstreamClient,
        tally: Tally,
        query: ShadowQuery,
        authorization: str,
        request_id: str,
        status: int,
        body: bytes | None,
        again: AskAgain,
    ) -> None:
        route = query.route.name
        params = dict(query.params)
        # the candidate first: nothing is parsed before its answer is in, by when the
        # callers of this request (woken a turn or two of the loop after the offer)
        # have theirs
        asked = client.fetch(query, authorization=authorization, request_id=request_id)
        candidate = await _ask(asked, route, params)
        try:
            primary = answer_of(route, status, body, params)
        except NotComparable:
            return  # the gateway could not publish it either: nothing to compare
        if isinstance(candidate, str):
            tally.candidate_failed(route, candidate)
            self._count(route, "candidate_error")
            log.debug(
                "shadow: the candidate gave no answer to compare",
                extra={"event": "shadow", "route": route, "error": candidate},
            )
            return
        differences = compare(route, primary, candidate)
        if (
            differences
            and differences[0].field != STATUS_FIELD
            and (
                tally.needs_recheck(route, differences)
                or self._sample() < self._settings.recheck_ratio
            )
        ):
            second = await _ask(again(), route, params)
            if isinstance(second, Answer) and second.status == primary.status:
                tally.learn_noise(route, differences, compare(route, primary, second), request_id)
        outcome = tally.record(route, request_id, differences)
        self._count(route, outcome)
        metrics = self._metrics
        if metrics is not None and outcome == "different":
            noisy = tally.noisy(route)
            for difference in differences:
                if difference.field not in noisy:
                    label = field_label(route, difference.field)
                    metrics.shadow_differences.labels(route, label, difference.kind).inc()

    def _count(self, route: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.shadow_requests.labels(route, outcome).inc()

    async def close(self) -> None:
        """Stop every comparison under way and close the candidate's connections."""
        for task in (*self._running, *self._retiring):
            task.cancel()
        for task in (*self._running, *self._retiring):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._link is not None:
            await self._link.close()
        self._link = self._client = None
        if self._workers is not None:
            self._workers.remove()


async def _ask(call: Awaitable[UpstreamReply], route: str, params: dict[str, str]) -> Answer | str:
    """The answer of one upstream call, or what went wrong instead (a status, or
    ``timeout``, ``unreachable``, ``invalid-body``)."""
    try:
        reply = await call
    except UpstreamRejected as exc:
        if exc.upstream_status in COMPARED_STATUSES:
            return Answer(exc.upstream_status or 0)
        return outcome_of(exc)
    except UpstreamContractError:
        return "invalid-body"
    except UpstreamError as exc:
        return outcome_of(exc)
    try:
        return answer_of(route, reply.status, reply.body, params)
    except NotComparable:
        return "invalid-body"
