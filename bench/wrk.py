"""Running wrk and reading its report.

Every configuration is loaded with the same command: ``wrk -t THREADS -c CONNECTIONS
-d DURATION --latency -H "Authorization: Bearer demo-token" URL``. wrk prints times
with a unit (``812.00us``, ``4.37ms``, ``1.02s``); everything here is milliseconds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

from servers import TOKEN, BenchError

_MS_PER_UNIT = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)\s*$", re.MULTILINE)
_PERCENTILE = re.compile(r"^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.MULTILINE)
_TOTAL = re.compile(r"^\s*(\d+) requests in ", re.MULTILINE)
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


@dataclass(frozen=True, slots=True)
class WrkSettings:
    threads: int = 2
    connections: int = 64
    duration_s: int = 5

    def command(self, url: str, duration_s: int | None = None) -> list[str]:
        binary = shutil.which("wrk") or "wrk"
        return [binary, "-t", str(self.threads), "-c", str(self.connections),
                "-d", f"{duration_s or self.duration_s}s", "--latency",
                "-H", f"Authorization: Bearer {TOKEN}", url]  # fmt: skip

    def shown(self) -> str:
        return f"wrk -t {self.threads} -c {self.connections} -d {self.duration_s}s --latency"


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    socket_errors: int
    non_2xx: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def parse(report: str) -> WrkResult:
    """The numbers of one wrk report; BenchError when it has none."""
    rps = _RPS.search(report)
    percentiles = {
        p: float(value) * _MS_PER_UNIT[unit] for p, value, unit in _PERCENTILE.findall(report)
    }
    total = _TOTAL.search(report)
    if rps is None or "50" not in percentiles or "99" not in percentiles or total is None:
        raise BenchError(f"cannot read wrk's report:\n{report}")
    socket_errors = _SOCKET_ERRORS.search(report)
    non_2xx = _NON_2XX.search(report)
    return WrkResult(
        requests_per_s=float(rps.group(1)),
        p50_ms=percentiles["50"],
        p99_ms=percentiles["99"],
        requests=int(total.group(1)),
        socket_errors=sum(int(n) for n in socket_errors.groups()) if socket_errors else 0,
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
    )


def run(settings: WrkSettings, url: str, duration_s: int | None = None) -> WrkResult:
    """Load ``url`` once; the result of a warm-up is read too, to catch errors early."""
    command = settings.command(url, duration_s)
    limit = (duration_s or settings.duration_s) + 30
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"wrk did not finish within {limit} s: {' '.join(command)}") from exc
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    return parse(done.stdout)
