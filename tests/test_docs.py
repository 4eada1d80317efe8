"""Pages never name tests; tests name the pages whose claims they hold (docs/testing.md,
"Tests hold the docs' claims"): every page and section a test names is there, and every
row of docs/deployment.md's tables of faults is held by a test that names it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config.reference import reference_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# the pages of the site and the README; bench/ and deploy/ have their own, shown on the site
PAGES = [
    ROOT / "README.md",
    ROOT / "bench" / "README.md",
    ROOT / "deploy" / "README.md",
    *sorted(DOCS.glob("*.md")),
]
# the site's pages written at build time (mkdocs_hooks.py), and what they hold
GENERATED = {
    "configuration.md": reference_markdown(),
    "bench/README.md": (ROOT / "bench" / "README.md").read_text(encoding="utf-8"),
    "deploy/README.md": (ROOT / "deploy" / "README.md").read_text(encoding="utf-8"),
}
A_TEST = re.compile(r"tests/[\w/]*test_\w*\.py|::test_\w+")
A_PAGE = re.compile(r'docs/([\w/-]+\.md)(?:,? "([^"]+)")?')
FAULT_TABLES = ("Faults, and what callers see", "When the upstream fails")


def _flat(text: str) -> str:
    """``text`` on one line: line breaks, a comment's ``#`` and indentation as one space."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


TESTS = {
    path: _flat(path.read_text(encoding="utf-8"))
    for path in sorted(ROOT.glob("tests/**/*.py"))
    if path.name != "test_docs.py"
}


def _page(name: str) -> str:
    if name in GENERATED:
        return GENERATED[name]
    return (DOCS / name).read_text(encoding="utf-8")


def _headings(text: str) -> set[str]:
    """The page's headings, without an attribute list; none of a code block's lines."""
    found = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,4} (.*?)(?: \{[^}]*\})?$", line)
        if heading:
            found.add(heading[1].strip())
    return found


def _named() -> list[tuple[str, str, str | None]]:
    named = set()
    for path, text in TESTS.items():
        for page, section in A_PAGE.findall(text):
            named.add((str(path.relative_to(ROOT)), page, section or None))
    return sorted(named, key=lambda item: (item[0], item[1], item[2] or ""))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_names_a_test(page: Path) -> None:
    named = A_TEST.findall(page.read_text(encoding="utf-8"))
    assert named == [], f"{page.name} names tests: {named}"


@pytest.mark.parametrize(("test", "page", "section"), _named())
def test_every_page_and_section_a_test_names_is_there(
    test: str, page: str, section: str | None
) -> None:
    assert page in GENERATED or (DOCS / page).is_file(), f"{test} names docs/{page}"
    if section is not None:
        assert section in _headings(_page(page)), f'{test} names docs/{page}, "{section}"'


@pytest.mark.parametrize("table", FAULT_TABLES)
def test_every_fault_of_the_tables_is_held_by_a_test(table: str) -> None:
    text = (DOCS / "deployment.md").read_text(encoding="utf-8")
    rows = text.split(f"## {table}", 1)[1].split("\n## ", 1)[0]
    faults = [
        line.split("|")[1].strip()
        for line in rows.splitlines()
        if line.startswith("| ") and "---" not in line
    ][1:]
    assert len(faults) >= 8
    everything = " ".join(TESTS.values())
    for fault in faults:
        held = f'Held for docs/deployment.md, "{table}": {fault[:40]}'
        assert held in everything, f"no test holds {fault!r}"


def test_every_log_event_the_troubleshooting_page_names_is_one_the_gateway_logs() -> None:
    """docs/troubleshooting.md, "By log event": each `event` it names is logged."""
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    table = page.split("## By log event", 1)[1]
    named = re.findall(
        r"`([a-z_]+)`",
        "\n".join(row.split("|")[1] for row in table.splitlines() if row.startswith("| `")),
    )
    source = " ".join(path.read_text(encoding="utf-8") for path in (ROOT / "gateway").rglob("*.py"))
    logged = set(re.findall(r'"event": "([a-z_]+)"|event="([a-z_]+)"', source))
    events = {name for pair in logged for name in pair if name}
    # a breaker logs "<its name>_circuit" (gateway.ops.circuit): "cache" and "upstream"
    breakers = re.findall(r'name(?:: str)? ?= ?"([a-z]+)"', source)
    events |= {f"{name}_circuit" for name in breakers}
    events |= set(re.findall(r'"(start_failed|config_error)"', source))
    named.remove("event")  # the table's heading
    assert len(named) >= 20
    for event in named:
        assert event in events, f"docs/troubleshooting.md names {event!r}, which nothing logs"


def test_every_problem_type_the_troubleshooting_page_names_has_its_section() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    errors = _headings((DOCS / "errors.md").read_text(encoding="utf-8"))
    linked = re.findall(r"\]\(errors\.md#([a-z-]+)\)", page)
    assert len(set(linked)) >= 15
    for slug in linked:
        assert f"`{slug}`" in errors
