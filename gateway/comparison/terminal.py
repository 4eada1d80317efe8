"""A comparison report (``Tally.report``) as text for a terminal: the totals, then a
table per route with its worst fields first, noise apart."""

from __future__ import annotations

import difflib
import json
from typing import Any

_EXAMPLE_CHARS = 60


def to_text(report: dict[str, Any]) -> str:
    """The report of ``Tally.report()`` (or of ``GET /admin/shadow``) as text."""
    totals = report["totals"]
    lines = [
        f"primary:   {report['primary']}",
        f"candidate: {report['candidate']}",
        f"since:     {report['since']}",
        "",
        f"compared {totals['compared']} requests: {totals['identical']} identical"
        f" ({_share(totals['identicalShare'])}), {totals['different']} different,"
        f" {totals['noiseOnly']} only in noise; candidate errors {totals['candidateErrors']},"
        f" skipped {totals['skipped']}",
    ]
    if not report["routes"]:
        lines += ["", "nothing compared yet"]
    for name, route in report["routes"].items():
        lines += ["", *_route_lines(name, route)]
    return "\n".join(lines)


def _route_lines(name: str, route: dict[str, Any]) -> list[str]:
    lines = [
        f"== {name}: {route['compared']} compared, {route['identical']} identical"
        f" ({_share(route['identicalShare'])}), {route['different']} different,"
        f" {route['noiseOnly']} only in noise, {route['skipped']} skipped",
    ]
    errors = route["candidateErrors"]
    if errors:
        shown = ", ".join(f"{what} x{count}" for what, count in errors.items())
        lines.append(f"   candidate errors: {shown}")
    if route["fields"]:
        lines += _table("differences (worst first)", route["fields"])
    if route["noise"]:
        lines += _table("noise (differs between two answers of the primary)", route["noise"])
    if not route["fields"] and not route["noise"] and not errors:
        lines.append("   no difference")
    return lines


def _table(title: str, fields: list[dict[str, Any]]) -> list[str]:
    width = max(len("field"), *(len(item["field"]) for item in fields))
    lines = [f"   {title}:", f"   {'field':<{width}}  {'count':>6}  kinds             example"]
    for item in fields:
        kinds = ", ".join(f"{kind} {count}" for kind, count in item["kinds"].items()) or "-"
        examples = item["examples"] or item.get("evidence") or []
        example = ""
        if examples:
            first = examples[0]
            example = (
                f"{_cut(first['primary'])} -> {_cut(first['candidate'])}"
                f"  (request {first['requestId']})"
            )
        lines.append(f"   {item['field']:<{width}}  {item['total']:>6}  {kinds:<16}  {example}")
    return lines


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _cut(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= _EXAMPLE_CHARS else text[: _EXAMPLE_CHARS - 3] + "..."


def answers_text(kept: dict[str, Any]) -> str:
    """The two whole answers of a request that differed, as a unified diff of their
    indented JSON: ``-`` the primary's lines, ``+`` the candidate's."""
    primary = json.dumps(json.loads(kept["primary"]), indent=2).splitlines()
    candidate = json.dumps(json.loads(kept["candidate"]), indent=2).splitlines()
    head = f"request {kept['requestId']} ({kept['route']}): {kept['target']}"
    diff = difflib.unified_diff(primary, candidate, "primary", "candidate", lineterm="", n=2)
    return "\n".join([head, *diff]) if primary != candidate else f"{head}\nthe same answers"
