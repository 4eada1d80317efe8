"""The OpenTelemetry tracer through the whole gateway: the spans of a request, its cache
read and its upstream call, exported to an in-memory exporter (no collector, no
network), each continuing the caller's trace."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pytest_aiohttp import AiohttpClient

from gateway.demo import RequestLog
from gateway.http.app import create_app
from gateway.ops.otel import OtelTracer, _ClockOffset

from ..conftest import AUTH, TOKEN, FakeClock, base_url, gateway_client, make_settings, until
from ..http.test_wire import count_full_reads

Client = TestClient[web.Request, web.Application]
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
SERVICE = "gateway-under-test"


async def traced_gateway(
    aiohttp_client: AiohttpClient,
    upstream_url: str,
    exporter: InMemorySpanExporter,
    *,
    sample_ratio: float = 1.0,
    clock: FakeClock | None = None,
    **sections: Any,
) -> tuple[Client, OtelTracer]:
    """A gateway whose spans go to ``exporter``."""
    tracer = OtelTracer.build(exporter, service_name=SERVICE, sample_ratio=sample_ratio)
    settings = make_settings(upstream_url, **sections)
    times: dict[str, Any] = {} if clock is None else {"clock": clock}
    app = create_app(settings, tracer=tracer, **times)
    return await gateway_client(aiohttp_client, app), tracer


def finished(tracer: OtelTracer, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    tracer.flush()
    return list(exporter.get_finished_spans())


def forget(tracer: OtelTracer, exporter: InMemorySpanExporter) -> None:
    """Drop the spans ended so far."""
    tracer.flush()
    exporter.clear()


def ids(span: ReadableSpan) -> tuple[str, str]:
    """The span's trace id and span id, as hex."""
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def assert_no_secret(spans: list[ReadableSpan]) -> None:
    for span in spans:
        assert TOKEN not in span.name
        for key, value in (span.attributes or {}).items():
            assert "authorization" not in key.lower()
            assert TOKEN not in str(value)
            assert "Bearer" not in str(value)


