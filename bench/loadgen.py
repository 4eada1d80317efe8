"""Building and running the mix's load client (bench/loadgen.c) and reading its report.

The bench compiles ``loadgen.c`` with ``gcc -O2`` into its temporary folder (nothing
is installed), writes the mix's keys file there (bench/mix.py) and runs the client
once per warm-up + measured run. The client prints one JSON object; :func:`parse`
turns it into a :class:`LoadResult` and refuses a report that lacks a field, so a
changed client cannot pass unnoticed. Times are milliseconds, CPU is seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servers import BENCH, BenchError

SOURCE = BENCH / "loadgen.c"


def compile_client(folder: Path) -> Path:
    """``gcc -O2 -pthread`` of loadgen.c into ``folder``; BenchError with gcc's output."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise BenchError("no C compiler (gcc) to build bench/loadgen.c: install gcc")
    binary = folder / "loadgen"
    command = [compiler, "-O2", "-Wall", "-Wextra", "-pthread", "-o", str(binary), str(SOURCE)]
    done = subprocess.run([*command, "-lm"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(command)} failed:\n{done.stderr}")
    return binary


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """One run's load; the shape options are the client's (bench/loadgen.c's header):
    ``pooled`` draws each request's token, ``gzip_share`` and ``conditional_share`` are
    the shares of requests sent with ``Accept-Encoding: gzip`` and ``If-None-Match``,
    ``close`` sends each request on a connection of its own, ``rate`` (requests/s over
    all connections, 0 for a closed loop) runs an open loop."""

    threads: int = 2
    connections: int = 48
    duration_s: float = 5.0
    warmup_s: float = 2.0
    seed: int = 1
    pooled: bool = False
    gzip_share: float = 0.0
    conditional_share: float = 0.0
    close: bool = False
    rate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("gzip_share", "conditional_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BenchError(f"{name} must be within [0, 1]: {getattr(self, name)!r}")
        if not self.rate >= 0.0:
            raise BenchError(f"rate must be 0 (closed loop) or positive: {self.rate!r}")

    def options(self) -> list[str]:
        """The client's shape options, none when every one is off."""
        shape = ["--pooled"] if self.pooled else []
        if self.gzip_share:
            shape += ["--gzip-share", f"{self.gzip_share:.10g}"]
        if self.conditional_share:
            shape += ["--conditional-share", f"{self.conditional_share:.10g}"]
        if self.close:
            shape.append("--close")
        if self.rate:
            shape += ["--rate", f"{self.rate:.10g}"]
        return shape

    def shown(self) -> str:
        shape = "".join(f" {option}" for option in self.options())
        return (
            f"loadgen -t {self.threads} -c {self.connections} -d {self.duration_s:g}s{shape} "
            f"(after {self.warmup_s:g} s of warm-up)"
        )


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    """CPU seconds one process spent during the measured phase."""

    pid: int
    user_s: float
    system_s: float
    exited: bool = False  # gone before the end of the phase: its CPU is not counted

    @property
    def total_s(self) -> float:
        return self.user_s + self.system_s


@dataclass(frozen=True, slots=True)
class LoadResult:
    """One measured run of the load client."""

    requests_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    requests: int
    seconds: float
    statuses: dict[str, int]
    body_bytes: int
    gzip_answers: int
    x_cache: dict[str, int]
    errors: int  # reads cut short, failed connects and requests unanswered for 10 s
    reconnects: int
    client_user_s: float
    client_system_s: float
    servers: tuple[ProcessCpu, ...] = field(default=())
    by_token: tuple[int, ...] = field(default=())
    warmup_statuses: dict[str, int] = field(default_factory=dict)
    gzip_requests: int = 0  # measured requests sent with Accept-Encoding: gzip
    conditional_requests: int = 0  # measured requests sent with If-None-Match
    connects: int = 0  # connections opened in the measured phase
    offered_per_s: float = 0.0  # the open loop's rate; 0.0 in a closed loop
    achieved_per_s: float = 0.0  # measured requests per second
    behind_max_ms: float = 0.0  # open loop: the largest lag of a send behind its time
    shape: dict[str, object] = field(default_factory=dict)  # the shape the client ran

    @property
    def non_200(self) -> int:
        return sum(count for status, count in self.statuses.items() if status != "200")

    @property
    def warmup_non_200(self) -> int:
        return sum(count for status, count in self.warmup_statuses.items() if status != "200")

    @property
    def client_cpu_ms_per_1000(self) -> float:
        """The client's own CPU per 1,000 requests, in milliseconds."""
        used = self.client_user_s + self.client_system_s
        return used * 1000 / self.requests * 1000 if self.requests else 0.0

    def cpu_of(self, pids: Sequence[int], *, but: bool = False) -> tuple[float, float]:
        """(user, system) seconds of the processes ``pids`` together (``but``: of every
        process read except those)."""
        chosen = [p for p in self.servers if (p.pid in pids) is not but]
        return sum(p.user_s for p in chosen), sum(p.system_s for p in chosen)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _number(data: Mapping[str, Any], name: str) -> float:
    value = data.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BenchError(f"the load client's report has no number {name!r}: {data!r:.300}")
    return float(value)


def _counts(data: Mapping[str, Any], name: str) -> dict[str, int]:
    value = data.get(name)
    if not isinstance(value, dict):
        raise BenchError(f"the load client's report has no {name!r} counts")
    return {str(key): int(count) for key, count in value.items()}


def parse(report: str) -> LoadResult:
    """The numbers of one report of bench/loadgen.c; BenchError when one is missing."""
    try:
        data = json.loads(report)
    except ValueError as exc:
        raise BenchError(f"the load client's report is not JSON: {exc}: {report[:300]!r}") from exc
    if not isinstance(data, dict):
        raise BenchError(f"the load client's report is not an object: {report[:300]!r}")
    for part in ("latency_ms", "measured", "warmup", "client_cpu"):
        if not isinstance(data.get(part), dict):
            raise BenchError(f"the load client's report has no {part!r}")
    latency, measured, client = data["latency_ms"], data["measured"], data["client_cpu"]
    servers = data.get("server_cpu")
    by_token = data.get("requests_by_token")
    if not isinstance(servers, list) or not isinstance(by_token, list):
        raise BenchError("the load client's report has no server_cpu or requests_by_token")
    shape = data.get("shape")
    if not isinstance(shape, dict):
        raise BenchError("the load client's report has no 'shape'")
    if "rate" not in data or not isinstance(data["rate"], dict | None):
        raise BenchError("the load client's report has no 'rate' (an object, or null)")
    rate: Mapping[str, Any] | None = data["rate"]
    return LoadResult(
        requests_per_s=_number(data, "requests_per_s"),
        p50_ms=_number(latency, "p50"),
        p99_ms=_number(latency, "p99"),
        p999_ms=_number(latency, "p999"),
        requests=int(_number(measured, "requests")),
        seconds=_number(data, "duration_s"),
        statuses=_counts(measured, "statuses"),
        body_bytes=int(_number(measured, "body_bytes")),
        gzip_answers=int(_number(measured, "gzip_answers")),
        x_cache=_counts(measured, "x_cache"),
        errors=int(
            sum(_number(measured, n) for n in ("read_errors", "connect_errors", "timeouts"))
        ),
        reconnects=int(_number(measured, "reconnects")),
        client_user_s=_number(client, "user_s"),
        client_system_s=_number(client, "system_s"),
        servers=tuple(
            ProcessCpu(
                int(_number(p, "pid")),
                _number(p, "user_s"),
                _number(p, "system_s"),
                p.get("exited") is True,
            )
            for p in servers
        ),
        by_token=tuple(int(count) for count in by_token),
        warmup_statuses=_counts(data["warmup"], "statuses"),
        gzip_requests=int(_number(measured, "gzip_requests")),
        conditional_requests=int(_number(measured, "conditional_requests")),
        connects=int(_number(measured, "connects")),
        offered_per_s=_number(rate, "offered_per_s") if rate is not None else 0.0,
        achieved_per_s=(
            _number(rate, "achieved_per_s") if rate is not None else _number(data, "requests_per_s")
        ),
        behind_max_ms=_number(rate, "behind_max_ms") if rate is not None else 0.0,
        shape=dict(shape),
    )


def run(
    binary: Path,
    url: str,
    keys_file: Path,
    settings: LoadSettings,
    *,
    headers: Sequence[str] = (),
    cpu_pids: Sequence[int] = (),
) -> LoadResult:
    """One warm-up + measured run against ``url`` (``http://127.0.0.1:PORT``)."""
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    command = [str(binary), "--host", host, "--port", port, "--keys", str(keys_file),
               "--threads", str(settings.threads), "--connections", str(settings.connections),
               "--warmup", f"{settings.warmup_s:g}", "--duration", f"{settings.duration_s:g}",
               "--seed", str(settings.seed), *settings.options()]  # fmt: skip
    for header in headers:
        command += ["--header", header]
    for pid in cpu_pids:
        command += ["--cpu-pid", str(pid)]
    limit = settings.warmup_s + settings.duration_s + 30
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"the load client did not finish within {limit:g} s") from exc
    if done.returncode != 0:
        raise BenchError(
            f"the load client failed ({done.returncode}) on {url}: {done.stderr.strip()}"
        )
    return parse(done.stdout)
