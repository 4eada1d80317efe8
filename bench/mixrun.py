"""The mix part of the bench: every row on the mix workload, in interleaved rounds.

Rows (bench/README.md, "The mix"):

mix-memory          the gateway, memory backend large enough for every key
mix-redis           redis + near cache large enough for every key
mix-redis-quarter   redis + near cache at a quarter of the working set
mix-redis-nonear    redis, near cache off: every hit is a Redis read
mix-redis-2w        redis + near cache, two workers
mix-redis-gzip      as mix-redis, the load client sending ``Accept-Encoding: gzip``
mix-nginx           nginx's proxy_cache (the single-key rows' nginx)
mix-varnish         Varnish (bench/varnish.vcl)

Each gateway row is its own process (its own Redis namespace). Every peer is warmed
with every key before anything is measured (bench/warm.py) and must answer 200 for
each; then each round loads every row once with bench/loadgen.c, the order rotated
by one each round. The load client reads the CPU of every process of the server
(and of Redis) over the measured phase.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
import mix
import probes
import warm
import wrk
from loadgen import LoadResult, LoadSettings
from servers import (
    AUTH,
    VARNISH_STORAGE,
    BenchError,
    Gateway,
    Proc,
    Stack,
    gateway_config,
    group_members,
    http_get,
    start_gateway,
    start_varnish,
)

MIB = 1024 * 1024
GZIP = "Accept-Encoding: gzip"
# Large enough for every key of the mix (about 50 MiB as the caches count it).
WHOLE_MIX_BYTES = 512 * MIB
# The smallest near_max_bytes the gateway accepts.
NEAR_MINIMUM = MIB
# Passes over every key, after the one that fills the caches, looking for all hits.
CHECKS = 3
# The gateway's default cache.breaker_reset_s: how long an open cache breaker stays open.
BREAKER_RESET_S = 5.0
GATEWAY_ROWS = (
    "mix-memory",
    "mix-redis",
    "mix-redis-quarter",
    "mix-redis-nonear",
    "mix-redis-2w",
    "mix-redis-gzip",
)
ROWS = (*GATEWAY_ROWS, "mix-nginx", "mix-varnish")
REDIS_ROWS = tuple(row for row in GATEWAY_ROWS if row.startswith("mix-redis"))
# The row whose namespace, once warm, gives the working set the quarter row is sized on.
SIZING_ROW = "mix-redis"
NAMESPACES = {
    "mix-redis": "mr",
    "mix-redis-quarter": "mq",
    "mix-redis-nonear": "mn",
    "mix-redis-2w": "m2",
    "mix-redis-gzip": "mg",
}


@dataclass(frozen=True, slots=True)
class Peer:
    """One row's server: where it listens, its processes, what the client adds."""

    name: str
    url: str
    proc: Proc
    pids: tuple[int, ...]
    headers: tuple[str, ...] = ()
    gateway: Gateway | None = None


@dataclass(slots=True)
class MixStack:
    """What every mix row shares: the stack, the upstream, Redis, the client and its keys."""

    stack: Stack
    upstream: str
    redis_url: str
    redis_pid: int
    client: Path
    keys_file: Path
    keys: tuple[mix.Key, ...]


def prepare(stack: Stack, upstream: str, redis_url: str, redis_pid: int) -> MixStack:
    """Compile the load client and write the keys file into the stack's folder."""
    keys = mix.every_key()
    keys_file = stack.dir / "mix-keys.txt"
    mix.write_keys(keys_file, keys)
    client = loadgen.compile_client(stack.dir)
    return MixStack(stack, upstream, redis_url, redis_pid, client, keys_file, keys)