async def test_a_miss_and_a_hit_are_spans_of_the_caller_s_trace(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    upstream_log: RequestLog,
    monkeypatch: pytest.MonkeyPatch,
    fast_path: bool,
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    exporter = InMemorySpanExporter()
    client, tracer = await traced_gateway(aiohttp_client, base_url(upstream), exporter)
    headers = {**AUTH, "traceparent": TRACEPARENT, "tracestate": "rojo=1"}
    miss = await client.get("/users", headers={**headers, "X-Request-ID": "the-miss"})
    assert miss.headers["X-Cache"] == "MISS"
    assert not {"traceparent", "traceresponse", "tracestate"} & set(map(str.lower, miss.headers))
    full_reads = count_full_reads(client.app, monkeypatch)
    hit = await client.get("/users", headers={**headers, "X-Request-ID": "the-hit"})
    assert hit.headers["X-Cache"] == "HIT"
    assert full_reads == [0]  # the hit from the bytes, or by the gateway's server, is traced too

    spans = finished(tracer, exporter)
    assert {ids(span)[0] for span in spans} == {CALLER_TRACE}
    servers = [span for span in spans if span.kind is SpanKind.SERVER]
    assert [span.name for span in servers] == ["GET /users", "GET /users"]
    for span, request_id, cache in zip(
        servers, ("the-miss", "the-hit"), ("miss", "hit"), strict=True
    ):
        assert parent_of(span) == CALLER_SPAN
        assert span.parent is not None
        assert span.parent.is_remote
        assert dict(span.attributes or {}) == {
            "http.request.method": "GET",
            "http.route": "/users",
            "gateway.request_id": request_id,
            "http.response.status_code": 200,
            "gateway.cache.result": cache,
        }
        assert span.status.status_code is StatusCode.UNSET
        reads = [s for s in spans if s.name == "cache.get" and parent_of(s) == ids(span)[1]]
        assert len(reads) == 1
        assert reads[0].kind is SpanKind.INTERNAL
        found = "absent" if cache == "miss" else "found"
        assert dict(reads[0].attributes or {}) == {"gateway.cache.lookup": found}
        assert span.start_time is not None
        assert reads[0].start_time is not None
        assert span.start_time <= reads[0].start_time
    (call,) = [span for span in spans if span.kind is SpanKind.CLIENT]
    assert call.name == "GET /users"
    assert parent_of(call) == ids(servers[0])[1]
    assert dict(call.attributes or {}) == {
        "http.request.method": "GET",
        "url.template": "/users",
        "server.address": "127.0.0.1",
        "server.port": upstream.port,
        "http.response.status_code": 200,
    }
    # the upstream's parent is the client span
    (record,) = upstream_log.entries
    assert record.traceparent == f"00-{CALLER_TRACE}-{ids(call)[1]}-01"
    assert record.tracestate == "rojo=1"
    assert len(spans) == 5
    for span in spans:
        assert span.resource.attributes["service.name"] == SERVICE
    assert_no_secret(spans)


async def test_a_trace_the_gateway_starts_is_the_one_logged_and_forwarded(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    upstream_log: RequestLog,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    caplog.set_level(logging.INFO, logger="gateway.access")
    exporter = InMemorySpanExporter()
    client, tracer = await traced_gateway(aiohttp_client, base_url(upstream), exporter)
    listed = await (await client.get("/expenses?limit=1", headers=AUTH)).json()
    expense_id = listed["data"][0]["id"]
    upstream_log.clear()
    forget(tracer, exporter)
    response = await client.get(f"/expenses/{expense_id}", headers=AUTH)
    assert response.status == 200

    spans = finished(tracer, exporter)
    (server,) = [span for span in spans if span.kind is SpanKind.SERVER]
    (call,) = [span for span in spans if span.kind is SpanKind.CLIENT]
    assert server.parent is None  # a trace of its own
    assert server.name == call.name == "GET /expenses/{expenseId}"
    assert (server.attributes or {})["http.route"] == "/expenses/{expenseId}"
    trace_id, _ = ids(server)
    (record,) = upstream_log.entries
    assert record.traceparent == f"00-{trace_id}-{ids(call)[1]}-01"
    (line,) = [r for r in caplog.records if r.name == "gateway.access"][-1:]
    assert vars(line)["trace_id"] == trace_id
    for span in spans:  # never the raw path, nor the id in it
        assert all(expense_id not in str(value) for value in (span.attributes or {}).values())
    assert_no_secret(spans)


async def test_an_unsampled_trace_records_no_span_and_says_so_upstream(
    aiohttp_client: AiohttpClient, upstream: TestServer, upstream_log: RequestLog
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    exporter = InMemorySpanExporter()
    client, tracer = await traced_gateway(
        aiohttp_client, base_url(upstream), exporter, sample_ratio=0.0
    )
    unsampled = f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"
    assert (await client.get("/users", headers={**AUTH, "traceparent": unsampled})).status == 200
    assert (await client.get("/clients", headers=AUTH)).status == 200  # the ratio: 0
    assert finished(tracer, exporter) == []
    caller, own = (entry.traceparent for entry in upstream_log.entries)
    assert caller is not None
    assert own is not None
    assert caller.startswith(f"00-{CALLER_TRACE}-")
    assert caller.endswith("-00")
    assert not own.startswith(f"00-{CALLER_TRACE}-")
    assert own.endswith("-00")
    # a caller's sampled flag outweighs the ratio: the caller's trace is recorded
    sampled = {**AUTH, "traceparent": TRACEPARENT}
    assert (await client.get("/accounts", headers=sampled)).status == 200
    assert {ids(span)[0] for span in finished(tracer, exporter)} == {CALLER_TRACE}


async def test_an_upstream_failure_is_an_error_of_both_spans(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    exporter = InMemorySpanExporter()
    client, tracer = await traced_gateway(aiohttp_client, base_url(upstream), exporter)
    await upstream.close()
    response = await client.get("/users", headers={**AUTH, "traceparent": TRACEPARENT})
    assert response.status == 502
    spans = finished(tracer, exporter)
    (server,) = [span for span in spans if span.kind is SpanKind.SERVER]
    (call,) = [span for span in spans if span.kind is SpanKind.CLIENT]
    assert server.status.status_code is call.status.status_code is StatusCode.ERROR
    assert (server.attributes or {})["http.response.status_code"] == 502
    assert (call.attributes or {})["error.type"] == "unreachable"
    assert "http.response.status_code" not in (call.attributes or {})
    assert_no_secret(spans)


async def test_a_refused_token_is_an_error_of_the_upstream_span_without_the_token(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    exporter = InMemorySpanExporter()
    client, tracer = await traced_gateway(aiohttp_client, base_url(upstream), exporter)
    wrong = {"Authorization": "Bearer wrong-secret-token"}
    assert (await client.get("/users", headers=wrong)).status == 401
    spans = finished(tracer, exporter)
    (call,) = [span for span in spans if span.kind is SpanKind.CLIENT]
    assert (call.attributes or {})["http.response.status_code"] == 401
    assert call.status.status_code is StatusCode.ERROR
    for span in spans:
        assert "wrong-secret-token" not in str(dict(span.attributes or {}))


async def test_a_background_refresh_is_a_span_of_the_request_that_found_the_entry_stale(
    aiohttp_client: AiohttpClient,
    upstream: TestServer,
    upstream_log: RequestLog,
    clock: FakeClock,
) -> None:
    exporter = InMemorySpanExporter()
    client, tracer = await traced_gateway(aiohttp_client, base_url(upstream), exporter, clock=clock)
    assert (await client.get("/users", headers=AUTH)).status == 200
    clock.advance(301)  # past the TTL, within stale_while_revalidate_s
    forget(tracer, exporter)
    response = await client.get("/users", headers={**AUTH, "traceparent": TRACEPARENT})
    assert response.headers["X-Cache"] == "STALE"
    await until(lambda: len(upstream_log) == 2)
    await until(lambda: any(s.kind is SpanKind.CLIENT for s in finished(tracer, exporter)))
    spans = finished(tracer, exporter)
    (server,) = [span for span in spans if span.kind is SpanKind.SERVER]
    (refresh,) = [span for span in spans if span.kind is SpanKind.CLIENT]
    assert (server.attributes or {})["gateway.cache.result"] == "stale"
    assert ids(refresh)[0] == CALLER_TRACE
    assert parent_of(refresh) == ids(server)[1]
    assert upstream_log.entries[1].traceparent == f"00-{CALLER_TRACE}-{ids(refresh)[1]}-01"


class _Stopping(InMemorySpanExporter):
    """An in-memory exporter that says whether it was shut down."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    def shutdown(self) -> None:
        self.stopped = True
        super().shutdown()


async def test_the_spans_left_are_exported_when_the_app_stops(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    """Held for docs/operations.md, "Tracing"."""
    exporter = _Stopping()
    client, _ = await traced_gateway(aiohttp_client, base_url(upstream), exporter)
    assert (await client.get("/users", headers=AUTH)).status == 200
    assert not exporter.stopped
    await client.close()
    assert exporter.stopped
    names = sorted(span.name for span in exporter.get_finished_spans())
    assert names == ["GET /users", "GET /users", "cache.get"]


async def test_the_health_metrics_and_admin_routes_have_no_spans(
    aiohttp_client: AiohttpClient, upstream: TestServer
) -> None:
    exporter = InMemorySpanExporter()
    admin = {"Authorization": "Bearer admin-token-0123456789abcdef"}
    client, tracer = await traced_gateway(
        aiohttp_client, base_url(upstream), exporter, admin={"token": admin["Authorization"][7:]}
    )
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/admin/config"):
        response = await client.get(path, headers={**admin, "traceparent": TRACEPARENT})
        assert response.status == 200, path
    assert (await client.get("/nowhere", headers=AUTH)).status == 404
    assert finished(tracer, exporter) == []
    assert (await client.get("/users", headers=AUTH)).status == 200
    assert len(finished(tracer, exporter)) == 3  # the check above can fail


def test_one_instant_is_one_wall_time_for_every_span_made_of_it() -> None:
    """A request's span and the children begun at the same perf_counter instant get
    the same start (reading both clocks per span put tens of ns between them, and a
    child before its parent)."""
    clock = _ClockOffset()
    started = time.perf_counter()
    starts = {clock.epoch_ns(started) for _ in range(10_000)}
    assert len(starts) == 1
    (start,) = starts
    assert abs(start - time.time_ns()) < 1_000_000_000  # the wall time, within a second
    assert abs(clock.epoch_ns(started + 0.001) - start - 1_000_000) < 100  # float rounding
