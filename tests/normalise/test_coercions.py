"""The single-value coercions of gateway/normalise/coercions.py, edge cases and
regressions; and the canonical forms, which are both the checks' patterns and the
published schema's."""

from __future__ import annotations

import re
from datetime import UTC
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.normalise.coercions import (
    CANONICAL_UUID,
    DATE_PATTERN,
    INSTANT_PATTERN,
    MAX_EXPONENT,
    UUID_PATTERN,
    DecimalCheck,
    clear_value_caches,
    decimal_pattern,
    enumeration,
    is_canonical_instant,
    is_known_date,
    scaled_decimal,
    to_boolean,
    to_date,
    to_decimal,
    to_instant,
    to_integer,
    to_number,
    to_uuid,
)
from gateway.normalise.schema import (
    Account,
    Bank,
    CanonicalModel,
    Client,
    Expense,
    User,
    published_pattern,
)
from tests.profiles import examples

amount = scaled_decimal(4)
threshold = scaled_decimal(2)


@pytest.mark.parametrize(
    ("sent", "published", "kind"),
    [
        ("1694.8300", "1694.8300", None),
        ("12.5", "12.5000", "reformatted"),
        ("12.500000", "12.500000", None),  # more decimals than the scale: all kept
        ("0.123456789", "0.123456789", None),
        ("1E+2", "100.0000", "reformatted"),
        ("+7", "7.0000", "reformatted"),
        (".5", "0.5000", "reformatted"),
        ("007.5", "7.5000", "reformatted"),
        ("-0.0000", "0.0000", "reformatted"),
        ("-0.0500", "-0.0500", None),
        (Decimal("0.1"), "0.1000", "number->string"),
        (Decimal("12345678901234.5678"), "12345678901234.5678", "number->string"),
        (Decimal("1E+2"), "100.0000", "number->string"),
        (42, "42.0000", "number->string"),
        # Past the 28 digits of decimal's default context: padded, never rounded.
        ("12345678901234567890123456", "12345678901234567890123456.0000", "reformatted"),
        (Decimal("1E+30"), "1" + "0" * 30 + ".0000", "number->string"),
        (
            Decimal("123456789012345678901234567890.123456789"),
            "123456789012345678901234567890.123456789",
            "number->string",
        ),
    ],
)
def test_decimal_quantities(sent: Any, published: str, kind: str | None) -> None:
    assert amount[1](sent) == (published, kind)
    assert Decimal(published) == Decimal(sent)


def test_canonical_decimal_text_takes_the_fast_path() -> None:
    is_canonical, _ = threshold
    assert is_canonical("5000.00")
    assert is_canonical("-12.3456")
    assert not is_canonical("5000.0")
    assert not is_canonical("-0.00")
    assert not is_canonical("05.00")


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        ("abc", "a string that is not a plain decimal number"),
        ("1,000.00", "a string that is not a plain decimal number"),
        ("NaN", "a string that is not a plain decimal number"),
        ("Infinity", "a string that is not a plain decimal number"),
        ("-inf", "a string that is not a plain decimal number"),
        ("", "a string that is not a plain decimal number"),
        (" 1.00", "a string that is not a plain decimal number"),
        ("15%", "a string that is not a plain decimal number"),
        (True, "a boolean is not a decimal number"),
        (1.5, "a binary floating-point value cannot be taken exactly"),
        (Decimal("NaN"), "not a finite number"),
        (None, "a JSON null is not a decimal number"),
        (["1"], "a JSON array is not a decimal number"),
        ("1" * 61, "a number out of the range that a financial value can take"),
        ("1E+101", "a number out of the range that a financial value can take"),
    ],
)
def test_values_that_are_not_decimals_are_refused(sent: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(reason)}$"):
        to_decimal(sent)


