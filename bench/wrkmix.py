"""The matrix's second load client: wrk with bench/mix.lua, the pooled shape.

The bench's own client (bench/loadgen.c) is checked against a well-known one on the
same traffic: wrk, its connections and timing its own, each request's token and key
drawn by ``mix.lua`` from the same keys file. wrk's latency is closed-loop (from each
request's write). ``run`` parses the one ``MIXJSON`` line the script prints.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servers import BENCH, BenchError

SCRIPT = BENCH / "mix.lua"
MARKER = "MIXJSON "


@dataclass(frozen=True, slots=True)
class WrkMixSettings:
    threads: int = 2
    connections: int = 48
    duration_s: int = 5
    seed: int = 1
    gzip_share: float = 0.0

    def command(self, url: str) -> list[str]:
        binary = shutil.which("wrk") or "wrk"
        return [binary, "-t", str(self.threads), "-c", str(self.connections),
                "-d", f"{self.duration_s}s", "--latency", "-s", str(SCRIPT), url]  # fmt: skip

    def shown(self) -> str:
        gzip = f", gzip share {self.gzip_share:g}" if self.gzip_share else ""
        return (
            f"wrk -t {self.threads} -c {self.connections} -d {self.duration_s}s "
            f"-s bench/mix.lua{gzip}"
        )


@dataclass(frozen=True, slots=True)
class WrkMixResult:
    requests: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    errors: dict[str, int]


def parse(output: str) -> WrkMixResult:
    """The figures of wrk's run with mix.lua; BenchError without them, or with any
    error (a connect, read, write or timeout error, or an answer not 2xx or 3xx)."""
    line = next((line for line in output.splitlines() if line.startswith(MARKER)), None)
    if line is None:
        raise BenchError(f"wrk with mix.lua printed no {MARKER.strip()} line: {output[-500:]!r}")
    try:
        data = json.loads(line.removeprefix(MARKER))
        errors = {name: int(count) for name, count in data["errors"].items()}
        latency = data["latency_ms"]
        result = WrkMixResult(
            requests=int(data["requests"]),
            requests_per_s=float(data["requests_per_s"]),
            p50_ms=float(latency["p50"]),
            p99_ms=float(latency["p99"]),
            p999_ms=float(latency["p999"]),
            errors=errors,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"wrk with mix.lua printed a report that does not read: {line!r}") from exc
    if any(errors.values()):
        raise BenchError(f"wrk with mix.lua saw errors: {errors}")
    return result


def run(settings: WrkMixSettings, url: str, keys_file: Path) -> WrkMixResult:
    """One run of wrk with mix.lua against ``url`` on the keys of ``keys_file``."""
    env = {
        **os.environ,
        "MIX_KEYS": str(keys_file),
        "MIX_SEED": str(settings.seed),
        "MIX_GZIP_SHARE": f"{settings.gzip_share:g}",
    }
    limit = settings.duration_s + 30
    try:
        done = subprocess.run(
            settings.command(url), capture_output=True, text=True, env=env, timeout=limit,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"wrk did not finish within {limit} s") from exc
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}) on {url}: {done.stderr.strip()}")
    return parse(done.stdout)
