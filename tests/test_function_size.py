"""No function of the serving core (``gateway/records``, ``gateway/http``,
``gateway/cache``, ``gateway/fastpath``) is longer than 60 lines, from its ``def`` to its
last line, so that each reads on one screen (docs/architecture.md). Functions that only
hold the OpenAPI document's schema data are apart: they are data, written as code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
CORE = ("records", "http", "cache", "fastpath")
LONGEST = 60
# (module, function) pairs that return the OpenAPI document's schema data, and nothing else
SCHEMA_DATA = frozenset(
    {
        ("http/openapi_admin.py", "admin_schemas"),
        ("http/openapi.py", "_readiness_schema"),
        ("http/openapi_responses.py", "problem_schemas"),
        ("http/openapi_responses.py", "headers"),
    }
)


def _functions(path: Path) -> list[tuple[str, int, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _modules() -> list[Path]:
    return sorted(path for layer in CORE for path in (PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("module", _modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_function_of_the_serving_core_is_longer_than_60_lines(module: Path) -> None:
    relative = str(module.relative_to(PACKAGE))
    too_long = [
        f"{name} (line {line}): {length} lines"
        for name, line, length in _functions(module)
        if length > LONGEST and (relative, name) not in SCHEMA_DATA
    ]
    assert too_long == []


def test_the_schema_data_apart_is_still_there() -> None:
    """Each exemption names a function that exists: a renamed one is not silently let off."""
    for relative, name in SCHEMA_DATA:
        assert name in {found for found, _, _ in _functions(PACKAGE / relative)}, relative