@pytest.mark.parametrize(
    ("sent", "published", "kind"),
    [
        (15, "15", None),
        (Decimal("2.5"), "2.5", None),
        (Decimal("0.10"), "0.1", None),
        ("15.0000", "15", "string->number"),
        ("2.5000", "2.5", "string->number"),
        ("1E+2", "100", "string->number"),
        # Past the 28 digits of decimal's default context: never rounded.
        ("12345678901234567890123456789.5", "12345678901234567890123456789.5", "string->number"),
    ],
)
def test_percentages_become_numbers(sent: Any, published: str, kind: str | None) -> None:
    number, got_kind = to_number(sent)
    assert (format(number, "f"), got_kind) == (published, kind)


@pytest.mark.parametrize("sent", [[15], {"value": 15}, "15%", True, "", "NaN"])
def test_percentages_that_are_not_numbers_are_refused(sent: Any) -> None:
    # A list or an object used to escape as a TypeError from the cache (a 500).
    with pytest.raises(ValueError):  # noqa: PT011 - the reason is asserted elsewhere
        to_number(sent)


@pytest.mark.parametrize(
    ("sent", "published", "kind"),
    [
        (170, 170, None),
        ("170", 170, "string->integer"),
        ("0170", 170, "string->integer"),
        (Decimal("170.0"), 170, "number->integer"),
        (Decimal("1.7E+2"), 170, "number->integer"),
        (2**63 - 1, 2**63 - 1, None),
    ],
)
def test_integers(sent: Any, published: int, kind: str | None) -> None:
    assert to_integer(sent) == (published, kind)


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        ("Colombia", "a JSON string that is not an integer"),
        (Decimal("170.5"), "a JSON number that is not an integer"),
        (Decimal("NaN"), "a JSON number that is not an integer"),
        (True, "a boolean is not an integer"),
        # orjson writes at most 64 bits: these used to fail at serialisation (a 500).
        (2**63, "an integer out of the 64-bit range"),
        (-(2**63) - 1, "an integer out of the 64-bit range"),
        (Decimal("1E+999999"), "an integer out of the 64-bit range"),
    ],
)
def test_values_that_are_not_integers_are_refused(sent: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(reason)}$"):
        to_integer(sent)


def test_booleans() -> None:
    assert to_boolean(True) == (True, None)
    assert to_boolean("FALSE") == (False, "string->boolean")
    for junk in ("yes", 1, None):
        with pytest.raises(ValueError):  # noqa: PT011
            to_boolean(junk)


@pytest.mark.parametrize(
    ("sent", "kind"),
    [
        ("3730bf79-913a-47af-a917-9e028868b644", None),
        ("3730BF79-913A-47AF-A917-9E028868B644", "uuid->canonical"),
        ("3730bf79913a47afa9179e028868b644", "uuid->canonical"),
        ("{3730bf79-913a-47af-a917-9e028868b644}", "uuid->canonical"),
        ("urn:uuid:3730bf79-913a-47af-a917-9e028868b644", "uuid->canonical"),
    ],
)
def test_uuids(sent: str, kind: str | None) -> None:
    assert to_uuid(sent) == ("3730bf79-913a-47af-a917-9e028868b644", kind)


@pytest.mark.parametrize(
    "sent",
    [
        "EXP-2025-0001",
        "3730bf79-913a-47af-a917-9e028868b64",
        # uuid.UUID ends in int(hex, 16), which takes signs, blanks and "_": these
        # used to become ids.
        "  730bf79913a47afa9179e028868b644",
        "+730bf79913a47afa9179e028868b644",
        "3730_f79913a47afa9179e028868b644",
    ],
)
def test_strings_that_are_not_uuids_are_refused(sent: str) -> None:
    with pytest.raises(ValueError, match=r"is not a UUID$"):
        to_uuid(sent)