def row_config(m: MixStack, name: str, near_max_bytes: int = WHOLE_MIX_BYTES) -> dict[str, Any]:
    """The gateway config of one mix row."""
    if name == "mix-memory":
        return gateway_config(
            m.upstream,
            "memory",
            memory_max_bytes=WHOLE_MIX_BYTES,
            identity_memo_max_bytes=WHOLE_MIX_BYTES,
        )
    if name not in NAMESPACES:
        raise BenchError(f"no gateway row {name!r}; the rows: {', '.join(GATEWAY_ROWS)}")
    return gateway_config(
        m.upstream,
        "redis",
        redis_url=m.redis_url,
        namespace=NAMESPACES[name],
        workers=2 if name == "mix-redis-2w" else 1,
        near_cache=name != "mix-redis-nonear",
        near_max_bytes=near_max_bytes if name == "mix-redis-quarter" else WHOLE_MIX_BYTES,
        identity_memo_max_bytes=WHOLE_MIX_BYTES,
    )


def start_row(m: MixStack, name: str, near_max_bytes: int = WHOLE_MIX_BYTES) -> Peer:
    gateway = start_gateway(m.stack, name, row_config(m, name, near_max_bytes))
    headers = (GZIP,) if name == "mix-redis-gzip" else ()
    pids = tuple(sorted(group_members(gateway.proc.pid)))
    return Peer(name, gateway.url, gateway.proc, pids, headers, gateway)


def peer_of(name: str, proc: Proc, url: str) -> Peer:
    """nginx or Varnish (every process of its group: master or manager, and workers)."""
    return Peer(name, url, proc, tuple(sorted(group_members(proc.pid))))


def fill(m: MixStack, peer: Peer, say: Callable[[str], None], notes: list[str]) -> dict[str, Any]:
    """Every key once (each must answer 200, or BenchError lists those that did not),
    then every key again until a pass finds them all hits (at most ``CHECKS`` passes;
    each that does not is listed under Notes, with the gateway's cache errors, and the
    next waits for an open cache breaker to close)."""
    first = asyncio.run(warm.request_each(peer.url, m.keys, peer.headers))
    if first.failed:
        raise BenchError(
            f"{peer.name}: {len(first.failed)} of {first.keys} keys did not answer 200 while "
            f"warming:\n{first.failures()}"
        )
    checks: list[warm.Pass] = []
    for attempt in range(1, CHECKS + 1):
        check = asyncio.run(warm.request_each(peer.url, m.keys, peer.headers))
        checks.append(check)
        if not check.failed and check.hits == check.keys:
            break
        notes.append(
            f"{peer.name}: warm-up check {attempt} was not all hits: X-Cache {check.x_cache}, "
            f"{len(check.failed)} not 200" + (f"; {cache_faults(peer)}" if peer.gateway else "")
        )
        time.sleep(BREAKER_RESET_S)
    say(
        f"{peer.name}: {first.keys:,} keys warmed in {first.seconds:.1f} s, then "
        + ", ".join(f"{check.hits:,} hits" for check in checks)
        + f" of {first.keys:,}"
    )
    return {"fill": first.as_dict(), "checks": [check.as_dict() for check in checks]}


