"""Public APIs only: outside gateway/fastpath/, no module of the gateway uses a private
name (a leading underscore) of another package, nor subclasses aiohttp's internal
server classes. aiohttp's runners (``web.AppRunner``) may be subclassed through their
documented interface only (``setup``, ``server``, ``shutdown``, ``cleanup``): a
subclass that defines a private name (``_make_server``) is found. The fast path may,
because it must; it checks at start that what it uses is there
(tests/fastpath/test_server.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
QUARANTINE = PACKAGE / "fastpath"
# documented public names that start with an underscore: os._exit, and the named
# tuple's own methods
DOCUMENTED = frozenset({"_exit", "_replace", "_asdict", "_fields", "_make"})
# aiohttp's server internals: no subclass of these outside the fast path
INTERNAL_CLASSES = frozenset({"RequestHandler", "Server", "BaseSite"})
# aiohttp's runners: subclassed through their public members only
RUNNERS = frozenset({"BaseRunner", "AppRunner"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own_private_names(sources: list[str]) -> set[str]:
    """Every private name the gateway itself defines: functions, classes, module and
    class variables, attributes it assigns, and the names in its ``__slots__``."""
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
            ):
                names.update(
                    element.value
                    for element in ast.walk(node.value)
                    if isinstance(element, ast.Constant) and isinstance(element.value, str)
                )
    return {name for name in names if _private(name)}


# modules of other packages that are their internals, whatever their names say
INTERNAL_MODULES = frozenset(
    {
        "aiohttp.base_protocol",
        "aiohttp.helpers",
        "aiohttp.http_parser",
        "aiohttp.http_writer",
        "aiohttp.web_protocol",
        "aiohttp.web_runner",
        "aiohttp.web_server",
        "asyncio.base_events",
        "asyncio.selector_events",
        "asyncio.tasks",
        "prometheus_client.mmap_dict",
        "prometheus_client.utils",
        "prometheus_client.values",
    }
)
_REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


class _Finder(ast.NodeVisitor):
    """Private names of other packages used in one module: imported, reached as an
    attribute of anything but the gateway's own names, or subclassed."""

    def __init__(self, own: set[str]) -> None:
        self.own = own
        self.found: list[str] = []
        self.foreign: dict[str, str] = {}  # local name -> what it was imported as

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            parts = alias.name.split(".")
            if any(_private(part) for part in parts) or alias.name in INTERNAL_MODULES:
                self.found.append(f"line {node.lineno}: import {alias.name}")
            if parts[0] != "gateway":
                self.foreign[alias.asname or parts[0]] = alias.name
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and not module.startswith("gateway"):
            if any(_private(part) for part in module.split(".")) or module in INTERNAL_MODULES:
                self.found.append(f"line {node.lineno}: from {module} import ...")
            for alias in node.names:
                if _private(alias.name):
                    self.found.append(f"line {node.lineno}: from {module} import {alias.name}")
                self.foreign[alias.asname or alias.name] = f"{module}.{alias.name}"
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        if _private(name) and name not in self.own and name not in DOCUMENTED:
            self.found.append(f"line {node.lineno}: ...{name}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        if (
            isinstance(function, ast.Name)
            and function.id in _REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
            if _private(name) and name not in self.own and name not in DOCUMENTED:
                self.found.append(f"line {node.lineno}: {function.id}(..., {name!r})")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if isinstance(base, ast.Attribute):
                name, root = base.attr, base.value
                origin = self.foreign.get(root.id, "") if isinstance(root, ast.Name) else ""
            else:
                name = getattr(base, "id", "")
                origin = self.foreign.get(name, "")
            if not origin.startswith("aiohttp"):
                continue
            if name in INTERNAL_CLASSES:
                self.found.append(f"line {node.lineno}: class {node.name}({name})")
            elif name in RUNNERS:
                self.found += [
                    f"line {member.lineno}: class {node.name}({name}) defines {member.name}"
                    for member in node.body
                    if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
                    and _private(member.name)
                ]
        self.generic_visit(node)


OUTSIDE = sorted(path for path in PACKAGE.rglob("*.py") if QUARANTINE not in path.parents)
OWN = own_private_names([path.read_text() for path in OUTSIDE])


def private_uses(source: str, own: set[str] = OWN) -> list[str]:
    finder = _Finder(own)
    finder.visit(ast.parse(source))
    return finder.found


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_the_fast_path_uses_a_private_name_of_another_package(
    path: Path,
) -> None:
    assert private_uses(path.read_text()) == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio\nasyncio.tasks._enter_task(1, 2)\n",
        "from asyncio.tasks import _enter_task\n",
        "import _sha2\n",
        "from aiohttp import web\nweb.AppRunner._make_server\n",
        "def f(histogram):\n    histogram._sum.inc(1)\n",
        "import asyncio\nasyncio.get_running_loop()._ready\n",
        "from aiohttp.web_protocol import RequestHandler\nclass C(RequestHandler):\n    pass\n",
        "from aiohttp import web\nclass S(web.Server):\n    pass\n",
        "from aiohttp import web\nclass R(web.AppRunner):\n    async def _make_server(self): ...\n",
        "def f(protocol):\n    return getattr(protocol, '_waiter', None)\n",
        "from aiohttp.web_protocol import RequestHandler\n",
        "from prometheus_client.utils import floatToGoString\n",
        "import asyncio.tasks\n",
    ],
)
def test_the_check_finds_each_kind_of_private_use(source: str) -> None:
    assert private_uses(source) != []


def test_a_runner_subclassed_through_its_public_members_is_no_private_use() -> None:
    source = "from aiohttp import web\nclass R(web.AppRunner):\n    async def setup(self): ...\n"
    assert private_uses(source) == []


def test_the_fast_path_is_where_the_internals_are() -> None:
    """The check is not vacuous: the quarantined package does use them."""
    used = [found for path in QUARANTINE.rglob("*.py") for found in private_uses(path.read_text())]
    assert any("RequestHandler" in found for found in used)
