"""The tracing seam in processes of their own: without ``tracing.otlp_endpoint`` no
``opentelemetry`` module is imported at all, serving included; with it and without
OpenTelemetry installed, the configuration is refused with the key and the extra."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from gateway.ops.tracers import tracer_for
from gateway.ops.tracing import NO_TRACER

ROOT = Path(__file__).resolve().parent.parent.parent
OTEL_EXTRA = "pip install 'records-gateway[otel]'"

# A gateway and the reference upstream in one process: serves a miss and a hit (the
# fast path's), then prints the opentelemetry modules loaded. With an endpoint (argv[1])
# it serves nothing (the spans would go to the endpoint) and only starts and stops.
SERVE = """
import asyncio, json, sys
import aiohttp
from aiohttp import web
from gateway.config.settings import Settings
from gateway.demo import REQUEST_LOG, start_demo_server
from gateway.fastpath.server import FastPathRunner, make_runner
from gateway.http.app import create_app

async def main(endpoint):
    demo = await start_demo_server()
    tracing = {"otlp_endpoint": endpoint} if endpoint else {}
    runner = make_runner(create_app(Settings(upstream={"base_url": demo.url}, tracing=tracing)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    caches = []
    if not endpoint:
        headers = {
            "Authorization": "Bearer demo-token",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        }
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.get(f"http://127.0.0.1:{port}/users", headers=headers) as r:
                    caches.append((r.status, r.headers["X-Cache"]))
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
    report = {
        "caches": caches,
        "fast": isinstance(runner, FastPathRunner),
        "loaded": loaded,
        "forwarded": [entry.traceparent for entry in demo.app[REQUEST_LOG].entries],
    }
    await runner.cleanup()
    await demo.close()
    print(json.dumps(report))

asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
"""

# OpenTelemetry made impossible to import, as where the extra is not installed
BLOCKED = "import sys; sys.modules['opentelemetry'] = None\n"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    return {**env, **extra}


async def python(code: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or clean_env(),
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_without_an_endpoint_serving_imports_no_opentelemetry_module() -> None:
    """Held for docs/operations.md, "Tracing"."""
    code, out, err = await python(SERVE)
    assert code == 0, err
    report = json.loads(out)
    assert report["caches"] == [[200, "MISS"], [200, "HIT"]]
    assert report["fast"] is True
    assert report["loaded"] == []
    # and the trace context went upstream all the same
    (forwarded,) = report["forwarded"]
    assert forwarded.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")


async def test_with_an_endpoint_the_app_s_start_imports_opentelemetry() -> None:
    """The check above can fail: the same script loads OpenTelemetry once asked to."""
    code, out, err = await python(SERVE, "http://127.0.0.1:4318")
    assert code == 0, err
    loaded = json.loads(out)["loaded"]
    assert "opentelemetry.sdk.trace" in loaded
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in loaded


async def test_an_endpoint_without_opentelemetry_is_refused_naming_the_key_and_the_extra() -> None:
    """Held for docs/operations.md, "Tracing"."""
    env = clean_env(GATEWAY_TRACING__OTLP_ENDPOINT="http://127.0.0.1:4318")
    for command in ("check-config", "serve --log-format text"):
        main = f"from gateway.cli import main; main({command.split()!r})"
        code, out, err = await python(BLOCKED + main, env=env)
        assert code == 2, err
        assert out == ""
        assert err.strip().splitlines() == [
            "records-gateway: configuration error: tracing.otlp_endpoint: exporting spans"
            " needs OpenTelemetry, and opentelemetry.sdk.trace is not installed:"
            f" {OTEL_EXTRA}"
        ]


async def test_the_tracer_of_an_endpoint_without_opentelemetry_is_a_config_error() -> None:
    """Settings made without validation still cannot start a gateway without its spans."""
    script = BLOCKED + (
        "from gateway.errors import ConfigError\n"
        "from gateway.ops.tracers import tracer_for\n"
        "try:\n"
        "    tracer_for('http://127.0.0.1:4318/v1/traces', service_name='s', sample_ratio=1)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    code, out, err = await python(script)
    assert code == 0, err
    assert out.startswith("tracing.otlp_endpoint: exporting spans needs OpenTelemetry")
    assert out.strip().endswith(OTEL_EXTRA)


def test_without_an_endpoint_the_tracer_records_nothing() -> None:
    tracer = tracer_for(None, service_name="s", sample_ratio=1.0)
    assert tracer is NO_TRACER
    assert not tracer.recording
    span = tracer.request("GET", "/users", None, "r", 0.0)
    first = span.call("GET /users", {})
    second = span.call("GET /users", {})
    assert first.traceparent.split("-")[1] == second.traceparent.split("-")[1] == span.trace_id
    assert first.traceparent != second.traceparent
    assert span.detached().trace_id == span.trace_id


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"])
def test_with_an_endpoint_the_tracer_records(endpoint: str) -> None:
    tracer = tracer_for(endpoint, service_name="s", sample_ratio=1.0)
    try:
        assert tracer.recording
    finally:
        tracer.shutdown()
