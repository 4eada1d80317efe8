"""MkDocs hooks (mkdocs.yml): the pages and files of the site written at build time, so
that none of them is a copy that can drift.

- ``configuration.md``: the configuration reference, from the settings model
  (:func:`gateway.config.reference.reference_markdown`);
- ``openapi.json``: the document the gateway publishes, admin routes included, and
  ``swagger-ui/``: the files of ``GET /docs``, which ``api.md`` renders it with;
- ``bench/README.md`` and ``deploy/README.md``: those folders' own pages, as they are;
- on ``alerts.md``, the table of the alerting rules of ``deploy/prometheus/alerts.yml``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from gateway.http.api_docs import asset

ROOT = Path(__file__).resolve().parent
SWAGGER_UI_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "init.js")
# a link of those pages to a page of docs/, as the site has it
_DOCS_LINK = "](../docs/"


def _outside_page(path: str) -> str:
    """A README outside docs/, its links into docs/ made the site's."""
    return (ROOT / path).read_text(encoding="utf-8").replace(_DOCS_LINK, "](../")


# the document with its admin routes, as a gateway with an admin token serves it
_OPENAPI = (
    "import sys, gateway.cache.registry;"
    " from gateway.config.settings import Settings;"
    " from gateway.http.openapi import openapi_bytes;"
    " sys.stdout.buffer.write(openapi_bytes(Settings.model_validate("
    "{'admin': {'token': 'x' * 16}})))"
)


def _written(*args: str) -> bytes:
    """What a fresh interpreter writes: the gateway's modules as they are on disk now,
    not as ``make docs-serve`` imported them at its start."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, check=True, capture_output=True, timeout=120
    ).stdout


def on_files(files: Files, config: MkDocsConfig) -> Files:
    generated: dict[str, str | bytes] = {
        "configuration.md": _written("-m", "gateway.config.reference", "markdown"),
        "openapi.json": _written("-c", _OPENAPI),
        "bench/README.md": _outside_page("bench/README.md"),
        "deploy/README.md": _outside_page("deploy/README.md"),
        **{f"swagger-ui/{name}": asset(name) for name in SWAGGER_UI_FILES},
    }
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    return files


ALERTS_MARK = "<!-- alerts -->"
# a template of an alert's summary ("{{ $labels.route }}"), shown as the word it stands for
_PLACEHOLDER = re.compile(r"\{\{\s*\$(?:labels\.)?(\w+)[^}]*\}\}")


def _placeholder(match: re.Match[str]) -> str:
    return f"*{match[1]}*"


def alerts_table(rules_file: Path) -> str:
    """The alerting rules as a table: name, severity, how long, summary, runbook."""
    rows = ["| alert | severity | for | what | runbook |", "|---|---|---|---|---|"]
    for group in yaml.safe_load(rules_file.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            summary = " ".join(rule["annotations"]["summary"].split())
            summary = _PLACEHOLDER.sub(_placeholder, summary)
            rows.append(
                f"| `{name}` | {rule['labels']['severity']} | {rule.get('for', '-')} |"
                f" {summary} | [runbook](deploy/README.md#{name.lower()}) |"
            )
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if ALERTS_MARK in markdown:
        table = alerts_table(ROOT / "deploy" / "prometheus" / "alerts.yml")
        markdown = markdown.replace(ALERTS_MARK, table)
    return markdown
