"""The published document in the generators callers use, taken whole.

openapi-python-client generates a client from the document the gateway serves, without
a warning; the client then calls the real gateway (in front of the reference upstream)
on every record route and gets typed records, and typed problems for a 400, a 401 and
a 404. datamodel-code-generator makes models of it whose every class has a readable
name (none numbered).
"""

from __future__ import annotations

import datetime
import importlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.config.settings import Settings
from gateway.fastpath.server import make_runner
from gateway.http.app import create_app
from gateway.http.openapi import openapi_bytes
from gateway.process.listener import listen
from gateway.routing.standard import ROUTES

from ..conftest import TOKEN, GatewayFactory, base_url, make_settings

Gateway = TestClient[web.Request, web.Application]
ADMIN = "admin-token-0123456789abcdef"
PACKAGE = "records_gateway_client"
_BIN = Path(sys.executable).parent


def _document(folder: Path) -> Path:
    """The document a gateway with admin routes serves, as a file."""
    path = folder / "openapi.json"
    path.write_bytes(openapi_bytes(Settings.model_validate({"admin": {"token": ADMIN}})))
    return path


def _run(*command: str | Path) -> str:
    """A generator's run: it must succeed; its output (both streams) is returned."""
    environment = {**os.environ, "PATH": f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The client openapi-python-client generates, imported."""
    folder = tmp_path_factory.mktemp("generated")
    output = _run(
        _BIN / "openapi-python-client",
        "generate",
        "--path",
        _document(folder),
        "--output-path",
        folder / PACKAGE,
        "--meta",
        "none",
    )
    assert "warning" not in output.lower(), output
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def _api(generated: ModuleType, tag: str, operation: str) -> Any:
    return importlib.import_module(f"{generated.__name__}.api.{tag}.{operation}")


def _models(generated: ModuleType) -> Any:
    return importlib.import_module(f"{generated.__name__}.models")


@pytest.fixture
async def gateway_url(gateway: Gateway) -> str:
    return str(gateway.make_url("/"))


async def test_a_generated_client_gets_typed_records_from_every_route(
    generated: ModuleType, gateway_url: str
) -> None:
    """Held for docs/openapi.md, "Generating a client"."""
    models = _models(generated)
    async with generated.AuthenticatedClient(base_url=gateway_url, token=TOKEN) as client:
        pages = {
            "list_users": models.UserPage,
            "list_clients": models.ClientPage,
            "list_expenses": models.ExpensePage,
            "list_accounts": models.AccountPage,
        }
        found: dict[str, Any] = {}
        for operation, page_type in pages.items():
            response = await _api(generated, "records", operation).asyncio_detailed(
                client=client, limit=3
            )
            assert response.status_code == 200, operation
            page = response.parsed
            assert isinstance(page, page_type), operation
            assert page.limit == 3
            assert len(page.data) == 3
            assert all(isinstance(record.id, str) and record.id for record in page.data)
            found[operation] = page.data[0]
        expense = await _api(generated, "records", "get_expense").asyncio(
            client=client, expense_id=uuid.UUID(found["list_expenses"].id)
        )
        assert isinstance(expense, models.Expense)
        assert expense.id == found["list_expenses"].id
        assert isinstance(expense.account, models.Account)
        assert re.fullmatch(r"-?[0-9]+\.[0-9]{4,}", expense.amount)  # money as text
        account = await _api(generated, "records", "get_account").asyncio(
            client=client, account_id=found["list_accounts"].id
        )
        assert isinstance(account, models.Account)
        assert account.id == found["list_accounts"].id


async def test_a_generated_client_gets_typed_problems(
    generated: ModuleType, gateway_url: str
) -> None:
    """Held for docs/openapi.md, "Generating a client"."""
    models = _models(generated)
    expenses = _api(generated, "records", "list_expenses")
    async with generated.AuthenticatedClient(base_url=gateway_url, token=TOKEN) as client:
        refused = await expenses.asyncio_detailed(
            client=client,
            date_from=datetime.date(2024, 6, 30),
            date_to=datetime.date(2024, 1, 1),
        )
        absent = await _api(generated, "records", "get_expense").asyncio(
            client=client, expense_id=uuid.UUID("00000000-0000-4000-8000-000000000000")
        )
    assert refused.status_code == 400
    problem = refused.parsed
    assert isinstance(problem, models.ValidationProblem)
    assert problem.type_ == "urn:records-gateway:problem:invalid-parameters"
    assert [(e.parameter, e.message) for e in problem.errors] == [
        ("dateFrom", "must not be after dateTo")
    ]
    assert isinstance(absent, models.Problem)
    assert (absent.status, absent.type_) == (404, "urn:records-gateway:problem:not-found")
    async with generated.AuthenticatedClient(base_url=gateway_url, token="unknown") as client:
        refused_token = await _api(generated, "records", "list_users").asyncio(client=client)
    async with generated.Client(base_url=gateway_url) as anonymous:
        no_token = await _api(generated, "records", "list_users").asyncio(client=anonymous)
    for unauthenticated, slug in (
        (refused_token, "upstream-unauthorized"),
        (no_token, "unauthenticated"),
    ):
        assert isinstance(unauthenticated, models.Problem)
        assert unauthenticated.status == 401
        assert unauthenticated.type_ == f"urn:records-gateway:problem:{slug}"


@pytest.fixture
async def listened_url(upstream: Any, fast_path: bool) -> AsyncIterator[str]:
    """The gateway served as a worker serves it (``make_runner``, then ``listen``),
    with the fast path or without; its URL."""
    runner = make_runner(
        create_app(make_settings(base_url(upstream), server={"fast_path": fast_path})),
        access_log=None,
    )
    await runner.setup()
    server = await listen(runner, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    server.close()
    await runner.cleanup()


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast", "plain"], indirect=True)
async def test_a_generated_client_reads_the_400_of_a_request_the_parser_refuses(
    generated: ModuleType, listened_url: str
) -> None:
    """An X-Request-ID past the header limit (the document lets a caller send any): the
    400 malformed-request has no `errors`, and the client's ValidationProblem says so
    rather than failing to read it; alike with the fast path and without.

    Held for docs/openapi.md, "Generating a client".
    """
    gateway_url = listened_url
    models = _models(generated)
    async with generated.AuthenticatedClient(base_url=gateway_url, token=TOKEN) as client:
        refused = await _api(generated, "records", "list_users").asyncio(
            client=client, x_request_id="r" * 40_000
        )
    assert isinstance(refused, models.ValidationProblem)
    assert (refused.status, refused.type_) == (400, "urn:records-gateway:problem:malformed-request")
    assert isinstance(refused.errors, generated.types.Unset)


async def test_a_generated_client_reaches_the_admin_routes_with_the_admin_token(
    generated: ModuleType, gateway_factory: GatewayFactory, upstream: Any
) -> None:
    """Held for docs/openapi.md, "Generating a client"."""
    gateway = await gateway_factory(base_url(upstream), admin={"token": ADMIN})
    models = _models(generated)
    url = str(gateway.make_url("/"))
    async with generated.AuthenticatedClient(base_url=url, token=ADMIN) as client:
        advice = await _api(generated, "admin", "get_ttl_advice").asyncio(client=client)
        purged = await _api(generated, "admin", "purge_cache").asyncio(
            client=client, route=models.PurgeCacheRoute.EXPENSES
        )
    assert isinstance(advice, models.TtlAdvice)
    assert {item.route for item in advice.routes} == {route.name for route in ROUTES}
    assert isinstance(purged, models.PurgeResult)
    assert purged.purged == models.PurgeResultPurged.EXPENSES
    async with generated.AuthenticatedClient(base_url=url, token=TOKEN) as caller:
        refused = await _api(generated, "admin", "get_ttl_advice").asyncio(client=caller)
    assert isinstance(refused, models.Problem)
    assert refused.status == 401


def test_generated_models_have_readable_names(tmp_path: Path) -> None:
    """Held for docs/openapi.md, "Generating a client"."""
    models = tmp_path / "models.py"
    _run(
        _BIN / "datamodel-codegen",
        "--input",
        _document(tmp_path),
        "--input-file-type",
        "openapi",
        "--output-model-type",
        "pydantic_v2.BaseModel",
        "--formatters",
        "ruff-format",
        "--output",
        models,
    )
    names = re.findall(r"^class (\w+)\(", models.read_text(), flags=re.MULTILINE)
    assert {"User", "Client", "Account", "Bank", "Expense", "ExpensePage"} <= set(names)
    assert {"Problem", "ValidationProblem", "ParameterError"} <= set(names)
    numbered = [name for name in names if re.search(r"[0-9]$", name)]
    assert numbered == [], numbered
