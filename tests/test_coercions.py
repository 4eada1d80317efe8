"""The single-value coercions of gateway/coercions.py, edge cases and regressions."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from gateway.normalise.coercions import (
    clear_value_caches,
    enumeration,
    scaled_decimal,
    to_boolean,
    to_date,
    to_decimal,
    to_instant,
    to_integer,
    to_number,
    to_uuid,
)

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
        ("abc", "the string 'abc' is not a plain decimal number"),
        ("1,000.00", "the string '1,000.00' is not a plain decimal number"),
        ("NaN", "the string 'NaN' is not a plain decimal number"),
        ("Infinity", "the string 'Infinity' is not a plain decimal number"),
        ("-inf", "the string '-inf' is not a plain decimal number"),
        ("", "the string '' is not a plain decimal number"),
        (" 1.00", "the string ' 1.00' is not a plain decimal number"),
        ("15%", "the string '15%' is not a plain decimal number"),
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
        ("yesterday", "the string 'yesterday' is not an ISO 8601 date-time"),
        ("2024-02-30T10:00:00Z", "the string '2024-02-30T10:00:00Z' is not an ISO 8601 date-time"),
        (1709288100, "a JSON number is not an ISO 8601 date-time"),
        # A date alone would be published as midnight UTC: a guess.
        ("2024-03-01", "the string '2024-03-01' is a date without a time"),
        ("20240301", "the string '20240301' is a date without a time"),
        # Used to raise OverflowError (a 500).
        ("0001-01-01T00:30:00+01:00", "0001-01-01T00:30:00+01:00 is outside the years"),
        ("9999-12-31T23:30:00-01:00", "9999-12-31T23:30:00-01:00 is outside the years"),
    ],
)
def test_values_that_are_not_instants_are_refused(sent: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(reason)}"):
        to_instant(sent)


def test_dates() -> None:
    assert to_date("2024-02-29") == ("2024-02-29", None)
    with pytest.raises(ValueError, match=r"^2024-02-31 is not a real calendar date$"):
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
