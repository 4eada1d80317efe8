"""The compiled record canonicaliser (gateway/normalise/compiled.pyx) against the Python rules.

The Python ``canonicalise_python`` is the rules as written, the reference; the compiled
canonicaliser is an optional speed-up of it, which the gateway runs when it was built
(gateway.normalise.rules). Two kinds of property hold them equal:

- each check written in C (UUID, decimal of a scale, instant, list of text) says
  "already canonical" for exactly the strings the Python check does;
- a whole record, well-formed or with junk in any field, comes out the same both ways:
  the same published bytes, or the same error at the same path with the same reason,
  and the same coercion counts, unknown values and dropped fields.

Where the compiled module was not built (an install without a C compiler) there is
nothing to hold, and the whole module is skipped, saying so.

tests/normalise/test_schema.py checks the published values themselves (through the gateway's
Normaliser, so through the canonicaliser in use) against what each generated body calls
for; tests/normalise/test_rules.py holds whole bodies and the body parse to the same output
whichever canonicaliser runs.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.normalise.coercions import (
    CANONICAL_UUID,
    INSTANT_PATTERN,
    KNOWN_DATES,
    CanonicalError,
    DecimalCheck,
    clear_value_caches,
    is_canonical_instant,
    text_list,
    to_date,
)
from gateway.normalise.normaliser import dump_canonical, parse_lossless
from gateway.normalise.rules import compiled, compiled_available, engine_name, use_engine
from gateway.normalise.schema import (
    Account,
    Bank,
    CanonicalModel,
    Client,
    Expense,
    NormaliseContext,
    User,
    canonicalise,
    canonicalise_items,
    canonicalise_python,
    compiled_plan,
)
from tests.normalise.test_schema import json_values, records, write_json
from tests.profiles import examples

if not compiled_available():
    pytest.skip(
        "gateway.normalise.compiled was not built (installed without a C compiler):"
        " there is no compiled canonicaliser to hold to the Python rules",
        allow_module_level=True,
    )

SETTINGS = settings(
    max_examples=examples(400),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MODELS: list[type[CanonicalModel]] = [User, Client, Bank, Account, Expense]


def step(check: int, argument: Any = None, scale: int = 0, max_scale: int = 0) -> compiled.Step:
    return compiled.Step("f", "M.f", check, argument, text_list, scale, max_scale)


def near(pattern: str, alphabet: str, sizes: tuple[int, int]) -> st.SearchStrategy[str]:
    """Strings of the pattern, and strings one edit away from it, and noise."""
    exact = st.from_regex(pattern, fullmatch=True)
    return st.one_of(
        exact,
        st.tuples(exact, st.integers(0, 40), st.sampled_from(alphabet)).map(
            lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + 1 :]
        ),
        st.tuples(exact, st.integers(0, 40), st.sampled_from(alphabet)).map(
            lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]
        ),
        st.tuples(exact, st.integers(0, 40)).map(lambda t: t[0][: t[1]] + t[0][t[1] + 1 :]),
        st.text(alphabet, min_size=sizes[0], max_size=sizes[1]),
    )


# ------------------------------------------------------------------- the C checks

UUID_STEP = step(compiled.CHECK_UUID)
UUID_ALPHABET = "0123456789abcdefABCDEFg-{}: ١"


@SETTINGS
@given(
    value=st.one_of(
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u).upper()),
        st.uuids().map(lambda u: u.hex),
        near(CANONICAL_UUID.pattern, UUID_ALPHABET, (30, 40)),
    )
)
@example(value="")
@example(value="3730bf79-913a-47af-a917-9e028868b644\n")
@example(value="3730bf79-913a-47af-a917-9e028868b64٤")  # an Arabic-Indic digit
def test_uuid_check_is_the_python_check(value: str) -> None:
    assert compiled.check(UUID_STEP, value) is (CANONICAL_UUID.fullmatch(value) is not None)


DECIMAL_ALPHABET = "0123456789-+.eE ٣"


@pytest.mark.parametrize("scale", [0, 2, 4])
@SETTINGS
@given(
    value=st.one_of(
        near(r"-?(0|[1-9][0-9]{0,4})\.[0-9]{0,7}", DECIMAL_ALPHABET, (0, 12)),
        st.builds(
            lambda sign, whole, fraction: f"{sign}{whole}.{fraction}",
            st.sampled_from(["", "-"]),
            st.sampled_from(["0", "00", "1" + "0" * 39, "1" + "0" * 40, "12"]),
            st.sampled_from(["", "0", "00", "0000", "5" * 100, "5" * 101, "01"]),
        ),
    ),
)
@example(value="-0.00")
@example(value="-0.01")
@example(value="-0.10")
@example(value="0.")
def test_decimal_check_is_the_python_check(scale: int, value: str) -> None:
    python = DecimalCheck(scale)
    ours = step(compiled.CHECK_DECIMAL, scale=scale, max_scale=python.max_scale)
    assert compiled.check(ours, value) is python(value)


INSTANT_STEP = step(compiled.CHECK_INSTANT)


def instant_text(moment: datetime, millis: bool) -> str:
    spec = "milliseconds" if millis else "seconds"
    return moment.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


@SETTINGS
@given(
    value=st.one_of(
        st.builds(instant_text, st.datetimes(), st.booleans()),
        st.from_regex(INSTANT_PATTERN, fullmatch=True),  # 2023-02-30, 24:00:00, 0000-...
        st.builds(
            lambda year, month, day, rest: f"{year:04d}-{month:02d}-{day:02d}{rest}",
            st.integers(0, 9999),
            st.integers(0, 13),
            st.integers(0, 32),
            st.sampled_from(["T00:00:00Z", "T23:59:59.999Z", "T12:00:60Z", "T24:00:00Z"]),
        ),
        near(INSTANT_PATTERN, "0123456789-:.TZz+ ", (18, 26)),
        st.builds(
            lambda moment: moment.isoformat(),
            st.datetimes(timezones=st.just(UTC)),
        ),
    )
)
@example(value="2024-02-29T10:00:00Z")
@example(value="2023-02-29T10:00:00Z")
@example(value="1900-02-29T10:00:00Z")
@example(value="2000-02-29T10:00:00Z")
@example(value="2024-04-31T10:00:00Z")
@example(value="2024-01-01T10:00:00.12Z")
def test_instant_check_is_the_python_check(value: str) -> None:
    assert compiled.check(INSTANT_STEP, value) is is_canonical_instant(value)


TEXT_LIST_STEP = step(compiled.CHECK_TEXT_LIST)


def leaves_alone(coerce: Callable[[Any], tuple[Any, str | None]], value: Any) -> bool:
    """True when ``coerce`` returns ``value`` itself and no kind: nothing to do."""
    try:
        result, kind = coerce(value)
    except ValueError:
        return False
    return result is value and kind is None


@SETTINGS
@given(value=st.one_of(st.lists(json_values, max_size=4), json_values))
def test_text_list_check_is_the_python_coercion_doing_nothing(value: Any) -> None:
    assert compiled.check(TEXT_LIST_STEP, value) is leaves_alone(text_list, value)


def test_member_check_reads_the_set_as_it_is_now() -> None:
    known: set[str] = set()
    member = step(compiled.CHECK_MEMBER, known)
    assert not compiled.check(member, "2024-01-31")
    known.add("2024-01-31")
    assert compiled.check(member, "2024-01-31")
    assert not compiled.check(member, "2024-01-30")


def test_a_check_without_a_c_form_calls_the_python_check() -> None:
    seen: list[str] = []

    def says_yes(value: str) -> bool:
        seen.append(value)
        return value == "yes"

    call = step(compiled.CHECK_CALL, says_yes)
    assert compiled.check(call, "yes")
    assert not compiled.check(call, "no")
    assert seen == ["yes", "no"]


def test_steps_and_plans_refuse_what_they_cannot_check() -> None:
    with pytest.raises(ValueError, match="unknown check"):
        step(99)
    with pytest.raises(TypeError, match="needs a set"):
        step(compiled.CHECK_MEMBER, ["a", "b"])
    with pytest.raises(ValueError, match="scale"):
        step(compiled.CHECK_DECIMAL, scale=5, max_scale=4)
    with pytest.raises(ValueError, match="differ in length"):
        compiled.Plan("M", ("a",), (), frozenset(), (), (), (), (), None)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_rule_of_the_models_is_checked_in_c(model: type[CanonicalModel]) -> None:
    """No model falls back to calling a Python check per value (that would be slow, not
    wrong); and the plan lists the model's fields and embedded records as they are."""
    plan = compiled_plan(model)
    assert plan.order == tuple(model.model_fields)
    assert plan.qualified == tuple(f"{model.__name__}.{name}" for name in plan.order)
    assert plan.required == model._required
    assert {s.name for s in plan.steps} == set(model._rules)
    assert all(s.check != compiled.CHECK_CALL for s in plan.steps)
    assert [(name, sub.model_name) for name, sub in plan.nested] == [
        (name, sub.__name__) for name, sub in model._nested
    ]


