"""What purging by record costs (docs/purging.md): the store, the index, the purge.

Run it as ``.venv/bin/python bench/records.py`` (``make bench-records``); it starts its
own redis-server and a three-primary Redis Cluster on free ports. What is measured:

- **the store**: CPU of this process per stored entry, a page of 10 expenses of the
  reference data set (seed 42) as the gateway stores it (normalise, compress, write to
  a standalone Redis), without the index (``normalise`` and ``set``, the store before
  purging by record) and with it (``normalise_held`` and ``set_holding``); the target
  is at most 1.10 x;
- **the index**: Redis's ``MEMORY USAGE`` of every record's set and purge mark, per
  entry, beside the entries' own, after every page of every route is stored for 24
  callers;
- **the purge**: the wall time of purging one record held by 10,000 entries over 24
  callers on the cluster, each entry in its own slot's node, p50 and p99 over repeated
  purges (the entries stored again between them).

The figures go to bench/results/records.json and bench/results/records.md; a summary
goes to stdout. This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as redis
from normalise import machine  # bench/normalise.py: the CPU model and count
from redis.asyncio.cluster import RedisCluster as ClusterClient

from gateway.cache.backend import EVERY_CALLER
from gateway.cache.coding import stored_body
from gateway.cache.entry import GZIP, CacheEntry, CacheKey, Generations, etag_of
from gateway.cache.redis import RedisBackend
from gateway.demo import generate_dataset
from gateway.demo.params import PageRequest
from gateway.demo.representations import expense_json
from gateway.demo.store import page_envelope
from gateway.normalise.normaliser import CoercionCounts, Normaliser
from gateway.records.keys import caller_of
from gateway.records.routes import parse_record_query
from gateway.routing.standard import EXPENSES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.redis_server import RedisServer
from tests.redis_topologies import RedisCluster

RESULTS = Path(__file__).parent / "results"
CALLERS = 24
PAGE_SIZE = 10
STORES = 200
STORE_ROUNDS = 21
HOLDERS = 10_000
PURGES = 15
TARGET_STORE_RATIO = 1.10


def pages() -> list[tuple[int, bytes]]:
    """Every page of PAGE_SIZE expenses, as (page number, upstream bytes)."""
    items = [orjson.dumps(expense_json(e)) for e in generate_dataset(42).expenses]
    count = (len(items) + PAGE_SIZE - 1) // PAGE_SIZE
    return [
        (page, page_envelope(items, PageRequest(page=page, limit=PAGE_SIZE)))
        for page in range(1, count + 1)
    ]


def query_of(page: int) -> Any:
    return parse_record_query(
        EXPENSES, None, [("page", str(page)), ("limit", str(PAGE_SIZE))], max_limit=100
    )


def key(page: int, caller: int) -> CacheKey:
    """An entry key of the gateway's shape (a 32-digit fingerprint per caller)."""
    return CacheKey("expenses", f"rg:bench:e:expenses||limit={PAGE_SIZE}&page={page}|{caller:032x}")


