"""The docs name the tests that hold their claims (docs/deployment.md's tables of
faults): every test they name exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _named_tests() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for path, name in NAMED.findall(doc.read_text()):
            found.append((doc.name, path, name))
    return found


@pytest.mark.parametrize(
    ("section", "least"),
    [("## Faults, and what callers see", 10), ("## When the upstream fails", 8)],
)
def test_the_tables_of_faults_name_a_test_on_every_row(section: str, least: int) -> None:
    text = (ROOT / "docs" / "deployment.md").read_text()
    table = text.split(section, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > least  # the header and the faults
    for row in rows[1:]:
        assert NAMED.search(row), row


@pytest.mark.parametrize(("doc", "path", "name"), _named_tests())
def test_every_test_a_doc_names_exists(doc: str, path: str, name: str) -> None:
    source = ROOT / path
    assert source.is_file(), f"{doc} names {path}, which does not exist"
    defined = {
        node.name
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert name in defined, f"{doc} names {path}::{name}, which is not defined there"
