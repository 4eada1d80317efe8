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
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
import mix
import probes
import warm
from loadgen import LoadResult, LoadSettings
from servers import (
    AUTH,
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
    keys = mix.keys()
    keys_file = stack.dir / "mix-keys.txt"
    mix.write_keys(keys_file, keys)
    client = loadgen.compile_client(stack.dir)
    return MixStack(stack, upstream, redis_url, redis_pid, client, keys_file, keys)


def row_config(m: MixStack, name: str, near_max_bytes: int = WHOLE_MIX_BYTES) -> dict[str, Any]:
    """The gateway config of one mix row."""
    if name == "mix-memory":
        return gateway_config(m.upstream, "memory", memory_max_bytes=WHOLE_MIX_BYTES)
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
    then every key again (each should be a hit; the others are listed under Notes)."""
    first = asyncio.run(warm.request_each(peer.url, m.keys, peer.headers))
    if first.failed:
        raise BenchError(
            f"{peer.name}: {len(first.failed)} of {first.keys} keys did not answer 200 while "
            f"warming:\n{first.failures()}"
        )
    second = asyncio.run(warm.request_each(peer.url, m.keys, peer.headers))
    if second.failed or second.hits != second.keys:
        notes.append(
            f"{peer.name}: the second warm-up pass was not all hits: X-Cache {second.x_cache}, "
            f"{len(second.failed)} not 200" + (f"; {cache_faults(peer)}" if peer.gateway else "")
        )
    say(
        f"{peer.name}: {first.keys:,} keys warmed in {first.seconds:.1f} s, "
        f"then {second.hits:,} hits of {second.keys:,}"
    )
    return {"first": first.as_dict(), "second": second.as_dict()}


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
    exposition = http_get(peer.url + "/metrics").body.decode()
    return probes.by_label(exposition, "gateway_cache_results_total", "result")


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
    """The misses, stale answers and bypasses between two readings of the results."""
    return {
        result: after.get(result, 0) - before.get(result, 0)
        for result in ("miss", "stale", "bypass")
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
            result = loadgen.run(
                m.client,
                peer.url,
                m.keys_file,
                settings,
                headers=peer.headers,
                cpu_pids=[*peer.pids, *redis],
            )
            results[name].append(result)
            used = sum(p.total_s for p in result.servers if p.pid in peer.pids)
            trouble = result.non_200 or result.errors
            say(
                f"round {index + 1}/{rounds} {name:<18} {result.requests_per_s:>9,.0f} req/s"
                f"  p50 {result.p50_ms:6.2f}  p99 {result.p99_ms:6.2f}  p99.9 "
                f"{result.p999_ms:6.2f} ms  CPU {used * 1e6 / max(result.requests, 1):5.1f} µs/req"
                + (f"  ({result.non_200} non-200, {result.errors} errors)" if trouble else "")
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


def row_summary(
    name: str, results: Sequence[LoadResult], pids: Sequence[int], redis_pid: int | None
) -> dict[str, Any]:
    """Medians over the rounds of one row: throughput, latency, CPU per 1,000 requests
    (the server's processes together, user and system; Redis's apart), bytes."""

    def cpu(of: Sequence[int], part: str) -> float:
        values = []
        for r in results:
            user, system = r.cpu_of(of)
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
            "user_s": round(cpu(pids, "user"), 4),
            "system_s": round(cpu(pids, "system"), 4),
            "total_s": round(cpu(pids, "total"), 4),
        },
        "client_cpu_per_1000_s": round(
            statistics.median(r.client_cpu_ms_per_1000 / 1000 for r in results), 4
        ),
        "mean_body_bytes": round(sum(r.body_bytes for r in results) / requests) if requests else 0,
        "gzip_share": round(sum(r.gzip_answers for r in results) / requests, 4) if requests else 0,
        "non_200": sum(r.non_200 for r in results),
        "errors": sum(r.errors for r in results),
        "pids": list(pids),
        "rounds": [r.as_dict() for r in results],
    }
    cpu_share = row["cpu_per_1000"]
    row["system_share"] = (
        round(cpu_share["system_s"] / cpu_share["total_s"], 3) if cpu_share["total_s"] else 0.0
    )
    if redis_pid is not None:
        row["redis_cpu_per_1000_s"] = round(cpu([redis_pid], "total"), 4)
    return row


def summarise(
    results: Mapping[str, Sequence[LoadResult]], peers: Mapping[str, Peer], redis_pid: int
) -> dict[str, dict[str, Any]]:
    rows = {
        name: row_summary(
            name, results[name], peers[name].pids, redis_pid if name in REDIS_ROWS else None
        )
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
