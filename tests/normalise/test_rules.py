"""Which canonicaliser runs (gateway.normalise.rules), and that it makes no difference.

- ``engine_name`` is "compiled" when the compiled module was built and
  RECORDS_GATEWAY_PURE_PYTHON is not true, else "python"; ``use_engine`` switches.
- The reference samples (tests/fixtures) and generated bodies are published byte for
  byte the same, with the same coercion counts, whichever canonicaliser runs: in this
  process switched by ``use_engine``; in a process started with
  RECORDS_GATEWAY_PURE_PYTHON=1; and in one where the compiled module cannot be
  imported, as after an install without a C compiler, which never makes a Plan.
- The body parse is jiter's Decimal parse alone, value for value and type for type,
  errors included, with either canonicaliser (the compiled one parses with floats first
  and again with Decimals when ``holds_float`` finds one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import jiter
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.normalise.coercions import CanonicalError, clear_value_caches
from gateway.normalise.duplicates import repeated_key
from gateway.normalise.normaliser import CoercionCounts, Normaliser, parse_lossless
from gateway.normalise.rules import (
    ENVIRONMENT_VARIABLE,
    Engine,
    compiled,
    compiled_available,
    compiled_in_use,
    engine_name,
    use_engine,
)
from gateway.normalise.schema import Account, Bank, Client, Expense, User
from gateway.records.routes import parse_record_query
from gateway.routing.standard import ROUTES
from tests.normalise.test_schema import PATH_VALUES, Num, bodies, write_json
from tests.profiles import examples

ROOT = Path(__file__).parent.parent.parent
FIXTURES = Path(__file__).parent.parent / "fixtures"
NOT_BUILT = "gateway.normalise.compiled was not built (installed without a C compiler)"
needs_compiled = pytest.mark.skipif(not compiled_available(), reason=NOT_BUILT)
ENGINES = [pytest.param("compiled", marks=needs_compiled), "python"]
# the body parse differs from the Decimal parse only with the compiled rules (its
# quick float-mode parse first); with the Python rules it is the Decimal parse itself
QUICK_PARSE = [pytest.param("compiled", marks=needs_compiled)]
SETTINGS = settings(
    max_examples=examples(100),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextlib.contextmanager
def running(engine: Engine) -> Iterator[None]:
    """``engine`` in use, then what the environment says again."""
    use_engine(engine)
    try:
        yield
    finally:
        use_engine()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Generated unknown enumeration values would log a warning each."""
    logger = logging.getLogger("gateway.normalise")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# ------------------------------------------------------------- choosing the engine


@pytest.mark.parametrize(
    ("value", "pure"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("yes", True),
        (" on ", True),
    ],
)
def test_the_environment_variable_rules_out_the_compiled_canonicaliser(
    monkeypatch: pytest.MonkeyPatch, value: str | None, pure: bool
) -> None:
    if value is None:
        monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(ENVIRONMENT_VARIABLE, value)
    try:
        expected = "python" if pure or not compiled_available() else "compiled"
        assert use_engine() == expected
        assert engine_name() == expected
        assert compiled_in_use() is (expected == "compiled")
    finally:
        monkeypatch.undo()
        use_engine()


def test_use_engine_switches_and_refuses_what_it_cannot_run() -> None:
    try:
        assert use_engine("python") == "python"
        assert engine_name() == "python"
        assert not compiled_in_use()
        if compiled_available():
            assert use_engine("compiled") == "compiled"
            assert compiled_in_use()
        else:
            with pytest.raises(RuntimeError, match="not built"):
                use_engine("compiled")
        with pytest.raises(ValueError, match="unknown engine"):
            use_engine("cython")  # type: ignore[arg-type]
    finally:
        use_engine()


# ------------------------------------------------------------- the reference samples

# (fixture, route, path value, query): the requests of tests/normalise/test_normaliser.py's SAMPLES
SAMPLES: list[tuple[str, str, str | None, list[tuple[str, str]]]] = [
    ("users", "users", None, [("limit", "2")]),
    ("clients", "clients", None, [("page", "2"), ("limit", "3")]),
    ("expenses", "expenses", None, [("limit", "2")]),
    ("expense", "expense", PATH_VALUES["expense"], []),
    ("accounts", "accounts", None, [("page", "3"), ("limit", "3")]),
    ("account", "account", PATH_VALUES["account"], []),
]


def normalise(route: str, path_value: str | None, query: list[tuple[str, str]], body: bytes) -> Any:
    """The published bytes of ``body`` through the gateway's Normaliser, as hex, and the
    coercions it counted (or the error it raised), as JSON can carry them."""
    clear_value_caches()
    spec = next(r for r in ROUTES if r.name == route)
    request = parse_record_query(spec, path_value, query, max_limit=1000)
    counts = CoercionCounts()
    try:
        published = Normaliser(counts).normalise(request, body).hex()
    except Exception as exc:  # the same error both ways is as good as the same bytes
        published = f"{type(exc).__name__}: {exc}"
    return [published, sorted([*key, n] for key, n in counts.snapshot().items())]


