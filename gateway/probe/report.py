"""The probe's report for people (text) and for programs (JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict

from gateway.probe.conformance import PROBE_LIMIT, ProbeReport, RouteReport


def to_json(report: ProbeReport) -> str:
    """The report as JSON: every route with every field, then the summary."""
    document = {
        "base_url": report.base_url,
        "ok": report.ok,
        "exit_code": report.exit_code,
        "summary": {
            "routes": len(report.routes),
            "ok": report.count("ok"),
            "failed": report.count("failed"),
            "skipped": report.count("skipped"),
        },
        "routes": [asdict(route) for route in report.routes],
        "mixed_types": report.mixed_types(),
    }
    return json.dumps(document, indent=2, ensure_ascii=False)


def to_text(report: ProbeReport) -> str:
    """The report for a person: per route, per field, aligned; the summary last."""
    lines = [
        f"Probe of {report.base_url} (page 1, limit {PROBE_LIMIT} of each list)",
        "",
    ]
    for route in report.routes:
        lines += _route_text(route)
        lines.append("")
    mixed = report.mixed_types()
    if mixed:
        lines.append("Fields sent as more than one JSON type:")
        width = max(map(len, mixed))
        for field, routes in mixed.items():
            where = "; ".join(
                f"{template}: {_counts(variants)}" for template, variants in routes.items()
            )
            lines.append(f"  {field:<{width}}  {where}")
        lines.append("")
    lines.append(_summary(report))
    return "\n".join(lines)


def _route_text(route: RouteReport) -> list[str]:
    if route.outcome == "skipped":
        return [f"GET {route.template}  SKIPPED", f"  {route.detail}"]
    head = f"GET {route.target}  {route.outcome.upper()}"
    facts = []
    if route.upstream_status is not None:
        facts.append(f"status {route.upstream_status}")
    if route.detail is None:
        facts.append(f"{route.records} record{'' if route.records == 1 else 's'}")
    if route.elapsed_ms is not None:
        facts.append(f"{route.elapsed_ms} ms")
    facts.append(f"request {route.request_id}")
    lines = [f"{head}  ({', '.join(facts)})"]
    if route.detail is not None:
        return [*lines, f"  {route.detail}"]
    lines += _table(
        ("field", "sent as", "coercions"),
        [(f.field, _counts(f.variants), _counts(f.coercions)) for f in route.fields],
    )
    unknown = [f"{f.field} {', '.join(f.unknown_values)}" for f in route.fields if f.unknown_values]
    lines += [
        _listing("missing, filled with null", [_counts(route.filled_with_null)]),
        _listing("extra fields dropped", route.dropped),
        _listing("unknown enumeration values", unknown),
    ]
    if route.failures:
        lines.append(f"  failures ({len(route.failures)}):")
        width = max(len(failure.path) for failure in route.failures)
        lines += [f"    {f.path:<{width}}  {f.reason}" for f in route.failures]
    else:
        lines.append("  failures: none")
    return lines


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _listing(title: str, items: Iterable[str]) -> str:
    return f"  {title}: {', '.join(items) or 'none'}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} ×{count}" for name, count in counts.items())


def _summary(report: ProbeReport) -> str:
    counts = (
        f"{len(report.routes)} routes: {report.count('ok')} OK, {report.count('failed')} failed,"
        f" {report.count('skipped')} skipped"
    )
    if report.ok:
        return f"{counts}. Exit 0: every route probed normalises."
    return f"{counts}. Exit 1: not every route normalises."