def test_dates_are_checked_against_the_dates_already_proven_real() -> None:
    (issue,) = [s for s in compiled_plan(Expense).steps if s.name == "issueDate"]
    assert issue.check == compiled.CHECK_MEMBER
    assert issue.argument is KNOWN_DATES
    to_date("2031-07-14")
    assert compiled.check(issue, "2031-07-14")


MODEL_STEPS = [
    pytest.param(python, ours, id=ours.qualified)
    for model in MODELS
    for python, ours in zip(model._steps, compiled_plan(model).steps, strict=True)
]
KNOWN_WORDS = sorted({"PAID", "PENDING", "CANCELLED", "ADMIN", "ACCOUNTANT", "VIEWER"})
step_values = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    near(r"-?(0|[1-9][0-9]{0,4})\.[0-9]{0,6}", DECIMAL_ALPHABET, (0, 12)),
    st.builds(instant_text, st.datetimes(), st.booleans()),
    st.from_regex(INSTANT_PATTERN, fullmatch=True),
    st.dates().map(lambda d: d.isoformat()),
    st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", fullmatch=True),
    st.sampled_from([*KNOWN_WORDS, "CASH", "BANK", "CLIENT", "PROVIDER", "paid", "Bank"]),
    st.text(max_size=8),
    st.lists(st.one_of(st.text(max_size=4), st.integers()), max_size=3),
    json_values,
)