def normalise_samples() -> dict[str, Any]:
    """Every reference sample normalised by the canonicaliser in use; with the engine's
    name and whether any model has a compiled Plan."""
    out: dict[str, Any] = {
        name: normalise(route, path_value, query, (FIXTURES / f"{name}.upstream.json").read_bytes())
        for name, route, path_value, query in SAMPLES
    }
    out["(engine)"] = engine_name()
    out["(plans)"] = [model._plan is not None for model in (User, Client, Bank, Account, Expense)]
    return out


def expected(name: str) -> bytes:
    """The hand-written expected output, as the compact bytes the gateway writes."""
    return orjson.dumps(orjson.loads((FIXTURES / f"{name}.expected.json").read_bytes()))


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_publishes_the_samples_exactly(engine: Engine) -> None:
    with running(engine):
        outputs = normalise_samples()
    assert outputs.pop("(engine)") == engine
    for name, _, _, _ in SAMPLES:
        assert bytes.fromhex(outputs[name][0]) == expected(name), name


def in_this_process() -> dict[str, Any]:
    """The samples as the compiled canonicaliser publishes them, where it was built (the
    Python rules' else)."""
    with running("compiled" if compiled_available() else "python"):
        outputs = normalise_samples()
    del outputs["(engine)"], outputs["(plans)"]
    return outputs


@needs_compiled
def test_the_engines_publish_the_same_bytes_and_counts() -> None:
    compiled_outputs = in_this_process()
    with running("python"):
        python_outputs = normalise_samples()
    del python_outputs["(engine)"], python_outputs["(plans)"]
    assert python_outputs == compiled_outputs


@needs_compiled
def test_the_python_rules_never_touch_the_compiled_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """With "python" in use, nothing reaches the compiled module (it might be stale or
    wrong: that is when one rules it out), and the samples still come out exactly."""

    def untouchable(*args: object) -> None:
        raise AssertionError("the compiled module was used")

    for name in ("canonicalise", "canonicalise_items", "holds_float", "Plan", "Step"):
        monkeypatch.setattr(compiled, name, untouchable)
    for model in (User, Client, Bank, Account, Expense):
        monkeypatch.setattr(model, "_plan", None)
    with running("python"):
        outputs = normalise_samples()
    assert outputs["(plans)"] == [False] * 5
    for name, _, _, _ in SAMPLES:
        assert bytes.fromhex(outputs[name][0]) == expected(name), name


SUBPROCESS = """
import json, sys
{block}
from tests.normalise.test_rules import normalise_samples
print(json.dumps(normalise_samples()))
"""
BLOCK_COMPILED = 'sys.modules["gateway.normalise.compiled"] = None  # as if never built'


