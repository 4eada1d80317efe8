"""Before the mix is measured: every key in every peer's cache, and proof that it is there.

``request_each`` asks a peer for every key of the mix once (``CONCURRENCY`` at a time,
each with its own token and the row's extra headers), and tells what came back: the
keys that did not answer 200, the ``X-Cache`` values, the body bytes. The bench runs
it twice per peer: the first pass fills the cache (and must answer 200 for every key),
the second must find every key a hit. ``working_set`` is what the gateway's near
cache would hold of every entry in one Redis namespace.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import redis
from mix import Key

from gateway.cache.keyspace import ENTRY_PART, LEASE_SUFFIX
from gateway.cache.memory import ENTRY_OVERHEAD_BYTES

# Enough to fill quickly (the upstream answers in 20 ms), few enough that a gateway
# normalising its misses keeps its event loop's turns short.
CONCURRENCY = 32


@dataclass(slots=True)
class Pass:
    """What one request of every key answered."""

    keys: int
    failed: list[tuple[str, str, int]] = field(default_factory=list)  # token, target, status
    x_cache: dict[str, int] = field(default_factory=dict)
    body_bytes: int = 0
    gzip: int = 0
    seconds: float = 0.0

    @property
    def hits(self) -> int:
        return self.x_cache.get("HIT", 0)

    def failures(self, shown: int = 20) -> str:
        """The keys that did not answer 200, for a message."""
        lines = [f"  {status} {target} (token {token})" for token, target, status in self.failed]
        more = len(lines) - shown
        return "\n".join(lines[:shown] + ([f"  ... and {more} more"] if more > 0 else []))

    def as_dict(self) -> dict[str, object]:
        return {
            "keys": self.keys,
            "not_200": len(self.failed),
            "x_cache": dict(sorted(self.x_cache.items())),
            "body_bytes": self.body_bytes,
            "gzip_answers": self.gzip,
            "seconds": round(self.seconds, 2),
        }


async def request_each(
    base: str, keys: Sequence[Key], headers: Sequence[str] = (), concurrency: int = CONCURRENCY
) -> Pass:
    """One GET of every key against ``base``, ``concurrency`` at a time.

    The client sends no Accept-Encoding of its own (aiohttp would add one) and does not
    decompress: the peer sees what the load client sends, and the bytes are the wire's."""
    extra = dict(header.split(": ", 1) for header in headers)
    result = Pass(keys=len(keys))
    seen: collections.Counter[str] = collections.Counter()
    todo = iter(keys)
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
    ) as session:

        async def worker() -> None:
            for key in todo:
                wanted = {"Authorization": key.authorization, **extra}
                async with session.get(base + key.target, headers=wanted) as response:
                    body = await response.read()
                if response.status != 200:
                    result.failed.append((key.token, key.target, response.status))
                seen[response.headers.get("X-Cache", "-")] += 1
                result.body_bytes += len(body)
                if "gzip" in response.headers.get("Content-Encoding", ""):
                    result.gzip += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - started
    result.x_cache = dict(seen)
    return result


def entry_pattern(namespace: str) -> str:
    """The Redis keys of a namespace's entries (``namespace:upstream:e:...``)."""
    return f"{namespace}:*:{ENTRY_PART}:*"


def working_set(redis_url: str, namespace: str) -> tuple[int, int]:
    """(entries, bytes) of one namespace's entries, counted as the near cache charges
    them: the key, the stored entry (body with its ETag and a header of a few dozen
    bytes) and ``ENTRY_OVERHEAD_BYTES``."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        names = [
            name
            for name in client.scan_iter(match=entry_pattern(namespace), count=1000)
            if not name.endswith(LEASE_SUFFIX.encode())
        ]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.strlen(name)
        sizes = pipe.execute()
    finally:
        client.close()
    charged = zip(names, sizes, strict=True)
    total = sum(len(name) + int(size) + ENTRY_OVERHEAD_BYTES for name, size in charged)
    return len(names), total
