"""Observability that every layer may use: Prometheus metrics, structured logs, the
readiness report, the per-request trace the access log is made from, the W3C trace
context and the tracing seam (``tracing``) in front of OpenTelemetry.

Imports nothing of the gateway but ``gateway.errors``, and of aiohttp only the
parser's exception (the log filter keeps a rejected request's text out of the logs).
``opentelemetry`` is imported by ``otel`` alone, which ``tracers`` imports only when
``tracing.otlp_endpoint`` is set (so that the seam, ``tracing``, and its OpenTelemetry
side, ``otel``, do not import each other).
"""
