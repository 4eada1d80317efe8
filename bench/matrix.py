"""The matrix part of the bench: traffic shapes as callers send them, against every server.

The mix (bench/mixrun.py) is one shape: each connection carries one token for its
whole life. Internal services call through pooled clients instead, so the matrix runs
each of these shapes (rows) against each server (columns), in interleaved rounds:

a-token-per-connection   the mix as it is: connection i carries token i mod 24
b-pooled                 each request of any connection draws its token, then its key
c-hot-key                one key (the mix's heaviest), every connection
d-flat                   b's 6,000 keys with equal weights (no hot set)
e-gzip-mixed             b, half the requests sending ``Accept-Encoding: gzip``
f-conditional            b, a third of the requests sending ``If-None-Match`` with the
                         ETag the client saw for that key (answered 304)
g-connection-per-request b, each request on a connection of its own (``Connection: close``)

Servers: ``gateway`` (the memory backend, one process, the fast path on),
``gateway-redis`` (Redis and the near cache), ``gateway-plain`` (as ``gateway`` with
``server.fast_path = false``: public aiohttp only), ``floor`` (bench/replay_floor.py: a
bare aiohttp app replaying ``gateway``'s own answers from a dict, the public path's
floor), ``ceiling`` (bench/replay_ceiling.py: a bare asyncio Protocol on uvloop
replaying the same answers, the least any Python server needs; the gateway's CPU per
answer beyond it is the gateway's own), nginx and Varnish (the mix's).

Beside the closed-loop cells: the pooled shape at fixed offered rates (half and four
fifths of nginx's requests/s in b), latency counted from each request's intended send
time; and the pooled shape on nginx by a second load client (wrk, bench/mix.lua) against
the bench's own.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
import mix
import mixrun
import wrkmix
from loadgen import LoadResult, LoadSettings
from mixrun import GZIP, WHOLE_MIX_BYTES, MixStack, Peer
from servers import (
    BenchError,
    Proc,
    Stack,
    gateway_config,
    group_members,
    start_gateway,
    start_script,
)


@dataclass(frozen=True, slots=True)
class Shape:
    """One traffic shape: which keys, and how the load client sends them."""

    keys: str = "mix"  # "mix", "flat" (equal weights) or "hot" (one key)
    pooled: bool = True
    gzip_share: float = 0.0
    conditional_share: float = 0.0
    close: bool = False

    def settings(self, base: LoadSettings, rate: float = 0.0) -> LoadSettings:
        return dataclasses.replace(
            base,
            pooled=self.pooled,
            gzip_share=self.gzip_share,
            conditional_share=self.conditional_share,
            close=self.close,
            rate=rate,
        )


SHAPES: Mapping[str, Shape] = {
    "a-token-per-connection": Shape(pooled=False),
    "b-pooled": Shape(),
    "c-hot-key": Shape(keys="hot", pooled=False),
    "d-flat": Shape(keys="flat"),
    "e-gzip-mixed": Shape(gzip_share=0.5),
    "f-conditional": Shape(conditional_share=1 / 3),
    "g-connection-per-request": Shape(close=True),
}
POOLED = "b-pooled"
PER_REQUEST = "g-connection-per-request"
GATEWAYS = ("gateway", "gateway-redis", "gateway-plain")
SERVERS = (*GATEWAYS, "floor", "ceiling", "nginx", "varnish")
# the gateway columns held to the targets (gateway-plain is held to the floor)
JUDGED = ("gateway", "gateway-redis")
# the offered rates of the open-loop runs, as shares of nginx's requests/s in b
RATES = (0.5, 0.8)
NAMESPACE = "xr"


def keys_files(m: MixStack) -> dict[str, Path]:
    """The keys file of each kind of shape: the mix's, its keys at equal weights, and
    its heaviest key alone."""
    flat = m.stack.dir / "matrix-flat-keys.txt"
    mix.write_keys(flat, m.keys, flat=True)
    hot = m.stack.dir / "matrix-hot-key.txt"
    mix.write_keys(hot, [max(m.keys, key=lambda key: key.weight)])
    return {"mix": m.keys_file, "flat": flat, "hot": hot}


def start_servers(
    m: MixStack, nginx: Peer, say: Callable[[str], None], notes: list[str]
) -> dict[str, Peer]:
    """Every column's server, warm: each key answered a HIT both with and without gzip."""
    peers: dict[str, Peer] = {}
    # sized for the whole mix, as the entries are: its pages' identity bodies (about 21
    # MB) do not fit the memo's default, and shapes a to d and f are identity callers
    whole = WHOLE_MIX_BYTES
    configs = {
        "gateway": gateway_config(
            m.upstream, "memory", memory_max_bytes=WHOLE_MIX_BYTES, identity_memo_max_bytes=whole
        ),
        "gateway-redis": gateway_config(
            m.upstream,
            "redis",
            redis_url=m.redis_url,
            namespace=NAMESPACE,
            near_cache=True,
            near_max_bytes=WHOLE_MIX_BYTES,
            identity_memo_max_bytes=whole,
        ),
        "gateway-plain": gateway_config(
            m.upstream, "memory", memory_max_bytes=WHOLE_MIX_BYTES, identity_memo_max_bytes=whole
        ),
    }
    configs["gateway-plain"]["server"] = {**configs["gateway-plain"]["server"], "fast_path": False}
    for name, config in configs.items():
        gateway = start_gateway(m.stack, f"matrix-{name}", config)
        pids = tuple(sorted(group_members(gateway.proc.pid)))
        peers[name] = Peer(name, gateway.url, gateway.proc, pids, (), gateway)
        say(f"matrix: {name} {gateway.url}")
    peers["varnish"] = mixrun.start_varnish_peer(m)
    peers["nginx"] = nginx
    for peer in peers.values():
        warm_both(m, peer, say, notes)
    # the floor replays the warm gateway's own answers
    peers["floor"] = start_floor(m.stack, peers["gateway"].url)
    say(f"matrix: floor {peers['floor'].url} (replaying {peers['gateway'].url})")
    warm_both(m, peers["floor"], say, notes)
    peers["ceiling"] = start_ceiling(m.stack, peers["gateway"].url)
    say(f"matrix: ceiling {peers['ceiling'].url} (replaying {peers['gateway'].url})")
    warm_both(m, peers["ceiling"], say, notes)
    return peers


