"""Profile one gateway row of the mix with py-spy, for whoever works on the hit path.

    .venv/bin/python bench/profile_row.py mix-redis [--duration 20] [--rate 500] [--native]
                                                [--nonblocking] [--out FILE] [--top 30]

Starts what the row needs as ``make bench`` does (the reference upstream with the mix's
tokens, a redis-server for the redis rows, the row's gateway), warms every key of the
mix, then loads the row with the mix's load client and, once the client's warm-up is
over, runs ``py-spy record --format raw`` on the gateway (its workers too with two) for
``--duration`` seconds. It writes py-spy's raw file (one line per distinct stack:
``frame;frame;... count``, the root first) and prints the functions with the most
samples of their own (the stack's last frame) and in total (anywhere in the stack,
once per stack), a function being its name and file without the line. The load
client's figures for the same run are printed too; profiling slows the gateway, so
they are not the bench's.

The rows: mix-memory, mix-redis, mix-redis-quarter, mix-redis-nonear, mix-redis-2w,
mix-redis-gzip (bench/mixrun.py). py-spy is installed into the bench's venv by
``make bench``.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import mix
import mixrun
from loadgen import LoadResult, LoadSettings
from loadgen import run as load
from servers import BENCH, TOKEN, BenchError, Stack, run_in_stack, start_redis, start_upstream

UPSTREAM_LATENCY_MS = 20.0
_LINE = re.compile(r":\d+\)$")


@dataclass(frozen=True, slots=True)
class Profile:
    """Samples by function: of their own (the innermost frame) and in total."""

    samples: int
    own: collections.Counter[str]
    total: collections.Counter[str]


def function_of(frame: str) -> str:
    """``name (file.py:123)`` without its line: ``name (file.py)``."""
    return _LINE.sub(")", frame.strip())


def parse_raw(lines: Iterable[str]) -> Profile:
    """py-spy's raw (collapsed) output: ``frame;frame;...;frame count`` per line.

    A ``process ...`` root frame (``--subprocesses``) is not a function and is dropped."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [function_of(f) for f in stack.split(";") if not f.startswith("process ")]
        if not frames:
            continue
        weight = int(count)
        samples += weight
        own[frames[-1]] += weight
        for function in set(frames):
            total[function] += weight
    return Profile(samples, own, total)


def table(profile: Profile, top: int) -> str:
    """The top functions by own samples, then by total samples, in per cent."""
    lines: list[str] = []
    for title, counts in (("own", profile.own), ("total", profile.total)):
        lines += ["", f"top {top} by {title} time ({profile.samples:,} samples)", ""]
        lines.append("   own %  total %  function")
        for function, _ in counts.most_common(top):
            lines.append(
                f"  {100 * profile.own[function] / profile.samples:6.2f}"
                f"   {100 * profile.total[function] / profile.samples:6.2f}  {function}"
            )
    return "\n".join(lines)


def py_spy() -> str:
    found = Path(sys.executable).parent / "py-spy"
    binary = str(found) if found.exists() else shutil.which("py-spy")
    if binary is None:
        raise BenchError(
            "py-spy is missing: `make bench` installs it, or .venv/bin/pip install py-spy"
        )
    return binary


def profile(args: argparse.Namespace, stack: Stack) -> tuple[Profile, LoadResult]:
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)

    _, upstream = start_upstream(stack, UPSTREAM_LATENCY_MS, [TOKEN, *mix.tokens()])
    redis_proc, redis_url = start_redis(stack)
    m = mixrun.prepare(stack, upstream, redis_url, redis_proc.pid)
    notes: list[str] = []
    peers, _, sized = mixrun.start_rows(m, [args.row], {}, say, notes)
    for note in notes:
        say(f"note: {note}")
    peer = peers[args.row]
    settings = LoadSettings(warmup_s=args.warmup, duration_s=args.duration + 1)
    outcome: list[LoadResult] = []
    failure: list[BaseException] = []

    def client() -> None:
        try:
            outcome.append(load(m.client, peer.url, m.keys_file, settings, headers=peer.headers))
        except BaseException as exc:
            failure.append(exc)

    command = [py_spy(), "record", "--pid", str(peer.proc.pid), "--rate", str(args.rate),
               "--format", "raw", "--output", str(args.out),
               "--duration", str(args.duration)]  # fmt: skip
    if len(peer.pids) > 1:
        command.append("--subprocesses")
    command += ["--native"] if args.native else []
    command += ["--nonblocking"] if args.nonblocking else []
    say(f"loading {args.row} with the mix; py-spy on pid {peer.proc.pid} for {args.duration} s")
    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(args.warmup)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    thread.join()
    if failure:
        raise failure[0]
    if done.returncode != 0 or not args.out.exists():
        raise BenchError(f"py-spy failed ({done.returncode}): {done.stderr.strip()}")
    if sized:
        say(f"near_max_bytes {sized['near_max_bytes']:,} (a quarter of {sized['bytes']:,})")
    return parse_raw(args.out.read_text().splitlines()), outcome[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/profile_row.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("row", choices=mixrun.GATEWAY_ROWS)
    parser.add_argument("--duration", type=int, default=20, help="seconds py-spy samples")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before it")
    parser.add_argument("--rate", type=int, default=500, help="py-spy's samples per second")
    parser.add_argument("--native", action="store_true", help="py-spy --native (C frames)")
    parser.add_argument(
        "--nonblocking", action="store_true", help="py-spy --nonblocking (no pause per sample)"
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="the raw file (default below)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = BENCH / "results" / f"profile-{args.row}.txt"
    args.out = args.out.resolve()
    done, status = run_in_stack("profile", lambda stack: profile(args, stack))
    if done is None:
        return status
    found, result = done
    if not found.samples:
        print("profile: py-spy recorded no sample", file=sys.stderr)
        return 1
    print(table(found, args.top))
    print(
        f"\nunder py-spy: {result.requests_per_s:,.0f} req/s, p50 {result.p50_ms:.2f} ms, "
        f"p99 {result.p99_ms:.2f} ms ({result.non_200} non-200, {result.errors} errors)"
    )
    print(f"raw py-spy output: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