def python_says(python: Any, value: Any) -> bool:
    """What the Python rule of a model step decides: already canonical, nothing to do."""
    if type(value) is str:
        return python.fast is not None and bool(python.fast(value))
    return python.coerce is text_list and leaves_alone(text_list, value)


@pytest.mark.parametrize(("python", "ours"), MODEL_STEPS)
@SETTINGS
@given(value=step_values, known=st.booleans())
def test_each_model_step_checks_as_its_python_rule(
    python: Any, ours: compiled.Step, value: Any, known: bool
) -> None:
    """The models' own steps (their scales, sets and kinds), not steps made for the
    test; a date is asked both before and after it is proven real."""
    clear_value_caches()
    if known and type(value) is str:
        with contextlib.suppress(ValueError):
            to_date(value)
    assert compiled.check(ours, value) is python_says(python, value)


# ------------------------------------------------------------- whole records


def run(
    canonicalise_with: Callable[[Any, NormaliseContext], Any],
    record: Any,
    context: NormaliseContext | None = None,
) -> tuple[Any, NormaliseContext]:
    """The published bytes of ``record`` or the error's (path, reason); and the context.
    Each run starts as a fresh process would: no date known real, no number cached, so
    that neither path finds what the other left (the C checks' slow ways included)."""
    clear_value_caches()
    context = context or NormaliseContext()
    try:
        outcome: Any = dump_canonical(canonicalise_with(copy.deepcopy(record), context))
    except CanonicalError as exc:
        outcome = ("error", exc.path, exc.reason)
    return outcome, context