def warm_both(m: MixStack, peer: Peer, say: Callable[[str], None], notes: list[str]) -> None:
    for headers in ((), (GZIP,)):
        mixrun.fill(m, dataclasses.replace(peer, headers=headers), say, notes)


def start_floor(stack: Stack, origin: str) -> Peer:
    proc, url = start_script(stack, "matrix-floor", "replay_floor.py", "--origin", origin)
    return Peer("floor", url, proc, (proc.pid,))


def start_ceiling(stack: Stack, origin: str) -> Peer:
    proc, url = start_script(stack, "matrix-ceiling", "replay_ceiling.py", "--origin", origin)
    return Peer("ceiling", url, proc, (proc.pid,))


def run_cell(
    m: MixStack,
    peers: Mapping[str, Peer],
    files: Mapping[str, Path],
    server: str,
    shape: Shape,
    base: LoadSettings,
    rate: float = 0.0,
) -> LoadResult:
    """One run of the load client in ``shape`` (at ``rate``, or closed loop) against
    ``server``, reading the CPU of its processes (and of Redis for the Redis column)."""
    peer = peers[server]
    redis = [m.redis_pid] if server == "gateway-redis" else []
    return loadgen.run(
        m.client,
        peer.url,
        files[shape.keys],
        shape.settings(base, rate=rate),
        cpu_pids=[*sorted(group_members(peer.proc.pid)), *redis],
    )


