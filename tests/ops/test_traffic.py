"""Each route's traffic and the keys it fetched (gateway.ops.traffic), as GET
/admin/ttl and the admin console show them (docs/console.md, "TTLs")."""

from __future__ import annotations

import pytest

from gateway.ops.traffic import KeySketch, Traffic, estimated


def test_a_key_is_counted_once_and_many_keys_within_a_few_per_cent() -> None:
    sketch = KeySketch()
    assert sketch.add("users|page=1|token-a") == pytest.approx(1.0)
    assert sketch.add("users|page=1|token-a") == 0.0
    grown = 1 + sum(sketch.add(f"expenses|page={n}|token-{n % 97}") for n in range(200_000))
    assert abs(grown - 200_001) / 200_001 < 0.02
    assert estimated(0) == 0
    # four processes' estimates add up: no process's bits are taken for another's
    sketches = [KeySketch() for _ in range(4)]
    total = sum(sketches[n % 4].add(f"k{n}") for n in range(300_000))
    assert abs(total - 300_000) / 300_000 < 0.02


def test_the_best_hit_ratio_is_every_key_missed_once_bypasses_aside() -> None:
    traffic = Traffic(counts={"hits": 90, "stale": 5, "misses": 5, "bypasses": 10}, distinct_keys=4)
    assert traffic.best_hit_ratio == round(96 / 110, 4)
    assert traffic.as_json()["hitRatio"] == round(95 / 110, 4)
    assert Traffic().best_hit_ratio is None