@pytest.mark.parametrize(
    ("sent", "published", "kind"),
    [
        ("2024-03-01T10:15:00Z", "2024-03-01T10:15:00Z", None),
        ("2024-03-01T10:15:00.250Z", "2024-03-01T10:15:00.250Z", None),
        ("2024-03-01T15:45:00+05:30", "2024-03-01T10:15:00Z", "offset->utc"),
        ("2024-03-01T07:15:00-03:00", "2024-03-01T10:15:00Z", "offset->utc"),
        ("2024-03-01T10:15:00+00:00", "2024-03-01T10:15:00Z", "reformatted"),
        ("2024-03-01T10:15:00", "2024-03-01T10:15:00Z", "naive->utc"),
        ("2024-03-01T10:15:00.123999Z", "2024-03-01T10:15:00.123Z", "reformatted"),
        ("2024-03-01T10:15:00.5Z", "2024-03-01T10:15:00.500Z", "reformatted"),
        ("2024-03-01T00:15:00+01:00", "2024-02-29T23:15:00Z", "offset->utc"),
        # strftime("%Y") does not pad years before 1000 on glibc.
        ("0999-03-01T10:00:00+01:00", "0999-03-01T09:00:00Z", "offset->utc"),
    ],
)
def test_instants(sent: str, published: str, kind: str | None) -> None:
    assert to_instant(sent) == (published, kind)


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        ("yesterday", "a string that is not an ISO 8601 date-time"),
        ("2024-02-30T10:00:00Z", "a string that is not an ISO 8601 date-time"),
        (1709288100, "a JSON number is not an ISO 8601 date-time"),
        # A date alone would be published as midnight UTC: a guess.
        ("2024-03-01", "a string that is a date without a time"),
        ("20240301", "a string that is a date without a time"),
        # Used to raise OverflowError (a 500).
        ("0001-01-01T00:30:00+01:00", "a date-time outside the years"),
        ("9999-12-31T23:30:00-01:00", "a date-time outside the years"),
    ],
)
def test_values_that_are_not_instants_are_refused(sent: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(reason)}"):
        to_instant(sent)


def test_dates() -> None:
    assert to_date("2024-02-29") == ("2024-02-29", None)
    with pytest.raises(ValueError, match=r"^a date that is not a real calendar date$"):
        to_date("2024-02-31")
    with pytest.raises(ValueError, match=r"is not a date in the form YYYY-MM-DD$"):
        to_date("01/03/2024")


def test_enumerations() -> None:
    types = enumeration(frozenset({"CASH", "BANK"}))
    assert types("bank") == ("BANK", "lowercase->uppercase")
    assert types("Crypto") == ("CRYPTO", "unknown-value")
    with pytest.raises(ValueError, match="where an enumeration value is expected"):
        types(1)


@pytest.mark.parametrize(
    "order",
    [("-0", "0", "-0.0", "0E+2"), ("0E+2", "-0.0", "0", "-0")],
    ids=["neg-first", "pos-first"],
)
def test_a_number_does_not_depend_on_the_numbers_converted_before(order: tuple[str, ...]) -> None:
    """Decimal("-0") equals Decimal("0") and hashes alike: the conversion cache must not
    hand one for the other (the same upstream body would publish other bytes)."""
    clear_value_caches()
    published = {text: str(to_number(Decimal(text))[0]) for text in order}
    assert published == {"-0": "-0", "0": "0", "-0.0": "-0", "0E+2": "0"}
    assert to_number("-0.0")[0].is_signed()
    assert not to_number("0.0")[0].is_signed()


# ------------------------------------------------------------------ canonical forms

