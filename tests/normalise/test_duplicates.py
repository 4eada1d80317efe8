"""A key repeated in any object of an upstream body (docs/normalisation.md, "Errors"):

- end to end, with either canonicaliser: a 502 upstream-contract naming the path of
  the second occurrence (top level, page envelope, record, embedded record), never
  quoting a value or a key the published schema does not define, and not cached;
- the body parse (gateway.normalise.normaliser.parse_lossless) gives the same answer
  with either canonicaliser on generated documents with and without repeated keys,
  escaped spellings of one key included: the Python rules find them with jiter's
  check, the compiled ones by counting (``compiled.members`` of the text against the
  entries ``compiled.shape`` finds in the parse), held here to a plain reference.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jiter
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pytest_aiohttp import AiohttpServer

from gateway.normalise.coercions import CanonicalError
from gateway.normalise.duplicates import (
    REPEATED_KEY,
    REPEATED_OTHER_KEY,
    REPEATED_WITHIN,
    repeated_key,
)
from gateway.normalise.normaliser import parse_lossless
from gateway.normalise.rules import Engine, compiled, compiled_available, use_engine
from tests.profiles import examples

from ..conftest import AUTH, GatewayFactory, base_url

Client = TestClient[web.Request, web.Application]
FIXTURES = Path(__file__).parent.parent / "fixtures"
CONTRACT = "urn:records-gateway:problem:upstream-contract"
NOT_BUILT = "gateway.normalise.compiled was not built (installed without a C compiler)"
needs_compiled = pytest.mark.skipif(not compiled_available(), reason=NOT_BUILT)
ENGINES = [pytest.param("compiled", marks=needs_compiled), "python"]
SETTINGS = settings(
    max_examples=examples(200),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    name: Engine = request.param
    use_engine(name)
    yield name
    use_engine()


def text_of(name: str) -> str:
    """A reference sample as compact JSON text, to repeat keys in by hand."""
    return json.dumps(json.loads((FIXTURES / f"{name}.upstream.json").read_text()))


def once(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


_ACCOUNT = text_of("account")
_ACCOUNTS = text_of("accounts")
_EXPENSE = text_of("expense")
_EXPENSE_PATH = "/expenses/3730bf79-913a-47af-a917-9e028868b644"

# (gateway path, upstream body, JSON path, reason)
REPEATED: list[tuple[str, str, str, str]] = [
    # the case: the last value would have been published
    (
        "/accounts/ACC-001",
        once(_ACCOUNT, '"lastBalance": ', '"lastBalance": "1.00", "lastBalance": '),
        "lastBalance",
        REPEATED_KEY,
    ),
    (
        "/accounts",
        once(_ACCOUNTS, '"total": ', '"total": 999999, "total": '),
        "total",
        REPEATED_KEY,
    ),
    (
        "/accounts",
        once(_ACCOUNTS, '"total": ', '"data": [], "total": '),
        "data",
        REPEATED_KEY,
    ),
    (
        "/accounts",
        _ACCOUNTS.replace('"lastBalance": ', '"lastBalance": "999999.00", "lastBalance": ').replace(
            '"lastBalance": "999999.00", ', "", 1
        ),  # the first record's is single
        "data[1].lastBalance",
        REPEATED_KEY,
    ),
    (
        _EXPENSE_PATH,
        once(
            _EXPENSE,
            '"liquidityThreshold": ',
            '"liquidityThreshold": "0.00", "liquidityThreshold": ',
        ),
        "account.liquidityThreshold",
        REPEATED_KEY,
    ),
    # one key however it is escaped
    (
        "/accounts/ACC-001",
        once(_ACCOUNT, '"lastBalance": ', '"lastBalance": "1.00", "l\\u0061stBalance": '),
        "lastBalance",
        REPEATED_KEY,
    ),
    # a key the schema does not define is not shown; nor what lies below one
    (
        "/accounts/ACC-001",
        once(_ACCOUNT, "{", '{"tok-secret": 1, "tok-secret": 2, '),
        "(body)",
        REPEATED_OTHER_KEY,
    ),
    (
        _EXPENSE_PATH,
        once(_EXPENSE, '"client": {', '"client": {"x-tok-secret": [{"a": 1, "a": 2}], '),
        "client",
        REPEATED_WITHIN,
    ),
]


def _ids() -> list[str]:
    return [f"{case[2]}: {case[3]}" for case in REPEATED]


@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize(("path", "body", "where", "reason"), REPEATED, ids=_ids())
async def test_a_repeated_key_is_a_502_naming_its_path_and_not_cached(
    aiohttp_server: AiohttpServer,
    gateway_factory: GatewayFactory,
    path: str,
    body: str,
    where: str,
    reason: str,
) -> None:
    calls: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    client: Client = await gateway_factory(base_url(await aiohttp_server(app)))
    template = next(
        t
        for prefix, t in (
            ("/expenses/", "/expenses/{expenseId}"),
            ("/accounts/", "/accounts/{accountId}"),
            ("/accounts", "/accounts"),
        )
        if path.startswith(prefix)
    )
    for _ in range(2):
        response = await client.get(path, headers=AUTH)
        assert response.status == 502
        problem = await response.json(content_type=None)
        assert problem["type"] == CONTRACT
        assert problem["detail"] == (
            f"GET {template}: the upstream's {where} cannot be brought to the published"
            f" schema: {reason}"
        )
        assert "999999" not in problem["detail"]
        assert "tok-secret" not in problem["detail"]
    assert len(calls) == 2  # refused, so never cached


@pytest.mark.usefixtures("engine")
def test_a_body_that_is_not_json_is_that_error_whatever_keys_repeat() -> None:
    with pytest.raises(ValueError, match="expected value") as caught:
        parse_lossless(b'{"a": 1, "a": 2, "b": }')
    assert not isinstance(caught.value, CanonicalError)


# ------------------------------------------------------------ generated, both engines


@dataclass(frozen=True)
class Obj:
    """A JSON object as written: its members in order, repeats allowed, each key as
    (its value, how it is written)."""

    members: tuple[tuple[tuple[str, str], Any], ...]


@dataclass(frozen=True)
class Raw:
    """A JSON number written as it is."""

    text: str


# keys from a small alphabet, so that repeats are frequent; "a" also written escaped
keys = st.sampled_from(["a", "b", "id", "total", "lastBalance", ":", '"', "\\", "x:y"]).map(
    lambda key: (key, json.dumps(key))
) | st.just(("a", '"\\u0061"'))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from(["1.5", "0.10", "1e3", "-0"]).map(Raw),
    st.text(alphabet='ab:"\\{}[],', max_size=6),
)
documents = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(st.tuples(keys, inner), max_size=4).map(lambda pairs: Obj(tuple(pairs)))
    ),
    max_leaves=30,
)


def write(value: Any) -> bytes:
    def text(value: Any) -> str:
        if isinstance(value, Obj):
            return "{" + ", ".join(f"{key[1]}: {text(m)}" for key, m in value.members) + "}"
        if isinstance(value, list):
            return "[" + ", ".join(text(member) for member in value) + "]"
        if isinstance(value, Raw):
            return value.text
        return json.dumps(value)

    return text(value).encode()


def repeats(value: Any) -> bool:
    """Whether a key repeats in any object of ``value`` (the reference rule)."""
    if isinstance(value, Obj):
        names = [key[0] for key, _ in value.members]
        return len(names) != len(set(names)) or any(repeats(m) for _, m in value.members)
    if isinstance(value, list):
        return any(repeats(member) for member in value)
    return False


def outcome(body: bytes) -> str:
    try:
        return "value " + repr(parse_lossless(body))
    except CanonicalError as exc:
        return f"repeated {exc.path}: {exc.reason}"


_A = ("a", '"a"')
_ESCAPED_A = ("a", '"\\u0061"')


@pytest.mark.parametrize("engine", ENGINES)
@SETTINGS
@given(documents)
@example(Obj(((_A, 1), (_ESCAPED_A, Raw("2.5")))))
@example([{"x": 1}, Obj(((("b", '"b"'), Obj(((_A, 1), (_A, 2)))),))])
def test_the_body_parse_refuses_a_repeated_key_alike_with_either_engine(
    engine: Engine, document: Any
) -> None:
    body = write(document)
    try:
        use_engine(engine)
        got = outcome(body)
    finally:
        use_engine()
    if repeats(document):
        expected = repeated_key(body)
        assert got == f"repeated {expected.path}: {expected.reason}"
    else:
        assert got == "value " + repr(jiter.from_json(body, float_mode="decimal"))


@needs_compiled
@SETTINGS
@given(documents)
def test_members_counts_every_member_of_the_text_and_shape_every_entry(document: Any) -> None:
    body = write(document)

    def members(value: Any) -> int:
        if isinstance(value, Obj):
            return len(value.members) + sum(members(m) for _, m in value.members)
        if isinstance(value, list):
            return sum(members(m) for m in value)
        return 0

    def entries(value: Any) -> int:
        if isinstance(value, dict):
            return len(value) + sum(entries(m) for m in value.values())
        if isinstance(value, list):
            return sum(entries(m) for m in value)
        return 0

    parsed = jiter.from_json(body)
    assert compiled.members(body) == members(document)
    assert compiled.shape(parsed) == (compiled.holds_float(parsed), entries(parsed))
