"""``make bench``: the gateway's throughput and latency next to a floor, nginx and Varnish.

Starts everything on 127.0.0.1 (the reference upstream with 20 ms latency, a
redis-server, the floor app, nginx, the gateway in each configuration). The
single-key part loads each with the same wrk command after a warm-up, in interleaved
rounds, then checks coalescing and the memory backend's bound; the mix part loads
every mix row (bench/mixrun.py: the gateway, nginx and Varnish) with the mix's load
client, many tokens and keys, in interleaved rounds too. It writes
``bench/results/latest.{md,json}``, refreshes the table in ``bench/README.md`` (whole
runs only) and prints it. Everything it started is stopped on the way out, Ctrl-C
included. bench/README.md explains how to read it.

    .venv/bin/python bench/run.py [--rounds 3] [--duration 5] [--warmup 2] [--soak 40]
                                  [--only all|single|mix|matrix] [--profile ROW ...]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matrix
import mix
import mixrun
import normalise
import probes
import profile_row
import report
import wrk
from loadgen import LoadSettings
from servers import (
    AUTH,
    BENCH,
    TOKEN,
    BenchError,
    Gateway,
    Stack,
    gateway_config,
    http_get,
    nginx_binary,
    run_in_stack,
    start_floor,
    start_gateway,
    start_miss_floor,
    start_nginx,
    start_redis,
    start_upstream,
    varnishd_binary,
)

UPSTREAM_LATENCY_MS = 20.0
HIT_PATH = "/expenses?limit=10"
COLD_PATH = "/expenses?limit=10&page=7"
COALESCE_REQUESTS = 500
SOAK_MAX_BYTES = 16 * 1024 * 1024
SOAK_CONCURRENCY = 32
ADMIN_TOKEN = "bench-admin-token-0123456789"
# Interleaved in this order (rotated by one each round).
CONFIGS = (
    "floor",
    "hit-memory",
    "hit-redis",
    "hit-redis-2w",
    "nginx",
    "miss",
    "miss-floor",
    "direct",
)
HITS = ("hit-memory", "hit-redis", "hit-redis-2w")
RESULTS = BENCH / "results"
# The single-key ratios the rows are compared with (bench/README.md, the baseline).
BASELINE = RESULTS / "single-key-baseline.json"
# What a miss adds to one request, without queueing: these again with one connection.
UNLOADED = ("miss", "miss-floor", "direct")


def _x_cache(url: str) -> str:
    answer = http_get(url, AUTH)
    if answer.status != 200:
        raise BenchError(f"GET {url}: {answer.status} {answer.body[:300]!r}")
    return answer.headers.get("X-Cache", "-")


def prime(name: str, url: str) -> int:
    """One request to fill the cache, a second that must be a hit; returns the body size."""
    answer = http_get(url, AUTH)
    if answer.status != 200:
        raise BenchError(f"{name}: GET {url} answered {answer.status}: {answer.body[:300]!r}")
    seen = _x_cache(url)
    if seen != "HIT":
        raise BenchError(f"{name}: the second GET {url} is X-Cache {seen}, not HIT")
    return len(answer.body)


def one_body(name: str, url: str, headers: dict[str, str] | None = None) -> int:
    answer = http_get(url, headers if headers is not None else AUTH)
    if answer.status != 200:
        raise BenchError(f"{name}: GET {url} answered {answer.status}: {answer.body[:300]!r}")
    return len(answer.body)


def normalise_cost(url: str) -> dict[str, float]:
    """What the normalise step costs for the page a miss fetches (the reference
    upstream's own bytes), timed in this process as bench/normalise.py times it: the
    part of a miss's added latency that the miss target allows on top of 1 ms."""
    from gateway.normalise.normaliser import CoercionCounts, Normaliser
    from gateway.records.routes import parse_record_query
    from gateway.routing.standard import EXPENSES

    answer = http_get(url, AUTH)
    query = parse_record_query(EXPENSES, None, [("limit", "10")], max_limit=1000)
    normaliser = Normaliser(CoercionCounts())
    return normalise.per_call_ms(lambda: normaliser.normalise(query, answer.body))


def normalise_totals(gateway: Gateway) -> tuple[int, float]:
    """(answers normalised, seconds spent normalising) by ``gateway`` so far."""
    answers, mean_s = probes.histogram_mean(
        http_get(gateway.url + "/metrics").body.decode(), "gateway_normalise_duration_seconds"
    )
    return answers, answers * mean_s


def cache_results(gateway: Gateway) -> dict[str, float]:
    exposition = http_get(gateway.url + "/metrics").body.decode()
    return probes.by_label(exposition, "gateway_cache_results_total", "result")


def bench(stack: Stack, args: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    """The single-key part, the mix, then the matrix, as ``--only`` asks; all share the
    reference upstream (which accepts the single key's token and the mix's), Redis and
    nginx."""
    say = _printer()
    _, upstream = start_upstream(stack, UPSTREAM_LATENCY_MS, [TOKEN, *mix.tokens()])
    say(f"reference upstream {upstream} ({UPSTREAM_LATENCY_MS:g} ms latency)")
    redis_proc, redis_url = start_redis(stack)
    say(f"redis-server {redis_url}")
    nginx_proc, nginx = start_nginx(stack, upstream)
    say(f"nginx {nginx} (proxy_cache)")
    data: dict[str, Any] = {}
    if args.only in ("all", "single"):
        data.update(single_key(stack, args, notes, say, upstream, redis_url, nginx))
    settings = LoadSettings(
        threads=args.threads,
        connections=args.mix_connections,
        duration_s=args.duration,
        warmup_s=args.warmup,
    )
    if args.only in ("all", "mix"):
        say("the mix: every row on the same workload (bench/README.md, the mix)")
        single = wrk.WrkSettings(args.threads, args.connections, args.duration)
        data["mix"] = mixrun.run_part(
            stack,
            upstream,
            (redis_proc, redis_url),
            (nginx_proc, nginx),
            HIT_PATH,
            settings,
            single,
            args.rounds,
            say,
            notes,
        )
    if args.only in ("all", "matrix"):
        say("the matrix: traffic shapes x servers (bench/matrix.py)")
        data["matrix"] = matrix.run_part(
            stack,
            upstream,
            (redis_proc, redis_url),
            (nginx_proc, nginx),
            settings,
            args.rounds,
            say,
            notes,
        )
    return data


def single_key(
    stack: Stack,
    args: argparse.Namespace,
    notes: list[str],
    say: Callable[[str], None],
    upstream: str,
    redis_url: str,
    nginx: str,
) -> dict[str, Any]:
    """Today's rows: one request, repeated by wrk on every connection."""
    gateways = {
        "hit-memory": start_gateway(stack, "hit-memory", gateway_config(upstream, "memory")),
        "hit-redis": start_gateway(
            stack,
            "hit-redis",
            gateway_config(upstream, "redis", redis_url=redis_url, namespace="b1"),
        ),
        "hit-redis-2w": start_gateway(
            stack,
            "hit-redis-2w",
            gateway_config(upstream, "redis", redis_url=redis_url, workers=2, namespace="b2"),
        ),
        "miss": start_gateway(stack, "miss", gateway_config(upstream, "none")),
    }
    for name, gateway in gateways.items():
        say(f"gateway {name} {gateway.url}")

    sizes = {name: prime(name, gateways[name].url + HIT_PATH) for name in HITS}
    if len(set(sizes.values())) != 1:
        raise BenchError(f"the hit configurations answer different bodies: {sizes}")
    hit_size = sizes["hit-memory"]
    floor_proc, floor = start_floor(stack, hit_size)
    say(f"floor {floor} ({hit_size} bytes, the gateway's hit body)")
    sizes["nginx"] = prime("nginx", nginx + HIT_PATH)
    say(f"nginx {nginx} primed")
    sizes["floor"] = one_body("floor", floor + HIT_PATH)
    seen = _x_cache(gateways["miss"].url + HIT_PATH)
    if seen != "BYPASS":
        raise BenchError(f"miss: X-Cache {seen}, expected BYPASS with cache.backend = none")
    sizes["miss"] = one_body("miss", gateways["miss"].url + HIT_PATH)
    sizes["direct"] = one_body("direct", upstream + HIT_PATH)
    miss_floor_proc, miss_floor = start_miss_floor(stack, upstream)
    sizes["miss-floor"] = one_body("miss-floor", miss_floor + HIT_PATH)
    if sizes["miss-floor"] != sizes["miss"]:
        raise BenchError(f"miss-floor answers {sizes['miss-floor']} bytes, miss {sizes['miss']}")
    say(f"miss floor {miss_floor} (a bare aiohttp proxy and the gateway's normaliser)")
    normalising = normalise_cost(upstream + HIT_PATH)
    say(f"normalising the miss page takes {normalising['median_ms']:.3f} ms (median)")
    before = {name: cache_results(gateways[name]) for name in HITS}

    urls = {
        "floor": floor + HIT_PATH,
        **{name: gateways[name].url + HIT_PATH for name in (*HITS, "miss")},
        "nginx": nginx + HIT_PATH,
        "miss-floor": miss_floor + HIT_PATH,
        "direct": upstream + HIT_PATH,
    }
    settings = wrk.WrkSettings(args.threads, args.connections, args.duration)
    single = wrk.WrkSettings(1, 1, args.duration)
    rounds: dict[str, list[wrk.WrkResult]] = {name: [] for name in CONFIGS}
    unloaded: dict[str, list[wrk.WrkResult]] = {name: [] for name in UNLOADED}
    # what normalising took inside the miss gateway during its one-connection runs
    normalised_single = [0, 0.0]  # answers, seconds
    for index in range(args.rounds):
        order = CONFIGS[index % len(CONFIGS) :] + CONFIGS[: index % len(CONFIGS)]
        runs = [(name, settings, rounds) for name in order]
        runs += [(name, single, unloaded) for name in UNLOADED]
        for name, how, into in runs:
            label = name if how is settings else f"{name} (1 conn)"
            warm = wrk.run(how, urls[name], duration_s=args.warmup)
            if warm.non_2xx or warm.socket_errors:
                notes.append(
                    f"{label}, round {index + 1}: warm-up had {warm.non_2xx} non-2xx "
                    f"and {warm.socket_errors} socket errors"
                )
            counting = name == "miss" and how is single
            if counting:
                answers_before, seconds_before = normalise_totals(gateways["miss"])
            result = wrk.run(how, urls[name])
            if counting:
                answers_after, seconds_after = normalise_totals(gateways["miss"])
                normalised_single[0] += answers_after - answers_before
                normalised_single[1] += seconds_after - seconds_before
            into[name].append(result)
            say(
                f"round {index + 1}/{args.rounds} {label:<16} {result.requests_per_s:>9,.0f} req/s"
                f"  p50 {result.p50_ms:6.2f} ms  p99 {result.p99_ms:6.2f} ms"
                + (
                    f"  ({result.non_2xx} non-2xx, {result.socket_errors} socket errors)"
                    if result.non_2xx or result.socket_errors
                    else ""
                )
            )

    # what normalising cost inside the miss gateway, over every run it served
    answers, seconds = normalise_totals(gateways["miss"])
    normalised_inside = {
        "answers": answers,
        "mean_ms": round(seconds * 1000 / answers if answers else 0.0, 3),
    }
    single_answers, single_seconds = normalised_single
    normalised_inside["single_answers"] = single_answers
    normalised_inside["single_mean_ms"] = round(
        single_seconds * 1000 / single_answers if single_answers else 0.0, 3
    )
    for name in HITS:
        seen = _x_cache(urls[name])
        after = cache_results(gateways[name])
        other = {
            result: after.get(result, 0) - before[name].get(result, 0)
            for result in ("miss", "stale", "bypass")
            if after.get(result, 0) - before[name].get(result, 0)
        }
        if seen != "HIT" or other:
            notes.append(
                f"{name} was not all hits: X-Cache {seen} after the runs; during them {other}"
            )
    say("near cache: a purge on one instance, timed until another stops serving its copy")
    shared = gateway_config(upstream, "redis", redis_url=redis_url, namespace="near")
    shared["admin"] = {"token": ADMIN_TOKEN}
    near = [start_gateway(stack, f"near-{n}", shared) for n in ("a", "b")]
    invalidated = asyncio.run(
        probes.invalidation(near[0].url, near[1].url, HIT_PATH, ADMIN_TOKEN, trials=5)
    )
    for gateway in near:
        stack.stop(gateway.proc)
    say(f"near cache: worst {invalidated.worst_ms:.1f} ms over {invalidated.trials} purges")

    for proc in (*[g.proc for g in gateways.values()], floor_proc, miss_floor_proc):
        stack.stop(proc)

    table = report.summarise(rounds)
    configs = {
        name: {
            **table[name].as_dict(),
            "body_bytes": sizes[name],
            "socket_errors": sum(r.socket_errors for r in rounds[name]),
            "non_2xx": sum(r.non_2xx for r in rounds[name]),
            "rounds": [r.as_dict() for r in rounds[name]],
        }
        for name in CONFIGS
    }
    single_table = report.summarise_unloaded(unloaded)

    say(f"coalesce: {COALESCE_REQUESTS} concurrent requests for {COLD_PATH}")
    fresh = start_gateway(stack, "coalesce", gateway_config(upstream, "memory"))
    coalesced = asyncio.run(probes.coalesce(fresh.url, COLD_PATH, COALESCE_REQUESTS))
    stack.stop(fresh.proc)
    say(f"coalesce: {coalesced.upstream_calls} upstream call(s), X-Cache {coalesced.x_cache}")

    total = json.loads(http_get(upstream + "/expenses?limit=1", AUTH).body)["total"]
    paths = probes.soak_paths(int(total), max_limit=100)
    config = gateway_config(upstream, "memory")
    config["cache"]["memory_max_bytes"] = SOAK_MAX_BYTES
    soaked = start_gateway(stack, "soak", config)
    say(f"soak: {len(paths):,} keys, {SOAK_CONCURRENCY} callers, up to {args.soak:g} s")
    soak = asyncio.run(
        probes.soak(
            soaked.url,
            soaked.proc.pid,
            paths,
            max_bytes=SOAK_MAX_BYTES,
            concurrency=SOAK_CONCURRENCY,
            duration_s=args.soak,
        )
    )
    stack.stop(soaked.proc)
    say(f"soak: {soak.requests:,} requests, peak RSS {soak.rss_peak / probes.MIB:.1f} MiB")

    return {
        "settings": {
            "wrk": settings.shown(),
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "upstream_latency_ms": UPSTREAM_LATENCY_MS,
            "hit_path": HIT_PATH,
            "gateway_configs": {
                name: gateway.config_path.read_text() for name, gateway in gateways.items()
            },
        },
        "configs": configs,
        "unloaded": {
            "wrk": single.shown(),
            "configs": {
                name: {
                    **single_table[name],
                    "non_2xx": sum(r.non_2xx for r in unloaded[name]),
                    "rounds": [r.as_dict() for r in unloaded[name]],
                }
                for name in UNLOADED
            },
        },
        "normalise_ms": normalising,
        "normalise_in_gateway": normalised_inside,
        "coalesce": coalesced.as_dict(),
        "invalidation": invalidated.as_dict(),
        "soak": soak.as_dict(),
    }


def _printer() -> Callable[[str], None]:
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)

    return say


def _missing_tools(only: str) -> list[str]:
    missing = [tool for tool in ("wrk", "redis-server") if shutil.which(tool) is None]
    missing += ["nginx"] if nginx_binary() is None else []
    if only != "single":
        missing += ["varnish"] if varnishd_binary() is None else []
        missing += ["gcc"] if shutil.which("gcc") is None else []
    return missing


def _commits() -> tuple[str, str]:
    """(HEAD, the last commit that changed gateway/), ``+dirty`` when gateway/ has
    changes not committed: the code measured."""

    def git(*argv: str) -> str:
        done = subprocess.run(
            ["git", *argv], cwd=BENCH.parent, capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    dirty = "+dirty" if git("status", "--porcelain", "--", "gateway") else ""
    head = git("rev-parse", "HEAD") or "unknown"
    return head + dirty, (git("log", "-1", "--format=%H", "--", "gateway") or "unknown") + dirty


def main() -> int:
    if "--profile" in sys.argv[1:]:
        # bench/run.py --profile ROW [options] is bench/profile_row.py ROW [options]
        rest = sys.argv[1:]
        rest.remove("--profile")
        return profile_row.main(rest)
    parser = argparse.ArgumentParser(description="records-gateway bench (see bench/README.md)")
    parser.add_argument(
        "--profile",
        metavar="ROW",
        help="profile one gateway row of the mix instead (bench/profile_row.py ROW --help)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5, help="seconds of each measured run")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of the warm-up before each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--soak", type=float, default=40.0, help="seconds of the memory soak")
    parser.add_argument(
        "--only",
        choices=("all", "single", "mix", "matrix"),
        default="all",
        help="run one part: the single-key rows (with their probes), the mix, or the "
        "matrix of traffic shapes",
    )
    parser.add_argument(
        "--mix-connections",
        type=int,
        default=mix.CONNECTIONS,
        help="the mix's connections (a multiple of 24 tokens x threads keeps them even)",
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="folder of latest.md and latest.json"
    )
    parser.add_argument(
        "--record-baseline",
        action="store_true",
        help=f"store this run's single-key ratios as {BASELINE.name} for its Python version",
    )
    args = parser.parse_args()
    if args.record_baseline and args.only not in ("all", "single"):
        parser.error("--record-baseline needs the single-key rows")

    missing = _missing_tools(args.only)
    if missing:
        print(
            f"bench: missing {', '.join(missing)}; `make bench` installs them as root",
            file=sys.stderr,
        )
        return 1
    started = time.monotonic()
    cpu_before = report.cpu_snapshot()
    load_before = report.load_average()
    notes: list[str] = []
    data, status = run_in_stack("bench", lambda stack: bench(stack, args, notes))
    if data is None:
        return status
    elapsed = time.monotonic() - started
    others = report.foreign_cpu(cpu_before, report.cpu_snapshot())
    if others["share"] > 0.05:
        notes.append(
            f"other processes on the machine used {others['share']:.0%} of its CPU during the "
            "run: the numbers are noisier and lower than on a quiet machine"
        )
    if "configs" in data:
        baseline = report.baseline_for(BASELINE, platform.python_version())
        if baseline is None:
            notes.append(
                f"no single-key baseline for Python {platform.python_version()} in "
                f"bench/results/{BASELINE.name}: the single-key rows are not compared with one"
            )
        else:
            data["single_key_baseline"] = baseline
    data = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": report.machine(),
        "elapsed_s": round(elapsed, 1),
        "load_average_at_start": load_before,
        "foreign_cpu": others,
        **data,
        "targets": [target.as_dict() for target in report.targets(data)],
        "notes": notes,
    }
    print()
    if args.record_baseline:
        report.record_baseline(BASELINE, data, *_commits())
        print(f"bench: the single-key ratios of this run are the baseline in {BASELINE}")
    # Only a whole run into the default folder is "the latest" that the README quotes.
    readme = BENCH / "README.md" if args.results == RESULTS and args.only == "all" else None
    print(report.write(args.results, readme, data))
    print(f"bench: done in {elapsed:.0f} s; results in {args.results}/latest.md and latest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
