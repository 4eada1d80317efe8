"""Which tracer a configuration gets: :data:`~gateway.ops.tracing.NO_TRACER` without
``tracing.otlp_endpoint``, OpenTelemetry's (``gateway.ops.otel``) with it.

Apart from ``gateway.ops.tracing`` (the seam) and ``gateway.ops.otel`` (its
OpenTelemetry side), so that neither imports the other: ``otel`` implements the seam,
and this module alone knows both.
"""

from __future__ import annotations

from gateway.errors import ConfigError
from gateway.ops.tracing import NO_TRACER, Tracer

OTEL_EXTRA = "pip install 'records-gateway[otel]'"


def tracer_for(otlp_traces_url: str | None, *, service_name: str, sample_ratio: float) -> Tracer:
    """The tracer of the settings: :data:`NO_TRACER` without an endpoint; otherwise
    OpenTelemetry's, exporting over OTLP/HTTP to ``otlp_traces_url``. Raises
    ConfigError, naming the key and the extra to install, when OpenTelemetry's SDK
    or exporter cannot be imported."""
    if otlp_traces_url is None:
        return NO_TRACER
    try:
        from gateway.ops.otel import OtelTracer, otlp_exporter
    except ImportError as exc:
        raise ConfigError(
            f"tracing.otlp_endpoint: exporting spans needs OpenTelemetry ({exc.name or exc}"
            f" cannot be imported): {OTEL_EXTRA}"
        ) from exc
    return OtelTracer.build(
        otlp_exporter(otlp_traces_url), service_name=service_name, sample_ratio=sample_ratio
    )