def quarter_of(working_set_bytes: int) -> int:
    """near_max_bytes of the quarter row: a quarter of the working set, at least the
    gateway's minimum."""
    return max(NEAR_MINIMUM, working_set_bytes // 4)


def sizing(m: MixStack) -> dict[str, Any]:
    """The working set of the sizing row's warm namespace and the quarter made of it."""
    entries, total = warm.working_set(m.redis_url, NAMESPACES[SIZING_ROW])
    if entries < len(m.keys):
        raise BenchError(
            f"{SIZING_ROW}'s namespace holds {entries} entries after the warm-up, "
            f"not the {len(m.keys)} keys"
        )
    return {
        "row": SIZING_ROW,
        "entries": entries,
        "bytes": total,
        "near_max_bytes": quarter_of(total),
        "counted": "per entry in Redis: key + stored entry (STRLEN) + ENTRY_OVERHEAD_BYTES, "
        "as the near cache charges an entry",
    }


def start_rows(
    m: MixStack,
    names: Sequence[str],
    peers: Mapping[str, Peer],
    say: Callable[[str], None],
    notes: list[str],
) -> tuple[dict[str, Peer], dict[str, Any], dict[str, Any]]:
    """Start the gateway rows of ``names`` (peers already started are given), warm
    every row; returns the peers, the warm-up passes and the quarter row's sizing."""
    started = dict(peers)
    passes: dict[str, Any] = {}
    for name in names:
        if name in started or name == "mix-redis-quarter":
            continue
        started[name] = start_row(m, name)
        say(f"gateway {name} {started[name].url}")
    for name in names:
        if name in started:
            passes[name] = fill(m, started[name], say, notes)
    sized: dict[str, Any] = {}
    if "mix-redis-quarter" in names:
        if SIZING_ROW not in passes:
            # the quarter is of the working set measured in a warm mix-redis
            helper = start_row(m, SIZING_ROW)
            fill(m, helper, say, notes)
            sized = sizing(m)
            m.stack.stop(helper.proc)
        else:
            sized = sizing(m)
        say(
            f"working set {sized['bytes'] / MIB:.1f} MiB over {sized['entries']:,} entries: "
            f"mix-redis-quarter's near_max_bytes = {sized['near_max_bytes']:,}"
        )
        quarter = start_row(m, "mix-redis-quarter", sized["near_max_bytes"])
        started["mix-redis-quarter"] = quarter
        say(f"gateway mix-redis-quarter {quarter.url}")
        passes["mix-redis-quarter"] = fill(m, quarter, say, notes)
    return started, passes, sized


def cache_results(peer: Peer) -> dict[str, float]:
    """The gateway's cache results so far (hit, miss, stale, bypass), and its cache
    errors (Redis calls that failed or timed out) as "error"."""
    exposition = http_get(peer.url + "/metrics").body.decode()
    results = probes.by_label(exposition, "gateway_cache_results_total", "result")
    results["error"] = probes.counter_total(exposition, "gateway_cache_errors_total")
    return results


def cache_faults(peer: Peer) -> str:
    """The gateway's cache errors and circuit state: why answers may not be hits."""
    exposition = http_get(peer.url + "/metrics").body.decode()
    errors = probes.counter_total(exposition, "gateway_cache_errors_total")
    circuit = [
        line.rsplit(" ", 1)[-1]
        for line in exposition.splitlines()
        if line.startswith("gateway_cache_circuit_state")
    ]
    return f"{errors:.0f} cache errors so far, cache circuit state {'/'.join(circuit) or '-'}"


def not_hits(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The misses, stale answers, bypasses and cache errors between two readings."""
    return {
        result: after.get(result, 0) - before.get(result, 0)
        for result in ("miss", "stale", "bypass", "error")
        if after.get(result, 0) - before.get(result, 0)
    }


def measure(
    m: MixStack,
    peers: Mapping[str, Peer],
    settings: LoadSettings,
    rounds: int,
    say: Callable[[str], None],
    notes: list[str],
    extra: Callable[[int], None] | None = None,
) -> dict[str, list[LoadResult]]:
    """``rounds`` interleaved rounds over ``peers`` (in the order given, rotated by one
    each round); ``extra(round)`` runs after each round's rows."""
    order = [name for name in ROWS if name in peers]
    before = {name: cache_results(peers[name]) for name in order if peers[name].gateway}
    results: dict[str, list[LoadResult]] = {name: [] for name in order}
    for index in range(rounds):
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            peer = peers[name]
            redis = [m.redis_pid] if name in REDIS_ROWS else []
            # read again each run: nginx's cache loader comes and goes
            pids = sorted(group_members(peer.proc.pid))
            result = loadgen.run(
                m.client,
                peer.url,
                m.keys_file,
                settings,
                headers=peer.headers,
                cpu_pids=[*pids, *redis],
            )
            results[name].append(result)
            used = sum(p.total_s for p in result.servers if p.pid in pids)
            trouble = result.non_200 or result.errors
            say(
                f"round {index + 1}/{rounds} {name:<18} {result.requests_per_s:>9,.0f} req/s"
                f"  p50 {result.p50_ms:6.2f}  p99 {result.p99_ms:6.2f}  p99.9 "
                f"{result.p999_ms:6.2f} ms  CPU {used * 1e6 / max(result.requests, 1):5.1f} µs/req"
                + (f"  ({result.non_200} non-200, {result.errors} errors)" if trouble else "")
            )
            gone = [p.pid for p in result.servers if p.exited]
            if gone:
                notes.append(
                    f"{name}, round {index + 1}: process(es) {gone} exited during the measured "
                    "phase; their CPU is not counted"
                )
            if result.warmup_non_200 or result.non_200 or result.errors:
                notes.append(
                    f"{name}, round {index + 1}: {result.warmup_non_200} non-200 in the warm-up, "
                    f"{result.non_200} non-200 and {result.errors} errors measured"
                )
        if extra is not None:
            extra(index)
    for name in order:
        peer = peers[name]
        if peer.gateway is not None:
            other = not_hits(before[name], cache_results(peer))
            if other:
                notes.append(f"{name} was not all hits during the runs: {other}")
        else:
            missed = sum(
                count for r in results[name] for label, count in r.x_cache.items() if label != "HIT"
            )
            if missed:
                notes.append(f"{name}: {missed} answers during the runs were not X-Cache HIT")
    return results


def per_1000(seconds: float, requests: int) -> float:
    """CPU seconds per 1,000 requests."""
    return seconds * 1000 / requests if requests else 0.0


def row_summary(results: Sequence[LoadResult], redis_pid: int | None) -> dict[str, Any]:
    """Medians over the rounds of one row: throughput, latency, CPU per 1,000 requests
    (the server's processes together, user and system; Redis's apart), bytes."""
    redis = [] if redis_pid is None else [redis_pid]

    def cpu(server: bool, part: str) -> float:
        values = []
        for r in results:
            user, system = r.cpu_of(redis, but=server)
            used = {"user": user, "system": system, "total": user + system}[part]
            values.append(per_1000(used, r.requests))
        return statistics.median(values)

    requests = sum(r.requests for r in results)
    row: dict[str, Any] = {
        "requests_per_s": round(statistics.median(r.requests_per_s for r in results), 1),
        "p50_ms": round(statistics.median(r.p50_ms for r in results), 3),
        "p99_ms": round(statistics.median(r.p99_ms for r in results), 3),
        "p999_ms": round(statistics.median(r.p999_ms for r in results), 3),
        "cpu_per_1000": {
            "user_s": round(cpu(True, "user"), 4),
            "system_s": round(cpu(True, "system"), 4),
            "total_s": round(cpu(True, "total"), 4),
        },
        "client_cpu_per_1000_s": round(
            statistics.median(r.client_cpu_ms_per_1000 / 1000 for r in results), 4
        ),
        "mean_body_bytes": round(sum(r.body_bytes for r in results) / requests) if requests else 0,
        "gzip_share": round(sum(r.gzip_answers for r in results) / requests, 4) if requests else 0,
        "non_200": sum(r.non_200 for r in results),
        "errors": sum(r.errors for r in results),
        "rounds": [r.as_dict() for r in results],
    }
    cpu_share = row["cpu_per_1000"]
    row["system_share"] = (
        round(cpu_share["system_s"] / cpu_share["total_s"], 3) if cpu_share["total_s"] else 0.0
    )
    if redis_pid is not None:
        row["redis_cpu_per_1000_s"] = round(cpu(False, "total"), 4)
    return row


def summarise(
    results: Mapping[str, Sequence[LoadResult]], redis_pid: int
) -> dict[str, dict[str, Any]]:
    """Every row's medians, and its ratios to nginx's and Varnish's requests/s."""
    rows = {
        name: row_summary(results[name], redis_pid if name in REDIS_ROWS else None)
        for name in results
    }
    for peer, column in (("mix-nginx", "x_nginx"), ("mix-varnish", "x_varnish")):
        if peer in rows and rows[peer]["requests_per_s"]:
            bar = rows[peer]["requests_per_s"]
            for row in rows.values():
                row[column] = round(row["requests_per_s"] / bar, 2)
    return rows


def start_varnish_peer(m: MixStack) -> Peer:
    proc, url = start_varnish(m.stack, m.upstream)
    return peer_of("mix-varnish", proc, url)


def single_key_file(folder: Path, path: str) -> Path:
    """A keys file of one key, the single-key rows' request (the demo token)."""
    keys_file = folder / "single-key.txt"
    keys_file.write_text(f"token {AUTH['Authorization']}\n1 {path}\n")
    return keys_file


def run_part(
    stack: Stack,
    upstream: str,
    redis: tuple[Proc, str],
    nginx: tuple[Proc, str],
    single_path: str,
    settings: LoadSettings,
    single: wrk.WrkSettings,
    rounds: int,
    say: Callable[[str], None],
    notes: list[str],
) -> dict[str, Any]:
    """The whole mix part of ``make bench``: start and warm every row, measure them in
    ``rounds`` interleaved rounds, and, in each round, check the load client against wrk
    on the single-key request (``single_path``) to nginx."""
    redis_proc, redis_url = redis
    nginx_proc, nginx_url = nginx
    single_url = nginx_url + single_path
    m = prepare(stack, upstream, redis_url, redis_proc.pid)
    routes = collections.Counter(key.route for key in m.keys)
    say(
        f"mix: {len(m.keys):,} keys of {mix.TOKENS} tokens over {len(routes)} routes; "
        f"load client built"
    )
    peers = {"mix-nginx": peer_of("mix-nginx", nginx_proc, nginx_url)}
    peers["mix-varnish"] = start_varnish_peer(m)
    say(f"varnish {peers['mix-varnish'].url} ({VARNISH_STORAGE})")
    peers, passes, sized = start_rows(m, ROWS, peers, say, notes)

    one_key = single_key_file(stack.dir, single_path)
    one_key_settings = dataclasses.replace(settings, connections=single.connections)
    check: dict[str, list[float]] = {"wrk": [], "loadgen": []}

    def client_check(index: int) -> None:
        wrk.run(single, single_url, duration_s=int(settings.warmup_s))
        by_wrk = wrk.run(single, single_url)
        by_client = loadgen.run(m.client, peers["mix-nginx"].url, one_key, one_key_settings)
        check["wrk"].append(by_wrk.requests_per_s)
        check["loadgen"].append(by_client.requests_per_s)
        say(
            f"round {index + 1}/{rounds} single key on nginx: wrk {by_wrk.requests_per_s:,.0f}"
            f" req/s, load client {by_client.requests_per_s:,.0f} req/s"
        )

    results = measure(m, peers, settings, rounds, say, notes, extra=client_check)
    configs = {
        name: peer.gateway.config_path.read_text()
        for name, peer in peers.items()
        if peer.gateway is not None
    }
    for peer in peers.values():
        if peer.name != "mix-nginx":
            stack.stop(peer.proc)
    by_wrk, by_client = statistics.median(check["wrk"]), statistics.median(check["loadgen"])
    return {
        "settings": {
            "load": settings.shown(),
            "threads": settings.threads,
            "connections": settings.connections,
            "warmup_s": settings.warmup_s,
            "duration_s": settings.duration_s,
            "rounds": rounds,
            "seed": settings.seed,
            "tokens": mix.TOKENS,
            "keys": len(m.keys),
            "distinct_targets": len({key.target for key in m.keys}),
            "keys_by_route": dict(routes),
            "varnish_storage": VARNISH_STORAGE,
            "gateway_configs": configs,
        },
        "working_set": sized,
        "warmup": passes,
        "rows": summarise(results, redis_proc.pid),
        "client_check": {
            "request": f"GET {single_path}",
            "connections": single.connections,
            "wrk_requests_per_s": round(by_wrk, 1),
            "loadgen_requests_per_s": round(by_client, 1),
            "ratio": round(by_client / by_wrk, 2) if by_wrk else 0.0,
            "rounds": check,
        },
    }