@pytest.mark.parametrize(
    ("variable", "block"),
    [
        pytest.param("1", "", id=f"{ENVIRONMENT_VARIABLE}=1"),
        pytest.param(None, BLOCK_COMPILED, id="compiled-module-absent"),
    ],
)
def test_a_process_on_the_python_rules_publishes_the_same(variable: str | None, block: str) -> None:
    """Started with the environment variable set, or unable to import the compiled
    module: the Python rules run from the start, no Plan is ever made, and the samples
    come out as the compiled canonicaliser publishes them, counts included."""
    env = {k: v for k, v in os.environ.items() if k != ENVIRONMENT_VARIABLE}
    if variable is not None:
        env[ENVIRONMENT_VARIABLE] = variable
    done = subprocess.run(
        [sys.executable, "-c", SUBPROCESS.format(block=block)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outputs = json.loads(done.stdout)
    assert outputs.pop("(engine)") == "python"
    assert outputs.pop("(plans)") == [False] * 5
    assert outputs == in_this_process()


# ------------------------------------------------------------- generated bodies


@needs_compiled
@pytest.mark.parametrize("route", list(ROUTES.models()))
@SETTINGS
@given(data=st.data())
def test_every_generated_body_is_published_the_same_by_both_engines(
    route: str, data: st.DataObject
) -> None:
    """Every variant tests/normalise/test_schema.py generates, and one value in it made junk."""
    body, _, page, limit = data.draw(bodies(route), label="upstream body")
    if data.draw(st.booleans(), label="junk"):
        body = junk_in(body, data.draw(st.randoms(use_true_random=False), label="where"))
    query = [] if page is None else [("page", str(page)), ("limit", str(limit))]
    path_value = PATH_VALUES.get(route)
    with quiet():
        with running("compiled"):
            ours = normalise(route, path_value, query, body)
        with running("python"):
            python = normalise(route, path_value, query, body)
    assert ours == python


JUNK: list[Any] = [None, True, 7, "x", "-0.00", "1e5", "2024-02-30", [1, "a"], {"a": 1}]


def junk_in(body: bytes, where: Any) -> bytes:
    """``body`` with one value anywhere (a record's, an embedded record's, the
    envelope's) replaced by junk."""
    document = json.loads(body)  # floats are fine here: only structure is kept
    holders: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            holders.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(document)
    holder = where.choice(holders)
    if holder:
        holder[where.choice(sorted(holder))] = where.choice(JUNK)
    return json.dumps(document).encode()


# ------------------------------------------------------------------- the body parse


def decimal_parse(body: bytes) -> Any:
    """What parse_lossless must give: jiter's Decimal parse, nothing else, but for a
    valid body with a repeated key, which is the error gateway.normalise.duplicates
    names."""
    parsed = jiter.from_json(body, float_mode="decimal", allow_inf_nan=False)
    try:
        jiter.from_json(body, float_mode="decimal", catch_duplicate_keys=True)
    except ValueError:
        raise repeated_key(body) from None
    return parsed


def parsed_as(parse: Callable[[bytes], Any], body: bytes) -> str:
    """The parse of ``body`` as text that tells every type apart (1, 1.0 and Decimal("1.0")
    differ, so do Decimal("1.0") and Decimal("1.00")), or the error it raised (a
    repeated key's with the path it names)."""
    try:
        return "value " + repr(parse(body))
    except CanonicalError as exc:
        return f"repeated key at {exc.path}: {exc.reason}"
    except ValueError as exc:
        return f"error {exc}"


json_numbers = st.one_of(
    st.integers(-(10**40), 10**40).map(lambda value: Num(str(value))),
    st.from_regex(
        r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True
    ).map(Num),
    st.sampled_from(["-0", "-0.0", "0.0", "1E+2", "1e400", "-1e-400", "0.1", "5e-324"]).map(Num),
)
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=8),
    json_numbers,
    st.floats(allow_nan=False)
    .filter(lambda value: value not in (float("inf"), float("-inf")))
    .map(lambda value: Num(repr(value))),
)
json_documents = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=40,
)


def floats_in(value: Any) -> int:
    """How many floats ``value`` holds, anywhere (the rule holds_float implements)."""
    if type(value) is float:
        return 1
    if type(value) is dict:
        return sum(floats_in(item) for item in value.values())
    if type(value) is list:
        return sum(floats_in(item) for item in value)
    return 0


@pytest.mark.parametrize("engine", QUICK_PARSE)
@SETTINGS
@given(json_documents)
@example({"a": [1, {"b": [Num("-0.0")]}]})
@example([Num("123456789012345678901234567890"), Num("-0"), "1.5"])
def test_the_body_parse_is_the_decimal_parse(engine: Engine, document: Any) -> None:
    body = write_json(document, ascii_only=False).encode()
    with running(engine):
        assert parsed_as(parse_lossless, body) == parsed_as(decimal_parse, body)


@needs_compiled
@SETTINGS
@given(json_documents)
def test_holds_float_finds_every_float(document: Any) -> None:
    body = write_json(document, ascii_only=False).encode()
    with contextlib.suppress(ValueError):  # 1e400 has no float
        quick = jiter.from_json(body, allow_inf_nan=False)
        assert compiled.holds_float(quick) == (floats_in(quick) > 0)


@pytest.mark.parametrize("engine", QUICK_PARSE)
@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b'{"a": 1.5',
        b'{"a": 1}x',
        b"[1e400]",
        b"[-1e400, 2.5]",
        b"[NaN]",
        b"[Infinity]",
        b'{"a": 01}',
        b'{"a": 1.}',
        b'{"a": "\\ud800"}',
        b"\xff",
        b'{"a": 1, "a": 2.50}',
        b"[" * 300 + b"1.5" + b"]" * 300,
    ],
)
def test_what_the_body_parse_refuses_or_reads_as_the_decimal_parse(
    engine: Engine, body: bytes
) -> None:
    with running(engine):
        assert parsed_as(parse_lossless, body) == parsed_as(decimal_parse, body)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_body_parse_keeps_every_digit_of_a_fraction(engine: Engine) -> None:
    body = b'{"data": [{"amount": 12345678901234.5678, "n": 7}], "total": 1e1}'
    with running(engine):
        parsed = parse_lossless(body)
    assert parsed == {
        "data": [{"amount": Decimal("12345678901234.5678"), "n": 7}],
        "total": Decimal("1E+1"),
    }
    assert [type(value) for value in parsed["data"][0].values()] == [Decimal, int]
