"""Records the examples of the OpenAPI document from real answers.

The gateway, with default settings, in front of the reference upstream (seed 42) is
asked what each example shows; the answers' bodies are written to
``gateway/http/openapi_examples.json``, which ``gateway.http.openapi`` reads.
tests/http/test_openapi_examples.py records them again and fails when the file differs,
so the examples stay what the gateway answers. After a change that alters an answer:

    make openapi-examples
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.config.settings import Settings
from gateway.demo import create_demo_app
from gateway.http.app import create_app
from gateway.http.openapi import EXAMPLES_FILE

TOKEN = "demo-token"
REQUEST_ID = "example-request-id"
ABSENT_EXPENSE = "00000000-0000-4000-8000-000000000000"

# (example name, method, path and query, with the token): what each example shows
_ASKED: tuple[tuple[str, str, str, bool], ...] = (
    ("users", "GET", "/users?limit=2", True),
    ("clients", "GET", "/clients?limit=2", True),
    ("expenses", "GET", "/expenses?limit=1", True),
    ("accounts", "GET", "/accounts?limit=2", True),
    ("invalid-parameters", "GET", "/expenses?page=0&limit=ten&type=card", True),
    ("date-range", "GET", "/expenses?dateFrom=2024-06-30&dateTo=2024-01-01", True),
    ("unauthenticated", "GET", "/users", False),
    ("not-found", "GET", f"/expenses/{ABSENT_EXPENSE}", True),
    ("method-not-allowed", "POST", "/users", True),
    ("healthz", "GET", "/healthz", False),
)


async def _ask(
    client: TestClient[web.Request, web.Application], method: str, path: str, token: str | None
) -> dict[str, Any]:
    headers = {"X-Request-ID": REQUEST_ID}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    response = await client.request(method, path, headers=headers)
    return {
        "request": f"{method} {path}",
        "status": response.status,
        "body": json.loads(await response.read()),
    }


async def record(client: TestClient[web.Request, web.Application]) -> dict[str, Any]:
    """Every example, asked of ``client`` (the gateway in front of the reference upstream)."""
    examples: dict[str, Any] = {}
    for name, method, path, with_token in _ASKED:
        examples[name] = await _ask(client, method, path, TOKEN if with_token else None)
    expense_id = examples["expenses"]["body"]["data"][0]["id"]
    account_id = examples["accounts"]["body"]["data"][0]["id"]
    examples["expense"] = await _ask(client, "GET", f"/expenses/{expense_id}", TOKEN)
    examples["account"] = await _ask(client, "GET", f"/accounts/{account_id}", TOKEN)
    examples["upstream-unauthorized"] = await _ask(client, "GET", "/users", "not-a-known-token")
    return dict(sorted(examples.items()))


def encode(examples: dict[str, Any]) -> str:
    """The file's text: stable, so that a change shows as a readable diff."""
    return json.dumps(examples, indent=2, ensure_ascii=False) + "\n"


async def _main() -> None:
    async with TestServer(create_demo_app()) as upstream:
        settings = Settings.model_validate({"upstream": {"base_url": str(upstream.make_url("/"))}})
        async with TestClient(TestServer(create_app(settings))) as client:
            text = encode(await record(client))
    await asyncio.to_thread(Path(EXAMPLES_FILE).write_text, text, encoding="utf-8")
    print(f"wrote {EXAMPLES_FILE}")


if __name__ == "__main__":
    asyncio.run(_main())