def assert_same_both_ways(model: type[CanonicalModel], record: dict[str, Any]) -> None:
    python, python_context = run(
        lambda data, context: canonicalise_python(model, data, context, nested=True), record
    )
    ours, our_context = run(
        lambda data, context: compiled.canonicalise(compiled_plan(model), data, context), record
    )
    assert ours == python
    assert our_context.coercions == python_context.coercions
    assert our_context.unknown_values == python_context.unknown_values
    assert our_context.dropped == python_context.dropped


junk = st.one_of(
    json_values,
    st.just([1, "a"]),
    st.just({"nested": True}),
    st.just(Decimal("1.5")),
    st.sampled_from(["1e5", "-0.00", "NaN", "Infinity", "12.3", "0012.30", "2024-13-01"]),
    st.sampled_from(["2024-02-30", "2024-01-01T10:00:00+02:00", "2024-01-01T10:00:00"]),
    st.sampled_from(["PAID", "paid", "Paid ", "BANK", "cash", "ADMIN", "{}"]),
    st.uuids().map(lambda u: str(u).upper()),
)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@SETTINGS
@given(data=st.data())
def test_a_record_comes_out_the_same_both_ways(model: type[CanonicalModel], data: Any) -> None:
    record = parse_lossless(write_json(data.draw(records(model)).raw, ascii_only=True).encode())
    assert_same_both_ways(model, record)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@SETTINGS
@given(data=st.data())
def test_a_record_with_junk_comes_out_the_same_both_ways(
    model: type[CanonicalModel], data: Any
) -> None:
    """One value anywhere in the record, embedded records included, replaced by junk:
    the same error at the same path, or the same output where the junk is acceptable."""
    record = parse_lossless(write_json(data.draw(records(model)).raw, ascii_only=True).encode())
    holders = [record]
    for value in record.values():
        if isinstance(value, dict):
            holders.append(value)
            holders.extend(v for v in value.values() if isinstance(v, dict))
    holder = data.draw(st.sampled_from(holders))
    if holder:
        holder[data.draw(st.sampled_from(sorted(holder)))] = data.draw(junk)
    assert_same_both_ways(model, record)


@SETTINGS
@given(data=st.data())
def test_a_list_of_records_comes_out_the_same_both_ways(data: Any) -> None:
    """The compiled loop over a page's records against the Python loop (the probe's,
    which tracks variants): the same records, or the same error at the same index."""
    raw = data.draw(st.lists(st.one_of(records(Expense).map(lambda g: g.raw), json_values)))
    items = parse_lossless(write_json(raw, ascii_only=True).encode())

    def python_loop(data: Any, context: NormaliseContext) -> Any:
        canonicalise_items(Expense, data, context)
        return data

    def compiled_loop(data: Any, context: NormaliseContext) -> Any:
        compiled.canonicalise_items(compiled_plan(Expense), data, context)
        return data

    python, python_context = run(python_loop, items, NormaliseContext(track_variants=True))
    ours, our_context = run(compiled_loop, items)
    assert ours == python
    assert our_context.coercions == python_context.coercions
    assert our_context.unknown_values == python_context.unknown_values
    assert our_context.dropped == python_context.dropped


@pytest.fixture
def compiled_engine() -> Iterator[None]:
    """The compiled canonicaliser in use, whatever RECORDS_GATEWAY_PURE_PYTHON says."""
    use_engine("compiled")
    yield
    use_engine()


@pytest.mark.usefixtures("compiled_engine")
def test_the_gateway_path_uses_the_compiled_canonicaliser() -> None:
    """canonicalise hands nested records to C; with the probe's variant tracking (which
    C does not do) it keeps to Python, and the two agree on the output."""
    assert engine_name() == "compiled"
    record = {
        "id": str(uuid.uuid4()).upper(),
        "amount": Decimal("12.5"),
        "paidAt": (datetime(2025, 1, 2, tzinfo=UTC) + timedelta(hours=3)).isoformat(),
    }
    fast, tracked = NormaliseContext(), NormaliseContext(track_variants=True)
    assert canonicalise(Expense, dict(record), fast, nested=True) == canonicalise(
        Expense, dict(record), tracked, nested=True
    )
    assert tracked.variants
    assert not fast.variants
    assert fast.coercions == tracked.coercions
    assert fast.coercions[("Expense.id", "uuid->canonical")] == 1
