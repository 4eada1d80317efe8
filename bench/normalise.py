"""How long the normalise step takes for one page of 100 expenses.

Run it as ``.venv/bin/python bench/normalise.py``. The page is built from the reference
data set (seed 42) exactly as the reference upstream writes it: each expense through
``expense_json`` (embedded account, client and user included) and orjson, inside the
page envelope. What is timed:

- ``direct``: ``Normaliser.normalise``, the gateway's whole step (lossless parse,
  ``canonical_body``, orjson), with its caches warm, as in a running gateway;
- ``direct, cold caches``: the same, with the date and percentage caches emptied
  before every call (a freshly started gateway);
- ``pydantic``: parse, ``ExpensePage.model_validate``, ``dump``, for comparison;
- ``parse only``: the lossless parse alone, the floor of both.

Each figure is the best and the median of 7 runs of 200 iterations (the cold figure:
of 1,400 single calls). The figures go to bench/results/normalise.json; one summary
line goes to stdout. This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.demo import generate_dataset
from gateway.demo.params import PageRequest
from gateway.demo.representations import expense_json
from gateway.demo.store import page_envelope
from gateway.normalise import coercions
from gateway.normalise.normaliser import CoercionCounts, Normaliser, dump, parse_lossless
from gateway.normalise.pages import ExpensePage
from gateway.normalise.schema import NormaliseContext
from gateway.records.routes import parse_record_query
from gateway.routing.standard import EXPENSES

PAGE_SIZE = 100
RUNS = 7
ITERATIONS = 200
BUDGET_MS = 2.0
RESULTS = Path(__file__).parent / "results" / "normalise.json"


def upstream_page(size: int = PAGE_SIZE) -> bytes:
    """Page 1 of /expenses?limit=<size>, in the bytes the reference upstream writes."""
    items = [orjson.dumps(expense_json(e)) for e in generate_dataset(42).expenses]
    return page_envelope(items, PageRequest(page=1, limit=size))


def per_call_ms(function: Callable[[], object]) -> dict[str, float]:
    """Best and median milliseconds per call over RUNS runs of ITERATIONS calls."""
    function()  # warm up: imports, caches, branch predictors
    runs = timeit.repeat(function, number=ITERATIONS, repeat=RUNS)
    per_call = [run / ITERATIONS * 1000 for run in runs]
    return {"best_ms": round(min(per_call), 4), "median_ms": round(statistics.median(per_call), 4)}


def cold_ms(function: Callable[[], object]) -> dict[str, float]:
    """Like per_call_ms, each call timed alone after the value caches are emptied."""
    samples = []
    for _ in range(RUNS * ITERATIONS):
        coercions.clear_value_caches()
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return {"best_ms": round(min(samples), 4), "median_ms": round(statistics.median(samples), 4)}


def machine() -> str:
    """The CPU model and count, for reading the figures later."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def measure() -> dict[str, Any]:
    body = upstream_page()
    query = parse_record_query(EXPENSES, None, [("limit", str(PAGE_SIZE))], max_limit=1000)
    normaliser = Normaliser(CoercionCounts())

    def direct() -> bytes:
        return normaliser.normalise(query, body)

    def via_models() -> bytes:
        context = NormaliseContext(page=1, limit=PAGE_SIZE)
        return dump(ExpensePage.model_validate(parse_lossless(body), context=context))

    if direct() != via_models():
        raise SystemExit("the direct and the pydantic path disagree; fix that first")
    return {
        "what": f"normalise one page of {PAGE_SIZE} expenses (embedded account, client, user)",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": machine(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "page_bytes_in": len(body),
        "page_bytes_out": len(direct()),
        "runs": RUNS,
        "iterations_per_run": ITERATIONS,
        "budget_ms": BUDGET_MS,
        "direct": per_call_ms(direct),
        "direct_cold_caches": cold_ms(direct),
        "pydantic": per_call_ms(via_models),
        "parse_only": per_call_ms(lambda: parse_lossless(body)),
    }


def main() -> None:
    results = measure()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    direct, pydantic = results["direct"], results["pydantic"]
    verdict = "within" if direct["median_ms"] < BUDGET_MS else "OVER"
    print(
        f"normalise: {PAGE_SIZE} expenses ({results['page_bytes_in'] // 1024} KiB) in"
        f" {direct['best_ms']:.2f} ms best / {direct['median_ms']:.2f} ms median"
        f" ({verdict} the {BUDGET_MS:g} ms budget; cold caches"
        f" {results['direct_cold_caches']['median_ms']:.2f} ms);"
        f" pydantic path {pydantic['median_ms']:.2f} ms median;"
        f" parse alone {results['parse_only']['median_ms']:.2f} ms -> {RESULTS}",
        file=sys.stdout,
    )


if __name__ == "__main__":
    main()