def closed_loop(
    m: MixStack,
    peers: Mapping[str, Peer],
    files: Mapping[str, Path],
    base: LoadSettings,
    rounds: int,
    say: Callable[[str], None],
) -> dict[str, dict[str, list[LoadResult]]]:
    """``rounds`` rounds of every cell, the servers' order rotated by one each round."""
    results: dict[str, dict[str, list[LoadResult]]] = {
        shape: {server: [] for server in SERVERS} for shape in SHAPES
    }
    for index in range(rounds):
        order = list(SERVERS[index % len(SERVERS) :] + SERVERS[: index % len(SERVERS)])
        for shape_name, shape in SHAPES.items():
            for server in order:
                result = run_cell(m, peers, files, server, shape, base)
                results[shape_name][server].append(result)
                say(
                    f"round {index + 1}/{rounds} {shape_name:<24} {server:<13} "
                    f"{result.requests_per_s:>9,.0f} req/s  p99 {result.p99_ms:6.2f} ms"
                    f"  CPU {_cpu_us(result, m.redis_pid):5.1f} µs/req"
                )
    return results


def open_loop(
    m: MixStack,
    peers: Mapping[str, Peer],
    files: Mapping[str, Path],
    base: LoadSettings,
    nginx_max: float,
    say: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """The pooled shape at each of ``RATES`` x ``nginx_max``, against every server."""
    found: dict[str, dict[str, Any]] = {}
    shape = SHAPES[POOLED]
    for share in RATES:
        rate = round(share * nginx_max)
        by_server: dict[str, Any] = {}
        for server in SERVERS:
            result = run_cell(m, peers, files, server, shape, base, rate)
            kept_up = result.achieved_per_s >= 0.97 * rate
            by_server[server] = {
                "offered_per_s": rate,
                "achieved_per_s": round(result.achieved_per_s, 1),
                "kept_up": kept_up,
                "p50_ms": result.p50_ms,
                "p99_ms": result.p99_ms,
                "p999_ms": result.p999_ms,
                "behind_max_ms": result.behind_max_ms,
            }
            say(
                f"open loop {share:.0%} of nginx ({rate:,} req/s) {server:<13} "
                f"{result.achieved_per_s:>9,.0f} req/s  p99 {result.p99_ms:7.2f}  "
                f"p99.9 {result.p999_ms:7.2f} ms" + ("" if kept_up else "  (fell behind)")
            )
        found[f"{share:.2f}"] = by_server
    return found


def _cpu_us(result: LoadResult, redis_pid: int) -> float:
    """The server's CPU per request in µs (its processes, Redis's not)."""
    user, system = result.cpu_of([redis_pid], but=True)
    return (user + system) * 1e6 / result.requests if result.requests else 0.0


def cell_summary(results: Sequence[LoadResult], redis_pid: int | None) -> dict[str, Any]:
    """Medians over the rounds of one cell; CPU per request in µs, user and system apart
    (the server's processes; Redis's apart)."""

    def per_request(part: str, server: bool = True) -> float:
        values = []
        for r in results:
            user, system = r.cpu_of([redis_pid] if redis_pid else [], but=server)
            used = {"user": user, "system": system, "total": user + system}[part]
            values.append(used * 1e6 / r.requests if r.requests else 0.0)
        return round(statistics.median(values), 2)

    cell: dict[str, Any] = {
        "requests_per_s": round(statistics.median(r.requests_per_s for r in results), 1),
        "p50_ms": round(statistics.median(r.p50_ms for r in results), 3),
        "p99_ms": round(statistics.median(r.p99_ms for r in results), 3),
        "p999_ms": round(statistics.median(r.p999_ms for r in results), 3),
        "cpu_us": {
            "user": per_request("user"),
            "system": per_request("system"),
            "total": per_request("total"),
        },
        "statuses": _summed(r.statuses for r in results),
        "x_cache": _summed(r.x_cache for r in results),
        "errors": sum(r.errors for r in results),
    }
    if redis_pid is not None:
        cell["redis_cpu_us"] = per_request("total", server=False)
    return cell


def _summed(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for name, count in one.items():
            total[name] = total.get(name, 0) + count
    return total


def summarise(
    results: Mapping[str, Mapping[str, Sequence[LoadResult]]], redis_pid: int
) -> dict[str, dict[str, Any]]:
    """Every cell's medians and its ratios to nginx's and Varnish's requests/s in the
    same shape."""
    table: dict[str, dict[str, Any]] = {}
    for shape, servers in results.items():
        cells = {
            server: cell_summary(runs, redis_pid if server == "gateway-redis" else None)
            for server, runs in servers.items()
        }
        for peer, column in (("nginx", "x_nginx"), ("varnish", "x_varnish"), ("floor", "x_floor")):
            bar = cells[peer]["requests_per_s"]
            for cell in cells.values():
                cell[column] = round(cell["requests_per_s"] / bar, 2) if bar else 0.0
        table[shape] = cells
    return table


def client_check(
    m: MixStack, nginx: Peer, base: LoadSettings, rounds: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """The pooled shape on nginx by both load clients, ``rounds`` times each."""
    shape = SHAPES[POOLED]
    by_wrk, by_loadgen = [], []
    for index in range(rounds):
        ours = loadgen.run(m.client, nginx.url, m.keys_file, shape.settings(base))
        theirs = wrkmix.run(
            wrkmix.WrkMixSettings(
                threads=base.threads,
                connections=base.connections,
                duration_s=int(base.duration_s),
            ),
            nginx.url,
            m.keys_file,
        )
        by_loadgen.append(ours.requests_per_s)
        by_wrk.append(theirs.requests_per_s)
        say(
            f"round {index + 1}/{rounds} pooled on nginx: load client "
            f"{ours.requests_per_s:,.0f} req/s, wrk {theirs.requests_per_s:,.0f} req/s"
        )
    ours_median, theirs_median = statistics.median(by_loadgen), statistics.median(by_wrk)
    return {
        "shape": POOLED,
        "loadgen_requests_per_s": round(ours_median, 1),
        "wrk_requests_per_s": round(theirs_median, 1),
        "ratio": round(ours_median / theirs_median, 3) if theirs_median else 0.0,
        "rounds": {"loadgen": by_loadgen, "wrk": by_wrk},
    }


def run_part(
    stack: Stack,
    upstream: str,
    redis: tuple[Proc, str],
    nginx: tuple[Proc, str],
    base: LoadSettings,
    rounds: int,
    say: Callable[[str], None],
    notes: list[str],
) -> dict[str, Any]:
    """The whole matrix part of ``make bench``."""
    redis_proc, redis_url = redis
    nginx_proc, nginx_url = nginx
    m = mixrun.prepare(stack, upstream, redis_url, redis_proc.pid)
    files = keys_files(m)
    nginx_peer = mixrun.peer_of("nginx", nginx_proc, nginx_url)
    peers = start_servers(m, nginx_peer, say, notes)
    results = closed_loop(m, peers, files, base, rounds, say)
    table = summarise(results, redis_proc.pid)
    nginx_max = table[POOLED]["nginx"]["requests_per_s"]
    if not nginx_max:
        raise BenchError("nginx answered nothing in the pooled shape: no rate to offer")
    rates = open_loop(m, peers, files, base, nginx_max, say)
    check = client_check(m, nginx_peer, base, rounds, say)
    for name, peer in peers.items():
        if name != "nginx":
            stack.stop(peer.proc)
    return {
        "settings": {
            "load": base.shown(),
            "threads": base.threads,
            "connections": base.connections,
            "warmup_s": base.warmup_s,
            "duration_s": base.duration_s,
            "rounds": rounds,
            "shapes": {name: dataclasses.asdict(shape) for name, shape in SHAPES.items()},
            "servers": list(SERVERS),
        },
        "cells": table,
        "open_loop": rates,
        "client_check": check,
    }