SETTINGS = settings(
    max_examples=examples(300),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
MODELS: list[type[CanonicalModel]] = [User, Client, Bank, Account, Expense]


def pattern_of_check(check: object) -> str:
    """The canonical form a field's quick check stands for, as gateway.normalise.coercions
    writes it (a decimal's without the quick check's bounds)."""
    if isinstance(check, DecimalCheck):
        return decimal_pattern(check.scale)
    if check == CANONICAL_UUID.fullmatch:
        return UUID_PATTERN
    if check is is_canonical_instant:
        return INSTANT_PATTERN
    if check is is_known_date:
        return DATE_PATTERN
    raise AssertionError(f"no canonical form for {check!r}")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_the_published_patterns_are_those_of_the_fields_checks(
    model: type[CanonicalModel],
) -> None:
    """Each field's JSON Schema pattern is the canonical form its rule checks, from the one
    definition in gateway.normalise.coercions; and only the fields with such a check have
    one."""
    schema = model.model_json_schema(mode="serialization")["properties"]
    published = {name: field["pattern"] for name, field in schema.items() if "pattern" in field}
    expected = {
        name: published_pattern(pattern_of_check(check))
        for name, (check, _) in model._rules.items()
        if check is not None and not isinstance(getattr(check, "__self__", None), frozenset)
    }
    assert published == expected


def test_the_checks_are_the_canonical_forms() -> None:
    assert CANONICAL_UUID.pattern == UUID_PATTERN
    assert DecimalCheck(4).pattern == decimal_pattern(4, most_whole=40, most=MAX_EXPONENT)
    assert decimal_pattern(4) == r"-?(?:0|[1-9][0-9]*)\.[0-9]{4,}"
    assert decimal_pattern(2, most_whole=40, most=100) == r"-?(?:0|[1-9][0-9]{0,39})\.[0-9]{2,100}"


decimals = st.one_of(
    st.integers(0, 12).flatmap(
        lambda places: st.decimals(allow_nan=False, allow_infinity=False, places=places)
    ),
    st.builds(
        lambda digits, exponent: Decimal(f"{digits}E{exponent}"),
        st.integers(-(10**59), 10**59),
        st.integers(-MAX_EXPONENT, MAX_EXPONENT),
    ),
)


@pytest.mark.parametrize("scale", [2, 4])
@SETTINGS
@given(number=decimals)
@example(number=Decimal("1E+50"))  # more whole digits than the quick check takes
@example(number=Decimal("-0.00001"))
@example(number=Decimal("-0"))
def test_every_published_decimal_matches_the_published_pattern(scale: int, number: Decimal) -> None:
    """The published pattern covers every decimal the coercion writes, and every text the
    quick check takes as already canonical (which the coercion gives back as it is)."""
    check, coerce = scaled_decimal(scale)
    pattern = re.compile(published_pattern(decimal_pattern(scale)))
    try:
        text, _ = coerce(number)
    except ValueError:
        return  # out of the range a financial value can take: never published
    assert pattern.search(text), text
    if check(text):
        assert coerce(text) == (text, None)
    for sent in (str(number), format(number, "f")):
        if check(sent):
            assert pattern.search(sent), sent
            assert coerce(sent) == (sent, None)


@SETTINGS
@given(
    value=st.one_of(
        st.datetimes(timezones=st.just(UTC)).map(lambda moment: moment.isoformat()),
        st.datetimes().map(lambda moment: moment.isoformat()),
        st.datetimes(timezones=st.timezones()).map(lambda moment: moment.isoformat()),
        st.from_regex(INSTANT_PATTERN, fullmatch=True),
    )
)
def test_every_published_instant_matches_the_published_pattern(value: str) -> None:
    pattern = re.compile(published_pattern(INSTANT_PATTERN))
    try:
        text, _ = to_instant(value)
    except ValueError:
        return
    assert pattern.search(text), text
    assert is_canonical_instant(text)
    if is_canonical_instant(value):
        assert pattern.search(value)


@SETTINGS
@given(value=st.one_of(st.uuids().map(str), st.uuids().map(lambda u: u.hex.upper())))
def test_every_published_uuid_matches_the_published_pattern(value: str) -> None:
    text, _ = to_uuid(value)
    assert re.search(published_pattern(UUID_PATTERN), text)


@SETTINGS
@given(value=st.dates().map(lambda day: day.isoformat()))
def test_every_published_date_matches_the_published_pattern(value: str) -> None:
    text, _ = to_date(value)
    assert re.search(published_pattern(DATE_PATTERN), text)
    assert is_known_date(text)