def before_the_index(published: bytes) -> tuple[bytes, str]:
    """The stored body as the store made it before purging by record: gzip at zlib's
    default level, 6 (since then ``GZIP_LEVEL``: bench/README.md, "Compression")."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return compressor.compress(published) + compressor.flush(), GZIP


async def store_cost(url: str) -> dict[str, Any]:
    """CPU per store without the index and with it, interleaved in rounds."""
    normaliser = Normaliser(CoercionCounts())
    backend = RedisBackend(redis.Redis.from_url(url), prefix="rg:bench", timeout_s=5.0)
    generations = (await backend.get(key(0, 0))).generations
    work = pages()

    async def one(index: int, held: bool) -> None:
        page, body = work[index % len(work)]
        asked = query_of(page)
        if held:
            published, holdings = normaliser.normalise_held(asked, body)
            coded, coding = stored_body(published)
        else:
            published = normaliser.normalise(asked, body)
            coded, coding = before_the_index(published)
        entry = CacheEntry(coded, etag_of(published), time.time(), 30, 200, generations, coding)
        target = key(page, index % CALLERS)
        if held:
            await backend.set_holding(target, entry, 60, holdings, 0)
        else:
            await backend.set(target, entry, 60)

    # short rounds, the two ways taking turns, so that what else the machine does
    # falls on both alike
    rounds: dict[bool, list[float]] = {False: [], True: []}
    for turn in range(STORE_ROUNDS):
        for held in (False, True) if turn % 2 else (True, False):
            started = time.process_time()
            for index in range(STORES):
                await one(turn * STORES + index, held)
            rounds[held].append((time.process_time() - started) / STORES * 1e6)
    await backend.close()
    plain = statistics.median(rounds[False])
    indexed = statistics.median(rounds[True])
    return {
        "stores_per_round": STORES,
        "rounds": STORE_ROUNDS,
        "without_index_us": round(plain, 1),
        "with_index_us": round(indexed, 1),
        "ratio": round(indexed / plain, 3),
        "target_ratio": TARGET_STORE_RATIO,
    }


async def index_size(url: str, consistency: str = "off") -> dict[str, Any]:
    """MEMORY USAGE of the index and of the entries, per entry, every page of 24 callers;
    with ``consistency`` ("caller" or "all", cache.record_consistency), each record's
    versions noted too (its hash of versions beside its set)."""
    client = redis.Redis.from_url(url)
    await client.flushall()
    normaliser = Normaliser(CoercionCounts())
    backend = RedisBackend(redis.Redis.from_url(url), prefix="rg:bench", timeout_s=5.0)
    generations = (await backend.get(key(0, 0))).generations
    records_per_entry = []
    entries = 0
    work = pages()
    for caller in range(CALLERS):
        for page, body in work:
            versions = consistency != "off"
            published, holdings = normaliser.normalise_held(query_of(page), body, versions=versions)
            coded, coding = stored_body(published)
            entry = CacheEntry(coded, etag_of(published), time.time(), 30, 200, generations, coding)
            target = key(page, caller)
            if versions:
                scope = EVERY_CALLER if consistency == "all" else caller_of(target)
                since = await backend.purge_sequence()
                await backend.set_consistent(target, entry, 60, holdings, since, scope)
            else:
                await backend.set_holding(target, entry, 60, holdings, 0)
            records_per_entry.append(len(holdings))
            entries += 1
    sizes = {"entries": 0, "index": 0, "sets": 0}
    async for name in client.scan_iter(match="rg:bench:*", count=1000):
        used = await client.memory_usage(name, samples=0) or 0
        if b":e:" in name:
            sizes["entries"] += used
        elif b":r}" in name:
            sizes["index"] += used
            sizes["sets"] += 0 if name.endswith((b":purged", b":r}")) else 1
    await client.aclose()
    await backend.close()
    return {
        "entries": entries,
        "callers": CALLERS,
        "records_per_entry": round(statistics.mean(records_per_entry), 1),
        "record_sets": sizes["sets"],
        "entry_bytes_per_entry": round(sizes["entries"] / entries),
        "index_bytes_per_entry": round(sizes["index"] / entries),
        "index_bytes_per_member": round(sizes["index"] / sum(records_per_entry)),
    }


async def purge_time(nodes: list[str]) -> dict[str, Any]:
    """One record held by HOLDERS entries over CALLERS callers, purged PURGES times."""
    host, port = nodes[0].split(":")
    client = ClusterClient(host=host, port=int(port), max_connections=256)
    backend = RedisBackend(client, prefix="rg:bench", timeout_s=10.0)
    generations = Generations(1, 1)
    body = b'{"data":[]}'
    coded, coding = stored_body(body)
    record = "account:Cuenta principal"

    async def fill() -> None:
        since = await backend.purge_sequence()
        batch = []
        for index in range(HOLDERS):
            entry = CacheEntry(coded, etag_of(body), time.time(), 30, 200, generations, coding)
            target = key(index // CALLERS, index % CALLERS)
            held = {record: "v1", f"expense:{index}": "v1"}
            batch.append(backend.set_holding(target, entry, 600, held, since))
            if len(batch) == 100:
                await asyncio.gather(*batch)
                batch = []
        await asyncio.gather(*batch)

    times = []
    reached = []
    for _ in range(PURGES):
        await fill()
        started = time.perf_counter()
        purged = await backend.purge_records([record], soft=False)
        times.append((time.perf_counter() - started) * 1000)
        reached.append(len(purged.keys))
    await backend.close()
    times.sort()
    return {
        "holders": HOLDERS,
        "callers": CALLERS,
        "nodes": len(nodes),
        "purges": PURGES,
        "entries_reached": sorted(set(reached)),
        "p50_ms": round(statistics.median(times), 1),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 1),
        "max_ms": round(times[-1], 1),
    }


async def measure() -> dict[str, Any]:
    server = RedisServer()
    server.start()
    cluster = RedisCluster()
    cluster.start()
    try:
        return {
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2),
            "store": await store_cost(server.url),
            "index": await index_size(server.url),
            "index_with_versions": {
                mode: await index_size(server.url, mode) for mode in ("caller", "all")
            },
            "purge": await purge_time(cluster.nodes),
        }
    finally:
        server.close()
        cluster.close()


def report(results: dict[str, Any]) -> str:
    store, index, purge = results["store"], results["index"], results["purge"]
    verdict = "PASS" if store["ratio"] <= store["target_ratio"] else "FAIL"
    rows = [
        (
            f"CPU per stored page of {PAGE_SIZE} expenses, without the index",
            f"{store['without_index_us']} µs",
        ),
        (
            "the same, with the index (records noted)",
            f"{store['with_index_us']} µs ({store['ratio']} x;"
            f" target <= {store['target_ratio']} x: {verdict})",
        ),
        (f"records an entry holds (pages of {PAGE_SIZE} expenses)", index["records_per_entry"]),
        ("Redis memory per entry: the entry", f"{index['entry_bytes_per_entry']} bytes"),
        (
            "Redis memory per entry: its part of the index",
            f"{index['index_bytes_per_entry']} bytes"
            f" ({index['index_bytes_per_member']} per record it holds)",
        ),
        *(
            (
                f"the same, with cache.record_consistency = {mode!r} (versions noted)",
                f"{sized['index_bytes_per_entry']} bytes"
                f" ({sized['index_bytes_per_member']} per record it holds)",
            )
            for mode, sized in results["index_with_versions"].items()
        ),
        (
            f"purge of one record held by {purge['holders']:,} entries of"
            f" {purge['callers']} callers, {purge['nodes']}-primary cluster",
            f"p50 {purge['p50_ms']} ms, p99 {purge['p99_ms']} ms (max {purge['max_ms']};"
            f" {purge['purges']} purges; entries reached {purge['entries_reached']})",
        ),
    ]
    return "\n".join(
        [
            "# Purge by record: what it costs",
            "",
            f"Measured {results['measured_at']} on {results['machine']},"
            f" Python {results['python']}"
            f" (load {results['load_average_1m']}).",
            "",
            "| what | figure |",
            "|---|---|",
            *(f"| {what} | {figure} |" for what, figure in rows),
            "",
        ]
    )


def main() -> None:
    results = asyncio.run(measure())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "records.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results)
    (RESULTS / "records.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
